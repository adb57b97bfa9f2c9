// gRPC bidi streams served directly on node:http2 (ProxyService.Proxy and AgentService.Connect), with
// gRPC's length-prefixed framing around our packet codec: no per-message promise/metadata machinery,
// and HTTP/2 windows we choose on the server side too. It serves what an unmodified konnectivity-client
// or ANP agent needs: POST with content-type application/grpc, response headers (our metadata such as
// serverID/serverCount), `grpc-status`/`grpc-message` trailers (trailers-only for early refusals),
// `grpc-timeout`, message size limits, pings (answered by HTTP/2; session-watchdog.ts sends ours).
//
// A call's life: open (headers not yet sent) → responding (headers sent) → ended (status sent, by us)
// or cancelled (the client reset the stream, or its deadline passed) → closed (the stream is gone).
import { EventEmitter } from 'node:events';
import http2 from 'node:http2';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import type { PeerCertificate, TLSSocket } from 'node:tls';
import {
  DataViews,
  GrpcMessageReader,
  GrpcStatus,
  PacketType,
  deliverMessage,
  encodeGrpcMessage,
  h2Socket,
  parseGrpcTimeout,
  watchSession,
  writeGrpcData,
  writeGrpcMessage,
  type DataViewHandler,
  type GrpcFramingError,
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

const { NGHTTP2_NO_ERROR, NGHTTP2_CANCEL } = http2.constants;

/** Each connection's client certificate, once read (keyed by the session's socket; dropped with it). */
const peerCertificates = new WeakMap<object, PeerCertificate | undefined>();

/**
 * One gRPC bidi call on the server: the events and methods our handlers use (the shape grpc-js's
 * ServerDuplexStream has, so the handlers read the same): 'data' (a Packet), 'end' (the client
 * half-closed), 'cancelled' (it reset the stream or its deadline passed), 'error' ({code, details}:
 * a message we could not take), 'drain'.
 */
export class GrpcServerCall extends EventEmitter {
  private ended = false;
  private cancelledFlag = false;
  /** We reset the stream (so a reset code on 'close' is ours, not the client's). */
  private resetByUs = false;
  private paused = false;
  private readonly reader: GrpcMessageReader;
  /** Told what the call read and when it stopped reading (the session's window grows from that). */
  flow: Pick<SessionWindow, 'consumed' | 'paused'> | undefined;
  /** Messages parsed while the handler is paused (DataViews: DATA for onDataViews' handler). */
  private readonly queue: (Packet | DataViews)[] = [];
  private dataViews: DataViewHandler | null = null;
  private deadline: NodeJS.Timeout | null = null;
  private status = { code: GrpcStatus.OK as number, details: '' };

  constructor(
    private readonly stream: http2.ServerHttp2Stream,
    private readonly headers: http2.IncomingHttpHeaders,
    private readonly socket: net.Socket | undefined,
    maxMessageBytes: number,
  ) {
    super();
    this.reader = new GrpcMessageReader(maxMessageBytes);
    stream.on('wantTrailers', () => {
      stream.sendTrailers({
        'grpc-status': String(this.status.code),
        ...(this.status.details ? { 'grpc-message': encodeGrpcMessage(this.status.details) } : {}),
      });
      this.closeAfterStatus();
    });
    stream.on('data', (chunk: Buffer) => this.onData(chunk));
    stream.on('end', () => {
      if (!this.cancelledFlag) this.emit('end');
    });
    stream.on('drain', () => this.emit('drain'));
    stream.on('aborted', () => this.cancel());
    stream.on('error', () => this.cancel());
    stream.on('close', () => {
      if (this.deadline) clearTimeout(this.deadline);
      this.deadline = null;
      // Torn down before we sent our status (the session died), or reset by the client at any time
      // (also after our status: it abandoned the call rather than finishing it).
      const code = stream.rstCode;
      const resetByClient = code !== undefined && code !== NGHTTP2_NO_ERROR && !this.resetByUs;
      if (!this.ended || resetByClient) this.cancel();
    });
    const timeout = parseGrpcTimeout(headers['grpc-timeout'] as string | undefined);
    if (timeout !== null) {
      this.deadline = setTimeout(
        () => {
          this.deadline = null;
          this.endWithStatus(GrpcStatus.DEADLINE_EXCEEDED, 'Deadline exceeded');
          this.cancel();
        },
        Math.max(1, Math.ceil(timeout)),
      );
    }
  }

  /** Request metadata: the request headers, lower-cased as HTTP/2 carries them. */
  readonly metadata = {
    get: (key: string): string[] => {
      const v = this.headers[key.toLowerCase()];
      return v === undefined ? [] : Array.isArray(v) ? v : [String(v)];
    },
  };

  get writableEnded(): boolean {
    return this.ended;
  }

  /** Bytes written to the stream and not yet sent (HTTP/2 flow control holds them back too). */
  get writableLength(): number {
    return this.stream.writableLength;
  }

  /** Client bytes the call holds that its handler has not taken: Node's buffer of the paused stream, a message not complete yet, messages parsed while paused. */
  get heldBytes(): number {
    let queued = 0;
    for (const p of this.queue) {
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

  /** Sends the response headers with our metadata (once; later calls are ignored). */
  sendMetadata(md: Record<string, string> = {}): void {
    if (this.stream.destroyed || this.stream.headersSent) return;
    this.stream.respond(
      { ':status': 200, 'content-type': 'application/grpc', 'grpc-accept-encoding': 'identity', ...md },
      { waitForTrailers: true },
    );
  }

  write(p: Packet, callback?: (err?: Error | null) => void): boolean {
    return this.writable(callback) && writeGrpcMessage(this.stream, p, callback);
  }

  /** Writes a DATA packet whose payload is `chunks` (`length` bytes) without copying them into one Buffer. */
  writeData(connectID: number, chunks: readonly Buffer[], length: number, callback?: (err?: Error | null) => void): boolean {
    return this.writable(callback) && writeGrpcData(this.stream, connectID, chunks, length, callback);
  }

  /** Whether a message may still be written (our headers go first); if not, `callback` hears why. */
  private writable(callback?: (err?: Error | null) => void): boolean {
    if (this.ended || this.stream.destroyed) {
      if (callback) process.nextTick(callback, new Error('call ended'));
      return false;
    }
    this.sendMetadata();
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

  /** Ends the call with status OK. */
  end(): void {
    this.endWithStatus(GrpcStatus.OK, '');
  }

  /** Ends the call with this status (trailers, or a trailers-only response if no headers went out). */
  endWithStatus(code: number, details: string): void {
    if (this.ended) return;
    this.ended = true;
    this.status = { code, details };
    if (this.stream.destroyed) return;
    if (!this.stream.headersSent) {
      this.stream.respond(
        {
          ':status': 200,
          'content-type': 'application/grpc',
          'grpc-status': String(code),
          ...(details ? { 'grpc-message': encodeGrpcMessage(details) } : {}),
        },
        { endStream: true },
      );
      this.closeAfterStatus();
    } else {
      this.stream.end(); // the trailers follow ('wantTrailers')
    }
  }

  /**
   * The client may still be sending: once our status is out, the stream ends (RST_STREAM NO_ERROR, as
   * gRPC servers do), so neither side waits on the other. Not on 'finish': that comes before Node
   * has sent the trailers, and the reset would overtake them.
   */
  private closeAfterStatus(): void {
    setImmediate(() => {
      if (this.stream.destroyed || this.stream.readableEnded) return;
      this.resetByUs = true;
      this.stream.close(NGHTTP2_NO_ERROR);
    });
  }

  /** Whether the handler paused the call (its reads stop). */
  get isPaused(): boolean {
    return this.paused;
  }

  pause(): this {
    if (!this.paused) this.flow?.paused();
    this.paused = true;
    this.stream.pause();
    return this;
  }

  resume(): this {
    this.paused = false;
    this.flush();
    if (!this.paused) this.stream.resume();
    return this;
  }

  private cancel(): void {
    if (this.cancelledFlag) return;
    this.cancelledFlag = true;
    if (!this.ended) {
      this.ended = true;
      this.resetByUs = true;
      if (!this.stream.destroyed) this.stream.close(NGHTTP2_CANCEL);
    }
    this.emit('cancelled');
  }

  private onData(chunk: Buffer): void {
    if (this.cancelledFlag) return;
    this.flow?.consumed(chunk.length);
    try {
      this.reader.push(chunk, this.queue);
    } catch (err) {
      const e = err as GrpcFramingError;
      return this.refuse(e.code, e.message);
    }
    this.flush();
  }

  /** Hands parsed messages to the handler while it is not paused. */
  private flush(): void {
    while (!this.paused && this.queue.length > 0 && !this.cancelledFlag) deliverMessage(this.queue.shift()!, this.dataViews, this.emitData);
  }

  private readonly emitData = (p: Packet): void => {
    this.emit('data', p);
  };

  private refuse(code: number, details: string): void {
    this.reader.clear();
    this.queue.length = 0;
    this.stream.pause();
    // Our status first: the handler's reaction to the error may end the call too.
    this.endWithStatus(code, details);
    if (this.listenerCount('error') > 0) this.emit('error', Object.assign(new Error(details), { code, details }));
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
}

/** The gRPC services of one listener (agent or frontend), fed with connections from a TlsPort or a Unix socket. */
export class GrpcServer {
  private readonly handlers = new Map<string, GrpcHandler>();
  private readonly sessions = new Set<http2.ServerHttp2Session>();
  /** Every connection handed to us, so shutdown can close them (see destroySockets). */
  private readonly sockets = new Set<Duplex>();
  /** The TLS socket under each injected session (h2Socket may give node:http2 a JS stream over it: see h2-transport.ts in proto). */
  private readonly tlsSockets = new WeakMap<http2.Http2Session, TLSSocket>();
  /** The TLS socket being injected, while node:http2 creates its session (synchronously). */
  private injecting: TLSSocket | undefined;
  private readonly calls = new Set<GrpcServerCall>();
  private readonly sessionWindows = new WeakMap<http2.Http2Session, SessionWindow>();
  /** Waiting for the last call to end (shutdown). */
  private readonly callsDone = new Set<() => void>();
  private readonly injector: http2.Http2Server;
  private readonly listeners: http2.Http2Server[] = [];

  constructor(private readonly opts: GrpcServerOptions) {
    this.injector = this.createH2();
  }

  /** Serves `path` (e.g. `/ProxyService/Proxy`) with `handler`. */
  handle(path: string, handler: GrpcHandler): void {
    this.handlers.set(path, handler);
  }

  /** A connection that already negotiated "h2" (TLS terminated and the client verified by the caller). */
  injectConnection(socket: TLSSocket): void {
    this.injecting = socket;
    try {
      this.injector.emit('connection', h2Socket(socket));
    } finally {
      this.injecting = undefined;
    }
  }

  /** Also serves plain HTTP/2 on a Unix socket. */
  listenUnix(path: string): Promise<void> {
    const h2 = this.createH2();
    this.listeners.push(h2);
    return new Promise((resolve, reject) => {
      h2.once('error', (err) => reject(new Error(`cannot listen on unix://${path}: ${err.message}`)));
      h2.listen(path, () => resolve());
    });
  }

  /** Open calls (for shutdown). */
  get openCalls(): number {
    return this.calls.size;
  }

  /**
   * Stops listening and asks every session to finish (GOAWAY): resolves once no call is open, then
   * closes the connections. (A session closed gracefully only half-closes its socket and waits for
   * the peer's FIN, which a client that closed its own session at the same moment may never send.)
   */
  async shutdown(): Promise<void> {
    for (const l of this.listeners) l.close();
    for (const s of this.sessions) {
      try {
        if (!s.closed && !s.destroyed) s.close();
      } catch {
        /* destroyed meanwhile */
      }
    }
    while (this.calls.size > 0) await new Promise<void>((resolve) => this.callsDone.add(resolve));
    this.destroySockets();
  }

  /** Ends every call and session now. */
  forceShutdown(): void {
    for (const c of [...this.calls]) c.endWithStatus(GrpcStatus.UNAVAILABLE, 'server shutting down');
    for (const s of [...this.sessions]) s.destroy();
    for (const l of this.listeners) l.close();
    this.destroySockets();
  }

  private destroySockets(): void {
    for (const s of this.sockets) s.destroy();
  }

  private createH2(): http2.Http2Server {
    const h2 = http2.createServer({
      settings: { initialWindowSize: this.opts.streamWindow, enablePush: false, maxConcurrentStreams: this.opts.maxConcurrentStreams },
      // Our frames are bounded by the message size; nghttp2's default session memory (10 MiB) would
      // refuse new streams on a busy agent session.
      maxSessionMemory: 64,
    });
    h2.on('connection', (socket: Duplex) => {
      (socket as net.Socket).setNoDelay?.(true);
      this.sockets.add(socket);
      socket.once('close', () => this.sockets.delete(socket));
    });
    h2.on('session', (session: http2.ServerHttp2Session) => {
      if (this.injecting) this.tlsSockets.set(session, this.injecting);
      this.sessions.add(session);
      session.once('close', () => this.sessions.delete(session));
      session.on('error', () => {}); // its calls report it
      try {
        session.setLocalWindowSize(this.opts.connectionWindow);
      } catch {
        /* closing already */
      }
      watchSession(session, this.opts.watchdog);
      if (this.opts.sessionWindow) {
        const window = new SessionWindow(session, { ...this.opts.sessionWindow, initial: this.opts.streamWindow });
        this.sessionWindows.set(session, window);
        session.once('close', () => window.close());
      }
    });
    h2.on('stream', (stream, headers) => this.onStream(stream, headers));
    return h2;
  }

  private onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    stream.on('error', () => {}); // the call reports it
    const contentType = String(headers['content-type'] ?? '');
    if (headers[':method'] !== 'POST' || !contentType.startsWith('application/grpc')) {
      stream.respond({ ':status': 415, 'content-type': 'text/plain' }, { endStream: false });
      stream.end('gRPC requests only (POST, content-type application/grpc)\n');
      return;
    }
    const session = stream.session;
    const socket = (session && this.tlsSockets.get(session)) ?? (session?.socket as net.Socket | undefined);
    const call = new GrpcServerCall(stream, headers, socket, this.opts.maxMessageBytes);
    const window = session && this.sessionWindows.get(session);
    if (window) {
      window.streamOpened();
      stream.once('close', () => window.streamClosed());
      call.flow = window;
    }
    const handler = this.handlers.get(String(headers[':path'] ?? ''));
    if (!handler) {
      call.endWithStatus(GrpcStatus.UNIMPLEMENTED, `unknown method ${String(headers[':path'])}`);
      return;
    }
    const encoding = headers['grpc-encoding'];
    if (encoding !== undefined && encoding !== 'identity') {
      call.endWithStatus(GrpcStatus.UNIMPLEMENTED, `grpc-encoding ${String(encoding)} is not supported`);
      return;
    }
    this.calls.add(call);
    stream.once('close', () => {
      this.calls.delete(call);
      if (this.calls.size > 0) return;
      for (const done of this.callsDone) done();
      this.callsDone.clear();
    });
    handler(call);
  }
}
