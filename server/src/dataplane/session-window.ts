// The HTTP/2 receive window of a gRPC client session on the hub's frontend: the session's
// SETTINGS_INITIAL_WINDOW_SIZE, which applies to every stream of the session (proto's H2Session), and
// a stream the hub pauses holds its whole window. So the window is sized for the session:
// - One stream (a konnectivity-client opens a session per connection): the session's window is the
//   connection's. It starts small (what a connection whose destination stalls may make the hub hold,
//   beside the agent's window, which the agent holds) and grows like a connection's ReceiveWindow
//   (flow-control.ts in proto), from the hub's memory budget, while the stream moves data and the hub
//   keeps reading it.
// - Several streams (our SDK on gRPC): the shared initial window (a connection's), and it grows the same
//   way while the session's streams move data, but all of them together may hold at most a sixteenth of
//   the budget, so a bulk stream beside a stalled one is not held to its initial window a round trip.
//   With many streams it shrinks below the shared initial window to stay within that share (1,024 stuck
//   streams held 64 MiB at 64 KiB each), not below MIN_SHARED_WINDOW.
//
// Every open stream is charged its window to the budget (a paused one holds that much): 1,024 konnectivity
// sessions of one stream each commit 8 MiB, which the budget sees.
//
//   single ──second stream──▶ shared (the shared initial window, less with many streams) ──down to one──▶ single (a grown window stays)
//   single, shared ──session closed──▶ closed (its charge goes back to the budget)
import { PROVEN_BULK_BYTES, type MemoryBudget } from '@cluster-proxy/proto';

/** A window grows only if it turned over within this long (as ReceiveWindow's). */
const GROWTH_TURNOVER_MS = 1000;
/** The share of the budget all streams of one shared session may hold in their windows together. */
const SHARED_BUDGET_SHARE = 1 / 16;
/** The least a shared session's streams get: one DATA frame of HTTP/2's default size. */
export const MIN_SHARED_WINDOW = 16 * 1024;

export interface SessionWindowOptions {
  /** The window a session's first stream starts with (the session's initial SETTINGS). */
  initial: number;
  /** The window the streams of a session with several start with (default `initial`). */
  sharedInitial?: number;
  /** The largest it may grow to. */
  max: number;
  budget: MemoryBudget;
  /** Gauge label of what it holds (to_agent: client bytes on their way to an agent). */
  direction: string;
}

type SessionWindowState = 'single' | 'shared' | 'closed';

export class SessionWindow {
  private state: SessionWindowState = 'single';
  private streams = 0;
  private window: number;
  /** What the session's streams are charged to the budget: the window once per open stream. */
  private charged = 0;
  /**
   * Bytes the session's streams were read in all, counted up to PROVEN_BULK_BYTES: the window grows only
   * after that, as the mux frontends' windows do (growOnceProven in flow-control.ts): a destination that
   * never reads takes a few hundred KiB past the agent before it stalls, which looks like a window turning
   * over quickly, and 256 konnectivity-style connections held 72 MiB of grown windows without this gate.
   */
  private readInAll = 0;
  /** Bytes read since the window last changed or a measurement restarted, and since when. */
  private turnover = 0;
  private since = Date.now();

  private readonly sharedInitial: number;

  constructor(
    private readonly session: { settings(s: { initialWindowSize: number }): void; readonly destroyed: boolean },
    private readonly opts: SessionWindowOptions,
  ) {
    this.window = opts.initial;
    this.sharedInitial = opts.sharedInitial ?? opts.initial;
  }

  get size(): number {
    return this.window;
  }

  streamOpened(): void {
    this.streams++;
    switch (this.state) {
      case 'single':
        if (this.streams > 1) {
          this.state = 'shared';
          this.setWindow(this.fitShare(this.sharedInitial));
        } else this.recharge();
        return;
      case 'shared':
        this.setWindow(this.fitShare(this.window));
        return;
      case 'closed':
        return;
    }
  }

  streamClosed(): void {
    this.streams = Math.max(0, this.streams - 1);
    switch (this.state) {
      case 'shared':
        if (this.streams <= 1) {
          // A grown window stays (charged once now); any other goes back to the initial.
          this.state = 'single';
          this.setWindow(this.window > this.sharedInitial ? this.window : this.opts.initial);
          this.restart();
        } else if (this.window < this.sharedInitial) {
          // Back up only once the larger window would use half the share: streams that open and close
          // around a step would otherwise send a SETTINGS frame each time.
          const larger = this.fitShare(this.sharedInitial, 0.5);
          this.setWindow(Math.max(this.window, larger));
        } else this.recharge();
        return;
      case 'single':
        this.recharge();
        return;
      case 'closed':
        return;
    }
  }

  /** The hub read `bytes` of one of the session's streams (the session returns them to the client's window as it does). */
  consumed(bytes: number): void {
    if (this.state === 'closed') return;
    this.opts.budget.markMoving(this, bytes);
    if (this.readInAll < PROVEN_BULK_BYTES) this.readInAll += bytes;
    this.turnover += bytes;
    if (this.turnover < this.window) return;
    if (this.readInAll >= PROVEN_BULK_BYTES && Date.now() - this.since <= GROWTH_TURNOVER_MS && this.window < this.opts.max) {
      const wanted = Math.min(3 * this.window, this.opts.max - this.window);
      let more = this.opts.budget.growth(this.opts.direction, this.window, this.opts.initial, wanted);
      if (this.state === 'shared') more = Math.min(more, Math.max(0, this.shareCap() - this.window));
      if (more > 0) this.setWindow(this.window + more);
    }
    this.restart();
  }

  /** The hub stopped reading a stream (its destination is slow): with one stream, what was read so far
   * says nothing of its speed; with several, the others' reading still counts. */
  paused(): void {
    if (this.state === 'single') this.restart();
  }

  close(): void {
    switch (this.state) {
      case 'closed':
        return;
      default:
        this.state = 'closed';
        this.opts.budget.release(this.opts.direction, this.charged);
        this.charged = 0;
        this.opts.budget.forget(this);
        this.window = this.opts.initial;
    }
  }

  private restart(): void {
    this.turnover = 0;
    this.since = Date.now();
  }

  /** What one stream of a shared session may hold: (a part of) the session's share of the budget over its streams. */
  private shareCap(part = 1): number {
    return Math.floor((this.opts.budget.limit * SHARED_BUDGET_SHARE * part) / Math.max(1, this.streams));
  }

  /** `size`, or less when the session's streams would hold more than (a part of) its share: halved step by
   * step (so that streams opening one by one change it now and then, not each time), not below MIN_SHARED_WINDOW. */
  private fitShare(size: number, part = 1): number {
    const cap = this.shareCap(part);
    let fitted = size;
    while (fitted > MIN_SHARED_WINDOW && fitted > cap) fitted = Math.max(MIN_SHARED_WINDOW, Math.floor(fitted / 2));
    return fitted;
  }

  private setWindow(size: number): void {
    const changed = size !== this.window;
    this.window = size;
    this.recharge();
    if (!changed) return;
    this.restart();
    if (this.session.destroyed) return;
    try {
      this.session.settings({ initialWindowSize: size });
    } catch {
      // The session already has as many SETTINGS waiting for the peer's ack as it allows: the peer
      // keeps the last window it saw until the next change.
    }
  }

  /** Charge the window once per open stream. */
  private recharge(): void {
    const want = this.state === 'closed' ? 0 : this.window * this.streams;
    if (want > this.charged) this.opts.budget.commit(this.opts.direction, want - this.charged);
    else if (want < this.charged) this.opts.budget.release(this.opts.direction, this.charged - want);
    this.charged = want;
  }
}
