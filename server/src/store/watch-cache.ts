// A store kind mirrored in memory by one list and a watch (an informer, in Kubernetes' words), for loops
// that read every object often: the addon manager's status pass read every addon and lease from the store
// each 7.5 s (5,000 of each at fleet scale, each copied), where the watch delivers only what changed.
// The mirror holds what the store holds for that kind, no more; objects are shared, never to be mutated.
import type { Logger } from 'pino';
import type { Kind, ObjectOfKind } from './objects.js';
import type { ListOptions, ObjectKey, Store, Watch } from './store.js';
import { TurnBudget } from './turns.js';

/** After a watch ends (e.g. GoneError), list and watch again after this long (doubling up to the max). */
const RESTART_MIN_MS = 500;
const RESTART_MAX_MS = 30_000;
/** A list is projected this many objects at a time at most, the event loop turning between (5,000 ManifestWorks took 2 s). */
const PROJECT_BATCH = 128;

export interface WatchCacheOptions<K extends Kind> {
  store: Store;
  kind: K;
  /** Which objects (a namespace, labels); all of the kind when absent. */
  select?: ListOptions;
  log: Logger;
  /** Called after each change the watch delivers (not for the initial list), with what the mirror held before. */
  onChange?: (obj: ObjectOfKind<K>, deleted: boolean, previous: ObjectOfKind<K> | undefined) => void;
  /** What the mirror keeps of each object (default: all of it); a loop that reads a few fields of large objects keeps those. */
  project?: (obj: ObjectOfKind<K>, previous: ObjectOfKind<K> | undefined) => ObjectOfKind<K>;
  /** After each list the mirror makes (its first, and after a watch ended): seconds it took, and its error if it failed. */
  onList?: (seconds: number, err: Error | null) => void;
}

const keyOf = (k: ObjectKey): string => `${k.namespace ?? ''}/${k.name}`;

export class WatchCache<K extends Kind> {
  private objects = new Map<string, ObjectOfKind<K>>();
  private watch: Watch | null = null;
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  private synced = false;
  private restartMs = RESTART_MIN_MS;
  private starting: Promise<void> | null = null;

  constructor(private readonly opts: WatchCacheOptions<K>) {}

  /**
   * Lists, then watches from the list's version; resolves once the mirror holds the list. Callers that start it
   * while a list is under way share that list. After stop() it does nothing: a pass or a renewal still running
   * when its owner stopped must not open a watch nobody stops.
   */
  start(): Promise<void> {
    if (this.stopped || this.watch) return Promise.resolve();
    this.starting ??= this.listAndWatch().finally(() => {
      this.starting = null;
    });
    return this.starting;
  }

  private async listAndWatch(): Promise<void> {
    const began = performance.now();
    let list;
    try {
      list = await this.opts.store.list(this.opts.kind, this.opts.select);
    } catch (err) {
      this.opts.onList?.((performance.now() - began) / 1000, err as Error);
      throw err;
    }
    this.opts.onList?.((performance.now() - began) / 1000, null);
    if (this.stopped) return;
    const { project } = this.opts;
    const before = this.objects;
    const next = new Map<string, ObjectOfKind<K>>();
    const budget = new TurnBudget(PROJECT_BATCH);
    for (const o of list.items) {
      const k = keyOf(o.metadata);
      next.set(k, project ? project(o, before.get(k)) : o);
      const turn = project ? budget.spend() : undefined;
      if (turn) {
        // Readers see the previous mirror (or none) until the whole list is in.
        await turn;
        if (this.stopped) return;
      }
    }
    this.objects = next;
    this.watch = this.opts.store.watch(
      this.opts.kind,
      { ...this.opts.select, resourceVersion: list.resourceVersion },
      {
        onEvent: (e) => {
          const k = keyOf(e.object.metadata);
          const previous = this.objects.get(k);
          if (e.type === 'DELETED') this.objects.delete(k);
          else this.objects.set(k, this.opts.project ? this.opts.project(e.object, previous) : e.object);
          this.restartMs = RESTART_MIN_MS;
          this.opts.onChange?.(e.object, e.type === 'DELETED', previous);
        },
        onError: (err) => {
          this.watch = null;
          if (this.stopped) return;
          this.opts.log.warn({ kind: this.opts.kind, err: err.message, retryInMs: this.restartMs }, 'watch ended; listing again');
          this.restartLater();
        },
      },
    );
    this.synced = true;
  }

  stop(): void {
    this.stopped = true;
    this.watch?.stop();
    this.watch = null;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  /** Whether the mirror holds a list (it may lag the store by the watch's delay). */
  get ready(): boolean {
    return this.synced;
  }

  get(key: ObjectKey): ObjectOfKind<K> | undefined {
    return this.objects.get(keyOf(key));
  }

  values(): IterableIterator<ObjectOfKind<K>> {
    return this.objects.values();
  }

  get size(): number {
    return this.objects.size;
  }

  private restartLater(): void {
    const delay = this.restartMs;
    this.restartMs = Math.min(RESTART_MAX_MS, this.restartMs * 2);
    this.timer = setTimeout(() => {
      this.timer = null;
      if (this.stopped) return;
      // Changes made while no watch ran are in the new list.
      this.start().catch((err: Error) => {
        this.opts.log.warn({ kind: this.opts.kind, err: err.message }, 'cannot list to restart the watch; retrying');
        if (!this.stopped && !this.watch) this.restartLater();
      });
    }, delay);
  }
}
