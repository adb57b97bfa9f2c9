// What node:http2 runs on over TLS in our gRPC clients (SDK, agent; the hub runs our own HTTP/2, h2/):
// the TLS socket itself (Node's native HTTP/2 on the TLS handle, the fast path), watched for the write
// that never completes; a JS stream over the TLS socket only where that watch cannot see (TLS over a
// socket without a TCP handle).
//
// Node's defect (seen on 20 and 24; reproduced in test/repro/h2-tls-reset.mjs, described in
// proto/README.md): when the TCP write under a TLS socket fails (ECONNRESET or EPIPE: the peer's
// kernel answered with RST, as for a SIGKILLed peer with unread bytes), the TLS layer reports the
// error to the HTTP/2 session, which drops it (it completes its write as if it had succeeded), and
// the TLS layer keeps counting a write in flight: its encrypted bytes stay pending, and every later
// write waits behind them for good. The HTTP/2 session stops reading while its write is pending, so
// it never reads the reset either, and session.destroy() waits for that write too: the session
// neither fails nor closes. Destroying the TLS socket does end it (and its session) at once.
//
// The watch: a healthy TLS socket with encrypted bytes pending has a TCP write under way (libuv's
// queue holds its bytes while the kernel's buffer is full) or one the kernel took whose completion
// runs on the next turn of the event loop, after which the TLS layer writes the rest. So encrypted
// bytes pending with nothing queued on the TCP handle, at two looks WATCH_INTERVAL_MS apart, with the
// same count pending and not one byte written to TCP in between, is the stuck write: the watch
// destroys the socket with ECONNRESET. (Pending bytes and an empty TCP queue alone are not enough: a
// busy connection often shows them for a turn of the loop, and a steady stream of equal writes can
// show the same count at two looks.) One timer for every watched socket. Each tick it looks at the
// suspects and at one of SCAN_TICKS groups of the other sockets, so a socket is scanned every
// SCAN_TICKS × WATCH_INTERVAL_MS and a stuck write ends within (SCAN_TICKS + 1) × WATCH_INTERVAL_MS: at 5,000
// clusters with 1,000 gRPC agents, looking at every socket every interval was 13 % of the idle hub's busy time.
import { Duplex } from 'node:stream';
import type tls from 'node:tls';

/** Time between ticks: a suspect is looked at again one tick later. */
export const WATCH_INTERVAL_MS = 250;
/** Ticks between two scans of the same healthy socket. */
export const SCAN_TICKS = 3;

/** Node's internals the watch reads: the TLS handle's pending encrypted bytes; the TCP handle's queued and written bytes. */
interface TlsHandle {
  writeQueueSize?: unknown;
  _parent?: { writeQueueSize?: unknown; bytesWritten?: unknown; constructor?: { name?: string } };
}

function handleOf(socket: tls.TLSSocket): TlsHandle | undefined {
  return (socket as unknown as { _handle?: TlsHandle | null })._handle ?? undefined;
}

/** True when the watch can see `socket`'s writes: a TLS handle over a TCP handle, counting queued and written bytes. */
export function canWatchTlsWrites(socket: tls.TLSSocket): boolean {
  const h = handleOf(socket);
  const tcp = h?._parent;
  return (
    typeof h?.writeQueueSize === 'number' &&
    tcp?.constructor?.name === 'TCP' &&
    typeof tcp.writeQueueSize === 'number' &&
    typeof tcp.bytesWritten === 'number'
  );
}

interface Watched {
  socket: tls.TLSSocket;
  /** The group that scans it. */
  group: number;
  /** Pending encrypted bytes at the last look when nothing was queued on TCP; -1 when the last look was fine. */
  suspect: number;
  /** Bytes written to TCP at that look. */
  written: number;
}

/** The healthy sockets, in SCAN_TICKS groups; a suspect is also in `suspects` until a look clears or ends it. */
const groups: Set<Watched>[] = Array.from({ length: SCAN_TICKS }, () => new Set());
const suspects = new Set<Watched>();
let nextGroup = 0;
let tick = 0;
let timer: NodeJS.Timeout | null = null;
let stuckWritesEnded = 0;

/** Sockets the watch has destroyed in this process (tests read it). */
export function stuckTlsWritesEnded(): number {
  return stuckWritesEnded;
}

function unwatch(w: Watched): void {
  if (!groups[w.group]!.delete(w)) return;
  suspects.delete(w);
  if (timer && groups.every((g) => g.size === 0)) {
    clearInterval(timer);
    timer = null;
  }
}

/** One look at `w`: ends its socket if the write it was suspected of is still stuck, else notes what it sees. */
function lookAt(w: Watched): void {
  const h = handleOf(w.socket);
  if (!h || w.socket.destroyed) return unwatch(w);
  const pending = h.writeQueueSize as number;
  // The common case, read with one number: nothing pending, nothing to suspect.
  const stuck = pending > 0 && h._parent?.writeQueueSize === 0;
  if (!stuck) {
    w.suspect = -1;
    suspects.delete(w);
    return;
  }
  const written = h._parent?.bytesWritten as number;
  if (pending === w.suspect && written === w.written) {
    unwatch(w);
    stuckWritesEnded++;
    w.socket.destroy(Object.assign(new Error('connection reset: a TLS write never completed'), { code: 'ECONNRESET' }));
    return;
  }
  w.suspect = pending;
  w.written = written;
  suspects.add(w);
}

function onTick(): void {
  tick = (tick + 1) % SCAN_TICKS;
  // The suspects of earlier ticks get their second look; this tick's group its first (a new suspect waits a tick).
  const again = [...suspects];
  for (const w of groups[tick]!) if (w.suspect < 0) lookAt(w);
  for (const w of again) lookAt(w);
}

/** Watches `socket` (established TLS over TCP, see canWatchTlsWrites) until it closes. */
export function watchTlsWrites(socket: tls.TLSSocket): void {
  const w: Watched = { socket, group: nextGroup, suspect: -1, written: -1 };
  nextGroup = (nextGroup + 1) % SCAN_TICKS;
  groups[w.group]!.add(w);
  socket.once('close', () => unwatch(w));
  if (!timer) {
    timer = setInterval(onTick, WATCH_INTERVAL_MS);
    timer.unref();
  }
}

/**
 * What to hand node:http2 for `socket`: the socket itself, watched from the end of its handshake, or,
 * where the watch cannot see, a JS stream over it (h2Transport).
 */
export function h2Socket(socket: tls.TLSSocket): Duplex {
  if (!canWatchTlsWrites(socket)) return h2Transport(socket);
  if ((socket as unknown as { _secureEstablished?: boolean })._secureEstablished) watchTlsWrites(socket);
  else socket.once('secureConnect', () => watchTlsWrites(socket));
  return socket;
}

/**
 * A Duplex carrying `socket`'s bytes, to hand to node:http2 in its place; destroying one destroys both.
 * Every write is the TLS socket's own JS write, whose failure destroys the socket, so the defect above
 * cannot keep the session; it costs about 40 % of the gRPC throughput (Node's JS-stream HTTP/2 path).
 */
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
