// A quiet process's heap made small after a full collection.
//
// An ordinary full collection leaves V8's young generation at the size start-up or traffic grew it
// to (two semi-spaces of 2 MiB here, gc-tuning.ts, both resident) and keeps the old generation's
// emptied pages. Only a memory-reducing collection shrinks the young generation and gives those back,
// and V8's own memory reducer starts one 8 s after the last full collection at the earliest, and
// after start-up at most a few times until the heap has grown by a tenth. So after a full collection
// (whoever started it: V8, the dead-Buffer governor, a test) that no young collection follows within
// QUIET_MS, and in which the process used under QUIET_CPU_SHARE of a core (a slow transfer may go a
// second without a young collection, not without CPU), the process is quiet and one
// memory-reducing collection runs: V8's gc() in its last-resort flavour, full collections until
// nothing more is freed (two on an idle hub or agent, ~10–30 ms in all). They stop the process while
// they run, so only a heap of at most HEAP_LIMIT live bytes is reduced this way: a larger one (a hub
// with thousands of agents) is left to V8's incremental memory reducer. allocator-trim.ts then gives
// the freed pages back. Anonymous memory at start (`pnpm bench -- --only idle-rss`, read 6.5 s after
// the bench's own full collection): agent 22 → 17 MiB, hub 25 → 20.
import { constants } from 'node:perf_hooks';
import { getHeapStatistics } from 'node:v8';
import { exposedGc } from './exposed-gc.js';
import { collectionKind, watchCollections, type CollectionEntry } from './gc-events.js';

/** No young collection for this long after a full one: the process is quiet. */
export const QUIET_MS = 1_000;

/** CPU time (all threads) over the quiet time, as a share of it, below which the process is quiet. */
export const QUIET_CPU_SHARE = 0.1;

/** Live heap bytes (after the full collection) up to which a quiet process's heap is reduced. */
export const HEAP_LIMIT = 64 * 1024 * 1024;

/** A collection as the watchers are handed it, with its start (performance.now() time). */
type TimedEntry = CollectionEntry & { startTime?: number };

export interface IdleHeapReducerOptions {
  /** Runs a memory-reducing full collection, synchronously (tests substitute their own). */
  reduce?: () => void;
  quietMs?: number;
  /** V8's live heap bytes now (tests substitute their own). */
  heapUsed?: () => number;
  heapLimit?: number;
  /** CPU milliseconds the process has used so far, all threads (tests substitute their own). */
  cpuMs?: () => number;
}

export class IdleHeapReducer {
  private readonly reduce: () => void;
  private readonly quietMs: number;
  private readonly heapUsed: () => number;
  private readonly heapLimit: number;
  private readonly cpuMs: () => number;
  /** CPU milliseconds used when the timer was armed. */
  private cpuAtArm = 0;
  private timer: NodeJS.Timeout | null = null;
  private stopWatching: (() => void) | null = null;
  /** When our last reduction ran (performance.now() times): the collections it reports are ours. */
  private ownFrom = Number.POSITIVE_INFINITY;
  private ownTo = Number.NEGATIVE_INFINITY;
  private count = 0;

  constructor(opts: IdleHeapReducerOptions = {}) {
    this.reduce = opts.reduce ?? reduceHeap;
    this.quietMs = opts.quietMs ?? QUIET_MS;
    this.heapUsed = opts.heapUsed ?? (() => getHeapStatistics().used_heap_size);
    this.heapLimit = opts.heapLimit ?? HEAP_LIMIT;
    this.cpuMs = opts.cpuMs ?? processCpuMs;
  }

  /** Memory-reducing collections run so far. */
  get reductions(): number {
    return this.count;
  }

  start(): void {
    if (this.stopWatching) return;
    this.stopWatching = watchCollections((entry) => this.afterCollection(entry));
  }

  stop(): void {
    this.stopWatching?.();
    this.stopWatching = null;
    this.cancel();
  }

  /** One collection V8 reported: a full one (not ours, on a small heap) arms the timer, a young one disarms it. */
  afterCollection(entry: TimedEntry): void {
    const kind = collectionKind(entry);
    if (kind === constants.NODE_PERFORMANCE_GC_MINOR) {
      this.cancel();
      return;
    }
    if (kind !== constants.NODE_PERFORMANCE_GC_MAJOR) return;
    const at = entry.startTime;
    if (at !== undefined && at >= this.ownFrom && at <= this.ownTo) return;
    this.cancel();
    if (this.heapUsed() > this.heapLimit) return;
    this.cpuAtArm = this.cpuMs();
    this.timer = setTimeout(() => this.run(), this.quietMs);
    // A pending reduction never keeps a process alive.
    this.timer.unref();
  }

  private run(): void {
    this.timer = null;
    if (this.cpuMs() - this.cpuAtArm > this.quietMs * QUIET_CPU_SHARE) return;
    this.count++;
    this.ownFrom = performance.now();
    this.reduce();
    this.ownTo = performance.now();
  }

  private cancel(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }
}

function processCpuMs(): number {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1000;
}

function reduceHeap(): void {
  exposedGc()({ type: 'major', execution: 'sync', flavor: 'last-resort' });
}
