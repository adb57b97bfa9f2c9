// Per-connection flow control for connections multiplexed over one AgentService.Connect stream.
//
// ANP has none: a slow reader on one connection stalls the shared stream (ANP's issues
// https://github.com/kubernetes-sigs/apiserver-network-proxy/issues/180 and …/issues/881). With the
// "credit" capability each side may have at most `window` unacknowledged bytes in flight per
// connection; the receiver returns credit as bytes leave its process. The shared stream is then
// always read at once, so HTTP/2 never stalls it on behalf of one connection. See proto/README.md.

import type { MemoryBudget } from './memory-budget.js';

/** A window that turned over within this long belongs to a connection moving data fast. */
const QUICK_TURNOVER_MS = 50;
/**
 * A window grows only if it turned over within this long: no window is more than a second of what
 * its connection moves. A destination that stopped reading still trickles now and then (the kernel
 * making room in its full receive buffer); without this, a thousand of them grew their windows.
 */
const GROWTH_TURNOVER_MS = 1000;
/**
 * What a sink must have taken before onBulk: more than a destination that never reads accepts into
 * its kernel receive buffer (tcp_rmem's default, 128 KiB, grows only for a reader that reads), which
 * otherwise looks like a window turned over quickly.
 */
export const PROVEN_BULK_BYTES = 1024 * 1024;

/** Sending side: how much more we may send on one connection. `null` window = peer has no credit
 * support (unmodified ANP), so only the shared stream's own backpressure applies. */
export class SendCredit {
  private available: number;
  readonly enabled: boolean;

  /** `onExhausted` runs each time the credit runs out (a flow-control stall: the sender must wait
   * for the receiver). A callback, so metrics live with the owner, not in the protocol package. */
  constructor(
    window: number | null,
    private readonly onExhausted?: () => void,
  ) {
    this.enabled = window !== null;
    this.available = window ?? Number.POSITIVE_INFINITY;
  }

  canSend(): boolean {
    return this.available > 0;
  }

  /** Our senders stay within the credit (allowance()); an older peer's chunk may overshoot it by one chunk. */
  consume(bytes: number): void {
    if (!this.enabled) return;
    const had = this.available > 0;
    this.available -= bytes;
    if (had && this.available <= 0) this.onExhausted?.();
  }

  /** Returns true when this grant unblocked a sender that was out of credit. */
  grant(bytes: number): boolean {
    if (!this.enabled) return false;
    const wasBlocked = this.available <= 0;
    this.available += bytes;
    return wasBlocked && this.available > 0;
  }

  get remaining(): number {
    return this.available;
  }

  /** How many of `bytes` may be sent now: all of them without credit, else what the credit covers. */
  allowance(bytes: number): number {
    return this.enabled ? Math.max(0, Math.min(bytes, this.available)) : bytes;
  }
}

/** Where received bytes go: a socket, or a gRPC call wrapped to take Buffers. The callback runs
 * once the chunk has left the sink's own buffer (written to the kernel / handed to HTTP/2). */
export interface ByteSink {
  write(chunk: Buffer, callback: (err?: Error | null) => void): boolean;
  /**
   * One payload of several chunks (`length` bytes; a DATA frame as the TLS records it arrived in),
   * sent on together; the callback runs once all of it has left. Without it a socket's cork() and
   * uncork() make the chunks one writev, and any other sink is handed them copied into one Buffer.
   */
  writeChunks?(chunks: readonly Buffer[], length: number, callback: (err?: Error | null) => void): void;
  cork?(): void;
  uncork?(): void;
}

/** Whether the kernel under a sink has sent what the sink took (sent-gate.ts's SentGate). */
export interface KernelSentGate {
  /** True if it has; otherwise false, and `then` runs once it has, unless disposed first. */
  passes(then: () => void): boolean;
  dispose(): void;
}

export interface ReceiveWindowOptions {
  sink: ByteSink;
  /** The window the sender starts with (announced in the handshake). */
  initial: number;
  /** Where the window is charged; growth comes from it. */
  budget: MemoryBudget;
  /** Gauge label: which way these bytes travel (to_agent, to_client, to_endpoint). */
  direction: string;
  /** Called with bytes of credit to return; the owner turns it into a CREDIT packet (or nothing for
   * a peer without credit support). */
  report: (bytes: number) => void;
  /** Count buffered bytes in the budget's gauge (default true; false when the sink counts them itself). */
  gauge?: boolean;
  /**
   * Called once, the first time a whole window went through within a second with the sink keeping
   * up, after PROVEN_BULK_BYTES in all: its reader takes a bulk transfer, so a socket may now keep
   * more unsent in the kernel (socket-options.ts). Whether the budget let the window grow does not
   * matter here.
   */
  onBulk?: () => void;
  /**
   * The window grows only once PROVEN_BULK_BYTES have gone through. For the hub's windows toward its
   * clients: a destination that never reads takes a few hundred KiB into the kernel buffers past the
   * agent before it stalls, which looks like a window turning over quickly, and the grown windows of many
   * such connections would hold their bytes in the hub. A client far from the hub pays for it once per
   * connection: its first MiB up moves one initial window per round trip.
   */
  growOnceProven?: boolean;
  /**
   * The sink's socket, when its kernel's unsent bytes can be read (sent-gate.ts): until onBulk, credit
   * for flushed bytes goes back only once the kernel has sent them, so a destination that stops reading
   * holds one window in all, not one in the kernel and the next in our process. Disposed with the window.
   */
  gate?: KernelSentGate | null;
}

/**
 * Receiving side of one connection: writes chunks to the sink in order and returns credit as each
 * chunk leaves the sink's buffer (its write callback). Counting per chunk, rather than waiting for
 * 'drain' (which needs an empty buffer), keeps credit flowing while data streams through.
 *
 * The window is what the sender may make us hold. It starts small and grows fourfold, from the budget,
 * each time a whole window has passed through quickly, or while the sender used most of its credit,
 * and the sink kept up (a bulk transfer), in the spirit of TCP's receive autotuning; a sink that stops
 * reading keeps the window it had, and an overdrawn budget takes flushed bytes back instead of
 * returning them.
 */
const ignore = (): void => {};

export class ReceiveWindow {
  private window: number;
  /** Credit the sender still holds (granted − received); negative when it overshot. */
  private outstanding: number;
  private pendingBytes = 0;
  private owed = 0;
  /** Bytes flushed since the window last changed. */
  private turnover = 0;
  /** The least credit the sender had left since then, and when that began. */
  private lowWater: number;
  private measuringSince = Date.now();
  private disposed = false;
  /** When bytes last went to the sink's reader, or began to wait for it (a stall policy's clock). */
  private movedAt = Date.now();
  /** Bytes flushed in all, counted up to PROVEN_BULK_BYTES. */
  private flushedInAll = 0;
  private bulkSeen: boolean;
  /** Bytes flushed into the kernel whose credit waits for the gate (it has not sent them yet). */
  private unsent = 0;
  private gate: KernelSentGate | null;

  constructor(private readonly opts: ReceiveWindowOptions) {
    this.window = opts.initial;
    // Nothing to do at the proof without a hook or a gate to drop.
    this.bulkSeen = opts.onBulk === undefined && !opts.gate;
    this.outstanding = opts.initial;
    this.lowWater = opts.initial;
    this.gate = opts.gate ?? null;
    opts.budget.commit(opts.direction, opts.initial);
  }

  /** Bytes handed to the sink that it has not yet flushed. */
  get buffered(): number {
    return this.pendingBytes;
  }

  /** The window now (initial, grown or shrunk). */
  get size(): number {
    return this.window;
  }

  /** How long the bytes buffered now have waited with none of them flushed (0: none wait). */
  stalledFor(now: number): number {
    return this.pendingBytes > 0 ? now - this.movedAt : 0;
  }

  /** Bytes the sender sent beyond the credit we gave it. */
  get overrun(): number {
    return Math.max(0, -this.outstanding);
  }

  /** Optional hook: the sink has flushed everything (used to lift stream-wide pressure). */
  onFlushed?: () => void;

  write(chunk: Buffer): void {
    this.writeChunks([chunk], chunk.length);
  }

  /** One payload as the chunks it arrived in (`n` bytes in all): counted once, flushed together. */
  writeChunks(chunks: readonly Buffer[], n: number): void {
    this.outstanding -= n;
    if (this.outstanding < this.lowWater) this.lowWater = this.outstanding;
    if (this.pendingBytes === 0) this.movedAt = Date.now();
    this.pendingBytes += n;
    this.gauge(n);
    const done = (err?: Error | null): void => {
      if (this.disposed) return;
      this.pendingBytes -= n;
      this.gauge(-n);
      if (err) return;
      this.movedAt = Date.now();
      this.settle(n);
      if (this.pendingBytes === 0) this.onFlushed?.();
    };
    const { sink } = this.opts;
    const last = chunks.length - 1;
    if (last === 0) sink.write(chunks[0]!, done);
    else if (sink.writeChunks) sink.writeChunks(chunks, n, done);
    else if (sink.cork && sink.uncork) {
      sink.cork();
      for (let i = 0; i < last; i++) sink.write(chunks[i]!, ignore);
      sink.write(chunks[last]!, done); // in order: its callback says the whole payload left
      sink.uncork();
    } else sink.write(Buffer.concat(chunks, n), done);
  }

  /** The connection is closed: its window goes back to the budget; late callbacks change nothing. */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    const { budget, direction } = this.opts;
    budget.release(direction, this.window);
    this.gate?.dispose();
    const pending = this.pendingBytes;
    this.pendingBytes = 0;
    this.gauge(-pending);
    budget.forget(this);
  }

  /** Starts a new turnover measurement (after a resize, or when the last one took too long). */
  private startMeasuring(): void {
    this.turnover = 0;
    this.lowWater = this.outstanding;
    this.measuringSince = Date.now();
  }

  private gauge(delta: number): void {
    if (this.opts.gauge !== false) this.opts.budget.held(this.opts.direction, delta, this.pendingBytes);
  }

  /** `n` bytes left the sink's buffer: their credit goes back now, or once the gate says the kernel sent them. */
  private settle(n: number): void {
    const gate = this.gate;
    if (!gate) {
      this.flushed(n);
      return;
    }
    this.unsent += n;
    if (gate.passes(this.releaseUnsent)) this.releaseUnsent();
  }

  private readonly releaseUnsent = (): void => {
    if (this.disposed) return;
    const n = this.unsent;
    this.unsent = 0;
    if (n > 0) this.flushed(n);
  };

  private flushed(bytes: number): void {
    const { budget, direction, initial } = this.opts;
    this.owed += bytes;
    this.turnover += bytes;
    if (this.flushedInAll < PROVEN_BULK_BYTES) this.flushedInAll += bytes;
    if (budget.overdrawn && this.window > initial) {
      const back = Math.min(this.owed, this.window - initial);
      this.window -= back;
      this.owed -= back;
      this.startMeasuring();
      budget.release(direction, back);
    } else if (this.turnover >= this.window) {
      // A whole window went through within a second and the sink kept up, and the sender used most of
      // its credit (a long round trip) or the window turned over quickly (a short one, with credit
      // always on its way): a bulk transfer. Grow fourfold: it reaches the largest window within a
      // few MiB. Otherwise measure again from here.
      const took = Date.now() - this.measuringSince;
      const bulk =
        took <= GROWTH_TURNOVER_MS &&
        this.pendingBytes <= this.window / 2 &&
        (this.lowWater <= this.window / 2 || took <= QUICK_TURNOVER_MS);
      const proven = this.flushedInAll >= PROVEN_BULK_BYTES;
      if (bulk && !this.bulkSeen && proven) {
        this.bulkSeen = true;
        this.gate?.dispose();
        this.gate = null;
        this.opts.onBulk?.();
      }
      const mayGrow = bulk && (proven || this.opts.growOnceProven !== true);
      const more = mayGrow ? budget.growth(direction, this.window, initial, 3 * this.window) : 0;
      if (more > 0) {
        this.window += more;
        this.owed += more;
        budget.commit(direction, more);
      }
      this.startMeasuring();
    }
    if (this.owed >= Math.max(1, Math.floor(this.window / 8))) {
      // Moving: once per credit batch is enough for the fair share (it looks at the last second or two).
      const n = this.owed;
      budget.markMoving(this, n);
      this.owed = 0;
      this.outstanding += n;
      this.opts.report(n);
    }
  }
}
