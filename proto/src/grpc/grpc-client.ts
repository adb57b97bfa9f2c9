// A gRPC client for bidi streams of packets on node:http2 (the SDK's Proxy streams, the agent's
// AgentService.Connect), without grpc-js: large receive windows, no per-message promise machinery, a
// socket we may hand in (a CONNECT tunnel through an egress proxy), and a close() that really closes
// the connection (grpc-js's graceful close can leave the TCP socket behind when the server closes at
// the same moment).
//
// One GrpcClient holds at most one HTTP/2 session at a time, opened on the first call and again after
// the server went away (GOAWAY or a broken connection); calls on the old session finish there.
//
// One call (GrpcClientCall), states:
//   failing    no stream (the client is closed, or the request failed): the status follows on the next tick
//   open       request sent, no response headers yet
//   streaming  response headers arrived ('metadata'): packets flow both ways
//   ending     the status is known (trailers with END_STREAM, an HTTP or framing error) but not delivered:
//              the packets before it go first, and the server's input must be over
//   closing    the stream has closed; the packets and the status before it wait for the paused reader
//   finished   the status is delivered ('end' + 'status' for OK, 'error' + 'status' otherwise); the
//              stream has not closed yet
//   closed     status delivered and stream closed ('close')
//
//   open ──headers──▶ streaming ──trailers + END_STREAM──▶ ending ──reader took all──▶ finished ──stream closed──▶ closed
//   open ──HTTP error, not gRPC──▶ ending;   streaming ──framing error──▶ ending
//   open, streaming, ending ──stream closed──▶ closing ──reader took all──▶ closed
//   open, streaming, ending ──cancel()──▶ finished;   closing ──cancel()──▶ closed
//   failing ──next tick──▶ closed;   failing ──cancel()──▶ finished ──next tick──▶ closed
// Our END_STREAM (end()) is the HTTP/2 stream's own: write() fails after it as it would on the stream.
// No timers; the stream's listeners go with the stream, which emits nothing after its 'close'.
// Packets that arrived before the status are delivered first, also across pause()/resume() (the
// Inbox below: the reader's own flowing/paused state).
import { EventEmitter } from 'node:events';
import http2 from 'node:http2';
import net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import { h2Socket } from './h2-transport.js';
import { splitHostPort } from '../wire/identifiers.js';
import type { DataViewHandler } from '../mux/framing.js';
import type { DataViews } from '../wire/codec.js';
import type { Packet } from '../wire/packet.js';
import {
  deliverMessage,
  GrpcCallError,
  type GrpcFramingError,
  GrpcMessageReader,
  GrpcStatus,
  decodeGrpcMessage,
  grpcStatusFromHttp,
  writeGrpcMessage,
  type GrpcCallStatus,
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
  /** Sessions whose server SETTINGS arrived (its stream limit is known). */
  private readonly settled = new WeakSet<http2.ClientHttp2Session>();
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

  private connect(): http2.ClientHttp2Session {
    const settings: http2.Settings = { initialWindowSize: this.opts.streamWindow, enablePush: false };
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

/**
 * Packets decoded but not yet handed to the call's reader, who may pause them. States:
 *   flowing  packets are handed over as they come
 *   paused   packets wait here (the HTTP/2 stream is paused as well, so only the rest of a chunk does)
 */
class Inbox {
  state: 'flowing' | 'paused' = 'flowing';
  /** In arrival order (the message reader appends to it; DataViews when the call asked for views). */
  readonly packets: (Packet | DataViews)[] = [];

  pause(): void {
    this.state = 'paused';
  }

  resume(): void {
    this.state = 'flowing';
  }

  /** The call is cancelled: nothing more is handed over, and nothing stays paused. */
  clear(): void {
    this.packets.length = 0;
    this.state = 'flowing';
  }

  /** Hands packets to `deliver` while flowing; true once the reader has taken every one. */
  drain(deliver: (p: Packet | DataViews) => void): boolean {
    while (this.state === 'flowing' && this.packets.length > 0) deliver(this.packets.shift()!);
    return this.state === 'flowing' && this.packets.length === 0;
  }
}

export type GrpcCallState = 'failing' | 'open' | 'streaming' | 'ending' | 'closing' | 'finished' | 'closed';

/** A client-side bidi call (the events and methods grpc-js's ClientDuplexStream has that we use). */
export class GrpcClientCall extends EventEmitter {
  state: GrpcCallState;
  private readonly stream: http2.ClientHttp2Stream | null;
  private readonly reader: GrpcMessageReader;
  private readonly inbox = new Inbox();
  /** The status the server's trailers carry (the call ends with it at END_STREAM or the stream's close). */
  private trailers: GrpcCallStatus | null = null;
  /** The status, from ending on. */
  private status: GrpcCallStatus | null = null;
  /** Why the connection failed, if it did (the status when the stream closes without one). */
  private streamError: string | null = null;

  /** A call that failed before it started (emits 'error' and 'status' on the next tick). */
  static failed(code: number, details: string): GrpcClientCall {
    const call = new GrpcClientCall(null, '', {}, 0);
    process.nextTick(() => call.fail(code, details));
    return call;
  }

  constructor(
    private readonly session: http2.ClientHttp2Session | null,
    path: string,
    metadata: Record<string, string>,
    maxMessageBytes: number,
  ) {
    super();
    this.reader = new GrpcMessageReader(maxMessageBytes);
    if (!session) {
      this.state = 'failing';
      this.stream = null;
      return;
    }
    let stream: http2.ClientHttp2Stream;
    try {
      stream = session.request({
        ':method': 'POST',
        ':path': path,
        'content-type': 'application/grpc',
        te: 'trailers',
        'user-agent': 'cluster-proxy',
        'grpc-accept-encoding': 'identity',
        ...metadata,
      });
    } catch (err) {
      this.state = 'failing';
      this.stream = null;
      process.nextTick(() => this.fail(GrpcStatus.UNAVAILABLE, (err as Error).message));
      return;
    }
    this.state = 'open';
    this.stream = stream;
    stream.on('response', (headers) => this.onResponse(headers));
    stream.on('trailers', (headers) => this.onTrailers(headers));
    stream.on('data', (chunk: Buffer) => this.onData(chunk));
    stream.on('end', () => this.onEnd());
    stream.on('drain', () => this.emit('drain'));
    stream.on('error', (err: NodeJS.ErrnoException) => this.onStreamError(err));
    stream.on('close', () => this.onClose());
    this.on('newListener', (event: string) => {
      // The listener is added after this event returns: hand it the waiting packets just after.
      if (event === 'data' && this.inbox.packets.length > 0) queueMicrotask(() => this.continueReading());
    });
  }

  /** Whether this call runs on `session`. */
  isOn(session: http2.ClientHttp2Session): boolean {
    return this.session === session;
  }

  get writableEnded(): boolean {
    return this.stream?.writableEnded ?? true;
  }

  /** Bytes written to the stream and not yet sent. */
  get writableLength(): number {
    return this.stream?.writableLength ?? 0;
  }

  get writableNeedDrain(): boolean {
    return this.stream?.writableNeedDrain ?? false;
  }

  write(p: Packet, callback?: (err?: Error | null) => void): boolean {
    const s = this.stream;
    switch (this.state) {
      case 'open':
      case 'streaming':
        if (s && !s.destroyed && !s.writableEnded) return writeGrpcMessage(s, p, callback);
        break;
      default:
        break; // the call is over (or never started)
    }
    if (callback) process.nextTick(callback, new Error('call ended'));
    return false;
  }

  /** Half-closes our side (END_STREAM). */
  end(): void {
    const s = this.stream;
    switch (this.state) {
      case 'failing':
      case 'closing':
      case 'closed':
        return; // no stream, or gone
      default:
        if (s && !s.destroyed && !s.writableEnded) s.end();
    }
  }

  /**
   * Abandons the call: RST_STREAM CANCEL, reported as CANCELLED. After the server's status the call is
   * complete, not cancelled: our side is ended (END_STREAM) if it was still open, which is all it needs.
   * (A reset there once sent a Node 20 HTTP/2 session on native TLS into an endless send loop in a full
   * suite run; not reproduced in isolation on Node 20 or 24, and our sessions no longer run on native TLS.)
   */
  cancel(): void {
    const s = this.stream;
    switch (this.state) {
      case 'failing':
        this.inbox.clear();
        this.deliver({ code: GrpcStatus.CANCELLED, details: 'Cancelled on client', metadata: {} }, 'finished');
        return;
      case 'open':
      case 'streaming':
        if (s && !s.destroyed) s.close(NGHTTP2_CANCEL);
        this.inbox.clear();
        this.deliver({ code: GrpcStatus.CANCELLED, details: 'Cancelled on client', metadata: {} }, 'finished');
        return;
      case 'ending':
        this.endOurSide();
        this.inbox.clear();
        this.deliver(this.status!, 'finished');
        return;
      case 'closing':
        this.inbox.clear();
        this.deliver(this.status!, 'closed');
        return;
      case 'finished':
        this.endOurSide();
        return;
      case 'closed':
        return;
    }
  }

  pause(): this {
    this.inbox.pause();
    this.stream?.pause();
    return this;
  }

  resume(): this {
    this.inbox.resume();
    this.continueReading();
    return this;
  }

  private continueReading(): void {
    this.flush();
    if (this.inbox.state === 'flowing' && this.inbox.packets.length === 0) this.stream?.resume();
  }

  /** The call never had a stream (next tick after it was made): it reports the status and is closed. */
  private fail(code: number, details: string): void {
    switch (this.state) {
      case 'failing':
        this.deliver({ code, details, metadata: {} }, 'closed');
        return;
      case 'finished':
        this.enterClosed(); // cancelled first: the status is out
        return;
      default:
        return; // only a call without a stream fails this way
    }
  }

  private onResponse(headers: http2.IncomingHttpHeaders & http2.IncomingHttpStatusHeader): void {
    switch (this.state) {
      case 'open':
        break;
      default:
        return; // one response per stream; cancelled before it came: ignored
    }
    const httpStatus = Number(headers[':status']);
    if (headers['grpc-status'] !== undefined) {
      // Trailers-only: the status came with the headers (no transition: END_STREAM or the close delivers it).
      this.trailers = statusFrom(headers);
      return;
    }
    if (httpStatus !== 200) {
      this.state = 'ending';
      this.status = { code: grpcStatusFromHttp(httpStatus), details: `Received HTTP status code ${httpStatus}`, metadata: {} };
      this.stream!.close(NGHTTP2_CANCEL);
      return;
    }
    const contentType = String(headers['content-type'] ?? '');
    if (!contentType.startsWith('application/grpc')) {
      this.state = 'ending';
      this.status = { code: GrpcStatus.UNKNOWN, details: `unexpected content-type "${contentType}"`, metadata: {} };
      this.stream!.close(NGHTTP2_CANCEL);
      return;
    }
    this.state = 'streaming';
    this.emit('metadata', metadataFrom(headers));
  }

  private onTrailers(headers: http2.IncomingHttpHeaders): void {
    switch (this.state) {
      case 'open':
      case 'streaming':
        this.trailers = statusFrom(headers);
        return;
      default:
        return; // the status is settled already
    }
  }

  private onData(chunk: Buffer): void {
    switch (this.state) {
      case 'open': // (HTTP/2 delivers the headers first)
      case 'streaming':
        break;
      default:
        return; // after the status, or cancelled: dropped
    }
    try {
      this.reader.push(chunk, this.inbox.packets);
    } catch (err) {
      const e = err as GrpcFramingError;
      this.state = 'ending';
      this.status = { code: e.code, details: e.message, metadata: {} };
      this.reader.clear();
      this.stream!.close(NGHTTP2_CANCEL);
      return;
    }
    this.flush();
  }

  /** The server's END_STREAM: with trailers, the status; without, 'close' decides (a dying connection ends streams too). */
  private onEnd(): void {
    switch (this.state) {
      case 'open':
      case 'streaming':
        if (!this.trailers) return;
        this.state = 'ending';
        this.status = this.trailers;
        this.flush();
        return;
      default:
        return; // the status is known already
    }
  }

  private onStreamError(err: NodeJS.ErrnoException): void {
    switch (this.state) {
      case 'open':
      case 'streaming':
        // A stream-level reset (the peer's RST_STREAM) is mapped from its code on 'close'; anything
        // else (refused, TLS, the session destroyed) means the connection failed.
        if (err.code !== 'ERR_HTTP2_STREAM_ERROR') this.streamError ??= err.message;
        return;
      default:
        return; // the status is known already; 'close' follows
    }
  }

  private onClose(): void {
    switch (this.state) {
      case 'open':
      case 'streaming':
        this.state = 'closing';
        this.status = this.statusAtClose();
        this.flush();
        return;
      case 'ending':
        this.state = 'closing';
        this.flush();
        return;
      case 'finished':
        this.enterClosed();
        return;
      default:
        return; // a stream closes once
    }
  }

  /** The status of a stream that closed before it had one. */
  private statusAtClose(): GrpcCallStatus {
    const stream = this.stream!;
    const code = stream.rstCode;
    const sessionGone = this.session?.destroyed ?? true;
    if (this.trailers) return this.trailers;
    if (this.streamError !== null || sessionGone) {
      // The connection failed or closed (refused, TLS, the server gone, a ping timeout).
      return { code: GrpcStatus.UNAVAILABLE, details: this.streamError ?? 'connection closed', metadata: {} };
    }
    if (stream.readableEnded) {
      return this.reader.pending > 0
        ? { code: GrpcStatus.INTERNAL, details: 'stream ended inside a message', metadata: {} }
        : { code: GrpcStatus.UNKNOWN, details: 'server ended the stream without a status', metadata: {} };
    }
    return { code: rstStatus(code), details: `Received RST_STREAM with code ${code ?? 'unknown'}`, metadata: {} };
  }

  /** Hands queued packets to the reader while it is not paused, then the status once all are out. */
  private flush(): void {
    // Packets wait for a reader (and reading stops): an agent listens a few ticks after the response
    // headers, and the hub may send a packet right behind them (a dial that waited for this agent).
    if (this.inbox.packets.length > 0 && this.listenerCount('data') === 0) {
      this.stream?.pause();
      return;
    }
    if (!this.inbox.drain(this.emitPacket)) return;
    switch (this.state) {
      case 'ending':
        // Trailers come with END_STREAM; after an error the stream's close ends the input.
        if (this.stream!.readableEnded) this.deliver(this.status!, 'finished');
        return;
      case 'closing':
        this.deliver(this.status!, 'closed');
        return;
      default:
        return; // no status yet, or delivered
    }
  }

  private readonly emitPacket = (m: Packet | DataViews): void => deliverMessage(m, this.dataViews, this.emitData);
  private readonly emitData = (p: Packet): void => {
    this.emit('data', p);
  };

  private dataViews: DataViewHandler | null = null;

  /**
   * DATA messages then go to `handler`, their payload as the HTTP/2 chunks it arrived in, instead of to
   * 'data' copied into one Buffer (as FramedPacketStream.onDataViews); null: as packets again.
   */
  onDataViews(handler: DataViewHandler | null): void {
    this.dataViews = handler;
    this.reader.views = handler !== null;
  }

  /** Reports the status: 'end' or 'error', then 'status', then 'close' if the stream is gone. */
  private deliver(status: GrpcCallStatus, next: 'finished' | 'closed'): void {
    this.state = next;
    this.status = status;
    if (status.code === GrpcStatus.OK) this.emit('end');
    else if (this.listenerCount('error') > 0) this.emit('error', new GrpcCallError(status.code, status.details));
    this.emit('status', status);
    if (next === 'closed') this.emit('close');
  }

  /** The status was delivered before; now the stream is gone too. */
  private enterClosed(): void {
    this.state = 'closed';
    this.emit('close');
  }

  /** After the status our side only needs ending (END_STREAM), not a reset. */
  private endOurSide(): void {
    const s = this.stream;
    if (s && !s.destroyed && !s.writableEnded) s.end();
  }
}

function rstStatus(code: number | undefined): number {
  switch (code) {
    case NGHTTP2_REFUSED_STREAM:
      return GrpcStatus.UNAVAILABLE;
    case NGHTTP2_CANCEL:
      return GrpcStatus.CANCELLED;
    case NGHTTP2_ENHANCE_YOUR_CALM:
      return GrpcStatus.RESOURCE_EXHAUSTED;
    case NGHTTP2_INADEQUATE_SECURITY:
      return GrpcStatus.PERMISSION_DENIED;
    default:
      return GrpcStatus.INTERNAL;
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
