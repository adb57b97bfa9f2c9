// A tunneled TCP connection, shaped like net.Socket: a Duplex with connect/timeout/half-close
// semantics, so HTTP clients and TLS can run over it. A "leg" carries its packets to the hub: its
// own gRPC stream, or a share of a multiplexed connection (legs.ts). States:
//   starting     waiting for the tunnel's transport (no leg yet)
//   dialing      DIAL_REQ sent on a leg, waiting for DIAL_RSP; writes and end() wait (timer running)
//   open         connected; each direction flows until it ends (`directions`, proto's HalfCloseDirections):
//                  inbound ended   the hub sent HALF_CLOSE (the destination's FIN): our readable has ended; we still write
//                  outbound ended  we sent HALF_CLOSE (end()): the destination still sends
//                  both ended      the hub's CLOSE_RSP comes once the destination's socket has closed
//   closing      we sent CLOSE_REQ (destroy(), or end() towards a hub without half-close); waiting for
//                CLOSE_RSP (timer running)
//   closed       the leg is finished (ended or aborted); every timer stopped
//
//   starting ──attach──▶ dialing ──DIAL_RSP──▶ open
//   open ──HALF_CLOSE──▶ open, inbound ended ──end()──▶ open, both ended
//   open ──end()──▶ open, outbound ended ──HALF_CLOSE──▶ open, both ended
//   open ──destroy()──▶ closing ──CLOSE_RSP, 5 s, leg broken──▶ closed
//   open ──CLOSE_RSP (the destination closed), an error, leg broken──▶ closed
//   starting, dialing ──dial timeout, abort, DIAL_RSP with an error, destroy(), no transport──▶ closed
// The Duplex has its own end: a closed connection still hands over what was read; the abort signal's
// listener goes when the Duplex is destroyed (as net.Socket's does).
import { randomBytes } from 'node:crypto';
import { Duplex } from 'node:stream';
import {
  HalfCloseDirections,
  MAX_DATA_CHUNK,
  PacketType,
  classifyDialError,
  packets,
  type DialResponse,
  type Packet,
} from '@cluster-proxy/proto';
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

type SocketState = 'starting' | 'dialing' | 'open' | 'closing' | 'closed';

/** After we close, how long we wait for the hub's CLOSE_RSP before giving up on it. */
const CLOSE_ACK_MS = 5000;

/** Random bytes drawn 1,024 dial IDs at a time: one call into the CSPRNG per 1,024 dials, not one per dial. */
const ID_POOL_BYTES = 8 * 1024;
let idPool = Buffer.alloc(0);
let idOffset = 0;

function randomDialID(): bigint {
  if (idOffset + 8 > idPool.length) {
    idPool = randomBytes(ID_POOL_BYTES);
    idOffset = 0;
  }
  const id = idPool.readBigUInt64BE(idOffset);
  idOffset += 8;
  // Positive int63, like Go's rand.Int63.
  return id >> 1n;
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
  private state: SocketState = 'starting';
  /** While open: inbound ended by the hub's HALF_CLOSE, outbound by ours (end()). */
  private readonly directions = new HalfCloseDirections();
  private connectID = 0;
  private readonly random = randomDialID();
  private leg: Leg | null = null;
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
    this.dialTimer = setTimeout(
      () => this.onDialTimeout(new TunnelError('timeout', destination, `dial ${destination} timed out after ${timeoutMs} ms`)),
      timeoutMs,
    );
    if (this.signal?.aborted) queueMicrotask(this.onAbort);
    else this.signal?.addEventListener('abort', this.onAbort, { once: true });
  }

  /** @internal Starts the dial on a leg from `factory` (the tunnel calls this once its transport is ready). */
  attach(factory: LegFactory): void {
    switch (this.state) {
      case 'starting':
        break;
      default:
        return; // closed before the transport was ready
    }
    const leg = factory.open(this.random, { onPacket: this.onPacket, onChunks: this.onChunks, onFailure: this.onLegFailure });
    this.leg = leg;
    this.state = 'dialing';
    leg.send(packets.dialRequest(this.destination, this.random));
  }

  /** @internal The transport could not be set up: fail like a dial would. */
  failToStart(err: TunnelError): void {
    switch (this.state) {
      case 'starting':
        this.enterClosed();
        this.destroy(err);
        return;
      default:
        return; // the tunnel calls it only instead of attach(); closed already
    }
  }

  // ------------------------------------------------------------ net.Socket look-alike

  /** True while the dial is in progress, as for `net.Socket`. */
  get pending(): boolean {
    return this.state === 'starting' || this.state === 'dialing';
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
      case PacketType.DIAL_RSP:
        this.onDialResponse(p.dialResponse);
        return;
      case PacketType.DATA:
        this.onData(p.data.data);
        return;
      case PacketType.HALF_CLOSE:
        this.onHalfClose();
        return;
      case PacketType.CLOSE_RSP:
        this.onCloseResponse(p.closeResponse.error);
        return;
      default:
        return;
    }
  };

  private onDialResponse(r: DialResponse): void {
    switch (this.state) {
      case 'dialing':
        if (r.random !== this.random) return; // another dial's: ignored
        break;
      default:
        return; // answered already, or given up
    }
    this.clearDialTimer();
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
  }

  private onData(data: Uint8Array): void {
    this.onChunks([data], data.length);
  }

  private readonly onChunks = (chunks: readonly Uint8Array[], n: number): void => {
    switch (this.state) {
      case 'open':
        if (this.directions.inbound === 'ended') return; // after the hub's HALF_CLOSE: ignored
        break;
      default:
        return; // not connected yet, or after the close: ignored
    }
    this.bytesRead += n;
    this.touch();
    let accepted = true;
    for (const chunk of chunks) accepted = this.push(chunk);
    this.leg!.received(n, accepted);
  };

  private onHalfClose(): void {
    switch (this.state) {
      case 'open':
        if (this.directions.endInbound()) this.push(null);
        return; // repeated: ignored
      default:
        return; // before the dial's answer, or after the close: ignored
    }
  }

  private onCloseResponse(error: string): void {
    let readable: boolean;
    switch (this.state) {
      case 'closing':
        this.finishLeg(); // the acknowledgement of our CLOSE_REQ
        return;
      case 'starting':
      case 'closed':
        return; // no leg yet; or finished already
      case 'dialing':
        readable = true;
        break;
      case 'open':
        readable = this.directions.inbound === 'open';
        break;
    }
    if (error) {
      this.fail(new TunnelError('tunnelclosed', this.destination, `connection to ${this.destination} closed by the hub: ${error}`));
      return;
    }
    // The destination closed the connection: deliver what was read, refuse further writes.
    this.finishLeg();
    if (readable) this.push(null);
    if (this.pendingWrite)
      this.pendingWrite.callback(
        new TunnelError('closed', this.destination, `connection to ${this.destination} was closed by the destination`),
      );
    this.pendingWrite = null;
    if (!this.writableEnded) this.end();
  }

  /** The leg broke (stream error, hub gone), or ended after we were done with it. */
  private readonly onLegFailure = (message: string): void => {
    switch (this.state) {
      case 'starting':
        return; // no leg yet
      case 'closing':
      case 'closed':
        // Our close needs no answer any more (or it came): let the leg go.
        this.enterClosed();
        this.leg?.abort();
        return;
      default:
        this.fail(new TunnelError('tunnelclosed', this.destination, `tunnel to ${this.destination} failed: ${message}`));
    }
  };

  // ------------------------------------------------------------ Duplex plumbing

  /** @internal */
  override _read(): void {
    switch (this.state) {
      case 'starting':
      case 'closed':
        return; // no leg yet; or nothing more comes
      default:
        this.leg!.resumeReading();
    }
  }

  /** @internal */
  override _write(chunk: Buffer, _enc: BufferEncoding, callback: (err?: Error | null) => void): void {
    switch (this.state) {
      case 'starting':
      case 'dialing':
        this.pendingWrite = { chunk, callback };
        return;
      case 'open':
        // No write follows end(), so the outbound direction is open here.
        if (this.directions.outbound === 'open') {
          this.sendData(this.leg!, chunk, callback);
          return;
        }
        break;
      default:
        break; // closing or closed
    }
    callback(new TunnelError('closed', this.destination, `connection to ${this.destination} is closed`));
  }

  /** Whether DATA may still go out (a write's pieces ask again after each wait). */
  private sending(leg: Leg): boolean {
    switch (this.state) {
      case 'open':
        return this.directions.outbound === 'open' && this.leg === leg;
      default:
        return false;
    }
  }

  /**
   * Sends `chunk` from `offset` in MAX_DATA_CHUNK pieces, each only when the leg is ready for it (credit,
   * and room on the shared transport): a 1 GiB write goes through piece by piece, never as one 1 GiB queue.
   */
  private sendData(leg: Leg, chunk: Buffer, callback: (err?: Error | null) => void, offset = 0): void {
    while (offset < chunk.length) {
      if (!this.sending(leg)) {
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
    switch (this.state) {
      case 'starting':
      case 'dialing':
        this.pendingFinal = callback;
        return;
      default:
        this.sendEnd();
        callback();
    }
  }

  /** Our side is done: HALF_CLOSE, or towards a hub without half-close, the close. */
  private sendEnd(): void {
    const leg = this.leg!;
    switch (this.state) {
      case 'open':
        if (this.directions.outbound === 'ended') return; // ended already
        if (!leg.halfClose) break;
        this.directions.endOutbound();
        leg.send(packets.halfClose(this.connectID));
        return;
      default:
        return; // closing or closed: nothing to end
    }
    // Half-close needs our hub; towards an ANP hub, ending our side closes the connection.
    this.closeConnection();
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
    this.clearDialTimer();
    this.clearIdleTimer();
    this.signal?.removeEventListener('abort', this.onAbort);
    switch (this.state) {
      case 'starting':
        this.enterClosed();
        break;
      case 'dialing':
        this.leg!.send(packets.closeDial(this.random));
        this.leg!.end();
        this.enterClosed();
        break;
      case 'open':
        this.closeConnection();
        break;
      case 'closing':
      case 'closed':
        break; // the close is under way, or over
    }
    if (this.pendingWrite)
      this.pendingWrite.callback(err ?? new TunnelError('closed', this.destination, `connection to ${this.destination} destroyed`));
    this.pendingWrite = null;
    callback(err);
  }

  // ------------------------------------------------------------ teardown

  private readonly onAbort = (): void => {
    switch (this.state) {
      case 'starting':
      case 'dialing':
        this.destroy(new TunnelError('context', this.destination, `dial ${this.destination} cancelled`));
        return;
      default:
        // Open or closed: the Duplex goes (a closed connection's unread bytes with it).
        this.destroy(new TunnelError('context', this.destination, `connection to ${this.destination} cancelled`));
    }
  };

  private onDialTimeout(err: TunnelError): void {
    switch (this.state) {
      case 'starting':
      case 'dialing':
        this.destroy(err);
        return;
      default:
        return; // the timer stops with the dial
    }
  }

  /** Full close: CLOSE_REQ, then wait (bounded) for the hub's CLOSE_RSP. */
  private closeConnection(): void {
    const leg = this.leg!;
    if (leg.backedUp) {
      // Our unsent data would hold a CLOSE_REQ back (the hub paused this stream for lack of credit):
      // abort instead; the hub treats a cancelled stream as a close, like a TCP reset.
      this.enterClosed();
      leg.abort();
      return;
    }
    this.state = 'closing';
    leg.send(packets.closeRequest(this.connectID));
    leg.resumeReading();
    this.closeTimer = setTimeout(this.onCloseTimeout, CLOSE_ACK_MS);
  }

  private readonly onCloseTimeout = (): void => {
    this.closeTimer = null;
    switch (this.state) {
      case 'closing':
        this.enterClosed();
        this.leg!.abort();
        return;
      default:
        return; // the timer stops with closing
    }
  };

  private fail(err: TunnelError): void {
    this.finishLeg();
    this.destroy(err);
  }

  /** Closed, and the leg finished normally. */
  private finishLeg(): void {
    this.enterClosed();
    this.leg?.end();
  }

  private enterClosed(): void {
    this.state = 'closed';
    this.clearDialTimer();
    this.clearIdleTimer();
    if (this.closeTimer) clearTimeout(this.closeTimer);
    this.closeTimer = null;
  }

  private touch(): void {
    switch (this.state) {
      case 'closed':
        return; // no timer starts once closed
      default:
        break;
    }
    if (this.idleMs <= 0) {
      this.clearIdleTimer();
      return;
    }
    if (this.idleTimer) this.idleTimer.refresh();
    else
      this.idleTimer = setTimeout(() => {
        this.idleTimer = null;
        this.emit('timeout');
      }, this.idleMs);
  }

  private clearDialTimer(): void {
    if (this.dialTimer) clearTimeout(this.dialTimer);
    this.dialTimer = null;
  }

  private clearIdleTimer(): void {
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = null;
  }
}
