// The server side of one HTTP/2 connection (RFC 9113), written for the hub's gRPC services: what
// konnectivity-client, ANP's agent (both grpc-go) and our own gRPC ends send, and nothing a gRPC peer
// does not use (no push, no priorities). It replaces node:http2 on the hub, whose per-stream cost was
// most of a gRPC dial's on the hub (its Duplex streams, nghttp2's callbacks, a JS object per header
// set) and whose session, on a TLS socket whose write fails, stalled for good (see h2-transport.ts).
//
// Bytes: a DATA frame's payload reaches the stream's handler as views of the chunks the socket read
// (no copy); what we send goes out through one corked socket per turn of the event loop.
// Flow control: each stream's receive window is the SETTINGS_INITIAL_WINDOW_SIZE we announced
// (settings() changes it for every stream, as RFC 9113 6.9.2 says) and is given back as the handler
// takes the bytes: a paused stream holds at most its window. The connection's window is given back
// on receipt (the streams' windows bound what is held), so a paused stream never stops the others.
//
// Session states (H2SessionState):
//   preface   waiting for the client's preface (our SETTINGS are out)
//   open      frames flow; new streams are taken
//   closing   GOAWAY sent or received: no new streams; the socket is ended once the last stream closes
//   failed    a connection error: its GOAWAY is out, every stream closed, nothing more is read; the socket ends
//   closed    the socket is gone; every stream has closed
//   preface ──the preface──▶ open ──close() or the peer's GOAWAY──▶ closing ──last stream closed──▶ closed
//   preface, open, closing ──a connection error (GOAWAY with its code)──▶ failed ──socket gone──▶ closed
//   any ──destroy(), the socket closed──▶ closed
//
// Stream states (H2StreamState), as RFC 9113 5.1 names them from the server's side:
//   open                the request headers came; both sides may send
//   half-closed-remote  the client's END_STREAM was handed on; we may still send
//   half-closed-local   our END_STREAM is out; the client may still send
//   closed              both ended, or reset (rstCode: by either side), or the session went
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import {
  CLIENT_PREFACE,
  DEFAULT_MAX_FRAME,
  DEFAULT_WINDOW,
  FRAME_HEADER_BYTES,
  Flags,
  FrameType,
  H2Error,
  MAX_FRAME_LIMIT,
  MAX_WINDOW,
  SettingId,
  frame,
  frameHeader,
  goawayPayload,
  settingsPayload,
  u32,
} from './frames.js';
import { HpackDecoder, HpackError, type HeaderField } from './hpack.js';
import { ChunkQueue } from '../flow/chunk-queue.js';

export type H2SessionState = 'preface' | 'open' | 'closing' | 'failed' | 'closed';
export type H2StreamState = 'open' | 'half-closed-remote' | 'half-closed-local' | 'closed';

/** Request headers: lower-case names; repeated ones joined with ", " (cookies with "; "). */
export type H2Headers = Record<string, string>;

export interface H2SessionOptions {
  /** SETTINGS_INITIAL_WINDOW_SIZE we announce: each stream's receive window. */
  streamWindow: number;
  /** The connection's receive window. */
  connectionWindow: number;
  /** SETTINGS_MAX_CONCURRENT_STREAMS (none: not limited). */
  maxConcurrentStreams?: number;
  /** A request whose headers are larger (RFC 9113's size) is refused. */
  maxHeaderListBytes?: number;
  /**
   * Bytes the socket may hold unsent before streams keep their DATA and write() says false (default
   * 64 KiB). Bytes on the socket are no longer a stream's, so a session per client keeps this small; one
   * busy session (an agent's) moves bulk faster with more: fewer, larger writes.
   */
  socketHighWater?: number;
}

/** What a stream tells its user (one object per stream, set by the 'stream' listener). */
export interface H2StreamHandler {
  /** Request body bytes (views of what the socket read), while the stream is not paused. */
  onStreamData(chunk: Buffer): void;
  /** The client's END_STREAM, after its last byte. */
  onStreamEnd(): void;
  /** write() said false, and the stream takes more now. */
  onStreamDrain(): void;
  /** Our trailers (sendTrailers) are on the socket. */
  onStreamTrailersSent(): void;
  /** The stream is over (stream.rstCode says whether it was reset, and who did it: stream.resetByPeer). */
  onStreamClose(): void;
  /**
   * The client reset the stream just after it had closed with both ends' END_STREAM: its reset crossed
   * our END_STREAM (node:http2 and grpc-js cancel a call with END_STREAM, then RST_STREAM).
   */
  onStreamResetAfterClose?(code: number): void;
}

const EMPTY: readonly Buffer[] = [];
type WriteCallback = (err?: Error | null) => void;
/** Bytes queued on the socket beyond which streams hold their DATA and write() says false (socketHighWater's default). */
const SOCKET_HIGH_WATER = 64 * 1024;
/** A connection error's GOAWAY gets this long to leave before the socket is destroyed. */
const GOAWAY_LINGER_MS = 1000;
/** A header block (HEADERS and its CONTINUATIONs) larger than this ends the connection. */
const MAX_HEADER_BLOCK_BYTES = 256 * 1024;
/**
 * Bytes the client left unread on its socket beyond which we stop answering its frames (PING, SETTINGS) and
 * end the connection (ENHANCE_YOUR_CALM): a client that sends pings and never reads would grow our queue.
 */
const MAX_UNREAD_ANSWERS = 1 << 20;
/** SETTINGS we sent and the client has not acknowledged: settings() sends no more beyond this. */
const MAX_PENDING_SETTINGS = 8;
/** Streams that closed by END_STREAM both ways, the newest this many, whose client may still reset them (onStreamResetAfterClose). */
const RECENTLY_CLOSED = 16;

class ConnectionError extends Error {
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
  }
}

export class H2Stream {
  private stateNow: H2StreamState = 'open';
  handler: H2StreamHandler | null = null;
  /** Set when the stream was reset (RST_STREAM's code), by either side. */
  rstCode: number | undefined = undefined;
  resetByPeer = false;
  headersSent = false;
  /** The client's END_STREAM was handed to the handler. */
  readableEnded = false;
  /** What the client may still send (our grants less what came). */
  private recvWindow: number;
  /** Bytes handed to the handler and not yet given back to the client. */
  private unreturned = 0;
  /** What we may still send. */
  sendWindow: number;
  private paused = false;
  /** Request body bytes that came while paused, and whether END_STREAM came behind them. */
  private held: Buffer[] | null = null;
  private heldBytes = 0;
  private endReceived = false;
  /** Body bytes and their callbacks waiting for window or socket (made when needed); then trailers (END_STREAM). */
  private queue: Buffer[] | null = null;
  private queueCallbacks: (WriteCallback | undefined)[] | null = null;
  private queued = 0;
  private trailers: Buffer | null = null;
  private wantDrain = false;

  constructor(
    readonly session: H2Session,
    readonly id: number,
    recvWindow: number,
    sendWindow: number,
  ) {
    this.recvWindow = recvWindow;
    this.sendWindow = sendWindow;
  }

  get state(): H2StreamState {
    return this.stateNow;
  }

  /** The one place the stream's state changes. */
  private setState(next: H2StreamState): void {
    this.stateNow = next;
  }

  get destroyed(): boolean {
    return this.stateNow === 'closed';
  }

  /** Bytes waiting to be sent (flow control or the socket hold them back). */
  get writableLength(): number {
    return this.queued;
  }

  /** Request body bytes held while paused. */
  get readableLength(): number {
    return this.heldBytes;
  }

  /** The client's END_STREAM came (handed on, or behind bytes held while paused). */
  get remoteEnded(): boolean {
    return this.endReceived;
  }

  /** Sends the response headers; `endStream`: and nothing after them (a trailers-only response). */
  respond(block: Buffer, endStream: boolean): void {
    if (this.headersSent || this.destroyed) return;
    this.headersSent = true;
    this.session.sendHeaders(this.id, block, endStream);
    if (endStream) this.localEnded();
  }

  /** Sends `chunks` (`length` bytes) as body; false: wait for onStreamDrain. `callback` runs once they are on the socket. */
  write(chunks: readonly Buffer[], length: number, callback?: WriteCallback): boolean {
    if (this.destroyed || this.trailers || this.stateNow === 'half-closed-local') {
      if (callback) process.nextTick(callback, new Error('stream closed'));
      return false;
    }
    if (this.queued === 0 && length <= this.sendWindow && length <= this.session.frameAllowance) {
      // Nothing waits and the windows take it all: one frame now, no queue.
      this.sendWindow -= length;
      this.session.sendData(this.id, chunks, length);
      if (callback) process.nextTick(callback);
      return !this.session.socketFull || this.mustWaitForSocket();
    }
    const queue = (this.queue ??= []);
    const callbacks = (this.queueCallbacks ??= []);
    for (let i = 0; i < chunks.length; i++) {
      queue.push(chunks[i]!);
      callbacks.push(i === chunks.length - 1 ? callback : undefined);
    }
    this.queued += length;
    this.session.flushStream(this);
    if (this.queued > 0) {
      this.wantDrain = true;
      return false;
    }
    return !this.session.socketFull || this.mustWaitForSocket();
  }

  /** write() says false: the socket is full; onStreamDrain comes once it has room. */
  private mustWaitForSocket(): false {
    this.wantDrain = true;
    this.session.waitForSocket(this);
    return false;
  }

  /** Ends our side with trailers (HEADERS with END_STREAM), after the body queued before them (onStreamTrailersSent once they are on the socket). */
  sendTrailers(block: Buffer): void {
    if (this.destroyed || this.trailers || this.stateNow === 'half-closed-local') return;
    this.trailers = block;
    this.session.flushStream(this);
  }

  /** Resets the stream (RST_STREAM `code`): nothing more is sent or handed on. */
  close(code: number): void {
    if (this.destroyed) return;
    this.session.sendReset(this.id, code);
    this.rstCode = code;
    this.closeNow();
  }

  pause(): void {
    this.paused = true;
  }

  resume(): void {
    if (!this.paused) return;
    this.paused = false;
    const held = this.held;
    this.held = null;
    for (let i = 0; held && i < held.length; i++) {
      const chunk = held[i]!;
      this.heldBytes -= chunk.length;
      this.deliver(chunk);
      if (this.destroyed) return;
      if (this.paused) {
        // Paused again by the handler: the rest stays held.
        if (i + 1 < held.length) this.held = held.slice(i + 1);
        return;
      }
    }
    if (this.endReceived && !this.readableEnded) this.deliverEnd();
  }

  // ------------------------------------------------------------ for the session

  /** Body bytes from the client (DATA's payload without padding). False: beyond the window we gave (a stream error). */
  received(chunks: readonly Buffer[], length: number, endStream: boolean): boolean {
    this.recvWindow -= length;
    if (this.recvWindow < 0) return false;
    for (const c of chunks) {
      if (this.paused || this.held) {
        (this.held ??= []).push(c);
        this.heldBytes += c.length;
      } else this.deliver(c);
      if (this.destroyed) return true;
    }
    if (endStream) {
      this.endReceived = true;
      if (!this.paused && !this.held) this.endLater();
    }
    return true;
  }

  /** The client's END_STREAM came on its HEADERS (a request without a body). */
  endedWithHeaders(): void {
    this.endReceived = true;
    if (!this.paused) this.endLater();
  }

  /**
   * Hands the client's END_STREAM on once the rest of what the socket read with it has been parsed: a
   * reset right behind it (grpc-js cancels a call with END_STREAM and RST_STREAM in one write) closes the
   * stream as reset by the client, not as ended by it and then answered.
   */
  private endLater(): void {
    queueMicrotask(() => {
      if (!this.destroyed && !this.readableEnded && !this.paused && !this.held) this.deliverEnd();
    });
  }

  /** The initial window we announced changed by `delta` (the client has our SETTINGS). */
  adjustRecvWindow(delta: number): void {
    this.recvWindow += delta;
    this.returnWindow();
  }

  private deliver(chunk: Buffer): void {
    this.unreturned += chunk.length;
    this.handler?.onStreamData(chunk);
    this.returnWindow();
  }

  /** Gives the client back what the handler took, once that is half the window (or the window ran low). */
  private returnWindow(): void {
    if (this.destroyed || this.readableEnded || this.endReceived) return;
    // A larger window counts once the client has it (adjustRecvWindow); a smaller one at once.
    const window = Math.min(this.session.streamWindow, this.session.ackedStreamWindow);
    if (this.unreturned === 0 || (this.unreturned < window / 2 && this.recvWindow > 0)) return;
    // Never more than the window: after the window shrank, what was handed on is kept back.
    const give = Math.min(this.unreturned, window - this.recvWindow);
    if (give <= 0) return;
    this.unreturned -= give;
    this.recvWindow += give;
    this.session.sendWindowUpdate(this.id, give);
  }

  private deliverEnd(): void {
    this.readableEnded = true;
    this.handler?.onStreamEnd();
    if (this.destroyed) return;
    if (this.stateNow === 'open') this.setState('half-closed-remote');
    else if (this.stateNow === 'half-closed-local') this.closeNow();
  }

  /** Our END_STREAM is out. */
  private localEnded(): void {
    if (this.stateNow === 'open') this.setState('half-closed-local');
    else if (this.stateNow === 'half-closed-remote') this.closeNow();
  }

  /** The client reset the stream. */
  resetByClient(code: number): void {
    if (this.destroyed) return;
    this.rstCode = code;
    this.resetByPeer = true;
    this.closeNow();
  }

  /** The session is gone under the stream. */
  sessionGone(): void {
    if (this.destroyed) return;
    this.rstCode = H2Error.CANCEL;
    this.closeNow();
  }

  /**
   * Sends what the windows and the socket allow (`connectionWindow`: what the connection may still
   * carry); returns the bytes sent. Trailers go once the body is out.
   */
  flush(connectionWindow: number, maxFrame: number): number {
    let sent = 0;
    const queue = this.queue;
    const callbacks = this.queueCallbacks;
    while (this.queued > 0 && queue && callbacks) {
      const n = Math.min(this.queued, this.sendWindow, connectionWindow - sent, maxFrame);
      if (n <= 0 || this.session.socketFull) break;
      const parts: Buffer[] = [];
      let left = n;
      while (left > 0) {
        const c = queue[0]!;
        if (c.length <= left) {
          parts.push(c);
          queue.shift();
          const cb = callbacks.shift();
          if (cb) process.nextTick(cb); // runs after this frame is written, below
          left -= c.length;
        } else {
          parts.push(c.subarray(0, left));
          queue[0] = c.subarray(left);
          left = 0;
        }
      }
      this.queued -= n;
      this.sendWindow -= n;
      sent += n;
      this.session.sendData(this.id, parts, n);
    }
    if (this.queued === 0) {
      this.queue = null;
      this.queueCallbacks = null;
    }
    if (this.queued === 0 && this.trailers && !this.destroyed) {
      const block = this.trailers;
      this.trailers = null;
      this.session.sendHeaders(this.id, block, true);
      const handler = this.handler;
      this.localEnded();
      handler?.onStreamTrailersSent();
    }
    return sent;
  }

  /** Tells the handler it may write again, if it was told to wait and nothing is queued (once the socket has room). */
  drained(): void {
    if (!this.wantDrain || this.queued > 0 || this.destroyed) return;
    if (this.session.socketFull) return this.session.waitForSocket(this);
    this.wantDrain = false;
    this.handler?.onStreamDrain();
  }

  get hasQueued(): boolean {
    return this.queued > 0 || this.trailers !== null;
  }

  private closeNow(): void {
    if (this.stateNow === 'closed') return;
    this.setState('closed');
    const callbacks = (this.queueCallbacks ?? []).filter((cb): cb is WriteCallback => cb !== undefined);
    this.queue = null;
    this.queueCallbacks = null;
    this.queued = 0;
    this.trailers = null;
    this.held = null;
    this.heldBytes = 0;
    for (const cb of callbacks) process.nextTick(cb, new Error('stream closed'));
    this.session.streamClosed(this);
    this.handler?.onStreamClose();
  }
}

/**
 * One HTTP/2 connection, server side. Events: 'stream' (H2Stream, H2Headers) for each request,
 * 'close' once the socket is gone and every stream closed, 'protocolError' (Error with the HTTP/2 code)
 * for a connection error we sent a GOAWAY for ('close' follows).
 */
export class H2Session extends EventEmitter {
  private stateNow: H2SessionState = 'preface';
  private readonly received = new ChunkQueue();
  private readonly decoder: HpackDecoder;
  private readonly streams = new Map<number, H2Stream>();
  /** The highest stream ID the client opened. */
  private lastStreamId = 0;
  /** A header block in progress (HEADERS without END_HEADERS, then CONTINUATIONs). */
  private continuing: { streamId: number; flags: number; parts: Buffer[]; bytes: number } | null = null;
  /** The client's settings. */
  private peerInitialWindow = DEFAULT_WINDOW;
  private peerMaxFrame = DEFAULT_MAX_FRAME;
  /** What we may still send on the connection. */
  private connSendWindow = DEFAULT_WINDOW;
  /** What the client may still send on the connection, and what we took and have not given back. */
  private connRecvWindow: number;
  private connUnreturned = 0;
  /** Our initial stream window as the client knows it, and changes sent and not yet acknowledged. */
  private windowAcked = DEFAULT_WINDOW;
  private pendingStreamWindows: number[] = [];
  /** The window new and open streams get once the client has our settings (what settings() asked for). */
  private windowAsked: number;
  /** Streams with bytes or trailers waiting for window. */
  private readonly blocked = new Set<H2Stream>();
  /** Streams told to wait for the socket. */
  private readonly waitingForSocket = new Set<H2Stream>();
  /** The handlers of the newest streams that closed by END_STREAM both ways (RECENTLY_CLOSED), by stream ID. */
  private readonly recentlyClosed = new Map<number, H2StreamHandler>();
  private corked = false;
  private pings: { payload: Buffer; callback: (err: Error | null) => void }[] = [];
  private pingCounter = 0;
  private lingerTimer: NodeJS.Timeout | null = null;

  constructor(
    readonly socket: Duplex,
    private readonly opts: H2SessionOptions,
  ) {
    super();
    this.decoder = new HpackDecoder(4096, opts.maxHeaderListBytes ?? 64 * 1024);
    this.connRecvWindow = DEFAULT_WINDOW;
    this.windowAsked = opts.streamWindow;
    socket.on('data', this.onSocketData);
    socket.on('drain', this.onSocketDrain);
    socket.on('close', this.onSocketClose);
    socket.on('error', this.onSocketError);
    socket.on('end', this.onSocketEnd);
    const settings: [number, number][] = [
      [SettingId.INITIAL_WINDOW_SIZE, opts.streamWindow],
      [SettingId.MAX_HEADER_LIST_SIZE, opts.maxHeaderListBytes ?? 64 * 1024],
    ];
    if (opts.maxConcurrentStreams !== undefined) settings.push([SettingId.MAX_CONCURRENT_STREAMS, opts.maxConcurrentStreams]);
    this.pendingStreamWindows.push(opts.streamWindow);
    this.out(frame(FrameType.SETTINGS, 0, 0, settingsPayload(settings)));
    if (opts.connectionWindow > DEFAULT_WINDOW) {
      const more = Math.min(opts.connectionWindow, MAX_WINDOW) - DEFAULT_WINDOW;
      this.connRecvWindow += more;
      this.out(frame(FrameType.WINDOW_UPDATE, 0, 0, u32(more)));
    }
  }

  get state(): H2SessionState {
    return this.stateNow;
  }

  /** Each stream's receive window as settings() last asked for it. */
  get streamWindow(): number {
    return this.windowAsked;
  }

  /** Each stream's receive window as the client last acknowledged it. */
  get ackedStreamWindow(): number {
    return this.windowAcked;
  }

  /** The one place the session's state changes. */
  private setState(next: H2SessionState): void {
    this.stateNow = next;
  }

  get destroyed(): boolean {
    return this.stateNow === 'closed';
  }

  /** No new streams: closing, failed or closed. */
  get closed(): boolean {
    return this.stateNow === 'closing' || this.stateNow === 'failed' || this.stateNow === 'closed';
  }

  /** Streams open now. */
  get streamCount(): number {
    return this.streams.size;
  }

  /** The most one DATA frame may carry now (the connection's window, the client's frame size; 0 while the socket is full). */
  get frameAllowance(): number {
    return this.socketFull ? 0 : Math.min(this.connSendWindow, this.peerMaxFrame);
  }

  /** Whether the socket holds more than we let it before streams wait. */
  get socketFull(): boolean {
    // Never below the socket's own mark: past it a write said false, so 'drain' comes.
    return this.socket.writableLength > Math.max(this.opts.socketHighWater ?? SOCKET_HIGH_WATER, this.socket.writableHighWaterMark);
  }

  /**
   * Changes every stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE; applies once the client
   * acknowledges). Throws while MAX_PENDING_SETTINGS of ours wait for their acknowledgement.
   */
  settings(s: { initialWindowSize?: number }): void {
    if (this.destroyed || s.initialWindowSize === undefined) return;
    if (this.pendingStreamWindows.length >= MAX_PENDING_SETTINGS) throw new Error('too many SETTINGS waiting for their acknowledgement');
    const size = Math.min(Math.max(0, Math.floor(s.initialWindowSize)), MAX_WINDOW);
    this.windowAsked = size;
    this.pendingStreamWindows.push(size);
    this.out(frame(FrameType.SETTINGS, 0, 0, settingsPayload([[SettingId.INITIAL_WINDOW_SIZE, size]])));
  }

  /** Sends a PING; `callback` hears the answer (null) or that the session went first. */
  ping(callback: (err: Error | null) => void): boolean {
    if (this.destroyed) return false;
    const payload = Buffer.alloc(8);
    payload.writeUInt32BE(++this.pingCounter, 4);
    this.pings.push({ payload, callback });
    this.out(frame(FrameType.PING, 0, 0, payload));
    return true;
  }

  /** Graceful close: GOAWAY (no new streams); the socket ends once the last stream has closed. */
  close(): void {
    if (this.stateNow !== 'open' && this.stateNow !== 'preface') return;
    this.setState('closing');
    this.out(frame(FrameType.GOAWAY, 0, 0, goawayPayload(this.lastStreamId, H2Error.NO_ERROR)));
    this.endIfIdle();
  }

  /** Ends the session now: every stream closes, the socket is destroyed. */
  destroy(): void {
    this.socket.destroy();
    this.onSocketClose();
  }

  // ------------------------------------------------------------ writing (for the streams)

  sendHeaders(streamId: number, block: Buffer, endStream: boolean): void {
    const max = this.peerMaxFrame;
    if (block.length <= max) {
      this.out(frameHeader(block.length, FrameType.HEADERS, Flags.END_HEADERS | (endStream ? Flags.END_STREAM : 0), streamId), block);
      return;
    }
    this.out(frameHeader(max, FrameType.HEADERS, endStream ? Flags.END_STREAM : 0, streamId), block.subarray(0, max));
    for (let at = max; at < block.length; at += max) {
      const part = block.subarray(at, at + max);
      const last = at + max >= block.length;
      this.out(frameHeader(part.length, FrameType.CONTINUATION, last ? Flags.END_HEADERS : 0, streamId), part);
    }
  }

  sendData(streamId: number, parts: readonly Buffer[], length: number): void {
    this.connSendWindow -= length;
    this.out(frameHeader(length, FrameType.DATA, 0, streamId), ...parts);
  }

  sendReset(streamId: number, code: number): void {
    if (this.destroyed) return;
    this.out(frame(FrameType.RST_STREAM, 0, streamId, u32(code)));
  }

  sendWindowUpdate(streamId: number, increment: number): void {
    if (this.destroyed) return;
    this.out(frame(FrameType.WINDOW_UPDATE, 0, streamId, u32(increment)));
  }

  /** Sends what `stream` may send now; keeps it listed while it waits for window. */
  flushStream(stream: H2Stream): void {
    if (this.destroyed) return;
    stream.flush(this.connSendWindow, this.peerMaxFrame);
    if (stream.hasQueued) this.blocked.add(stream);
    else this.blocked.delete(stream);
    if (this.socketFull) this.waitingForSocket.add(stream);
  }

  /** Sends what the blocked streams may send now (window or socket room came), in turn. */
  private flushBlocked(): void {
    for (const stream of this.blocked) {
      if (this.connSendWindow <= 0 || this.socketFull) break;
      stream.flush(this.connSendWindow, this.peerMaxFrame);
      if (!stream.hasQueued) {
        this.blocked.delete(stream);
        stream.drained();
      }
    }
  }

  waitForSocket(stream: H2Stream): void {
    this.waitingForSocket.add(stream);
  }

  streamClosed(stream: H2Stream): void {
    this.streams.delete(stream.id);
    if (stream.rstCode === undefined && stream.handler?.onStreamResetAfterClose) {
      this.recentlyClosed.set(stream.id, stream.handler);
      if (this.recentlyClosed.size > RECENTLY_CLOSED) this.recentlyClosed.delete(this.recentlyClosed.keys().next().value!);
    }
    this.blocked.delete(stream);
    this.waitingForSocket.delete(stream);
    this.endIfIdle();
  }

  private out(...buffers: Buffer[]): void {
    if (this.destroyed || this.socket.destroyed) return;
    if (!this.corked) {
      this.corked = true;
      this.socket.cork();
      process.nextTick(this.uncork);
    }
    for (const b of buffers) this.socket.write(b);
  }

  /** A frame the client's frame asks for; one that does not read what we send ends the connection. */
  private answer(b: Buffer): void {
    if (this.socket.writableLength > MAX_UNREAD_ANSWERS)
      throw new ConnectionError(H2Error.ENHANCE_YOUR_CALM, 'the client does not read our answers');
    this.out(b);
  }

  private readonly uncork = (): void => {
    this.corked = false;
    this.socket.uncork();
  };

  // ------------------------------------------------------------ reading

  private readonly onSocketData = (chunk: Buffer): void => {
    if (this.stateNow === 'closed' || this.stateNow === 'failed') return;
    this.received.push(chunk);
    try {
      this.parse();
    } catch (err) {
      if (err instanceof ConnectionError) this.fail(err.code, err.message);
      else if (err instanceof HpackError) this.fail(H2Error.COMPRESSION_ERROR, err.message);
      else throw err;
    }
  };

  private parse(): void {
    if (this.stateNow === 'preface') {
      const n = this.received.length;
      if (n < CLIENT_PREFACE.length) {
        if (n > 0 && !CLIENT_PREFACE.subarray(0, n).equals(this.received.peek(n).subarray(0, n)))
          throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'not an HTTP/2 client preface');
        return;
      }
      if (!this.received.take(CLIENT_PREFACE.length).equals(CLIENT_PREFACE))
        throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'not an HTTP/2 client preface');
      this.setState('open');
    }
    while (this.received.length >= FRAME_HEADER_BYTES && (this.stateNow === 'open' || this.stateNow === 'closing')) {
      const head = this.received.peek(FRAME_HEADER_BYTES);
      const length = (head[0]! << 16) | (head[1]! << 8) | head[2]!;
      if (length > DEFAULT_MAX_FRAME) throw new ConnectionError(H2Error.FRAME_SIZE_ERROR, `frame of ${length} bytes`);
      if (this.received.length < FRAME_HEADER_BYTES + length) return;
      const type = head[3]!;
      const flags = head[4]!;
      const streamId = head.readUInt32BE(5) & MAX_WINDOW;
      this.received.take(FRAME_HEADER_BYTES);
      if (this.continuing && (type !== FrameType.CONTINUATION || streamId !== this.continuing.streamId))
        throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'expected CONTINUATION');
      if (type === FrameType.DATA) {
        this.onData(flags, streamId, this.received.takeViews(length), length);
        continue;
      }
      const payload = this.received.take(length);
      switch (type) {
        case FrameType.HEADERS:
          this.onHeaders(flags, streamId, payload);
          break;
        case FrameType.CONTINUATION:
          this.onContinuation(flags, streamId, payload);
          break;
        case FrameType.PRIORITY:
          if (streamId === 0) throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'PRIORITY on stream 0');
          if (length !== 5) this.sendReset(streamId, H2Error.FRAME_SIZE_ERROR);
          break;
        case FrameType.RST_STREAM:
          this.onReset(streamId, payload);
          break;
        case FrameType.SETTINGS:
          this.onSettings(flags, streamId, payload);
          break;
        case FrameType.PUSH_PROMISE:
          throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'PUSH_PROMISE from a client');
        case FrameType.PING:
          this.onPing(flags, streamId, payload);
          break;
        case FrameType.GOAWAY:
          if (streamId !== 0) throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'GOAWAY on a stream');
          if (length < 8) throw new ConnectionError(H2Error.FRAME_SIZE_ERROR, 'short GOAWAY');
          if (this.stateNow === 'open') this.setState('closing');
          this.endIfIdle();
          break;
        case FrameType.WINDOW_UPDATE:
          this.onWindowUpdate(streamId, payload);
          break;
        default:
          break; // unknown frame types are ignored (RFC 9113 4.1)
      }
    }
  }

  private onData(flags: number, streamId: number, views: Buffer[], length: number): void {
    if (streamId === 0) throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'DATA on stream 0');
    this.connRecvWindow -= length;
    if (this.connRecvWindow < 0) throw new ConnectionError(H2Error.FLOW_CONTROL_ERROR, 'connection window exceeded');
    this.connUnreturned += length;
    this.returnConnectionWindow();
    let body = views;
    let bodyLength = length;
    if (flags & Flags.PADDED) {
      if (length < 1) throw new ConnectionError(H2Error.FRAME_SIZE_ERROR, 'padded DATA without its pad length');
      const pad = views[0]![0]!;
      if (pad >= length) throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'DATA padding beyond the frame');
      bodyLength = length - 1 - pad;
      body = sliceViews(views, 1, bodyLength);
    }
    const stream = this.streams.get(streamId);
    if (!stream) {
      if (streamId > this.lastStreamId) throw new ConnectionError(H2Error.PROTOCOL_ERROR, `DATA on idle stream ${streamId}`);
      return; // a stream closed meanwhile (we reset it, or it ended): ignored
    }
    if (stream.remoteEnded) {
      stream.close(H2Error.STREAM_CLOSED);
      return;
    }
    if (!stream.received(body, bodyLength, (flags & Flags.END_STREAM) !== 0)) stream.close(H2Error.FLOW_CONTROL_ERROR);
  }

  private returnConnectionWindow(): void {
    const window = Math.min(this.opts.connectionWindow, MAX_WINDOW);
    if (this.connUnreturned < window / 2 && this.connRecvWindow > 0) return;
    const give = this.connUnreturned;
    this.connUnreturned = 0;
    this.connRecvWindow += give;
    this.out(frame(FrameType.WINDOW_UPDATE, 0, 0, u32(give)));
  }

  private onHeaders(flags: number, streamId: number, payload: Buffer): void {
    if (streamId === 0) throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'HEADERS on stream 0');
    let at = 0;
    let end = payload.length;
    if (flags & Flags.PADDED) {
      if (payload.length < 1) throw new ConnectionError(H2Error.FRAME_SIZE_ERROR, 'padded HEADERS without its pad length');
      const pad = payload[0]!;
      at = 1;
      end -= pad;
    }
    if (flags & Flags.PRIORITY) {
      if (end - at < 5) throw new ConnectionError(H2Error.FRAME_SIZE_ERROR, 'HEADERS priority cut short');
      at += 5;
    }
    if (end < at) throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'HEADERS padding beyond the frame');
    const fragment = payload.subarray(at, end);
    if (flags & Flags.END_HEADERS) this.onHeaderBlock(streamId, flags, fragment);
    else this.continuing = { streamId, flags, parts: [fragment], bytes: fragment.length };
  }

  private onContinuation(flags: number, streamId: number, payload: Buffer): void {
    const c = this.continuing;
    if (!c) throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'CONTINUATION without HEADERS');
    c.parts.push(payload);
    c.bytes += payload.length;
    if (c.bytes > MAX_HEADER_BLOCK_BYTES) throw new ConnectionError(H2Error.ENHANCE_YOUR_CALM, 'header block too large');
    if (flags & Flags.END_HEADERS) {
      this.continuing = null;
      this.onHeaderBlock(streamId, c.flags, Buffer.concat(c.parts, c.bytes));
    }
  }

  private onHeaderBlock(streamId: number, flags: number, block: Buffer): void {
    // Decoded whatever becomes of the stream: the table must stay in step with the client's.
    const { fields, tooLarge } = this.decoder.decode(block);
    const endStream = (flags & Flags.END_STREAM) !== 0;
    const existing = this.streams.get(streamId);
    if (existing) {
      // Trailers: only with END_STREAM, and only while the client's side is open.
      if (!endStream || existing.remoteEnded) {
        existing.close(endStream ? H2Error.STREAM_CLOSED : H2Error.PROTOCOL_ERROR);
        return;
      }
      existing.received(EMPTY, 0, true);
      return;
    }
    if (streamId <= this.lastStreamId) return; // a stream we closed: ignored
    if (streamId % 2 === 0) throw new ConnectionError(H2Error.PROTOCOL_ERROR, `client stream ${streamId} is even`);
    this.lastStreamId = streamId;
    if (this.stateNow !== 'open') return this.sendReset(streamId, H2Error.REFUSED_STREAM);
    if (this.streams.size >= (this.opts.maxConcurrentStreams ?? Infinity)) return this.sendReset(streamId, H2Error.REFUSED_STREAM);
    const headers = tooLarge ? null : requestHeaders(fields);
    if (!headers) return this.sendReset(streamId, H2Error.PROTOCOL_ERROR);
    const stream = new H2Stream(this, streamId, this.windowAcked, this.peerInitialWindow);
    this.streams.set(streamId, stream);
    this.emit('stream', stream, headers);
    // A window we announced and the client does not know yet starts once it does (adjustRecvWindow).
    if (endStream && !stream.destroyed) stream.endedWithHeaders();
  }

  private onReset(streamId: number, payload: Buffer): void {
    if (streamId === 0) throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'RST_STREAM on stream 0');
    if (payload.length !== 4) throw new ConnectionError(H2Error.FRAME_SIZE_ERROR, 'RST_STREAM not 4 bytes');
    if (streamId > this.lastStreamId) throw new ConnectionError(H2Error.PROTOCOL_ERROR, `RST_STREAM on idle stream ${streamId}`);
    const code = payload.readUInt32BE(0);
    const stream = this.streams.get(streamId);
    if (stream) return stream.resetByClient(code);
    const handler = this.recentlyClosed.get(streamId);
    if (!handler) return;
    this.recentlyClosed.delete(streamId);
    handler.onStreamResetAfterClose?.(code);
  }

  private onSettings(flags: number, streamId: number, payload: Buffer): void {
    if (streamId !== 0) throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'SETTINGS on a stream');
    if (flags & Flags.ACK) {
      if (payload.length !== 0) throw new ConnectionError(H2Error.FRAME_SIZE_ERROR, 'SETTINGS ACK with a payload');
      const size = this.pendingStreamWindows.shift();
      if (size !== undefined && size !== this.windowAcked) {
        const delta = size - this.windowAcked;
        this.windowAcked = size;
        for (const s of this.streams.values()) s.adjustRecvWindow(delta);
      }
      return;
    }
    if (payload.length % 6 !== 0) throw new ConnectionError(H2Error.FRAME_SIZE_ERROR, 'SETTINGS not a multiple of 6 bytes');
    for (let at = 0; at < payload.length; at += 6) {
      const id = payload.readUInt16BE(at);
      const value = payload.readUInt32BE(at + 2);
      switch (id) {
        case SettingId.ENABLE_PUSH:
          if (value > 1) throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'ENABLE_PUSH not 0 or 1');
          break;
        case SettingId.INITIAL_WINDOW_SIZE: {
          if (value > MAX_WINDOW) throw new ConnectionError(H2Error.FLOW_CONTROL_ERROR, 'INITIAL_WINDOW_SIZE too large');
          const delta = value - this.peerInitialWindow;
          this.peerInitialWindow = value;
          for (const s of this.streams.values()) {
            s.sendWindow += delta;
            if (s.sendWindow > MAX_WINDOW) throw new ConnectionError(H2Error.FLOW_CONTROL_ERROR, 'a stream window beyond 2^31-1');
          }
          break;
        }
        case SettingId.MAX_FRAME_SIZE:
          if (value < DEFAULT_MAX_FRAME || value > MAX_FRAME_LIMIT)
            throw new ConnectionError(H2Error.PROTOCOL_ERROR, `MAX_FRAME_SIZE ${value}`);
          this.peerMaxFrame = value;
          break;
        default:
          break; // HEADER_TABLE_SIZE (our encoder keeps no table), MAX_CONCURRENT_STREAMS (we open none), others
      }
    }
    this.answer(frame(FrameType.SETTINGS, Flags.ACK, 0));
    this.flushBlocked();
  }

  private onPing(flags: number, streamId: number, payload: Buffer): void {
    if (streamId !== 0) throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'PING on a stream');
    if (payload.length !== 8) throw new ConnectionError(H2Error.FRAME_SIZE_ERROR, 'PING not 8 bytes');
    if (!(flags & Flags.ACK)) {
      this.answer(frame(FrameType.PING, Flags.ACK, 0, payload));
      return;
    }
    const i = this.pings.findIndex((p) => p.payload.equals(payload));
    if (i < 0) return;
    const [ping] = this.pings.splice(i, 1);
    ping!.callback(null);
  }

  private onWindowUpdate(streamId: number, payload: Buffer): void {
    if (payload.length !== 4) throw new ConnectionError(H2Error.FRAME_SIZE_ERROR, 'WINDOW_UPDATE not 4 bytes');
    const increment = payload.readUInt32BE(0) & MAX_WINDOW;
    if (streamId === 0) {
      if (increment === 0) throw new ConnectionError(H2Error.PROTOCOL_ERROR, 'WINDOW_UPDATE of 0');
      this.connSendWindow += increment;
      if (this.connSendWindow > MAX_WINDOW) throw new ConnectionError(H2Error.FLOW_CONTROL_ERROR, 'connection window beyond 2^31-1');
      this.flushBlocked();
      return;
    }
    if (streamId > this.lastStreamId) throw new ConnectionError(H2Error.PROTOCOL_ERROR, `WINDOW_UPDATE on idle stream ${streamId}`);
    const stream = this.streams.get(streamId);
    if (!stream) return;
    if (increment === 0) return stream.close(H2Error.PROTOCOL_ERROR);
    stream.sendWindow += increment;
    if (stream.sendWindow > MAX_WINDOW) return stream.close(H2Error.FLOW_CONTROL_ERROR);
    if (stream.hasQueued) {
      this.flushStream(stream);
      if (!stream.hasQueued) stream.drained();
    }
  }

  // ------------------------------------------------------------ the socket

  private readonly onSocketDrain = (): void => {
    this.flushBlocked();
    if (this.socketFull) return;
    const waiting = [...this.waitingForSocket];
    this.waitingForSocket.clear();
    for (const s of waiting) s.drained();
  };

  private readonly onSocketEnd = (): void => {
    // The client's FIN: nothing more will come. Streams still open cannot finish.
    this.destroy();
  };

  private readonly onSocketError = (): void => {
    // 'close' follows.
  };

  private readonly onSocketClose = (): void => {
    if (this.stateNow === 'closed') return;
    this.setState('closed');
    if (this.lingerTimer) clearTimeout(this.lingerTimer);
    this.lingerTimer = null;
    this.socket.off('data', this.onSocketData);
    this.socket.off('drain', this.onSocketDrain);
    this.socket.off('end', this.onSocketEnd);
    this.socket.off('close', this.onSocketClose);
    // 'error' stays listened to: a destroyed socket may still report one.
    for (const s of [...this.streams.values()]) s.sessionGone();
    this.streams.clear();
    this.recentlyClosed.clear();
    this.blocked.clear();
    this.waitingForSocket.clear();
    this.received.clear();
    const pings = this.pings;
    this.pings = [];
    for (const p of pings) p.callback(new Error('session closed'));
    this.emit('close');
  };

  /** A connection error: GOAWAY with its code, every stream closed, the socket ended (destroyed if it lingers). */
  private fail(code: number, message: string): void {
    if (this.stateNow === 'failed' || this.destroyed) return;
    this.out(frame(FrameType.GOAWAY, 0, 0, goawayPayload(this.lastStreamId, code, message)));
    this.setState('failed');
    this.received.clear();
    for (const s of [...this.streams.values()]) s.sessionGone();
    this.emit('protocolError', Object.assign(new Error(message), { code }));
    this.endSocket();
  }

  /** While closing: ends the socket once no stream is left. */
  private endIfIdle(): void {
    if (this.stateNow === 'closing' && this.streams.size === 0) this.endSocket();
  }

  private endSocket(): void {
    if (this.lingerTimer || this.destroyed) return;
    this.socket.end();
    this.lingerTimer = setTimeout(() => this.destroy(), GOAWAY_LINGER_MS);
    this.lingerTimer.unref();
  }
}

/** The views of `length` bytes from `offset` into `views`. */
function sliceViews(views: readonly Buffer[], offset: number, length: number): Buffer[] {
  const out: Buffer[] = [];
  for (const v of views) {
    if (length <= 0) break;
    if (offset >= v.length) {
      offset -= v.length;
      continue;
    }
    const part = v.subarray(offset, offset + length);
    out.push(part);
    length -= part.length;
    offset = 0;
  }
  return out;
}

/** Names HTTP/2 forbids (connection-specific, RFC 9113 8.2.2). */
const CONNECTION_HEADERS = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade']);
const REQUEST_PSEUDO = new Set([':method', ':scheme', ':authority', ':path']);

/** A request's header list as headers, or null if it is malformed (RFC 9113 8.3.1). */
function requestHeaders(fields: readonly HeaderField[]): H2Headers | null {
  const headers: H2Headers = Object.create(null) as H2Headers;
  let regular = false;
  for (const [name, value] of fields) {
    if (name.length === 0 || name !== name.toLowerCase()) return null;
    if (name.startsWith(':')) {
      if (regular || !REQUEST_PSEUDO.has(name) || name in headers) return null;
      headers[name] = value;
      continue;
    }
    regular = true;
    if (CONNECTION_HEADERS.has(name) || (name === 'te' && value !== 'trailers')) return null;
    const had = headers[name];
    headers[name] = had === undefined ? value : `${had}${name === 'cookie' ? '; ' : ', '}${value}`;
  }
  if (headers[':method'] === undefined || headers[':path'] === undefined || headers[':scheme'] === undefined) return null;
  return headers;
}
