// The HTTP/2 receive window of a gRPC client session on the hub's frontend. node:http2 has no
// per-stream window, only the session's SETTINGS_INITIAL_WINDOW_SIZE, which applies to every stream of
// the session. A konnectivity-client opens a session per connection, so there the session's window is
// the connection's: it starts small (what a connection whose destination stalls may make the hub hold)
// and grows like a connection's ReceiveWindow (flow-control.ts in proto), from the hub's memory budget,
// while its one stream moves data and the hub keeps reading it. A session with several streams (our SDK
// on gRPC) keeps the small window: growing it would grow every stream at once. With many streams it
// shrinks instead, so that all of them together may hold at most a share of the budget (every paused
// stream holds its window in Node's buffer: 1,024 stuck streams held 64 MiB at 64 KiB each).
//
//   single ──second stream──▶ shared (back to the initial window, less with many streams) ──down to one──▶ single
//   single, shared ──session closed──▶ closed (the growth goes back to the budget)
import type http2 from 'node:http2';
import type { MemoryBudget } from '@cluster-proxy/proto';

/** A window grows only if it turned over within this long (as ReceiveWindow's). */
const GROWTH_TURNOVER_MS = 1000;
/** The share of the budget all streams of one shared session may hold in their windows together. */
const SHARED_BUDGET_SHARE = 1 / 16;
/** The least a shared session's streams get: one DATA frame of HTTP/2's default size. */
export const MIN_SHARED_WINDOW = 16 * 1024;

export interface SessionWindowOptions {
  /** The window every stream starts with (the session's initial SETTINGS). */
  initial: number;
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
  /** Bytes read since the window last changed or a measurement restarted, and since when. */
  private turnover = 0;
  private since = Date.now();

  constructor(private readonly session: Pick<http2.ServerHttp2Session, 'settings' | 'destroyed'>, private readonly opts: SessionWindowOptions) {
    this.window = opts.initial;
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
          this.setWindow(this.sharedWindow());
        }
        return;
      case 'shared':
        this.setWindow(this.sharedWindow());
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
          this.state = 'single';
          this.setWindow(this.opts.initial);
          this.restart();
        } else this.setWindow(this.sharedWindow());
        return;
      case 'single':
      case 'closed':
        return;
    }
  }

  /** The hub read `bytes` of the stream (Node returns them to the client's window as it does). */
  consumed(bytes: number): void {
    switch (this.state) {
      case 'single':
        break;
      case 'shared':
      case 'closed':
        return;
    }
    this.opts.budget.markMoving(this, bytes);
    this.turnover += bytes;
    if (this.turnover < this.window) return;
    if (Date.now() - this.since <= GROWTH_TURNOVER_MS && this.window < this.opts.max) {
      const more = this.opts.budget.growth(this.opts.direction, this.window, this.opts.initial, Math.min(3 * this.window, this.opts.max - this.window));
      if (more > 0) this.setWindow(this.window + more);
    }
    this.restart();
  }

  /** The hub stopped reading the stream (its destination is slow): what was read so far says nothing of its speed. */
  paused(): void {
    this.restart();
  }

  close(): void {
    switch (this.state) {
      case 'closed':
        return;
      default:
        this.state = 'closed';
        this.opts.budget.release(this.opts.direction, this.growth(this.window));
        this.opts.budget.forget(this);
        this.window = this.opts.initial;
    }
  }

  private restart(): void {
    this.turnover = 0;
    this.since = Date.now();
  }

  /** The window of every stream of a shared session: the initial one, or less when that many streams
   * would hold more than their share of the budget (halved step by step, not below MIN_SHARED_WINDOW). */
  private sharedWindow(): number {
    const share = this.opts.budget.limit * SHARED_BUDGET_SHARE;
    let size = this.opts.initial;
    while (size > MIN_SHARED_WINDOW && size * this.streams > share) size /= 2;
    return Math.max(MIN_SHARED_WINDOW, size);
  }

  /** What a window holds beyond the initial one: that much is charged to the budget. */
  private growth(size: number): number {
    return Math.max(0, size - this.opts.initial);
  }

  private setWindow(size: number): void {
    if (size === this.window) return;
    const delta = this.growth(size) - this.growth(this.window);
    if (delta > 0) this.opts.budget.commit(this.opts.direction, delta);
    else if (delta < 0) this.opts.budget.release(this.opts.direction, -delta);
    this.window = size;
    this.restart();
    if (this.session.destroyed) return;
    try {
      this.session.settings({ initialWindowSize: size });
    } catch {
      // The session is closing: its close() returns the growth.
    }
  }
}
