// HTTP/1.1 chunked transfer coding on the writing side (RFC 9112 §7.1), for the gateway's relays, which pass
// on a chunked body as node's parser hands it over: each piece one chunk, in one write where the stream takes
// several (cork).
import type { Writable } from 'node:stream';

/** The last chunk and the empty trailer section. */
export const LAST_CHUNK = '0\r\n\r\n';

/** Writes `chunk` as one chunk of a chunked body; false: wait for 'drain', as write() says. */
export function writeChunk(w: Writable, chunk: Buffer): boolean {
  w.cork();
  w.write(`${chunk.length.toString(16)}\r\n`);
  w.write(chunk);
  const more = w.write('\r\n');
  w.uncork();
  return more;
}
