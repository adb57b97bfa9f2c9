// Freed memory given back to the kernel after full collections.
//
// glibc keeps the pages of freed allocations in its arenas (only the main arena's top is trimmed by
// itself, and Node's threads use others). A thousand stuck connections leave the hub with 100+ MiB
// of such pages after they are gone: Buffers, OpenSSL's and node's per-connection buffers. Nothing in
// Node calls malloc_trim, so we do (native-calls.ts, through FFI) after a full collection: that is
// when dead Buffers have just been freed. The backing stores are released by concurrent sweeping a
// little after the collection ends, hence the delay; the spacing keeps a busy process from trimming
// (and faulting the pages back in) more than once every few seconds.
import { canTrimAllocator, trimAllocator } from '@cluster-proxy/proto';
import { constants } from 'node:perf_hooks';
import { collectionKind, watchCollections } from './gc-events.js';

/** Wait after a full collection before trimming (sweeping frees backing stores meanwhile). */
export const TRIM_DELAY_MS = 1_000;
/** Least time between two trims. */
export const TRIM_SPACING_MS = 5_000;

export interface AllocatorTrimmerOptions {
  /** Gives free pages back (tests substitute their own). */
  trim?: () => void;
  now?: () => number;
  delayMs?: number;
  spacingMs?: number;
}

export class AllocatorTrimmer {
  private readonly trim: () => void;
  private readonly now: () => number;
  private readonly delayMs: number;
  private readonly spacingMs: number;
  private timer: NodeJS.Timeout | null = null;
  private stopWatching: (() => void) | null = null;
  private last = Number.NEGATIVE_INFINITY;
  private count = 0;

  constructor(opts: AllocatorTrimmerOptions = {}) {
    this.trim = opts.trim ?? (() => void trimAllocator());
    this.now = opts.now ?? Date.now;
    this.delayMs = opts.delayMs ?? TRIM_DELAY_MS;
    this.spacingMs = opts.spacingMs ?? TRIM_SPACING_MS;
  }

  /** Whether this platform can trim at all (glibc, FFI available). */
  static available(): boolean {
    return canTrimAllocator();
  }

  /** Trims done so far. */
  get trims(): number {
    return this.count;
  }

  /** Watches V8's full collections (whatever started them: V8, the dead-Buffer governor, a test). */
  start(): void {
    if (this.stopWatching) return;
    this.stopWatching = watchCollections((entry) => {
      if (collectionKind(entry) === constants.NODE_PERFORMANCE_GC_MAJOR) this.afterMajorCollection();
    });
  }

  /** A full collection ended: trim once the delay has passed, unless one ran within the spacing. */
  afterMajorCollection(): void {
    if (this.timer) return;
    const wait = Math.max(this.delayMs, this.last + this.spacingMs - this.now());
    this.timer = setTimeout(() => {
      this.timer = null;
      this.last = this.now();
      this.count++;
      this.trim();
    }, wait);
    // A pending trim never keeps a process alive.
    this.timer.unref();
  }

  stop(): void {
    this.stopWatching?.();
    this.stopWatching = null;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }
}
