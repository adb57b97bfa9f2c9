// Our own transport for Packets: length-prefixed frames over a TLS socket (ALPN
// "cluster-proxy-mux/1"), used between our peers instead of gRPC/HTTP2, which costs several times
// more CPU per byte in Node. Same packets, same per-connection credit; only the framing differs:
//   frame = uint32 big-endian length N, then N bytes: one kind byte and the body
//   kind 0 HELLO  — first frame each way: a JSON object of string arrays (what a gRPC stream carries
//                   in its headers: agentID, identifiers, capabilities, serverID, or an error)
//   kind 1 PACKET — one protobuf-encoded Packet
//   kind 2 PING / 3 PONG — keepalive: a PING is answered with a PONG; any frame proves the peer alive
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import { ChunkQueue } from '../flow/chunk-queue.js';
import { PacketDecodeError, decodePacket, encodeDataHeader, encodePacketParts } from '../wire/codec.js';
import type { Packet } from '../wire/packet.js';

export const MUX_ALPN = 'cluster-proxy-mux/1';

export type Hello = Record<string, string[]>;

/** Bytes we let queue in the socket before telling senders to wait for 'drain', and the level at
 * which we let them go again. Node's own 'drain' waits for an empty buffer, which would leave the
 * link idle while senders refill it; we emit 'drain' at the low-water mark instead. */
const WRITE_HIGH_WATER = 1024 * 1024;
const WRITE_LOW_WATER = 256 * 1024;
/** DATA obeys credit, so only control frames can pile up past the high-water mark; a peer that
 * lets this much accumulate is not reading at all, and is cut off rather than allowed to grow us. */
const WRITE_HARD_LIMIT = 64 * 1024 * 1024;
const MAX_HELLO_BYTES = 64 * 1024;

const KIND_HELLO = 0;
const KIND_PACKET = 1;
const KIND_PING = 2;
const KIND_PONG = 3;

/** Receives a DATA packet's payload as the chunks it arrived in (`length` bytes in all). */
export type DataViewHandler = (connectID: number, chunks: readonly Buffer[], length: number) => void;

/** hello: waiting for the peer's hello (the first frame); open: packets flow; closed: the socket
 * closed (nothing more is read or written). Changed only by enter(). Reading paused, writes
 * congested and our end() are separate: they come and go in any of these states. */
export type FramedStreamState = 'hello' | 'open' | 'closed';

export class FrameError extends Error {
  override name = 'FrameError';
}

/**
 * Emits 'hello' (Hello) once, then 'data' (Packet) per frame, 'end' when the peer finished,
 * 'error' (Error) on a broken frame or socket, and 'close' once. A packet that arrives before any
 * 'data' listener is attached is held (and reading stops) until one is: a reader learns of the hello
 * through a promise (connectMux) and listens a few ticks later, while the peer may send its first
 * packet right behind its hello (a hub sends a dial that waited for this agent at once).
 */
export class FramedPacketStream extends EventEmitter {
  private readonly received = new ChunkQueue();
  private state: FramedStreamState = 'hello';
  private paused = false;
  /** A packet decoded while nobody listened for packets; nothing more is read until it is delivered. */
  private held: Packet | null = null;
  /** end() was called: packets nobody listens for are dropped rather than held. */
  private ending = false;
  private corked = false;
  private keepaliveTimer: NodeJS.Timeout | null = null;
  private congested = false;
  private lastReceived = Date.now();
  private dataViews: DataViewHandler | null = null;

  constructor(
    readonly socket: Duplex,
    private readonly maxFrameBytes: number,
  ) {
    super();
    socket.on('data', this.onData);
    socket.on('end', () => this.emit('end'));
    socket.on('error', (err: Error) => this.fail(err));
    socket.on('close', () => this.onClose());
    socket.on('drain', this.onFlushed);
    this.on('newListener', (event: string) => {
      // The listener is added after this event returns: hand it the held packet just after.
      if (event === 'data' && this.held) queueMicrotask(() => this.continueReading());
    });
  }

  /** Every change of state; the keepalive timer stops with the socket. */
  private enter(state: FramedStreamState): void {
    this.state = state;
    if (state === 'closed') this.stopKeepalive();
  }

  get isClosed(): boolean {
    return this.state === 'closed';
  }

  sendHello(hello: Hello): void {
    const body = Buffer.from(JSON.stringify(hello));
    this.writeFrame(KIND_HELLO, [body], body.length);
  }

  /**
   * Sends a PING every `intervalMs`; if nothing at all arrived for `intervalMs + timeoutMs`, the peer
   * is gone: the stream fails. Also keeps idle-killing proxies from closing a quiet tunnel.
   * `whenIdle`: a PING only once nothing arrived for `intervalMs`, for the side whose peer pings on its own (the
   * hub: agents and SDK clients ping it every 15–30 s). Their pings and our PONGs prove both ends alive, so at 5,000
   * agents the hub writes two frames a period where it wrote three; a peer that stays quiet is still pinged
   * before it is given up. Never on both ends of a link: each would wait for the other.
   */
  startKeepalive(intervalMs: number, timeoutMs: number, { whenIdle = false }: { whenIdle?: boolean } = {}): void {
    this.stopKeepalive();
    const deadline = intervalMs + timeoutMs;
    const gone = (quiet: number): boolean => {
      if (quiet <= deadline) return false;
      this.fail(new FrameError(`peer did not answer keepalive within ${timeoutMs} ms`));
      return true;
    };
    if (!whenIdle) {
      this.keepaliveTimer = setInterval(() => {
        if (!gone(Date.now() - this.lastReceived)) this.writeFrame(KIND_PING, [], 0);
      }, intervalMs);
      this.keepaliveTimer.unref();
      return;
    }
    // Wakes when a PING falls due (quiet for intervalMs), then at the deadline that PING's answer must beat.
    const tick = (): void => {
      const quiet = Date.now() - this.lastReceived;
      if (gone(quiet)) return;
      if (quiet >= intervalMs) this.writeFrame(KIND_PING, [], 0);
      if (this.isClosed) return;
      this.keepaliveTimer = setTimeout(tick, quiet >= intervalMs ? deadline - quiet + 1 : intervalMs - quiet);
      this.keepaliveTimer.unref();
    };
    this.keepaliveTimer = setTimeout(tick, intervalMs);
    this.keepaliveTimer.unref();
  }

  private stopKeepalive(): void {
    if (this.keepaliveTimer) clearTimeout(this.keepaliveTimer);
    this.keepaliveTimer = null;
  }

  /** Bytes queued in the socket, not yet handed to the kernel. */
  get writableLength(): number {
    return this.socket.writableLength;
  }

  /** Queues one packet; false when the socket buffer is over its high-water mark ('drain' follows). */
  write(packet: Packet): boolean {
    if (this.state === 'closed') return false;
    const parts = encodePacketParts(packet);
    let n = 0;
    for (const p of parts) n += p.length;
    return this.writePacketFrame(parts, n);
  }

  /** Queues a DATA packet whose `length` (> 0) payload bytes are `chunks`, written as they are (no copy). */
  writeData(connectID: number, chunks: readonly Buffer[], length: number): boolean {
    if (this.state === 'closed') return false;
    const header = encodeDataHeader(connectID, length);
    return this.writePacketFrame([header, ...chunks], header.length + length);
  }

  private writePacketFrame(parts: Buffer[], length: number): boolean {
    this.writeFrame(KIND_PACKET, parts, length);
    if (this.socket.writableLength < WRITE_HIGH_WATER) return true;
    if (this.socket.writableLength > WRITE_HARD_LIMIT) {
      this.fail(new FrameError(`peer is not reading: more than ${WRITE_HARD_LIMIT} bytes queued`));
      return false;
    }
    this.congested = true;
    return false;
  }

  private readonly onFlushed = (): void => {
    if (this.congested && this.socket.writableLength <= WRITE_LOW_WATER) {
      this.congested = false;
      this.emit('drain');
    }
  };

  private writeFrame(kind: number, parts: Buffer[], length: number): void {
    if (this.state === 'closed' || this.socket.destroyed) return;
    // Frames written in one tick go out together: one writev, fewer TLS records and syscalls.
    if (!this.corked) {
      this.corked = true;
      this.socket.cork();
      process.nextTick(this.uncork);
    }
    const head = Buffer.allocUnsafe(5);
    head.writeUInt32BE(length + 1, 0);
    head[4] = kind;
    this.socket.write(head);
    const last = parts.length - 1;
    for (let i = 0; i < last; i++) this.socket.write(parts[i]!);
    if (last >= 0) this.socket.write(parts[last]!, this.onFlushed);
  }

  private readonly uncork = (): void => {
    this.corked = false;
    this.socket.uncork();
  };

  pause(): this {
    this.paused = true;
    this.socket.pause();
    return this;
  }

  resume(): this {
    if (!this.paused) return this;
    this.paused = false;
    this.continueReading();
    return this;
  }

  private continueReading(): void {
    this.safeParse();
    if (!this.paused && !this.held && this.state !== 'closed') this.socket.resume();
  }

  /** Finish our side after what is queued. */
  end(): void {
    if (this.state === 'closed') return;
    this.socket.end();
    this.ending = true;
    // Nobody will read a held packet (a refused peer): keep reading, so the peer's close is seen.
    if (this.held) {
      this.held = null;
      this.continueReading();
    }
  }

  destroy(err?: Error): void {
    this.socket.destroy(err);
  }

  private readonly onData = (chunk: Buffer): void => {
    // Bytes a socket still hands over after we failed it (several pushed in one read) are not read: one 'error' only.
    if (this.socket.destroyed) return;
    this.lastReceived = Date.now();
    this.received.push(chunk);
    this.safeParse();
  };

  private safeParse(): void {
    try {
      this.parse();
    } catch (err) {
      // A listener's bug or a frame we misread must cost this stream, never the process.
      this.fail(err as Error);
    }
  }

  private parse(): void {
    if (this.held && !this.paused && this.state !== 'closed' && this.listenerCount('data') > 0) {
      const p = this.held;
      this.held = null;
      this.emit('data', p);
    }
    while (!this.paused && !this.held && this.state !== 'closed' && this.received.length >= 4) {
      const length = this.received.peek(4).readUInt32BE(0);
      const limit = (this.state !== 'hello' ? this.maxFrameBytes : MAX_HELLO_BYTES) + 1;
      if (length > limit) {
        this.fail(new FrameError(`frame of ${length} bytes exceeds the ${limit}-byte limit`));
        return;
      }
      if (this.received.length < 4 + length) return;
      this.received.take(4);
      if (length === 0) {
        this.fail(new FrameError('empty frame'));
        return;
      }
      const kind = this.received.take(1)[0]!;
      if (
        kind === KIND_PACKET &&
        this.dataViews &&
        this.state === 'open' &&
        this.listenerCount('data') > 0 &&
        this.emitDataViews(this.dataViews, length - 1)
      )
        continue;
      const body = this.received.take(length - 1);
      if (this.state === 'hello') {
        if (kind !== KIND_HELLO) {
          this.fail(new FrameError('first frame is not a hello'));
          return;
        }
        this.enter('open');
        let hello: unknown;
        try {
          hello = JSON.parse(body.toString('utf8'));
        } catch {
          this.fail(new FrameError('hello is not JSON'));
          return;
        }
        if (!isHello(hello)) {
          this.fail(new FrameError('hello must be an object of string arrays'));
          return;
        }
        this.emit('hello', hello);
        continue;
      }
      if (kind === KIND_PING) {
        this.writeFrame(KIND_PONG, [], 0);
        continue;
      }
      if (kind === KIND_PONG) continue;
      if (kind !== KIND_PACKET) {
        this.fail(new FrameError(`unknown frame kind ${kind}`));
        return;
      }
      let packet: Packet;
      try {
        packet = decodePacket(body);
      } catch (err) {
        this.fail(err instanceof PacketDecodeError ? new FrameError(`malformed packet: ${err.message}`) : (err as Error));
        return;
      }
      if (this.listenerCount('data') === 0 && !this.ending) {
        this.held = packet;
        break;
      }
      this.emit('data', packet);
    }
    if (this.paused || this.held) this.socket.pause();
  }

  /**
   * DATA packets then go to `handler`, their payload as the chunks it arrived in (views, in order),
   * instead of to 'data' copied into one Buffer. A 256 KiB frame spans ~16 TLS records: the copy
   * doubled the Buffers a receiver allocates per byte, and the dead ones a bulk transfer leaves
   * between collections.
   */
  onDataViews(handler: DataViewHandler | null): void {
    this.dataViews = handler;
  }

  /** Hands a DATA frame of `length` bytes to `handler`; false, consuming nothing, for other packets. */
  private emitDataViews(handler: DataViewHandler, length: number): boolean {
    const data = this.received.takeDataViews(length);
    if (data) handler(data.connectID, data.chunks, data.length);
    return data !== null;
  }

  private fail(err: Error): void {
    if (this.state === 'closed') return;
    this.emit('error', err);
    this.socket.destroy();
  }

  private onClose(): void {
    if (this.state === 'closed') return;
    this.enter('closed');
    this.received.clear();
    this.emit('close');
  }
}

function isHello(v: unknown): v is Hello {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return false;
  return Object.values(v).every((x) => Array.isArray(x) && x.every((s) => typeof s === 'string'));
}
