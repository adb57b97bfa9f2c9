// A gRPC client for bidi streams of packets on node:http2 (the SDK's Proxy streams, the agent's
// AgentService.Connect), without grpc-js: large receive windows, no per-message promise machinery, a
// socket we may hand in (a CONNECT tunnel through an egress proxy), and a close() that really closes
// the connection (grpc-js's graceful close can leave the TCP socket behind when the server closes at
// the same moment).
//
// One GrpcClient holds at most one HTTP/2 session at a time, opened on the first call and again after
// the server went away (GOAWAY or a broken connection); calls on the old session finish there. Each
// call is a GrpcClientCall (grpc-client-call.ts).
import http2 from 'node:http2';
import net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import { h2Socket } from './h2-transport.js';
import { splitHostPort } from '../wire/identifiers.js';
import { GrpcStatus } from './grpc-framing.js';
import { GrpcClientCall } from './grpc-client-call.js';
import { watchSession, type WatchdogOptions } from './session-watchdog.js';

const { NGHTTP2_ENHANCE_YOUR_CALM } = http2.constants;

/** How long close() lets the last frames (RST_STREAM, GOAWAY) leave before destroying the sockets. */
const CLOSE_GRACE_MS = 100;

export interface GrpcClientOptions {
  /** HOST:PORT (TLS), or unix:PATH / unix:///PATH (plaintext HTTP/2 on a Unix socket). */
  address: string;
  /** TLS (required for HOST:PORT): the CA that signed the server, and our client certificate if any. */
  tls?: { ca: Buffer | string; cert?: Buffer | string; key?: Buffer | string; serverName?: string };
  /** A connected socket to run TLS over instead of dialing `address` (single use: the first session only). */
  socket?: Duplex;
  /** Receive windows we announce (stream) and grant (connection). */
  streamWindow: number;
  connectionWindow: number;
  maxMessageBytes: number;
  /** Ping the server; a ping not answered in time breaks the session (and fails its calls). */
  keepalive?: WatchdogOptions;
  /** Keep the process alive while the session is idle (the agent); the SDK does not. */
  refWhenIdle?: boolean;
  /**
   * The server said we ping too often (GOAWAY ENHANCE_YOUR_CALM "too_many_pings", as grpc-go sends
   * below its enforcement policy's MinTime: 30 s on ANP's agent listener). This client's later
   * sessions ping at twice the interval (gRFC A8); the caller may remember it for the next client.
   */
  onTooManyPings?: (nextIntervalMs: number) => void;
}

export class GrpcClient {
  private session: http2.ClientHttp2Session | null = null;
  /** Sessions whose server SETTINGS arrived (its stream limit is known). */
  private readonly settled = new WeakSet<http2.ClientHttp2Session>();
  private readonly sockets = new Set<Duplex>();
  private readonly calls = new Set<GrpcClientCall>();
  private socketHandedIn: Duplex | undefined;
  /** The TLS socket of the latest session (a call runs on the session that was current when it started). */
  private tlsSocket: tls.TLSSocket | undefined;
  private keepalive: WatchdogOptions | undefined;
  private closed = false;

  constructor(private readonly opts: GrpcClientOptions) {
    this.socketHandedIn = opts.socket;
    this.keepalive = opts.keepalive;
    if (!opts.address.startsWith('unix:') && !opts.tls) throw new Error(`gRPC to ${opts.address} needs TLS options`);
  }

  /** Open calls on `session` (counted, not copied: this runs once per call). */
  private callsOn(session: http2.ClientHttp2Session): number {
    let n = 0;
    for (const c of this.calls) if (c.isOn(session)) n++;
    return n;
  }

  /** Starts a bidi call on `path` with `metadata` as request headers. */
  call(path: string, metadata: Record<string, string> = {}): GrpcClientCall {
    if (this.closed) return GrpcClientCall.failed(GrpcStatus.UNAVAILABLE, 'client closed');
    let session: http2.ClientHttp2Session;
    try {
      session = this.currentSession();
    } catch (err) {
      return GrpcClientCall.failed(GrpcStatus.UNAVAILABLE, (err as Error).message);
    }
    // Past the server's stream limit nghttp2 would hold the new stream back until another ends: a
    // caller would wait for its own timeout. Refuse at once instead.
    // Only once the server's SETTINGS arrived: before that Node reports nghttp2's provisional 100.
    const limit = this.settled.has(session) ? session.remoteSettings.maxConcurrentStreams : undefined;
    if (limit !== undefined && this.callsOn(session) >= limit) {
      return GrpcClientCall.failed(
        GrpcStatus.RESOURCE_EXHAUSTED,
        `the server allows ${limit} concurrent calls on one connection, and as many are open`,
      );
    }
    const call = new GrpcClientCall(session, path, metadata, this.opts.maxMessageBytes);
    this.calls.add(call);
    if (this.calls.size === 1 && !this.opts.refWhenIdle) session.ref();
    call.once('close', () => {
      this.calls.delete(call);
      if (this.calls.size === 0 && !this.opts.refWhenIdle && !session.destroyed) session.unref();
    });
    return call;
  }

  /**
   * Cancels every call and closes the connection: the resets and a GOAWAY go out first, then the
   * sockets are destroyed (within CLOSE_GRACE_MS, without waiting for the server's FIN: a graceful
   * close that waits for it can leave the socket behind).
   */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const c of [...this.calls]) c.cancel();
    const session = this.session;
    this.session = null;
    const sockets = [...this.sockets];
    if (this.socketHandedIn) sockets.push(this.socketHandedIn);
    let timer: NodeJS.Timeout | undefined;
    const destroy = (): void => {
      clearTimeout(timer);
      session?.destroy();
      for (const s of sockets) s.destroy();
    };
    if (!session || session.destroyed) return destroy();
    timer = setTimeout(destroy, CLOSE_GRACE_MS).unref();
    session.close(destroy);
  }

  private currentSession(): http2.ClientHttp2Session {
    const s = this.session;
    if (s && !s.closed && !s.destroyed) return s;
    const session = this.connect();
    this.session = session;
    // After a GOAWAY the server takes no new streams here: the next call opens a new session.
    session.once('goaway', (code: number, _lastStreamID: number, data?: Buffer) => {
      if (this.session === session) this.session = null;
      if (code === NGHTTP2_ENHANCE_YOUR_CALM && data?.toString() === 'too_many_pings' && this.keepalive) {
        this.keepalive = { ...this.keepalive, intervalMs: this.keepalive.intervalMs * 2 };
        this.opts.onTooManyPings?.(this.keepalive.intervalMs);
      }
    });
    session.once('close', () => {
      if (this.session === session) this.session = null;
    });
    session.on('error', () => {}); // each call reports the failure
    session.once('remoteSettings', () => this.settled.add(session));
    if (!this.opts.refWhenIdle) session.unref();
    session.once('connect', () => {
      try {
        session.setLocalWindowSize(this.opts.connectionWindow);
      } catch {
        /* closing already */
      }
      if (this.keepalive) watchSession(session, this.keepalive);
    });
    return session;
  }

  /** The TLS socket of the current session (undefined on a Unix socket or before the first call). */
  get currentTlsSocket(): tls.TLSSocket | undefined {
    return this.tlsSocket;
  }

  private connect(): http2.ClientHttp2Session {
    // Frames up to 512 KiB from a server that sends them (our hub): a 256 KiB DATA message in one
    // frame instead of sixteen (node:http2 itself sends 16 KiB frames whatever the peer allows).
    const settings: http2.Settings = { initialWindowSize: this.opts.streamWindow, enablePush: false, maxFrameSize: 512 * 1024 };
    // Our frames are bounded by the message size; nghttp2's default session memory (10 MiB) would
    // refuse new streams on a busy session.
    const common = { settings, maxSessionMemory: 64 };
    const { address } = this.opts;
    let socket: Duplex;
    /** What node:http2 runs on: the Unix socket, or the TLS socket as h2Socket gives it (see h2-transport.ts). */
    let transport: Duplex;
    let authority: string;
    if (address.startsWith('unix:')) {
      const path = address.replace(/^unix:(\/\/)?/u, '');
      socket = net.connect({ path });
      transport = socket;
      authority = 'http://localhost';
    } else {
      const hp = splitHostPort(address);
      if (!hp) throw new Error(`address "${address}" is not HOST:PORT`);
      const t = this.opts.tls!;
      const handedIn = this.socketHandedIn;
      this.socketHandedIn = undefined;
      const servername = t.serverName ?? (net.isIP(hp.host) ? undefined : hp.host);
      const tlsSocket = tls.connect({
        ...(handedIn ? { socket: handedIn } : { host: hp.host, port: hp.port }),
        ca: t.ca,
        cert: t.cert,
        key: t.key,
        servername,
        ALPNProtocols: ['h2'],
      });
      socket = tlsSocket;
      this.tlsSocket = tlsSocket;
      transport = h2Socket(tlsSocket);
      if (handedIn) this.track(handedIn);
      authority = `https://${t.serverName ?? (hp.host.includes(':') ? `[${hp.host}]` : hp.host)}:${hp.port}`;
    }
    (socket as net.Socket).setNoDelay?.(true);
    this.track(socket);
    return http2.connect(authority, { ...common, createConnection: () => transport });
  }

  private track(s: Duplex): void {
    this.sockets.add(s);
    s.once('close', () => this.sockets.delete(s));
  }
}
