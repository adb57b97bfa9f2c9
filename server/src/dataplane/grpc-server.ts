// gRPC bidi streams served on our own HTTP/2 session (ProxyService.Proxy and AgentService.Connect:
// proto's h2/session.ts, on the TLS socket itself), with gRPC's length-prefixed framing around our
// packet codec: no per-message promise/metadata machinery, and HTTP/2 windows we choose. It serves
// what an unmodified konnectivity-client or ANP agent needs: POST with content-type application/grpc,
// response headers (our metadata such as serverID/serverCount), `grpc-status`/`grpc-message` trailers
// (trailers-only for early refusals), `grpc-timeout`, message size limits, pings (answered by HTTP/2;
// session-watchdog.ts sends ours).
//
// A call's states are GrpcServerCall's (below).
import type { KeyObject } from 'node:crypto';
import { EventEmitter } from 'node:events';
import net from 'node:net';
import type { PeerCertificate, TLSSocket } from 'node:tls';
import {
  DataViews,
  GrpcMessageReader,
  GrpcStatus,
  H2Error,
  H2Session,
  PacketType,
  packets,
  encodeGrpcMessage,
  encodeHeaderBlock,
  grpcDataParts,
  grpcMessageParts,
  linkIdentityKey,
  parseGrpcTimeout,
  watchSession,
  type DataViewHandler,
  type GrpcFramingError,
  type GrpcMessageParts,
  type H2Headers,
  type H2Stream,
  type H2StreamHandler,
  type HeaderField,
  type Packet,
  type WatchdogOptions,
} from '@cluster-proxy/proto';
import { SessionWindow, type SessionWindowOptions } from './session-window.js';

export { GrpcStatus };

/** The status a call is ended with. */
export interface GrpcStatusError {
  code: number;
  details: string;
}

/** Each connection's client certificate, once read (keyed by the session's socket; dropped with it). */
const peerCertificates = new WeakMap<object, PeerCertificate | undefined>();

/**
 * One gRPC bidi call on the server: the events and methods our handlers use (the shape grpc-js's
 * ServerDuplexStream has, so the handlers read the same): 'data' (a Packet), 'end' (the client
 * half-closed), 'cancelled' (it reset the stream or its deadline passed), 'error' ({code, details}:
 * a message we could not take), 'drain'.
 *
 * States (GrpcServerCallState):
 *   open        request headers taken; no response headers yet (a status would go out trailers-only)
 *   responding  our response headers are out: messages flow both ways
 *   ended       our status is out (trailers, or trailers-only); writes are refused, the client's
 *               messages are still read
 *   reset       ended, and the client's side was still open a while after our status: we reset the
 *               stream (RST_STREAM NO_ERROR, as gRPC servers do); a reset code on its close is ours
 *   closed      the stream is gone after our status
 *   cancelled   'cancelled' emitted: the client reset the stream, its deadline passed, or the stream
 *               went before our status (then we reset it, CANCEL); nothing more is read
 *
 *   open ──sendMetadata (or the first write)──▶ responding
 *   open, responding ──endWithStatus──▶ ended ──status out, the stream still open after RESET_GRACE_MS──▶ reset ──stream closed──▶ closed
 *   ended ──stream closed──▶ closed;   ended ──the client's reset──▶ cancelled
 *   closed ──the client's reset, crossing our status (a reset code other than NO_ERROR)──▶ cancelled
 *   open, responding ──the client's reset, a stream error, the stream closed──▶ cancelled
 *   open, responding, ended, reset ──deadline (DEADLINE_EXCEEDED first, if no status yet)──▶ cancelled
 * The deadline's timer stops on entering closed or cancelled. Whether the handler reads (flowing or
 * paused) is its own state, apart from the call's.
 */
export type GrpcServerCallState = 'open' | 'responding' | 'ended' | 'reset' | 'closed' | 'cancelled';

/** Response headers without metadata, encoded once. */
const RESPONSE_FIELDS: readonly HeaderField[] = [
  [':status', '200'],
  ['content-type', 'application/grpc'],
  ['grpc-accept-encoding', 'identity'],
];
const RESPONSE_BLOCK = encodeHeaderBlock(RESPONSE_FIELDS);
/** Trailers of a call that ended OK, encoded once. */
const OK_TRAILERS = encodeHeaderBlock([['grpc-status', '0']]);
/** The answer to a request that is not gRPC (no body: the status says it). */
const NOT_GRPC_BLOCK = encodeHeaderBlock([
  [':status', '415'],
  ['content-type', 'text/plain'],
]);

/** A client's side still open this long after our status is reset (see GrpcServerCall.closeAfterStatus). */
const RESET_GRACE_MS = 1000;

/**
 * Takes a call's events in place of its listeners ('data', 'end', 'cancelled', 'error'): a handler
 * holding many idle calls needs no closures per call for them (GrpcServerCall.setHandler).
 */
export interface GrpcCallHandler {
  onCallPacket(p: Packet): void;
  onCallEnd(): void;
  onCallCancelled(): void;
  onCallError(err: Error & GrpcStatusError): void;
}

/** The server a call belongs to. */
interface CallOwner {
  /** Our status is out: the stream is to be reset if the client's side is still open a while later. */
  statusSent(call: GrpcServerCall): void;
  /** The stream has closed. */
  streamClosed(call: GrpcServerCall): void;
}

export class GrpcServerCall extends EventEmitter implements H2StreamHandler {
  private state: GrpcServerCallState = 'open';
  /** The handler's reads: messages parsed while paused wait in `queue`. */
  private reading: 'flowing' | 'paused' = 'flowing';
  private readonly reader: GrpcMessageReader;
  /** Told what the call read and when it stopped reading (the session's window grows from that). */
  flow: Pick<SessionWindow, 'consumed' | 'paused' | 'streamClosed'> | undefined;
  /** Told when the stream has closed. */
  owner: CallOwner | undefined;
  /** Messages parsed while the handler is paused (DataViews: DATA for onDataViews' handler); made on first use. */
  private queue: (Packet | DataViews)[] | null = null;
  private dataViews: DataViewHandler | null = null;
  private deadline: NodeJS.Timeout | null = null;
  /** Metadata for the response headers sent with the first message (sendMetadataWithFirstMessage). */
  private firstMessageMetadata: Record<string, string> | undefined = undefined;
  /** Takes the events instead of listeners, while set. */
  private handler: GrpcCallHandler | null = null;
  /** The request headers, until the handler has run (see metadata). */
  private headers: H2Headers | null;

  constructor(
    private readonly stream: H2Stream,
    headers: H2Headers,
    private readonly socket: net.Socket | undefined,
    maxMessageBytes: number,
  ) {
    super();
    this.headers = headers;
    this.reader = new GrpcMessageReader(maxMessageBytes);
    stream.handler = this;
    const timeout = parseGrpcTimeout(headers['grpc-timeout']);
    if (timeout !== null) this.deadline = setTimeout(GrpcServerCall.onDeadline, Math.max(1, Math.ceil(timeout)), this);
  }

  // ------------------------------------------------------------ the stream's events (H2StreamHandler)

  onStreamData(chunk: Buffer): void {
    this.onData(chunk);
  }

  onStreamEnd(): void {
    if (this.state === 'cancelled') return;
    if (this.handler) this.handler.onCallEnd();
    else this.emit('end');
  }

  onStreamDrain(): void {
    this.emit('drain');
  }

  onStreamClose(): void {
    this.onClose();
    this.owner?.streamClosed(this);
  }

  /** The client reset the stream right after it closed (its reset crossed our status): it abandoned the call. */
  onStreamResetAfterClose(code: number): void {
    if (this.state !== 'closed' || code === H2Error.NO_ERROR) return;
    this.setState('cancelled');
    if (this.handler) this.handler.onCallCancelled();
    else this.emit('cancelled');
  }

  private static onDeadline(call: GrpcServerCall): void {
    call.deadline = null;
    call.endWithStatus(GrpcStatus.DEADLINE_EXCEEDED, 'Deadline exceeded');
    call.cancel();
  }

  /** Torn down before we sent our status (the session died), or reset by the client at any time (also after our status: it abandoned the call rather than finishing it). */
  private onClose(): void {
    const code = this.stream.rstCode;
    switch (this.state) {
      case 'open':
      case 'responding':
        return this.cancel();
      case 'ended':
        if (code !== undefined && code !== H2Error.NO_ERROR) return this.cancel();
        return this.setState('closed');
      case 'reset':
        return this.setState('closed');
      default:
        return; // cancelled already
    }
  }

  /**
   * Request metadata: the request headers, lower-cased as HTTP/2 carries them. Readable while the
   * handler runs: the server drops them after it (an idle call keeps no copy of its headers).
   */
  get metadata(): { get(key: string): string[] } {
    const headers = this.headers;
    if (!headers) throw new Error('request metadata is read while the handler runs');
    return {
      get: (key: string): string[] => {
        const v = headers[key.toLowerCase()];
        return v === undefined ? [] : [v];
      },
    };
  }

  /** The handler has run: the request headers are no longer needed. */
  dropRequestHeaders(): void {
    this.headers = null;
  }

  get writableEnded(): boolean {
    return this.statusSettled;
  }

  /** Our status is out, or the call was cancelled: no more writes. */
  private get statusSettled(): boolean {
    return this.state !== 'open' && this.state !== 'responding';
  }

  /** The one place the state changes; entering closed or cancelled stops the deadline. */
  private setState(next: GrpcServerCallState): void {
    this.state = next;
    if ((next === 'closed' || next === 'cancelled') && this.deadline) {
      clearTimeout(this.deadline);
      this.deadline = null;
    }
  }

  /** Bytes written to the stream and not yet sent (HTTP/2 flow control holds them back too). */
  get writableLength(): number {
    return this.stream.writableLength;
  }

  /** Client bytes the call holds that its handler has not taken: Node's buffer of the paused stream, a message not complete yet, messages parsed while paused. */
  get heldBytes(): number {
    let queued = 0;
    for (const p of this.queue ?? []) {
      if (p instanceof DataViews) queued += p.length;
      else if (p.type === PacketType.DATA) queued += p.data.data.length;
    }
    return this.stream.readableLength + this.reader.pending + queued;
  }

  getPeer(): string {
    return this.socket?.remoteAddress ? `${this.socket.remoteAddress}:${this.socket.remotePort}` : 'unix';
  }

  /**
   * The client's verified certificate (TLS ports), or undefined (the Unix socket). Read once per
   * connection: getPeerCertificate() builds a new object each time (10 % of the hub's time on gRPC dials).
   */
  peerCertificate(): PeerCertificate | undefined {
    const s = this.socket as TLSSocket | undefined;
    if (!s || typeof s.getPeerCertificate !== 'function') return undefined;
    if (peerCertificates.has(s)) return peerCertificates.get(s);
    const got = s.getPeerCertificate();
    const cert = got && Object.keys(got).length > 0 ? got : undefined;
    peerCertificates.set(s, cert);
    return cert;
  }

  /** The key this connection's TLS session gives the gateway's identity MAC (proto linkIdentityKey), or null (the Unix socket). */
  identityKey(): KeyObject | null {
    const s = this.socket as TLSSocket | undefined;
    return s && typeof s.exportKeyingMaterial === 'function' ? linkIdentityKey(s) : null;
  }

  /**
   * Our metadata goes with the response headers ahead of the first message (as grpc-go servers send
   * them): headers and message leave in one write instead of two. Dropped if the call ends without a
   * message (its status then goes trailers-only).
   */
  sendMetadataWithFirstMessage(md: Record<string, string> | undefined): void {
    this.firstMessageMetadata = md;
  }

  /** Sends the response headers with our metadata (once; later calls are ignored). */
  sendMetadata(md?: Record<string, string>): void {
    if (this.stream.destroyed || this.stream.headersSent) return;
    let block = RESPONSE_BLOCK;
    if (md) {
      const keys = Object.keys(md);
      if (keys.length > 0) block = encodeHeaderBlock([...RESPONSE_FIELDS, ...keys.map((k): HeaderField => [k.toLowerCase(), md[k]!])]);
    }
    this.stream.respond(block, false);
    if (this.state === 'open') this.setState('responding');
  }

  write(p: Packet, callback?: (err?: Error | null) => void): boolean {
    return this.writable(callback) && this.send(grpcMessageParts(p), callback);
  }

  /** Writes a DATA packet whose payload is `chunks` (`length` bytes) without copying them into one Buffer. */
  writeData(connectID: number, chunks: readonly Buffer[], length: number, callback?: (err?: Error | null) => void): boolean {
    return this.writable(callback) && this.send(grpcDataParts(connectID, chunks, length), callback);
  }

  private send(message: GrpcMessageParts, callback?: (err?: Error | null) => void): boolean {
    return this.stream.write(message.parts, message.length, callback);
  }

  /** Whether a message may still be written (our headers go first); if not, `callback` hears why. */
  private writable(callback?: (err?: Error | null) => void): boolean {
    if (this.statusSettled || this.stream.destroyed) {
      if (callback) process.nextTick(callback, new Error('call ended'));
      return false;
    }
    if (!this.stream.headersSent) this.sendMetadata(this.firstMessageMetadata);
    return true;
  }

  /**
   * DATA messages then go to `handler`, their payload as the HTTP/2 chunks it arrived in, instead of to
   * 'data' copied into one Buffer (as FramedPacketStream.onDataViews); null: as packets again.
   */
  onDataViews(handler: DataViewHandler | null): void {
    this.dataViews = handler;
    this.reader.views = handler !== null;
  }

  /** Hands 'data', 'end', 'cancelled' and 'error' to `handler` instead of the listeners (null: to the listeners again). */
  setHandler(handler: GrpcCallHandler | null): void {
    this.handler = handler;
  }

  /** Ends the call with status OK. */
  end(): void {
    this.endWithStatus(GrpcStatus.OK, '');
  }

  /** Ends the call with this status (trailers, or a trailers-only response if no headers went out). */
  endWithStatus(code: number, details: string): void {
    if (this.statusSettled) return;
    this.setState('ended');
    if (this.stream.destroyed) return;
    const status: HeaderField[] = [['grpc-status', String(code)]];
    if (details) status.push(['grpc-message', encodeGrpcMessage(details)]);
    if (!this.stream.headersSent) {
      this.stream.respond(encodeHeaderBlock([[':status', '200'], ['content-type', 'application/grpc'], ...status]), true);
      this.closeAfterStatus();
    } else {
      // The trailers follow what is queued; the reset that may follow them waits until they are out.
      this.stream.sendTrailers(code === GrpcStatus.OK && !details ? OK_TRAILERS : encodeHeaderBlock(status));
    }
  }

  onStreamTrailersSent(): void {
    this.closeAfterStatus();
  }

  /**
   * Our status is out; the client may still be sending. A gRPC client ends its side when it reads the
   * status (ours with END_STREAM, grpc-go's with RST_STREAM), and the stream closes. One that does not
   * has the stream reset (RST_STREAM NO_ERROR, as gRPC servers do) by its owner a little later
   * (GrpcServer's RESET_GRACE_MS), so neither side waits on the other for good: a reset right behind
   * every status would cost each call one more frame and a write of its own. Only once the trailers
   * are on the socket: a reset must not overtake them.
   */
  private closeAfterStatus(): void {
    if (this.owner) this.owner.statusSent(this);
    else setImmediate(GrpcServerCall.resetAfterStatus, this);
  }

  private static resetAfterStatus(call: GrpcServerCall): void {
    call.resetIfOpen();
  }

  /** Resets the stream (RST_STREAM NO_ERROR) if the client's side is still open after our status. */
  resetIfOpen(): void {
    if (this.stream.destroyed || this.stream.readableEnded) return;
    if (this.state === 'ended') this.setState('reset');
    this.stream.close(H2Error.NO_ERROR);
  }

  /** Whether the handler paused the call (its reads stop). */
  get isPaused(): boolean {
    return this.reading === 'paused';
  }

  pause(): this {
    if (this.reading === 'flowing') this.flow?.paused();
    this.reading = 'paused';
    this.stream.pause();
    return this;
  }

  resume(): this {
    this.reading = 'flowing';
    this.flush();
    if (this.reading === 'flowing') this.stream.resume();
    return this;
  }

  private cancel(): void {
    if (this.state === 'cancelled') return;
    const hadStatus = this.statusSettled;
    this.setState('cancelled');
    if (!hadStatus && !this.stream.destroyed) this.stream.close(H2Error.CANCEL);
    if (this.handler) this.handler.onCallCancelled();
    else this.emit('cancelled');
  }

  private onData(chunk: Buffer): void {
    if (this.state === 'cancelled') return;
    this.flow?.consumed(chunk.length);
    try {
      this.reader.push(chunk, (this.queue ??= []));
    } catch (err) {
      const e = err as GrpcFramingError;
      return this.refuse(e.code, e.message);
    }
    this.flush();
  }

  /** Hands parsed messages to the handler while it is not paused. */
  private flush(): void {
    const queue = this.queue;
    if (!queue) return;
    while (this.reading === 'flowing' && queue.length > 0 && this.state !== 'cancelled') this.deliver(queue.shift()!);
  }

  /** A message to the handler: DataViews to onDataViews' handler (copied into one DATA packet if it went meanwhile), packets to the handler or 'data'. */
  private deliver(m: Packet | DataViews): void {
    let p: Packet;
    if (m instanceof DataViews) {
      if (this.dataViews) return this.dataViews(m.connectID, m.chunks, m.length);
      p = packets.data(m.connectID, Buffer.concat(m.chunks, m.length));
    } else p = m;
    if (this.handler) this.handler.onCallPacket(p);
    else this.emit('data', p);
  }

  private refuse(code: number, details: string): void {
    this.reader.clear();
    if (this.queue) this.queue.length = 0;
    this.stream.pause();
    // Our status first: the handler's reaction to the error may end the call too.
    this.endWithStatus(code, details);
    const err = Object.assign(new Error(details), { code, details });
    if (this.handler) this.handler.onCallError(err);
    else if (this.listenerCount('error') > 0) this.emit('error', err);
  }
}

export type GrpcHandler = (call: GrpcServerCall) => void;

export interface GrpcServerOptions {
  /** HTTP/2 stream receive window we announce (SETTINGS_INITIAL_WINDOW_SIZE). */
  streamWindow: number;
  /** Connection receive window per session. */
  connectionWindow: number;
  /** Lets a session with one stream grow its stream window from a budget (session-window.ts); fixed without. */
  sessionWindow?: Omit<SessionWindowOptions, 'initial'>;
  maxMessageBytes: number;
  watchdog: WatchdogOptions;
  /** SETTINGS_MAX_CONCURRENT_STREAMS: streams one session may have open at once. */
  maxConcurrentStreams: number;
  /** What a session's socket may hold unsent before its streams wait (H2SessionOptions.socketHighWater). */
  socketHighWater?: number;
}

/** The gRPC services of one listener (agent or frontend), fed with connections from a TlsPort or a Unix socket. */
export class GrpcServer {
  private readonly handlers = new Map<string, GrpcHandler>();
  private readonly sessions = new Set<H2Session>();
  private readonly calls = new Set<GrpcServerCall>();
  private readonly sessionWindows = new WeakMap<H2Session, SessionWindow>();
  /** Waiting for the last call to end (shutdown). */
  private readonly callsDone = new Set<() => void>();
  private readonly listeners: net.Server[] = [];

  constructor(private readonly opts: GrpcServerOptions) {}

  /** Serves `path` (e.g. `/ProxyService/Proxy`) with `handler`. */
  handle(path: string, handler: GrpcHandler): void {
    this.handlers.set(path, handler);
  }

  /** A connection that already negotiated "h2" (TLS terminated and the client verified by the caller). */
  injectConnection(socket: TLSSocket): void {
    this.serve(socket);
  }

  /** Also serves plain HTTP/2 on a Unix socket. */
  listenUnix(path: string): Promise<void> {
    const server = net.createServer((socket) => this.serve(socket));
    this.listeners.push(server);
    return new Promise((resolve, reject) => {
      server.once('error', (err) => reject(new Error(`cannot listen on unix://${path}: ${err.message}`)));
      server.listen(path, () => resolve());
    });
  }

  /** Open calls (for shutdown). */
  get openCalls(): number {
    return this.calls.size;
  }

  /**
   * Stops listening and asks every session to finish (GOAWAY): resolves once no call is open, then
   * closes the connections.
   */
  async shutdown(): Promise<void> {
    for (const l of this.listeners) l.close();
    for (const s of this.sessions) s.close();
    while (this.calls.size > 0) await new Promise<void>((resolve) => this.callsDone.add(resolve));
    for (const s of [...this.sessions]) s.destroy();
  }

  /** Ends every call and session now. */
  forceShutdown(): void {
    this.stopResetTimer();
    for (const c of [...this.calls]) c.endWithStatus(GrpcStatus.UNAVAILABLE, 'server shutting down');
    for (const s of [...this.sessions]) s.destroy();
    for (const l of this.listeners) l.close();
  }

  private serve(socket: net.Socket): void {
    socket.setNoDelay(true);
    const session = new H2Session(socket, {
      streamWindow: this.opts.streamWindow,
      connectionWindow: this.opts.connectionWindow,
      maxConcurrentStreams: this.opts.maxConcurrentStreams,
      socketHighWater: this.opts.socketHighWater,
    });
    this.sessions.add(session);
    session.once('close', () => this.sessions.delete(session));
    watchSession(session, this.opts.watchdog);
    if (this.opts.sessionWindow) {
      const window = new SessionWindow(session, { ...this.opts.sessionWindow, initial: this.opts.streamWindow });
      this.sessionWindows.set(session, window);
      session.once('close', () => window.close());
    }
    session.on('stream', (stream: H2Stream, headers: H2Headers) => this.onStream(session, stream, headers));
  }

  private onStream(session: H2Session, stream: H2Stream, headers: H2Headers): void {
    const contentType = headers['content-type'] ?? '';
    if (headers[':method'] !== 'POST' || !contentType.startsWith('application/grpc')) {
      stream.respond(NOT_GRPC_BLOCK, true);
      return;
    }
    const call = new GrpcServerCall(stream, headers, session.socket as net.Socket, this.opts.maxMessageBytes);
    const window = this.sessionWindows.get(session);
    if (window) {
      window.streamOpened();
      call.flow = window;
    }
    call.owner = this.callOwner;
    const handler = this.handlers.get(headers[':path'] ?? '');
    if (!handler) {
      call.endWithStatus(GrpcStatus.UNIMPLEMENTED, `unknown method ${headers[':path']}`);
      return;
    }
    const encoding = headers['grpc-encoding'];
    if (encoding !== undefined && encoding !== 'identity') {
      call.endWithStatus(GrpcStatus.UNIMPLEMENTED, `grpc-encoding ${encoding} is not supported`);
      return;
    }
    this.calls.add(call);
    handler(call);
    call.dropRequestHeaders();
  }

  /**
   * Calls whose status is out while the client's side was open, in two generations: each tick of
   * resetTimer resets what is still open in `older` (so 1–2 ticks after the status), then ages `newer`.
   */
  private resetsNewer = new Set<GrpcServerCall>();
  private resetsOlder = new Set<GrpcServerCall>();
  private resetTimer: NodeJS.Timeout | null = null;

  private readonly resetTick = (): void => {
    for (const call of this.resetsOlder) call.resetIfOpen();
    this.resetsOlder.clear();
    [this.resetsOlder, this.resetsNewer] = [this.resetsNewer, this.resetsOlder];
    if (this.resetsOlder.size === 0) this.stopResetTimer();
  };

  private stopResetTimer(): void {
    if (this.resetTimer) clearInterval(this.resetTimer);
    this.resetTimer = null;
  }

  /** Every call's owner: resets after the status, and once the stream closed, its session's window shrinks back and shutdown hears when the last call went. */
  private readonly callOwner = {
    statusSent: (call: GrpcServerCall): void => {
      this.resetsNewer.add(call);
      if (!this.resetTimer) {
        this.resetTimer = setInterval(this.resetTick, RESET_GRACE_MS / 2);
        this.resetTimer.unref();
      }
    },
    streamClosed: (call: GrpcServerCall): void => {
      this.resetsNewer.delete(call);
      this.resetsOlder.delete(call);
      call.flow?.streamClosed();
      if (!this.calls.delete(call) || this.calls.size > 0) return;
      for (const done of this.callsDone) done();
      this.callsDone.clear();
    },
  };
}
