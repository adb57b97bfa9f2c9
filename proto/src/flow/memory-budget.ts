// The bytes one process may hold on behalf of its peers, shared by every connection's receive
// window (flow-control.ts). A window starts at its initial size, grows only from what is free and
// only up to a fair share among the connections that are moving data, and shrinks when the budget
// is overdrawn. A connection that stops reading keeps what it was granted and no more, so N stuck
// connections hold at most what the budget allows, never N full windows. While many connections
// move, a reserve stays untouched; when only a few move (a bulk transfer beside stalled ones),
// they may grow into it, so connections that stalled together cannot starve the ones that follow.

export interface MemoryBudgetOptions {
  /** Largest window one connection may grow to. */
  maxWindow: number;
  /** Part of the limit only a few moving connections may grow into (default 1/2): as many as it
   * holds largest windows. While many move, they share the rest. */
  reserveShare?: number;
  /** A window wanted to grow and the budget said no (or less); the owner counts or logs it. */
  onThrottle?: (direction: string) => void;
  /** Bytes a connection must pass on within an epoch to count as moving (default 64 KiB). */
  minMovingBytes?: number;
  /** Clock for the "moving recently" epochs (tests). */
  now?: () => number;
}

export interface DirectionUsage {
  direction: string;
  /** Sum of the windows granted to senders (what they may make us hold). */
  committed: number;
  /** Bytes actually held now: received, not yet passed on. */
  buffered: number;
}

/** Connections that passed data on within this long count as moving (for the fair share). */
const EPOCH_MS = 1000;
/**
 * What a connection must pass on within an epoch to count as moving. A destination that stopped
 * reading still trickles (the kernel makes a little room in its full receive buffer now and then):
 * a thousand of those counted as moving would leave a bulk beside them a thousandth of the budget.
 */
const MIN_MOVING_BYTES = 64 * 1024;

/** Bytes every budget of this process holds now (the dead-Buffer governor watches it fall). */
let heldInProcess = 0;

/** What all budgets of this process hold now: received, not yet passed on. */
export function bytesHeldInProcess(): number {
  return heldInProcess;
}

/** Connections of this process whose budgets hold bytes of theirs now. */
let holdersInProcess = 0;

/** How many connections hold bytes now: many at once are peers that stopped reading, not a bulk transfer. */
export function connectionsHoldingInProcess(): number {
  return holdersInProcess;
}

/** The largest limit of the budgets made in this process (a hub or an agent makes one). */
let largestLimitInProcess = 0;

/** What the process may hold at most, for watchers that compare it with bytesHeldInProcess(). */
export function largestBudgetInProcess(): number {
  return largestLimitInProcess;
}

/** The budgets made in this process (weakly: a budget nothing else holds is gone), for connectionsActiveInProcess(). */
const budgetsInProcess = new Set<WeakRef<MemoryBudget>>();

/**
 * Connections of this process that passed bytes on lately (within this epoch or the last, any amount), over
 * every budget. A thousand connections filling at once are all active, at a few KiB a second each, while few
 * of them hold bytes at any one moment and none moves enough to count for the fair share.
 */
export function connectionsActiveInProcess(): number {
  return liveBudgets().reduce((n, budget) => n + budget.activeNow(), 0);
}

/** The budgets still alive; the references of those collected are dropped on the way. */
function liveBudgets(): MemoryBudget[] {
  const live: MemoryBudget[] = [];
  for (const ref of budgetsInProcess) {
    const budget = ref.deref();
    if (budget) live.push(budget);
    else budgetsInProcess.delete(ref);
  }
  return live;
}

export class MemoryBudget {
  private committedBytes = 0;
  private readonly usage = new Map<string, DirectionUsage>();
  /** Bytes each connection passed on in this epoch, and those over the threshold in this and the last. */
  private passed = new Map<object, number>();
  private moving = new Set<object>();
  private movingBefore = new Set<object>();
  /** How many connections passed bytes on in the last epoch (0 if it was longer ago). */
  private passedBefore = 0;
  private epochStart = 0;
  private readonly now: () => number;

  constructor(
    readonly limit: number,
    private readonly opts: MemoryBudgetOptions,
  ) {
    if (!(limit > 0)) throw new Error(`memory budget must be positive, got ${limit}`);
    largestLimitInProcess = Math.max(largestLimitInProcess, limit);
    this.now = opts.now ?? Date.now;
    // Dropping the collected ones here too bounds the set where nothing reads it (a process without the CLI).
    liveBudgets();
    budgetsInProcess.add(new WeakRef(this));
  }

  /** Connections that passed bytes on within this epoch or the last. */
  activeNow(): number {
    this.rotate();
    return Math.max(this.passed.size, this.passedBefore);
  }

  get maxWindow(): number {
    return this.opts.maxWindow;
  }

  get committed(): number {
    return this.committedBytes;
  }

  /** Committed beyond the limit (initial windows are granted even when it is short). */
  get overdrawn(): boolean {
    return this.committedBytes > this.limit;
  }

  commit(direction: string, bytes: number): void {
    this.committedBytes += bytes;
    this.entry(direction).committed += bytes;
  }

  release(direction: string, bytes: number): void {
    this.committedBytes -= bytes;
    this.entry(direction).committed -= bytes;
  }

  /** Bytes actually held by one connection changed by `delta`, to `now` (the gauge; decisions use committed). */
  held(direction: string, delta: number, now: number): void {
    this.entry(direction).buffered += delta;
    heldInProcess += delta;
    const before = now - delta;
    if (before <= 0 && now > 0) holdersInProcess++;
    else if (before > 0 && now <= 0) holdersInProcess--;
  }

  /** `conn` just passed `bytes` on. */
  markMoving(conn: object, bytes: number): void {
    this.rotate();
    const total = (this.passed.get(conn) ?? 0) + bytes;
    this.passed.set(conn, total);
    if (total >= (this.opts.minMovingBytes ?? MIN_MOVING_BYTES)) this.moving.add(conn);
  }

  forget(conn: object): void {
    this.passed.delete(conn);
    this.moving.delete(conn);
    this.movingBefore.delete(conn);
  }

  /**
   * How many bytes a window of `window` (initial `initial`) may grow by, at most `wanted`: no more
   * than is free (outside the reserve unless few connections move), and no more than a fair share
   * among the moving connections.
   */
  growth(direction: string, window: number, initial: number, wanted: number): number {
    this.rotate();
    const movingCount = Math.max(1, this.moving.size, this.movingBefore.size);
    const reserve = (this.opts.reserveShare ?? 0.5) * this.limit;
    const few = Math.max(1, Math.floor(reserve / this.opts.maxWindow));
    const ceiling = movingCount <= few ? this.limit : this.limit - reserve;
    const share = initial + (this.limit - reserve) / movingCount;
    const room = Math.min(wanted, this.opts.maxWindow - window, share - window, ceiling - this.committedBytes);
    const granted = Math.max(0, Math.floor(room));
    // Short only when the budget (share or ceiling) gave less than the largest window allows: a window
    // that reaches maxWindow is not held back (a lone bulk transfer logged "budget is short" before).
    if (granted < Math.min(wanted, this.opts.maxWindow - window)) this.opts.onThrottle?.(direction);
    return granted;
  }

  usageByDirection(): DirectionUsage[] {
    return [...this.usage.values()].map((u) => ({ ...u }));
  }

  private entry(direction: string): DirectionUsage {
    let u = this.usage.get(direction);
    if (!u) this.usage.set(direction, (u = { direction, committed: 0, buffered: 0 }));
    return u;
  }

  private rotate(): void {
    const t = this.now();
    if (t - this.epochStart < EPOCH_MS) return;
    // Two epochs without data: the older set is dropped.
    const recent = t - this.epochStart < 2 * EPOCH_MS;
    this.movingBefore = recent ? this.moving : new Set();
    this.passedBefore = recent ? this.passed.size : 0;
    this.moving = new Set();
    this.passed = new Map();
    this.epochStart = t;
  }
}

/**
 * Turns throttle events into at most one `report` per interval (how many happened since the last
 * one), for a log line that says the budget is short without flooding. No timer: events drive it.
 */
export function throttleReporter(
  intervalMs: number,
  report: (count: number, direction: string) => void,
  now: () => number = Date.now,
): (direction: string) => void {
  let last = Number.NEGATIVE_INFINITY;
  let count = 0;
  return (direction) => {
    count++;
    const t = now();
    if (t - last < intervalMs) return;
    last = t;
    report(count, direction);
    count = 0;
  };
}
