// Dead Buffers that only a full collection frees, kept within an allowance.
//
// With external memory counted in V8's global heap limit (gc-tuning.ts), V8 no longer starts a full
// collection for every 64 MiB of Buffers allocated: right for bulk transfers, whose Buffers die young
// and go with the next young collection. Bytes held a while (queued for a slow peer, waiting for
// credit) outlive two young collections, are promoted, and once dead wait for a full collection,
// which the global limit may put hundreds of MiB away. A thousand connections starting at once left
// the hub with 220 MiB of dead Buffers within a second (`pnpm bench -- --only stuck-destination`),
// and the C allocator kept the pages after they were freed.
//
// So the Buffers' memory is read after each collection V8 reports. Young garbage makes it swing (its
// Buffers are swept a little after each young collection), so what counts is the least of every
// WINDOW readings: once that grew by more than the allowance since the last full collection, dead
// old Buffers are piling up and a full collection is asked for (asynchronously: V8 runs it as a task,
// not inside our callback).
//
// While the budgets are tight (budget-pressure.ts: many connections holding bytes or passing them on,
// as stuck ones do while they fill), the allowance and the window are smaller: a thousand stuck
// connections filling at once promote most of what passes through the hub (it waits for the agent's
// credit, or on the agent link), and the usual pair let 60 MiB of it pile up between two full
// collections. Applied for good, the smaller pair cost bulk transfers 3–6 % more CPU per GiB and up to
// 14 % of their speed; a bulk alone never tightens it (docs/measurements/log.md).
//
// Bytes released by connections that ended die without any allocation to notice: a process that
// held 180 MiB for a thousand stuck connections and then went quiet kept them (and their pages)
// until something else made V8 collect. So what the memory budgets hold is watched as well, after
// each collection and every few seconds: once it fell by more than the allowance since the last
// full collection, one is asked for. Reading it is reading a number; an idle process pays no more.
// The same timer notices a process that went quiet (no collection for a whole tick) with more
// Buffers than the first tick after the last full collection saw: the garbage of a transfer that
// ended, which a quiet process would keep (and its pages) until its next full collection, minutes
// away with the heap's growing factor at 2. One full collection is asked for then.
import { bytesHeldInProcess, connectionsActiveInProcess } from '@cluster-proxy/proto';
import { constants } from 'node:perf_hooks';
import { BudgetPressure } from './budget-pressure.js';
import { exposedGc } from './exposed-gc.js';
import { collectionKind, watchCollections, type CollectionEntry } from './gc-events.js';

/** Dead Buffers we let pile up before asking for a full collection. */
export const DEAD_BUFFER_ALLOWANCE = 32 * 1024 * 1024;
/** Young collections whose least reading is compared (a bulk transfer runs ~50 a second). */
export const WINDOW = 8;
/** The allowance and the window while the budgets are tight. */
export const TIGHT_DEAD_BUFFER_ALLOWANCE = 8 * 1024 * 1024;
export const TIGHT_WINDOW = 2;
/** How often held bytes and a quiet process's Buffers are looked at. */
export const RELEASE_CHECK_MS = 5_000;

export interface DeadBufferGovernorOptions {
  allowance?: number;
  /** Bytes held by ArrayBuffers now (tests substitute their own). */
  arrayBuffers?: () => number;
  /** Asks V8 for a full collection (tests substitute their own). */
  collect?: () => void;
  /** Bytes the memory budgets hold now (tests substitute their own). */
  held?: () => number;
  /** Whether the budgets are tight now (tests substitute their own). */
  tight?: () => boolean;
}

export class DeadBufferGovernor {
  private readonly allowance: number;
  private readonly arrayBuffers: () => number;
  private readonly collect: () => void;
  private readonly held: () => number;
  private readonly tight: () => boolean;
  private stopWatching: (() => void) | null = null;
  private releaseTimer: NodeJS.Timeout | null = null;
  /** The most the budgets held since the last full collection. */
  private heldPeak = 0;
  /** Collections V8 reported since the last tick (none: the process is quiet). */
  private collectionsSinceTick = 0;
  /** A full collection ran since the last tick; the next tick reads what it left live. */
  private majorSinceTick = false;
  /** The Buffers' memory the first tick after the last full collection saw. */
  private liveAfterMajor = 0;
  /** The least seen since the last full collection: what is live, plus dead old Buffers. */
  private floor = Number.POSITIVE_INFINITY;
  /** The least of the readings in the current window, and how many it has. */
  private windowLeast = Number.POSITIVE_INFINITY;
  private windowReadings = 0;
  /** A full collection was asked for and has not been seen yet. */
  private asked = false;
  private askedCount = 0;

  constructor(opts: DeadBufferGovernorOptions = {}) {
    this.allowance = opts.allowance ?? DEAD_BUFFER_ALLOWANCE;
    this.arrayBuffers = opts.arrayBuffers ?? (() => process.memoryUsage().arrayBuffers);
    this.collect = opts.collect ?? collectAsync;
    this.held = opts.held ?? bytesHeldInProcess;
    if (opts.tight) this.tight = opts.tight;
    else {
      const pressure = new BudgetPressure({ held: this.held, active: connectionsActiveInProcess });
      this.tight = () => pressure.update();
    }
  }

  /** Full collections asked for so far. */
  get asks(): number {
    return this.askedCount;
  }

  start(): void {
    if (this.stopWatching) return;
    this.stopWatching = watchCollections((entry) => this.afterCollection(entry));
    this.releaseTimer = setInterval(() => this.tick(), RELEASE_CHECK_MS);
    // Watching never keeps a process alive.
    this.releaseTimer.unref();
  }

  stop(): void {
    this.stopWatching?.();
    this.stopWatching = null;
    if (this.releaseTimer) clearInterval(this.releaseTimer);
    this.releaseTimer = null;
  }

  /** Every RELEASE_CHECK_MS: released held bytes, and a quiet process's dead Buffers. */
  tick(): void {
    this.checkReleased();
    const quiet = this.collectionsSinceTick === 0;
    this.collectionsSinceTick = 0;
    const buffers = this.arrayBuffers();
    if (this.majorSinceTick) {
      this.majorSinceTick = false;
      this.liveAfterMajor = buffers;
      return;
    }
    if (quiet && !this.asked && buffers - this.liveAfterMajor > this.allowance / 2) this.ask();
  }

  /** Asks for a full collection once the budgets hold more than the allowance less than they did. */
  checkReleased(): void {
    const held = this.held();
    this.heldPeak = Math.max(this.heldPeak, held);
    if (this.asked || this.heldPeak - held <= this.allowance) return;
    this.ask();
  }

  /** One collection V8 reported (its kind in entry.detail). */
  afterCollection(entry: CollectionEntry): void {
    const kind = collectionKind(entry);
    this.collectionsSinceTick++;
    if (kind === constants.NODE_PERFORMANCE_GC_MAJOR) {
      this.majorSinceTick = true;
      // Freed Buffers leave the count as they are swept, a little after the collection: the floor is
      // what the collections after it see.
      this.asked = false;
      this.floor = Number.POSITIVE_INFINITY;
      this.windowLeast = Number.POSITIVE_INFINITY;
      this.windowReadings = 0;
      this.heldPeak = this.held();
      return;
    }
    this.checkReleased();
    this.windowLeast = Math.min(this.windowLeast, this.arrayBuffers());
    const tight = this.tight();
    if (++this.windowReadings < (tight ? TIGHT_WINDOW : WINDOW)) return;
    const least = this.windowLeast;
    this.windowLeast = Number.POSITIVE_INFINITY;
    this.windowReadings = 0;
    this.floor = Math.min(this.floor, least);
    if (this.asked || least - this.floor <= (tight ? Math.min(this.allowance, TIGHT_DEAD_BUFFER_ALLOWANCE) : this.allowance)) return;
    this.ask();
  }

  private ask(): void {
    this.asked = true;
    this.askedCount++;
    this.collect();
  }
}

/** A full collection, run by V8 as a task rather than inside our callback. */
function collectAsync(): void {
  exposedGc()({ type: 'major', execution: 'async' });
}
