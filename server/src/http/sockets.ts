// Socket plumbing of the CONNECT listeners: binding TCP and Unix sockets (0660, stale files removed,
// live ones never), closing servers, resetting a client (TCP RST, also under TLS), peer names.
import { chmod, lstat, unlink } from 'node:fs/promises';
import net from 'node:net';
import tls from 'node:tls';
import { joinHostPort } from '@cluster-proxy/proto';

const UDS_MODE = 0o660;

/**
 * RST for a TCP client, TLS included (it learns the stream is incomplete; a FIN, or a TLS
 * close_notify, would read as a complete stream), whatever is still queued for it. A Unix socket
 * has no reset: it just closes. So does a socket whose FIN is already under way (see finEnRoute).
 */
export function resetSocket(s: net.Socket): void {
  if (s.destroyed) return;
  if (finEnRoute(s)) {
    s.destroy();
    return;
  }
  if (!(s instanceof tls.TLSSocket)) {
    try {
      s.resetAndDestroy();
    } catch {
      s.destroy(); // not a TCP handle (a Unix socket): a close is all there is
    }
    return;
  }
  // A TLS socket's TCP connection is the net.Socket it wraps (`_parent`, set by node:tls for
  // server-side sockets); resetAndDestroy() works only on that TCP handle.
  const raw = (s as tls.TLSSocket & { _parent?: unknown })._parent;
  if (!(raw instanceof net.Socket)) {
    s.destroy();
    return;
  }
  if (raw.destroyed) return; // reset already: the TLS socket follows its close (below)
  // The TLS socket is destroyed once its TCP socket has closed (node:tls does so too), not now:
  // destroying it in the turn of the reset frees its TLS state while a write made in that turn is
  // still to complete, and Node crashes (SIGSEGV, Node 20 and 24).
  try {
    raw.resetAndDestroy();
    raw.once('close', () => s.destroy());
  } catch {
    s.destroy(); // not over TCP
  }
}

/**
 * Whether a TCP client's connection was reset, asked without reading: once a reset arrived the kernel
 * knows no peer any more (getpeername fails with ENOTCONN), while reading would first have to take
 * every byte queued before it. A FIN does not show this way (the peer stays known until we close).
 * Only for TCP (plain or under TLS): the caller leaves Unix sockets out.
 */
export function peerReset(s: net.Socket): boolean {
  const tcp = s instanceof tls.TLSSocket ? (s as tls.TLSSocket & { _parent?: unknown })._parent : s;
  if (!(tcp instanceof net.Socket) || tcp.destroyed) return false;
  // The TCP handle's own getpeername: net.Socket's remoteAddress is read once and cached.
  const handle = (tcp as net.Socket & { _handle?: { getpeername?: (out: object) => number } | null })._handle;
  if (typeof handle?.getpeername !== 'function') return false;
  return handle.getpeername({}) !== 0;
}

/**
 * end() was called and every byte written: the shutdown (our FIN, after a TLS close_notify) is in
 * progress until 'finish'. libuv refuses a reset meanwhile (EINVAL), and Node then drops the TCP
 * handle without closing it: no 'close' ever, a leaked descriptor, and the client stays half-open.
 * The client's stream is complete by then, so a plain close loses nothing (and bytes it still
 * sends are answered with a reset by the kernel).
 */
export function finEnRoute(s: net.Socket): boolean {
  return s.writableEnded && s.writableLength === 0 && !s.writableFinished;
}

export function peerOf(s: net.Socket): string {
  if (!s.remoteAddress) return '';
  return joinHostPort(s.remoteAddress, s.remotePort ?? 0);
}

export function isLoopback(host: string): boolean {
  if (host === 'localhost') return true;
  if (net.isIPv4(host)) return host.startsWith('127.');
  if (net.isIPv6(host)) return host === '::1' || /^::ffff:127\./i.test(host);
  return false;
}

export function listen(server: net.Server, where: net.ListenOptions): Promise<number> {
  return new Promise((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException): void =>
      reject(new Error(`cannot listen on ${where.host}:${where.port}: ${err.code ?? err.message}`));
    server.once('error', onError);
    server.listen(where, () => {
      server.removeListener('error', onError);
      resolve((server.address() as net.AddressInfo).port);
    });
  });
}

/** Binds a Unix socket that is 0660 from the start (umask during the synchronous bind), removing a
 * stale socket file but never a live one or a non-socket. */
export async function listenUnix(server: net.Server, file: string): Promise<void> {
  await removeStaleSocket(file);
  await new Promise<void>((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException): void => reject(new Error(`cannot listen on ${file}: ${err.code ?? err.message}`));
    server.once('error', onError);
    let oldMask: number | null = null;
    try {
      oldMask = process.umask(0o777 & ~UDS_MODE);
    } catch {
      // Worker threads cannot change the umask; the chmod below still applies.
    }
    try {
      server.listen(file, () => {
        server.removeListener('error', onError);
        resolve();
      });
    } finally {
      if (oldMask !== null) process.umask(oldMask);
    }
  });
  await chmod(file, UDS_MODE);
}

async function removeStaleSocket(file: string): Promise<void> {
  let st;
  try {
    st = await lstat(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  if (!st.isSocket()) throw new Error(`cannot listen on ${file}: it exists and is not a socket`);
  const live = await new Promise<boolean>((resolve) => {
    const probe = net.connect(file);
    probe.once('connect', () => {
      probe.destroy();
      resolve(true);
    });
    probe.once('error', () => resolve(false));
  });
  if (live) throw new Error(`cannot listen on ${file}: another process is serving it`);
  await unlink(file);
}

export function closeServer(server: net.Server): Promise<void> {
  return new Promise((resolve) => {
    if (!server.listening) return resolve();
    server.close(() => resolve());
  });
}
