// A tunneled TCP connection, shaped like net.Socket: a Duplex with connect/timeout/half-close
// semantics, so HTTP clients and TLS can run over it. A "leg" carries its packets to the hub: its
// own gRPC stream, or a share of a multiplexed connection (legs.ts).
//   connecting → open → (ended either way) → closed
import { randomBytes } from 'node:crypto';
import { Duplex } from 'node:stream';
import { MAX_DATA_CHUNK, PacketType, classifyDialError, packets, type Packet } from '@cluster-proxy/proto';
import { TunnelError } from './errors.js';
import type { Leg, LegFactory } from './legs.js';

/** Options of one dial ({@link Tunnel.connect}, {@link Tunnel.dial}). */
export interface ConnectOptions {
  /** Abort a pending dial (reason `context`) or an open connection. */
  signal?: AbortSignal;
  /** Client-side dial deadline (reason `timeout`); the hub also enforces its own. Default 30 s. */
  timeoutMs?: number;
  /** As for net.Socket: when false (default), our side ends once the destination's side ended. */
  allowHalfOpen?: boolean;
}

type SocketState = 'connecting' | 'open' | 'closed';

/** After we close, how long we wait for the hub's CLOSE_RSP before giving up on it. */
const CLOSE_ACK_MS = 5000;

function randomDialID(): bigint {
  // Positive int63, like Go's rand.Int63.
  return randomBytes(8).readBigUInt64BE() >> 1n;
}

/**
 * One tunneled TCP connection, shaped like `net.Socket`: a Duplex with backpressure both ways,
 * half-close (`end()`; with our hub the other side still sends its reply), `setTimeout` and
 * `destroy`, so HTTP clients and TLS run over it. Made by {@link Tunnel.connect} and {@link Tunnel.dial}.
 * Connection states: connecting, then open, then closed.
 */
export class TunnelSocket extends Duplex {
  /** The `host:port` this connection was dialed to. */
  readonly destination: string;
  /** True until the agent reached the destination, as for `net.Socket`. */
  connecting = true;
  private state: SocketState = 'connecting';
  private connectID = 0;
  private readonly random = randomDialID();
  private leg: Leg | null = null;
  private readEnded = false;
  private dialTimer: NodeJS.Timeout | null = null;
  private idleTimer: NodeJS.Timeout | null = null;
  private idleMs = 0;
  private closeTimer: NodeJS.Timeout | null = null;
  private pendingWrite: { chunk: Buffer; callback: (err?: Error | null) => void } | null = null;
  private pendingFinal: ((err?: Error | null) => void) | null = null;
  private readonly signal: AbortSignal | undefined;
  /** Bytes received from the destination. */
  bytesRead = 0;
  /** Bytes sent towards the destination. */
  bytesWritten = 0;

  /** @internal Made by Tunnel.connect. */

  constructor(destination: string, opts: ConnectOptions = {}, onSettled?: (s: TunnelSocket) => void) {
    super({ allowHalfOpen: opts.allowHalfOpen ?? false, readableHighWaterMark: 256 * 1024, writableHighWaterMark: 256 * 1024 });
    this.destination = destination;
    this.signal = opts.signal;
    this.once('close', () => onSettled?.(this));
    const timeoutMs = opts.timeoutMs ?? 30_000;
    this.dialTimer = setTimeout(() => this.abandonDial(new TunnelError('timeout', destination, `dial ${destination} timed out after ${timeoutMs} ms`)), timeoutMs);
    if (this.signal?.aborted) queueMicrotask(this.onAbort);
    else this.signal?.addEventListener('abort', this.onAbort, { once: true });
  }

  /** @internal Starts the dial on a leg from `factory` (the tunnel calls this once its transport is ready). */
  attach(factory: LegFactory): void {
    if (this.state !== 'connecting' || this.leg) return;
    this.leg = factory.open(this.random, {
      onPacket: this.onPacket,
      onFailure: (message) => {
        if (this.state === 'closed') {
          this.leg?.abort();
          return;
        }
        this.fail(new TunnelError('tunnelclosed', this.destination, `tunnel to ${this.destination} failed: ${message}`));
      },
    });
    this.leg.send(packets.dialRequest(this.destination, this.random));
  }

  /** @internal The transport could not be set up: fail like a dial would. */
  failToStart(err: TunnelError): void {
    if (this.state === 'closed') return;
    this.clearDialTimer();
    this.state = 'closed';
    this.destroy(err);
  }

  // ------------------------------------------------------------ net.Socket look-alike

  /** True while the dial is in progress, as for `net.Socket`. */
  get pending(): boolean {
    return this.state === 'connecting';
  }

  /** The destination `host:port` (the real peer is behind the agent). */
  get remoteAddress(): string {
    return this.destination;
  }

  /** Emits `timeout` after `ms` without traffic either way (0 turns it off), as for `net.Socket`; the connection stays open. */
  setTimeout(ms: number, callback?: () => void): this {
    this.idleMs = ms;
    if (callback) this.once('timeout', callback);
    this.touch();
    return this;
  }

  /** Accepted for `net.Socket` compatibility; every write is sent at once anyway. */
  setNoDelay(_noDelay?: boolean): this {
    return this; // every write is sent at once
  }

  /** Accepted for `net.Socket` compatibility; the transport to the hub keeps itself alive. */
  setKeepAlive(_enable?: boolean, _delay?: number): this {
    return this; // the transport keeps itself alive
  }

  /** Accepted for `net.Socket` compatibility; has no effect. */
  ref(): this {
    return this;
  }

  /** Accepted for `net.Socket` compatibility; has no effect. */
  unref(): this {
    return this;
  }

  /** An empty object: the local end of a tunneled connection has no address of its own. */
  address(): Record<string, never> {
    return {};
  }

  // ------------------------------------------------------------ packets from the hub

  private readonly onPacket = (p: Packet): void => {
    switch (p.type) {
      case PacketType.DIAL_RSP: {
        if (this.state !== 'connecting' || p.dialResponse.random !== this.random) return;
        this.clearDialTimer();
        const r = p.dialResponse;
        if (r.error !== '' || r.connectID === 0) {
          const reason = classifyDialError(r.reason, r.error);
          this.fail(new TunnelError(reason, this.destination, `dial ${this.destination} failed (${reason}): ${r.error || 'no connection ID'}`));
          return;
        }
        this.connectID = r.connectID;
        this.state = 'open';
        this.connecting = false;
        this.touch();
        this.emit('connect');
        this.emit('ready');
        this.flushPending();
        return;
      }
      case PacketType.DATA: {
        if (this.state !== 'open' || this.readEnded) return;
        const n = p.data.data.length;
        this.bytesRead += n;
        this.touch();
        this.leg?.received(n, this.push(p.data.data));
        return;
      }
      case PacketType.HALF_CLOSE:
        if (this.state === 'open') this.endReadable();
        return;
      case PacketType.CLOSE_RSP:
        if (this.state === 'closed') {
          this.finishLeg(); // the acknowledgement of our CLOSE_REQ
          return;
        }
        if (p.closeResponse.error) {
          this.fail(new TunnelError('tunnelclosed', this.destination, `connection to ${this.destination} closed by the hub: ${p.closeResponse.error}`));
          return;
        }
        // The destination closed the connection: deliver what was read, refuse further writes.
        this.state = 'closed';
        this.cleanupTimers();
        this.finishLeg();
        this.endReadable();
        if (this.pendingWrite) this.pendingWrite.callback(new TunnelError('closed', this.destination, `connection to ${this.destination} was closed by the destination`));
        this.pendingWrite = null;
        if (!this.writableEnded) this.end();
        return;
      default:
        return;
    }
  };

  // ------------------------------------------------------------ Duplex plumbing

  /** @internal */
  override _read(): void {
    this.leg?.resumeReading();
  }

  /** @internal */
  override _write(chunk: Buffer, _enc: BufferEncoding, callback: (err?: Error | null) => void): void {
    if (this.state === 'connecting') {
      this.pendingWrite = { chunk, callback };
      return;
    }
    if (this.state !== 'open' || !this.leg) {
      callback(new TunnelError('closed', this.destination, `connection to ${this.destination} is closed`));
      return;
    }
    this.sendData(this.leg, chunk, callback);
  }

  /**
   * Sends `chunk` from `offset` in MAX_DATA_CHUNK pieces, each only when the leg is ready for it (credit,
   * and room on the shared transport): a 1 GiB write goes through piece by piece, never as one 1 GiB queue.
   */
  private sendData(leg: Leg, chunk: Buffer, callback: (err?: Error | null) => void, offset = 0): void {
    while (offset < chunk.length) {
      if (this.state !== 'open' || this.leg !== leg) {
        callback(new TunnelError('closed', this.destination, `connection to ${this.destination} is closed`));
        return;
      }
      if (!leg.readyForData) {
        // Wait before queueing: 128 connections writing at once must not put a chunk each on the shared transport.
        leg.whenWritable(() => this.sendData(leg, chunk, callback, offset));
        return;
      }
      // Within the hub's credit: a piece never overshoots what the hub granted this connection.
      const piece = chunk.subarray(offset, offset + leg.allowance(Math.min(MAX_DATA_CHUNK, chunk.length - offset)));
      offset += piece.length;
      const ok = leg.send(packets.data(this.connectID, piece));
      this.bytesWritten += piece.length;
      this.touch();
      if (!ok) {
        leg.whenWritable(() => (offset < chunk.length ? this.sendData(leg, chunk, callback, offset) : callback()));
        return;
      }
    }
    callback();
  }

  /** @internal */
  override _final(callback: (err?: Error | null) => void): void {
    if (this.state === 'connecting') {
      this.pendingFinal = callback;
      return;
    }
    this.sendEnd();
    callback();
  }

  private sendEnd(): void {
    if (this.state !== 'open' || !this.leg) return;
    // Half-close needs our hub; towards an ANP hub, ending our side closes the connection.
    if (this.leg.halfClose) this.leg.send(packets.halfClose(this.connectID));
    else this.closeConnection();
  }

  private flushPending(): void {
    const w = this.pendingWrite;
    this.pendingWrite = null;
    if (w && this.leg) this.sendData(this.leg, w.chunk, w.callback);
    const f = this.pendingFinal;
    this.pendingFinal = null;
    if (f) {
      this.sendEnd();
      f();
    }
  }

  /** @internal */
  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    this.cleanupTimers();
    this.signal?.removeEventListener('abort', this.onAbort);
    if (this.state === 'connecting') {
      if (this.leg) {
        this.leg.send(packets.closeDial(this.random));
        this.leg.end();
      }
    } else if (this.state === 'open') {
      this.closeConnection();
    }
    this.state = 'closed';
    if (this.pendingWrite) this.pendingWrite.callback(err ?? new TunnelError('closed', this.destination, `connection to ${this.destination} destroyed`));
    this.pendingWrite = null;
    callback(err);
  }

  // ------------------------------------------------------------ teardown

  private readonly onAbort = (): void => {
    if (this.state === 'connecting') this.abandonDial(new TunnelError('context', this.destination, `dial ${this.destination} cancelled`));
    else this.destroy(new TunnelError('context', this.destination, `connection to ${this.destination} cancelled`));
  };

  private abandonDial(err: TunnelError): void {
    if (this.state !== 'connecting') return;
    this.destroy(err);
  }

  /** Full close: CLOSE_REQ, then wait (bounded) for the hub's CLOSE_RSP. */
  private closeConnection(): void {
    if (this.state !== 'open' || !this.leg) return;
    this.state = 'closed';
    if (this.leg.backedUp) {
      // Our unsent data would hold a CLOSE_REQ back (the hub paused this stream for lack of credit):
      // abort instead; the hub treats a cancelled stream as a close, like a TCP reset.
      this.leg.abort();
      return;
    }
    this.leg.send(packets.closeRequest(this.connectID));
    this.leg.resumeReading();
    this.closeTimer = setTimeout(() => this.leg?.abort(), CLOSE_ACK_MS);
  }

  private fail(err: TunnelError): void {
    this.clearDialTimer();
    this.state = 'closed';
    this.finishLeg();
    this.destroy(err);
  }

  private finishLeg(): void {
    if (this.closeTimer) clearTimeout(this.closeTimer);
    this.closeTimer = null;
    this.leg?.end();
  }

  private endReadable(): void {
    if (this.readEnded) return;
    this.readEnded = true;
    this.push(null);
  }

  private touch(): void {
    if (this.idleMs <= 0) {
      if (this.idleTimer) clearTimeout(this.idleTimer);
      this.idleTimer = null;
      return;
    }
    if (this.idleTimer) this.idleTimer.refresh();
    else this.idleTimer = setTimeout(() => {
      this.idleTimer = null;
      this.emit('timeout');
    }, this.idleMs);
  }

  private clearDialTimer(): void {
    if (this.dialTimer) clearTimeout(this.dialTimer);
    this.dialTimer = null;
  }

  private cleanupTimers(): void {
    this.clearDialTimer();
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = null;
  }
}
