// Whether peers that stopped reading are what the process holds bytes for: many connections holding
// bytes at once, or much of the budget held. The governors of young and dead Buffers collect sooner then
// (young-buffers.ts, dead-buffers.ts), and go back to their usual pace once that is over. A bulk
// transfer, or a few, is neither (one upload made the hub hold 31 MiB, an eighth of its budget, on one
// connection), so they never pay for the extra collections; a thousand stuck connections are both.
import { bytesHeldInProcess, connectionsHoldingInProcess, largestBudgetInProcess } from '@cluster-proxy/proto';

/** Share of the budget held from which the governors tighten… */
export const TIGHT_SHARE = 1 / 8;
/** …and below which they relax again (apart, so they do not flap). */
export const RELAX_SHARE = 1 / 16;
/** Connections holding bytes at once from which the governors tighten, whatever they hold… */
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
}

export class BudgetPressure {
  private readonly held: () => number;
  private readonly limit: () => number;
  private readonly holders: () => number;
  private tightNow = false;

  constructor(opts: BudgetPressureOptions = {}) {
    this.held = opts.held ?? bytesHeldInProcess;
    this.limit = opts.limit ?? largestBudgetInProcess;
    this.holders = opts.holders ?? connectionsHoldingInProcess;
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
    const holders = this.holders();
    if (!this.tightNow && (share >= TIGHT_SHARE || holders >= TIGHT_HOLDERS)) this.tightNow = true;
    else if (this.tightNow && share < RELAX_SHARE && holders < RELAX_HOLDERS) this.tightNow = false;
    return this.tightNow;
  }
}
