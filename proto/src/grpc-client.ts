// A gRPC client for bidi streams of packets on node:http2 (the SDK's Proxy streams, the agent's
// AgentService.Connect), without grpc-js: large receive windows, no per-message promise machinery, a
// socket we may hand in (a CONNECT tunnel through an egress proxy), and a close() that really closes
// the connection (grpc-js's graceful close can leave the TCP socket behind when the server closes at
// the same moment).
//
// One GrpcClient holds at most one HTTP/2 session at a time, opened on the first call and again after
// the server went away (GOAWAY or a broken connection); calls on the old session finish there.
//
// A call's life: open (request sent) → streaming (response headers arrived: 'metadata') → finished
// (status known: 'end' + 'status' for OK, 'error' + 'status' otherwise) → closed (stream gone).
// Packets that arrived before the status are delivered first, also across pause()/resume().
import { EventEmitter } from 'node:events';
import http2 from 'node:http2';
import net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import { h2Transport } from './h2-transport.js';
import { splitHostPort } from './identifiers.js';
import type { Packet } from './packet.js';
import {
  GrpcCallError, GrpcFramingError, GrpcMessageReader, GrpcStatus, decodeGrpcMessage, grpcStatusFromHttp, writeGrpcMessage, type GrpcCallStatus,
} from './grpc-framing.js';
import { watchSession, type WatchdogOptions } from './session-watchdog.js';

const { NGHTTP2_CANCEL, NGHTTP2_REFUSED_STREAM, NGHTTP2_ENHANCE_YOUR_CALM, NGHTTP2_INADEQUATE_SECURITY } = http2.constants;

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
  private readonly sockets = new Set<Duplex>();
  private readonly calls = new Set<GrpcClientCall>();
  private socketHandedIn: Duplex | undefined;
  private keepalive: WatchdogOptions | undefined;
  private closed = false;

  constructor(private readonly opts: GrpcClientOptions) {
    this.socketHandedIn = opts.socket;
    this.keepalive = opts.keepalive;
    if (!opts.address.startsWith('unix:') && !opts.tls) throw new Error(`gRPC to ${opts.address} needs TLS options`);
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

  private connect(): http2.ClientHttp2Session {
    const settings: http2.Settings = { initialWindowSize: this.opts.streamWindow, enablePush: false };
    // Our frames are bounded by the message size; nghttp2's default session memory (10 MiB) would
    // refuse new streams on a busy session.
    const common = { settings, maxSessionMemory: 64 };
    const { address } = this.opts;
    let socket: Duplex;
    /** What node:http2 runs on: the Unix socket itself, or a JS stream over TLS (see h2-transport.ts). */
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
        ca: t.ca, cert: t.cert, key: t.key, servername, ALPNProtocols: ['h2'],
      });
      socket = tlsSocket;
      transport = h2Transport(tlsSocket);
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

/** A client-side bidi call (the events and methods grpc-js's ClientDuplexStream has that we use). */
export class GrpcClientCall extends EventEmitter {
  private readonly stream: http2.ClientHttp2Stream | null;
  private readonly reader: GrpcMessageReader;
  private readonly queue: Packet[] = [];
  private paused = false;
  private trailers: GrpcCallStatus | null = null;
  /** The status, once known; delivered after every queued packet. */
  private final: GrpcCallStatus | null = null;
  private delivered = false;
  private cancelled = false;
  private streamClosed = false;
  private streamError: string | null = null;

  /** A call that failed before it started (emits 'error' and 'status' on the next tick). */
  static failed(code: number, details: string): GrpcClientCall {
    const call = new GrpcClientCall(null, '', {}, 0);
    process.nextTick(() => call.fail(code, details));
    return call;
  }

  constructor(private readonly session: http2.ClientHttp2Session | null, path: string, metadata: Record<string, string>, maxMessageBytes: number) {
    super();
    this.reader = new GrpcMessageReader(maxMessageBytes);
    if (!session) {
      this.stream = null;
      return;
    }
    let stream: http2.ClientHttp2Stream;
    try {
      stream = session.request({
        ':method': 'POST', ':path': path, 'content-type': 'application/grpc', te: 'trailers',
        'user-agent': 'cluster-proxy', 'grpc-accept-encoding': 'identity', ...metadata,
      });
    } catch (err) {
      this.stream = null;
      process.nextTick(() => this.fail(GrpcStatus.UNAVAILABLE, (err as Error).message));
      return;
    }
    this.stream = stream;
    stream.on('response', (headers) => this.onResponse(headers));
    stream.on('trailers', (headers) => {
      this.trailers = statusFrom(headers);
    });
    stream.on('data', (chunk: Buffer) => this.onData(chunk));
    stream.on('end', () => this.onEnd());
    stream.on('drain', () => this.emit('drain'));
    stream.on('error', (err: NodeJS.ErrnoException) => {
      // A stream-level reset (the peer's RST_STREAM) is mapped from its code on 'close'; anything
      // else (refused, TLS, the session destroyed) means the connection failed.
      if (err.code !== 'ERR_HTTP2_STREAM_ERROR') this.streamError ??= err.message;
    });
    stream.on('close', () => this.onClose());
  }

  get writableEnded(): boolean {
    return this.stream?.writableEnded ?? true;
  }

  get writableNeedDrain(): boolean {
    return this.stream?.writableNeedDrain ?? false;
  }

  write(p: Packet, callback?: (err?: Error | null) => void): boolean {
    const s = this.stream;
    if (!s || this.final || s.destroyed || s.writableEnded) {
      if (callback) process.nextTick(callback, new Error('call ended'));
      return false;
    }
    return writeGrpcMessage(s, p, callback);
  }

  /** Half-closes our side (END_STREAM). */
  end(): void {
    const s = this.stream;
    if (s && !s.destroyed && !s.writableEnded) s.end();
  }

  /**
   * Abandons the call: RST_STREAM CANCEL, reported as CANCELLED. After the server's status the call is
   * complete, not cancelled: our side is ended (END_STREAM) if it was still open, which is all it needs.
   * (A reset there once sent a Node 20 HTTP/2 session on native TLS into an endless send loop in a full
   * suite run; not reproduced in isolation on Node 20 or 24, and our sessions no longer run on native TLS.)
   */
  cancel(): void {
    if (this.cancelled) return;
    this.cancelled = true;
    const s = this.stream;
    if (s && !s.destroyed) {
      if (!this.final) s.close(NGHTTP2_CANCEL);
      else if (!s.writableEnded) s.end();
    }
    this.queue.length = 0;
    this.paused = false;
    this.finish(this.final ?? { code: GrpcStatus.CANCELLED, details: 'Cancelled on client', metadata: {} });
  }

  pause(): this {
    this.paused = true;
    this.stream?.pause();
    return this;
  }

  resume(): this {
    this.paused = false;
    this.flush();
    if (!this.paused) this.stream?.resume();
    return this;
  }

  /** A call without a stream: reports the status and is closed. */
  private fail(code: number, details: string): void {
    this.streamClosed = true;
    this.finish({ code, details, metadata: {} });
  }

  private onResponse(headers: http2.IncomingHttpHeaders & http2.IncomingHttpStatusHeader): void {
    const httpStatus = Number(headers[':status']);
    if (headers['grpc-status'] !== undefined) {
      // Trailers-only: the status came with the headers.
      this.trailers = statusFrom(headers);
      return;
    }
    if (httpStatus !== 200) {
      this.final = { code: grpcStatusFromHttp(httpStatus), details: `Received HTTP status code ${httpStatus}`, metadata: {} };
      this.stream?.close(NGHTTP2_CANCEL);
      return;
    }
    const contentType = String(headers['content-type'] ?? '');
    if (!contentType.startsWith('application/grpc')) {
      this.final = { code: GrpcStatus.UNKNOWN, details: `unexpected content-type "${contentType}"`, metadata: {} };
      this.stream?.close(NGHTTP2_CANCEL);
      return;
    }
    this.emit('metadata', metadataFrom(headers));
  }

  private onData(chunk: Buffer): void {
    if (this.final || this.cancelled) return;
    try {
      this.reader.push(chunk, this.queue);
    } catch (err) {
      const e = err as GrpcFramingError;
      this.final = { code: e.code, details: e.message, metadata: {} };
      this.reader.clear();
      this.stream?.close(NGHTTP2_CANCEL);
      return;
    }
    this.flush();
  }

  /** The server's END_STREAM: with trailers, the status; without, 'close' decides (a dying connection ends streams too). */
  private onEnd(): void {
    if (this.final || !this.trailers) return;
    this.final = this.trailers;
    this.flush();
  }

  private onClose(): void {
    this.streamClosed = true;
    if (!this.final) {
      const stream = this.stream!;
      const code = stream.rstCode;
      const sessionGone = this.session?.destroyed ?? true;
      if (this.trailers) this.final = this.trailers;
      else if (this.streamError !== null || sessionGone) {
        // The connection failed or closed (refused, TLS, the server gone, a ping timeout).
        this.final = { code: GrpcStatus.UNAVAILABLE, details: this.streamError ?? 'connection closed', metadata: {} };
      } else if (stream.readableEnded) {
        this.final = this.reader.pending > 0
          ? { code: GrpcStatus.INTERNAL, details: 'stream ended inside a message', metadata: {} }
          : { code: GrpcStatus.UNKNOWN, details: 'server ended the stream without a status', metadata: {} };
      } else {
        this.final = { code: rstStatus(code), details: `Received RST_STREAM with code ${code ?? 'unknown'}`, metadata: {} };
      }
    }
    if (this.delivered) this.emit('close');
    else this.flush();
  }

  /** Hands queued packets to the reader while it is not paused, then the status once all are out. */
  private flush(): void {
    while (!this.paused && this.queue.length > 0 && !this.cancelled) this.emit('data', this.queue.shift()!);
    const inputDone = this.streamClosed || (this.stream?.readableEnded ?? true);
    if (!this.paused && this.queue.length === 0 && this.final && inputDone) this.finish(this.final);
  }

  private finish(status: GrpcCallStatus): void {
    if (this.delivered) return;
    this.delivered = true;
    this.final = status;
    if (status.code === GrpcStatus.OK) this.emit('end');
    else if (this.listenerCount('error') > 0) this.emit('error', new GrpcCallError(status.code, status.details));
    this.emit('status', status);
    if (this.streamClosed) this.emit('close');
  }
}

function rstStatus(code: number | undefined): number {
  switch (code) {
    case NGHTTP2_REFUSED_STREAM: return GrpcStatus.UNAVAILABLE;
    case NGHTTP2_CANCEL: return GrpcStatus.CANCELLED;
    case NGHTTP2_ENHANCE_YOUR_CALM: return GrpcStatus.RESOURCE_EXHAUSTED;
    case NGHTTP2_INADEQUATE_SECURITY: return GrpcStatus.PERMISSION_DENIED;
    default: return GrpcStatus.INTERNAL;
  }
}

function statusFrom(headers: http2.IncomingHttpHeaders): GrpcCallStatus {
  const raw = headers['grpc-status'];
  const code = raw === undefined ? GrpcStatus.UNKNOWN : Number(raw);
  const message = headers['grpc-message'];
  return {
    code: Number.isInteger(code) ? code : GrpcStatus.UNKNOWN,
    details: typeof message === 'string' ? decodeGrpcMessage(message) : raw === undefined ? 'trailers without grpc-status' : '',
    metadata: metadataFrom(headers),
  };
}

/** Headers as gRPC metadata: lower-case keys, without HTTP/2 pseudo-headers and transport headers. */
function metadataFrom(headers: http2.IncomingHttpHeaders): Record<string, string[]> {
  const md: Record<string, string[]> = {};
  for (const [k, v] of Object.entries(headers)) {
    if (k.startsWith(':') || k === 'content-type' || k === 'grpc-status' || k === 'grpc-message' || v === undefined) continue;
    md[k] = Array.isArray(v) ? v : [String(v)];
  }
  return md;
}
