// The collections V8 reports, for the watchers that act on them (dead-buffers.ts, allocator-trim.ts,
// young-buffers.ts). One observer serves them all: with young garbage kept short the agent reports
// ~100 collections a second, and each observer is handed every one.
import { PerformanceObserver } from 'node:perf_hooks';

/** A collection as V8 reports it (its kind in detail; tests build their own). */
export interface CollectionEntry {
  detail?: unknown;
}

/** The kind of a reported collection (perf_hooks' NODE_PERFORMANCE_GC_* constants). */
export function collectionKind(entry: CollectionEntry): number | undefined {
  return (entry.detail as { kind?: number } | null | undefined)?.kind;
}

type Watcher = (entry: CollectionEntry) => void;

const watchers = new Set<Watcher>();
let observer: PerformanceObserver | null = null;

/** Calls `fn` for every collection V8 reports from now on; returns what stops it. */
export function watchCollections(fn: (entry: CollectionEntry) => void): () => void {
  // Each call is its own watcher, even for the same function: stopping one leaves the others.
  const watcher: Watcher = (entry) => fn(entry);
  watchers.add(watcher);
  if (!observer) {
    observer = new PerformanceObserver((list) => {
      for (const entry of list.getEntries()) for (const w of watchers) w(entry as CollectionEntry);
    });
    observer.observe({ entryTypes: ['gc'] });
  }
  return () => {
    watchers.delete(watcher);
    if (watchers.size === 0 && observer) {
      observer.disconnect();
      observer = null;
    }
  };
}
