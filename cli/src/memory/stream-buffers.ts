// How much a paused socket keeps reading into Node's own stream buffer.
//
// The hub and the agent pause a socket when its connection's credit runs out (a destination or a
// client stopped reading). Node keeps reading until the stream's buffer reaches its high-water mark and
// then pushes the rest of the last read (for TLS, every record already decrypted), so each paused
// socket holds about twice the mark, outside every memory budget. Node 22 raised the default mark from
// 16 to 64 KiB; a TLS server socket (the CONNECT frontend's clients) takes no option for it.
// Measured with 512 TLS clients that keep writing to a server that pauses after the first chunk
// (Node 24.21): 266 KiB of RSS per paused connection with the default, 157-166 KiB with 16 KiB.
import { setDefaultHighWaterMark } from 'node:stream';

/** The default high-water mark of byte streams in hub, agent and forward: Node 20's. */
export const STREAM_BUFFER_BYTES = 16 * 1024;

export function limitStreamBuffers(): void {
  setDefaultHighWaterMark(false, STREAM_BUFFER_BYTES);
}
