// One client-side gRPC bidi call on node:http2 (GrpcClientCall, made by GrpcClient in grpc-client.ts),
// the packets it decoded for its reader (Inbox), and the mapping of HTTP/2 headers and resets to gRPC
// statuses and metadata.
//
// One call, states:
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

const { NGHTTP2_CANCEL, NGHTTP2_REFUSED_STREAM, NGHTTP2_ENHANCE_YOUR_CALM, NGHTTP2_INADEQUATE_SECURITY } = http2.constants;

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

/** The call a stream carries. */
const kCall = Symbol('grpcClientCall');
type CallStream = http2.ClientHttp2Stream & { [kCall]?: GrpcClientCall };

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
      // A header array: node:http2 copies a header object into one of its own (and keeps it).
      const headers = [
        ':method',
        'POST',
        ':path',
        path,
        'content-type',
        'application/grpc',
        'te',
        'trailers',
        'user-agent',
        'cluster-proxy',
        'grpc-accept-encoding',
        'identity',
      ];
      for (const k in metadata) headers.push(k, metadata[k]!);
      stream = requestWithHeaderList(session, headers);
    } catch (err) {
      this.state = 'failing';
      this.stream = null;
      process.nextTick(() => this.fail(GrpcStatus.UNAVAILABLE, (err as Error).message));
      return;
    }
    this.state = 'open';
    this.stream = stream;
    (stream as CallStream)[kCall] = this;
    stream.on('response', GrpcClientCall.onStreamResponse);
    stream.on('trailers', GrpcClientCall.onStreamTrailers);
    stream.on('data', GrpcClientCall.onStreamData);
    stream.on('end', GrpcClientCall.onStreamEnd);
    stream.on('drain', GrpcClientCall.onStreamDrain);
    stream.on('error', GrpcClientCall.onStreamError);
    stream.on('close', GrpcClientCall.onStreamClose);
  }

  // The stream's listeners (shared, not closures per call): `this` is the stream.
  private static onStreamResponse(this: CallStream, headers: http2.IncomingHttpHeaders & http2.IncomingHttpStatusHeader): void {
    this[kCall]!.onResponse(headers);
  }

  private static onStreamTrailers(this: CallStream, headers: http2.IncomingHttpHeaders): void {
    this[kCall]!.onTrailers(headers);
  }

  private static onStreamData(this: CallStream, chunk: Buffer): void {
    this[kCall]!.onData(chunk);
  }

  private static onStreamEnd(this: CallStream): void {
    this[kCall]!.onEnd();
  }

  private static onStreamDrain(this: CallStream): void {
    this[kCall]!.emit('drain');
  }

  private static onStreamError(this: CallStream, err: NodeJS.ErrnoException): void {
    this[kCall]!.onStreamError(err);
  }

  private static onStreamClose(this: CallStream): void {
    this[kCall]!.onClose();
  }

  /** Set while packets wait for a 'data' listener (see flush). */
  private onNewListener: ((event: string | symbol) => void) | null = null;

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
      if (!this.onNewListener) {
        // The listener is added after this event returns: hand it the waiting packets just after.
        const hook = (event: string | symbol): void => {
          if (event !== 'data') return;
          this.off('newListener', hook);
          this.onNewListener = null;
          queueMicrotask(() => this.continueReading());
        };
        this.onNewListener = hook;
        this.on('newListener', hook);
      }
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

  private readonly emitPacket = (m: Packet | DataViews): void => deliverMessage(m, this.dataViews, this);

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
  // for-in (node:http2's header objects have no prototype): no entry arrays per response.
  for (const k in headers) {
    const v = headers[k];
    if (k.startsWith(':') || k === 'content-type' || k === 'grpc-status' || k === 'grpc-message' || v === undefined) continue;
    md[k] = Array.isArray(v) ? v : [String(v)];
  }
  return md;
}

/** Whether node:http2 takes a header array (Node 24 and 22.17 do; older ones take only an object: an SDK
 * embedded in an application on Node 20 or an older 22). */
let headerArrays = true;

/** session.request() with headers as a flat [name, value, ...] array, or as an object where Node wants one. */
export function requestWithHeaderList(session: Pick<http2.ClientHttp2Session, 'request'>, headers: string[]): http2.ClientHttp2Stream {
  if (headerArrays) {
    try {
      return session.request(headers as unknown as http2.OutgoingHttpHeaders);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ERR_INVALID_ARG_TYPE') throw err;
      headerArrays = false;
    }
  }
  const object: http2.OutgoingHttpHeaders = {};
  for (let i = 0; i < headers.length; i += 2) object[headers[i]!] = headers[i + 1]!;
  return session.request(object);
}
