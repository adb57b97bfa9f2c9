// HTTP/2 over TLS through a JS stream instead of on the TLS socket's native handle (both ends of our gRPC).
//
// Why (Node's, seen on 20 and 24 with NODE_DEBUG_NATIVE=http2session,tls): when Node's native HTTP/2
// session writes to a TLS socket whose TCP connection the peer already reset (a SIGKILLed peer's kernel
// answers with RST), the TCP write fails at once. The TLS layer hands ECONNRESET to the HTTP/2 session,
// which completes its write as if it had succeeded, and the TLS layer still counts a write in flight: every
// later write waits behind it for good. The HTTP/2 session stops reading while its write is pending, so it
// never reads the reset either, and its destroy() waits for that write too: the session neither fails nor
// closes, and its socket stays open. Through a JS stream every write is the TLS socket's own JS write,
// whose failure destroys the socket with the error, and the session ends at once. It costs about 40 % of
// the gRPC throughput (Node's JS-stream HTTP/2 path, measured alike with or without our Duplex in between).
import { Duplex } from 'node:stream';
import type tls from 'node:tls';

/** A Duplex carrying `socket`'s bytes, to hand to node:http2 in its place; destroying one destroys both. */
export function h2Transport(socket: tls.TLSSocket): Duplex {
  const d = new Duplex({
    read() {
      socket.resume();
    },
    write(chunk: Buffer, _encoding, callback) {
      socket.write(chunk, callback);
    },
    writev(chunks, callback) {
      socket.cork();
      // Done once the last one is written (a failure before destroys the socket and fails it too).
      chunks.forEach(({ chunk }, i) => socket.write(chunk as Buffer, i === chunks.length - 1 ? callback : undefined));
      socket.uncork();
    },
    final(callback) {
      socket.end();
      callback();
    },
    destroy(err, callback) {
      socket.off('data', onData);
      if (!socket.destroyed) socket.destroy(err ?? undefined);
      callback(err);
    },
  });
  const onData = (chunk: Buffer): void => {
    if (!d.push(chunk)) socket.pause();
  };
  socket.on('data', onData);
  socket.once('end', () => d.push(null));
  socket.on('error', (err) => d.destroy(err));
  socket.once('close', () => d.destroy());
  return d;
}
