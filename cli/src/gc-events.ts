// The collections V8 reports, for the two watchers that act on them (dead-buffers.ts, allocator-trim.ts).
import { PerformanceObserver } from 'node:perf_hooks';

/** A collection as V8 reports it (its kind in detail; tests build their own). */
export interface CollectionEntry {
  detail?: unknown;
}

/** The kind of a reported collection (perf_hooks' NODE_PERFORMANCE_GC_* constants). */
export function collectionKind(entry: CollectionEntry): number | undefined {
  return (entry.detail as { kind?: number } | null | undefined)?.kind;
}

/** Calls `fn` for every collection V8 reports from now on; returns what stops it. */
export function watchCollections(fn: (entry: CollectionEntry) => void): () => void {
  const observer = new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) fn(entry as CollectionEntry);
  });
  observer.observe({ entryTypes: ['gc'] });
  return () => observer.disconnect();
}
