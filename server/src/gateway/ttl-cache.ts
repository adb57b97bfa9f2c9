// A small bounded cache with a lifetime per entry, for the gateway's TokenReview and SubjectAccessReview
// answers: entries expire after `ttlMs`, and past `maxEntries` the oldest goes first (a Map keeps
// insertion order). Concurrent misses for one key share one lookup, so a burst of requests with the same
// credential costs the hub's API server one review. No timers: expiry is checked on read.

export interface TtlCacheOptions {
  ttlMs: number;
  maxEntries: number;
  /** Clock, ms (tests). */
  now?: () => number;
}

export class TtlCache<V> {
  private readonly entries = new Map<string, { value: V; expires: number }>();
  private readonly pending = new Map<string, Promise<V>>();
  private readonly now: () => number;

  constructor(private readonly opts: TtlCacheOptions) {
    this.now = opts.now ?? Date.now;
  }

  get size(): number {
    return this.entries.size;
  }

  get(key: string): V | undefined {
    const e = this.entries.get(key);
    if (!e) return undefined;
    if (e.expires <= this.now()) {
      this.entries.delete(key);
      return undefined;
    }
    return e.value;
  }

  set(key: string, value: V, ttlMs = this.opts.ttlMs): void {
    this.entries.delete(key);
    if (ttlMs <= 0) return;
    this.entries.set(key, { value, expires: this.now() + ttlMs });
    while (this.entries.size > this.opts.maxEntries) {
      const oldest = this.entries.keys().next().value as string;
      this.entries.delete(oldest);
    }
  }

  /** The cached value, or `load()`'s (shared by concurrent callers; a rejection is not cached). */
  async getOrLoad(key: string, load: () => Promise<V>, ttlOf: (v: V) => number = () => this.opts.ttlMs): Promise<V> {
    const hit = this.get(key);
    if (hit !== undefined) return hit;
    const inFlight = this.pending.get(key);
    if (inFlight) return inFlight;
    const p = load()
      .then((v) => {
        this.set(key, v, ttlOf(v));
        return v;
      })
      .finally(() => this.pending.delete(key));
    this.pending.set(key, p);
    return p;
  }

  clear(): void {
    this.entries.clear();
  }
}
