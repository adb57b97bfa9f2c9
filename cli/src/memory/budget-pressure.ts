// Whether many peers at once are what the process holds bytes for: many connections holding bytes at
// once, or much of the budget held, and for the dead-Buffer governor also many connections passing bytes
// on at once. The governors of young and dead Buffers collect sooner then (young-buffers.ts,
// dead-buffers.ts), and go back to their usual pace once that is over. A bulk transfer, or a few, is none
// of these (one upload made the hub hold 31 MiB, an eighth of its budget, on one connection), so they
// never pay for the extra collections; a thousand stuck connections are all of them. While they fill, few
// hold bytes at any one moment but all pass a few KiB on each second, and what passes through waits on
// the agent link long enough to be promoted: the konnectivity-style hub held nothing in its budget while
// 60 MiB of dead Buffers piled up between two full collections. Young-buffers does not count those: its
// tight limit cost a bulk 10–30 % more CPU, and a busy agent has many connections passing bytes on.
import { bytesHeldInProcess, connectionsHoldingInProcess, largestBudgetInProcess } from '@cluster-proxy/proto';

/** Share of the budget held from which the governors tighten… */
export const TIGHT_SHARE = 1 / 8;
/** …and below which they relax again (apart, so they do not flap). */
export const RELAX_SHARE = 1 / 16;
/** Connections holding bytes (or passing bytes on) at once from which the governors tighten, whatever they hold… */
export const TIGHT_HOLDERS = 64;
/** …and below which (with the share below RELAX_SHARE) they relax again. */
export const RELAX_HOLDERS = 32;

export interface BudgetPressureOptions {
  /** Bytes the budgets hold now (tests substitute their own). */
  held?: () => number;
  /** What they may hold (tests substitute their own). */
  limit?: () => number;
  /** Connections holding bytes now (tests substitute their own). */
  holders?: () => number;
  /** Connections that passed bytes on lately (connectionsActiveInProcess); not counted without it. */
  active?: () => number;
}

export class BudgetPressure {
  private readonly held: () => number;
  private readonly limit: () => number;
  private readonly holders: () => number;
  private readonly active: () => number;
  private tightNow = false;

  constructor(opts: BudgetPressureOptions = {}) {
    this.held = opts.held ?? bytesHeldInProcess;
    this.limit = opts.limit ?? largestBudgetInProcess;
    this.holders = opts.holders ?? connectionsHoldingInProcess;
    this.active = opts.active ?? (() => 0);
  }

  /** Whether the budgets were tight at the last update(). */
  get tight(): boolean {
    return this.tightNow;
  }

  /** Reads the budgets again; returns whether they are tight now. Without a budget, nothing changes. */
  update(): boolean {
    const limit = this.limit();
    if (!(limit > 0)) return this.tightNow;
    const share = this.held() / limit;
    const many = Math.max(this.holders(), this.active());
    if (!this.tightNow && (share >= TIGHT_SHARE || many >= TIGHT_HOLDERS)) this.tightNow = true;
    else if (this.tightNow && share < RELAX_SHARE && many < RELAX_HOLDERS) this.tightNow = false;
    return this.tightNow;
  }
}
