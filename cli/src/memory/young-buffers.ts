// Young garbage kept short while memory is what is short (the agent's; main.ts says why not the hub's).
//
// A transfer's Buffers (a TLS record or a socket read each) die young, but V8 frees them only at a
// young collection, which their few JavaScript objects rarely start: with 2 MiB semi-spaces
// (gc-tuning.ts) 30–50 MiB of dead Buffers wait at a time during a bulk transfer. V8 also starts a
// young collection once young Buffers reach a size, 128 MiB by default. Lowered to 8 MiB for good, a
// lone upload took the agent to 94 MiB instead of 121, but cost hub and agent 10–30 % more CPU per GiB
// and up to 15 % of the speed (the collections, and Buffers still in flight promoted early). So the
// lower limit applies only while the memory budgets are tight (budget-pressure.ts: connections
// waiting on slow peers), and V8's default comes back once they relax: a lone transfer never pays,
// and the agent beside 1,024 stuck connections peaked at 130 MiB instead of 152 on `tunnel-grpc`
// (`pnpm bench -- --only stuck-destination`), its bulk as fast as before.
import { BudgetPressure, type BudgetPressureOptions } from './budget-pressure.js';
import { collectYoungBuffersAt } from './gc-tuning.js';
import { watchCollections } from './gc-events.js';

/** Young Buffers that start a young collection while memory is short. */
export const TIGHT_YOUNG_BUFFERS = 8 * 1024 * 1024;

export interface YoungBufferLimitOptions extends BudgetPressureOptions {
  /** Sets the young Buffers that start a young collection; null: V8's default (tests substitute their own). */
  apply?: (bytes: number | null) => void;
}

export class YoungBufferLimit {
  private readonly pressure: BudgetPressure;
  private readonly apply: (bytes: number | null) => void;
  private stopWatching: (() => void) | null = null;
  private tightNow = false;

  constructor(opts: YoungBufferLimitOptions = {}) {
    this.pressure = new BudgetPressure(opts);
    this.apply = opts.apply ?? collectYoungBuffersAt;
  }

  /** Whether young garbage is being kept short now. */
  get tight(): boolean {
    return this.tightNow;
  }

  /** Looks again after every collection: held bytes grow only as Buffers arrive, which collections follow. */
  start(): void {
    if (this.stopWatching) return;
    this.stopWatching = watchCollections(() => this.update());
  }

  /** Stops watching and gives V8's default back. */
  stop(): void {
    this.stopWatching?.();
    this.stopWatching = null;
    if (this.tightNow) this.set(false);
  }

  update(): void {
    const tight = this.pressure.update();
    if (tight !== this.tightNow) this.set(tight);
  }

  private set(tight: boolean): void {
    this.tightNow = tight;
    this.apply(tight ? TIGHT_YOUNG_BUFFERS : null);
  }
}
