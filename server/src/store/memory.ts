// MemoryStore: the Store semantics (Kubernetes API rules) on in-process maps. It is the front of the
// embedded store (which adds a journal through the `persist` hook) and the backing of the fake
// Kubernetes API server in tests; other helpers' tests use it directly.
//
// Ordering: every write is checked and applied synchronously (so optimistic concurrency needs no
// locks), then handed to `persist`; the caller's promise resolves, and watchers see the event, only
// after `persist` resolved. Reads wait until every write applied before them is persisted, so a
// reader never acts on a write that a crash could still take back.
import { randomUUID } from 'node:crypto';
import { sameJson } from './same-json.js';
import {
  KINDS,
  KINDS_WITHOUT_GENERATION,
  type CertificateSigningRequest,
  type HubObject,
  type Kind,
  type ObjectOfKind,
} from './objects.js';
import {
  AlreadyExistsError,
  ConflictError,
  GoneError,
  InvalidError,
  NotFoundError,
  UnavailableError,
  describeKey,
  type ListOptions,
  type ListResult,
  type ObjectKey,
  type StatusOptions,
  type Store,
  type Watch,
  type WatchEvent,
  type WatchEventType,
  type WatchHandlers,
  type WatchOptions,
} from './store.js';

/** One durable change: the object as stored after a put, or as it was when deleted. */
export interface StoreMutation {
  op: 'put' | 'delete';
  kind: Kind;
  /** Global version of this change (the object's resourceVersion after a put). */
  rv: number;
  object: HubObject;
}

export interface MemoryStoreOptions {
  /** Reported as Store.kind. Default 'memory'. */
  kind?: Store['kind'];
  /** Watch resume window: how many past events are kept. Older versions → GoneError. Default 1000. */
  historySize?: number;
  /** Makes a change durable; the write is acknowledged after it resolves. A rejection fails the store. */
  persist?: (m: StoreMutation) => Promise<void>;
}

export interface StoreSnapshot {
  /** The last version handed out. */
  rv: number;
  objects: { kind: Kind; object: HubObject }[];
}

interface HistoryEvent {
  rv: number;
  kind: Kind;
  type: WatchEventType;
  object: HubObject;
  /** The object before this change (for label-selector transitions). */
  prev: HubObject | null;
}

interface Watcher {
  kind: Kind;
  opts: WatchOptions;
  handlers: WatchHandlers<Kind>;
  /** Events at or below this version are not for this watcher. */
  fromRv: number;
  started: boolean;
  stopped: boolean;
  queue: WatchEvent<Kind>[];
  scheduled: boolean;
}

// DNS-1123 subdomain (names) and label (namespaces), as Kubernetes validates them.
const SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

export function validateKey(kind: Kind, key: ObjectKey): void {
  if (!(kind in KINDS)) throw new InvalidError(`unknown kind ${String(kind)}`);
  const info = KINDS[kind];
  if (typeof key.name !== 'string' || key.name.length === 0) throw new InvalidError(`${kind}: metadata.name is required`);
  if (key.name.length > 253 || !SUBDOMAIN.test(key.name)) {
    throw new InvalidError(
      `${kind} name ${JSON.stringify(key.name)} is not a DNS-1123 subdomain (lower case alphanumerics, '-', '.', at most 253)`,
    );
  }
  if (info.namespaced) {
    if (!key.namespace) throw new InvalidError(`${kind} ${key.name}: namespace is required (namespaced kind)`);
    if (key.namespace.length > 63 || !LABEL.test(key.namespace)) {
      throw new InvalidError(`${kind} namespace ${JSON.stringify(key.namespace)} is not a DNS-1123 label`);
    }
  } else if (key.namespace) {
    throw new InvalidError(`${kind} is cluster-scoped: namespace ${JSON.stringify(key.namespace)} not allowed`);
  }
}

export function matchesLabels(obj: HubObject, labels: Record<string, string> | undefined): boolean {
  if (!labels) return true;
  const have = obj.metadata.labels ?? {};
  return Object.entries(labels).every(([k, v]) => have[k] === v);
}

function matches(obj: HubObject, opts: ListOptions): boolean {
  if (opts.namespace !== undefined && obj.metadata.namespace !== opts.namespace) return false;
  return matchesLabels(obj, opts.labels);
}

/** Parses a resourceVersion we handed out; InvalidError for anything else. */
export function parseRv(rv: string): number {
  if (!/^\d{1,15}$/.test(rv)) throw new InvalidError(`invalid resourceVersion ${JSON.stringify(rv)}`);
  return Number(rv);
}

function keyOf(obj: { metadata: { name: string; namespace?: string } }): string {
  return `${obj.metadata.namespace ?? ''}/${obj.metadata.name}`;
}

function copy<T>(v: T): T {
  return structuredClone(v);
}

/** `approval` is a CertificateSigningRequest subresource only. */
export function checkSubresource(kind: Kind, opts: StatusOptions): void {
  if (opts.subresource === 'approval' && kind !== 'CertificateSigningRequest')
    throw new InvalidError(`${kind} has no approval subresource`);
}

const APPROVAL = new Set(['Approved', 'Denied']);

/**
 * Kubernetes' rules for a CSR's status: the approval subresource writes only the conditions (and only
 * adds or keeps Approved/Denied, never removes one); the status subresource writes the rest and leaves
 * Approved/Denied as they were.
 */
function csrStatus(
  current: CertificateSigningRequest['status'],
  given: CertificateSigningRequest['status'],
  sub: 'status' | 'approval',
): CertificateSigningRequest['status'] {
  const cur = current?.conditions ?? [];
  const next = given?.conditions ?? [];
  if (sub === 'approval') {
    const removed = cur.filter((c) => APPROVAL.has(c.type) && !next.some((n) => n.type === c.type));
    if (removed.length > 0) throw new InvalidError(`CertificateSigningRequest: the ${removed[0]!.type} condition cannot be removed`);
    if (next.some((n) => n.type === 'Approved' && n.status === 'True') && next.some((n) => n.type === 'Denied' && n.status === 'True')) {
      throw new InvalidError('CertificateSigningRequest: Approved and Denied conditions are mutually exclusive');
    }
    return { ...current, conditions: next };
  }
  // On /status the approval conditions stay as they are: adding or removing one is refused (as the apiserver does).
  for (const c of cur.filter((x) => APPROVAL.has(x.type))) {
    if (!next.some((n) => n.type === c.type))
      throw new InvalidError(`CertificateSigningRequest: status updates may not remove a condition of type "${c.type}"`);
  }
  for (const n of next.filter((x) => APPROVAL.has(x.type))) {
    if (!cur.some((c) => c.type === n.type))
      throw new InvalidError(`CertificateSigningRequest: status updates may not add a condition of type "${n.type}"`);
  }
  const conditions = [...cur.filter((c) => APPROVAL.has(c.type)), ...next.filter((c) => !APPROVAL.has(c.type))];
  const out: NonNullable<CertificateSigningRequest['status']> = { ...given, conditions };
  if (conditions.length === 0) delete out.conditions;
  return out;
}

/** The parts of an object other than metadata and status (spec, Secret data/type, ...). */
function body(obj: HubObject): Record<string, unknown> {
  const { metadata: _m, status: _s, apiVersion: _a, kind: _k, ...rest } = obj as HubObject & { status?: unknown };
  return rest;
}

export class MemoryStore implements Store {
  readonly kind: Store['kind'];
  private readonly objects = new Map<Kind, Map<string, HubObject>>();
  private rv = 0;
  private readonly history: HistoryEvent[] = [];
  private readonly historySize: number;
  private readonly persistHook: ((m: StoreMutation) => Promise<void>) | undefined;
  private readonly watchers = new Set<Watcher>();
  /** Writes applied but not yet persisted and delivered. */
  private pending = 0;
  private idle: (() => void)[] = [];
  /** Persist results, chained so events are delivered in version order. */
  private chain: Promise<void> = Promise.resolve();
  private failure: Error | null = null;
  private closed = false;

  constructor(opts: MemoryStoreOptions = {}, snapshot?: StoreSnapshot) {
    this.kind = opts.kind ?? 'memory';
    this.historySize = opts.historySize ?? 1000;
    this.persistHook = opts.persist;
    for (const k of Object.keys(KINDS) as Kind[]) this.objects.set(k, new Map());
    if (snapshot) {
      this.rv = snapshot.rv;
      for (const { kind, object } of snapshot.objects) this.table(kind).set(keyOf(object), copy(object));
    }
  }

  /** Everything stored, for the embedded store's snapshots. Call when no write is pending. */
  snapshot(): StoreSnapshot {
    const objects: StoreSnapshot['objects'] = [];
    for (const [kind, table] of this.objects) for (const object of table.values()) objects.push({ kind, object: copy(object) });
    return { rv: this.rv, objects };
  }

  get currentVersion(): string {
    return String(this.rv);
  }

  private table(kind: Kind): Map<string, HubObject> {
    const t = this.objects.get(kind);
    if (!t) throw new InvalidError(`unknown kind ${String(kind)}`);
    return t;
  }

  private usable(): void {
    if (this.closed) throw new UnavailableError('store is closed');
    if (this.failure) throw new UnavailableError(`store failed: ${this.failure.message}`);
  }

  /** Resolves when every write applied so far is persisted and delivered. */
  /** Resolves at the next moment no write is pending. Callers loop on `pending` and read synchronously after. */
  private idleOnce(): Promise<void> {
    return new Promise<void>((resolve) => this.idle.push(resolve));
  }

  async get<K extends Kind>(kind: K, key: ObjectKey): Promise<ObjectOfKind<K> | null> {
    this.usable();
    validateKey(kind, key);
    // Looped, and the read follows in the same synchronous block: a write applied after the wake-up
    // is not durable yet and must not be seen.
    while (this.pending > 0) await this.idleOnce();
    this.usable();
    const obj = this.table(kind).get(keyOf({ metadata: key }));
    return obj ? (copy(obj) as ObjectOfKind<K>) : null;
  }

  async list<K extends Kind>(kind: K, opts: ListOptions = {}): Promise<ListResult<K>> {
    this.usable();
    this.table(kind);
    // Looped, and the read follows in the same synchronous block: a write applied after the wake-up
    // is not durable yet and must not be seen.
    while (this.pending > 0) await this.idleOnce();
    this.usable();
    const items: ObjectOfKind<K>[] = [];
    for (const obj of this.table(kind).values()) if (matches(obj, opts)) items.push(copy(obj) as ObjectOfKind<K>);
    items.sort((a, b) => keyOf(a).localeCompare(keyOf(b)));
    return { items, resourceVersion: String(this.rv) };
  }

  private checkShape(kind: Kind, obj: HubObject): HubObject {
    if (!obj || typeof obj !== 'object' || !obj.metadata || typeof obj.metadata !== 'object') {
      throw new InvalidError(`${kind}: object with metadata required`);
    }
    const info = KINDS[kind];
    if (obj.kind !== undefined && obj.kind !== kind) throw new InvalidError(`object kind ${obj.kind} does not match ${kind}`);
    if (obj.apiVersion !== undefined && obj.apiVersion !== info.apiVersion) {
      throw new InvalidError(`${kind}: apiVersion ${obj.apiVersion} is not ${info.apiVersion}`);
    }
    validateKey(kind, obj.metadata);
    // apiVersion and kind first, as the Kubernetes API prints them.
    const { apiVersion: _a, kind: _k, ...rest } = copy(obj);
    return { apiVersion: info.apiVersion, kind, ...rest } as HubObject;
  }

  private checkRv(kind: Kind, current: HubObject, given: string | undefined): void {
    if (given === undefined || given === '') return;
    if (given !== current.metadata.resourceVersion) {
      throw new ConflictError(
        `${describeKey(kind, current.metadata)}: the object has been modified (resourceVersion ${given}, now ${current.metadata.resourceVersion ?? '?'}); read it again and retry`,
      );
    }
  }

  async create<K extends Kind>(kind: K, obj: ObjectOfKind<K>): Promise<ObjectOfKind<K>> {
    this.usable();
    const c = this.checkShape(kind, obj);
    if (c.metadata.resourceVersion) throw new InvalidError(`${describeKey(kind, c.metadata)}: resourceVersion must not be set on create`);
    const table = this.table(kind);
    const k = keyOf(c);
    if (table.has(k)) throw new AlreadyExistsError(`${describeKey(kind, c.metadata)} already exists`);
    if (KINDS[kind].hasStatus) delete (c as { status?: unknown }).status;
    const rv = ++this.rv;
    c.metadata.uid = randomUUID();
    c.metadata.creationTimestamp = new Date().toISOString().replace(/\.\d{3}Z$/, 'Z');
    if (KINDS_WITHOUT_GENERATION.has(kind)) delete c.metadata.generation;
    else c.metadata.generation = 1;
    delete c.metadata.deletionTimestamp;
    if (c.metadata.finalizers?.length === 0) delete c.metadata.finalizers;
    c.metadata.resourceVersion = String(rv);
    table.set(k, c);
    await this.commit({ op: 'put', kind, rv, object: c }, 'ADDED', null);
    return copy(c) as ObjectOfKind<K>;
  }

  async update<K extends Kind>(kind: K, obj: ObjectOfKind<K>): Promise<ObjectOfKind<K>> {
    return this.replace(kind, obj, false);
  }

  async updateStatus<K extends Kind>(kind: K, obj: ObjectOfKind<K>, opts: StatusOptions = {}): Promise<ObjectOfKind<K>> {
    if (!KINDS[kind]?.hasStatus) throw new InvalidError(`${kind} has no status subresource; use update`);
    checkSubresource(kind, opts);
    return this.replace(kind, obj, opts.subresource ?? 'status');
  }

  private async replace<K extends Kind>(
    kind: K,
    obj: ObjectOfKind<K>,
    statusOnly: false | 'status' | 'approval',
  ): Promise<ObjectOfKind<K>> {
    this.usable();
    const c = this.checkShape(kind, obj);
    const table = this.table(kind);
    const k = keyOf(c);
    const current = table.get(k);
    if (!current) throw new NotFoundError(`${describeKey(kind, c.metadata)} not found`);
    this.checkRv(kind, current, c.metadata.resourceVersion);
    let next: HubObject;
    if (statusOnly) {
      next = copy(current);
      const status =
        kind === 'CertificateSigningRequest'
          ? csrStatus((current as CertificateSigningRequest).status, (c as CertificateSigningRequest).status, statusOnly)
          : (c as { status?: unknown }).status;
      if (status === undefined) delete (next as { status?: unknown }).status;
      else (next as { status?: unknown }).status = status;
    } else {
      next = c;
      // Kubernetes: a CSR's spec never changes after create (what was asked for is what gets judged); an update
      // keeps the old spec and takes the rest, as the apiserver's strategy does.
      if (kind === 'CertificateSigningRequest')
        (next as CertificateSigningRequest).spec = copy((current as CertificateSigningRequest).spec);
      const m = next.metadata;
      const cur = current.metadata;
      m.uid = cur.uid;
      m.creationTimestamp = cur.creationTimestamp;
      if (cur.deletionTimestamp) m.deletionTimestamp = cur.deletionTimestamp;
      else delete m.deletionTimestamp;
      if (m.finalizers?.length === 0) delete m.finalizers;
      if (cur.deletionTimestamp) {
        const added = (m.finalizers ?? []).filter((f) => !(cur.finalizers ?? []).includes(f));
        if (added.length > 0) throw new InvalidError(`${describeKey(kind, m)} is being deleted: no new finalizers (${added.join(', ')})`);
      }
      if (KINDS[kind].hasStatus) {
        const st = (current as { status?: unknown }).status;
        if (st === undefined) delete (next as { status?: unknown }).status;
        else (next as { status?: unknown }).status = copy(st);
      }
      if (KINDS_WITHOUT_GENERATION.has(kind)) delete m.generation;
      else m.generation = (cur.generation ?? 1) + (sameJson(body(next), body(current)) ? 0 : 1);
    }
    const rv = ++this.rv;
    next.metadata.resourceVersion = String(rv);
    if (next.metadata.deletionTimestamp && !next.metadata.finalizers?.length) {
      // The last finalizer is gone on an object being deleted: it goes now (Kubernetes semantics).
      table.delete(k);
      await this.commit({ op: 'delete', kind, rv, object: next }, 'DELETED', current);
    } else {
      table.set(k, next);
      await this.commit({ op: 'put', kind, rv, object: next }, 'MODIFIED', current);
    }
    return copy(next) as ObjectOfKind<K>;
  }

  async delete<K extends Kind>(kind: K, key: ObjectKey, opts: { resourceVersion?: string } = {}): Promise<void> {
    this.usable();
    validateKey(kind, key);
    const table = this.table(kind);
    const k = keyOf({ metadata: key });
    const current = table.get(k);
    if (!current) throw new NotFoundError(`${describeKey(kind, key)} not found`);
    this.checkRv(kind, current, opts.resourceVersion);
    if (current.metadata.finalizers?.length) {
      if (current.metadata.deletionTimestamp) return; // already being deleted
      const next = copy(current);
      next.metadata.deletionTimestamp = new Date().toISOString().replace(/\.\d{3}Z$/, 'Z');
      const rv = ++this.rv;
      next.metadata.resourceVersion = String(rv);
      table.set(k, next);
      await this.commit({ op: 'put', kind, rv, object: next }, 'MODIFIED', current);
      return;
    }
    const rv = ++this.rv;
    const gone = copy(current);
    gone.metadata.resourceVersion = String(rv);
    table.delete(k);
    await this.commit({ op: 'delete', kind, rv, object: gone }, 'DELETED', current);
  }

  /** Persists a change that is already applied, then records and delivers its event, in version order. */
  private commit(m: StoreMutation, type: WatchEventType, prev: HubObject | null): Promise<void> {
    this.pending++;
    let persisted: Promise<void>;
    try {
      persisted = this.persistHook ? this.persistHook(m) : Promise.resolve();
    } catch (err) {
      persisted = Promise.reject(err);
    }
    const step = this.chain.then(() => persisted);
    this.chain = step.then(
      () => this.record({ rv: m.rv, kind: m.kind, type, object: m.object, prev }),
      (err: unknown) => {
        // A change the disk did not take: the in-memory state is ahead of the disk, so the store
        // stops serving rather than answer with what a restart would not have.
        this.failure ??= err instanceof Error ? err : new Error(String(err));
        this.done();
        for (const w of this.watchers) this.fail(w, new UnavailableError(`store failed: ${this.failure.message}`));
      },
    );
    return step.then(
      () => undefined,
      (err: unknown) => {
        throw new UnavailableError(
          `write of ${describeKey(m.kind, m.object.metadata)} not persisted: ${err instanceof Error ? err.message : String(err)}`,
        );
      },
    );
  }

  private done(): void {
    this.pending--;
    if (this.pending === 0) {
      const idle = this.idle;
      this.idle = [];
      for (const r of idle) r();
    }
  }

  private record(ev: HistoryEvent): void {
    this.history.push(ev);
    if (this.history.length > this.historySize) this.history.shift();
    for (const w of this.watchers) if (w.started) this.offer(w, ev);
    this.done();
  }

  /** Queues the event for a watcher if it passes its filters (with label-selector transitions). */
  private offer(w: Watcher, ev: HistoryEvent): void {
    if (ev.kind !== w.kind || ev.rv <= w.fromRv) return;
    if (w.opts.namespace !== undefined && ev.object.metadata.namespace !== w.opts.namespace) return;
    const now = matchesLabels(ev.object, w.opts.labels);
    const before = ev.prev !== null && matchesLabels(ev.prev, w.opts.labels);
    let type: WatchEventType = ev.type;
    if (ev.type === 'MODIFIED' && now && !before) type = 'ADDED';
    else if (ev.type === 'MODIFIED' && !now && before) type = 'DELETED';
    else if (!now && (ev.type !== 'DELETED' || !before)) return;
    this.enqueue(w, { type, object: copy(ev.object) as ObjectOfKind<Kind> });
  }

  private enqueue(w: Watcher, ev: WatchEvent<Kind>): void {
    w.queue.push(ev);
    if (w.scheduled) return;
    w.scheduled = true;
    queueMicrotask(() => {
      w.scheduled = false;
      while (!w.stopped && w.queue.length > 0) {
        const next = w.queue.shift() as WatchEvent<Kind>;
        try {
          w.handlers.onEvent(next);
        } catch (err) {
          process.emitWarning(`store watch handler threw: ${err instanceof Error ? err.message : String(err)}`);
        }
      }
    });
  }

  private fail(w: Watcher, err: Error): void {
    if (w.stopped) return;
    this.watchers.delete(w);
    queueMicrotask(() => {
      // Deliver what was queued before the error, then the error, unless stopped meanwhile.
      while (!w.stopped && w.queue.length > 0) {
        const next = w.queue.shift() as WatchEvent<Kind>;
        try {
          w.handlers.onEvent(next);
        } catch {
          /* reported above */
        }
      }
      if (w.stopped) return;
      w.stopped = true;
      w.handlers.onError?.(err);
    });
  }

  watch<K extends Kind>(kind: K, opts: WatchOptions, handlers: WatchHandlers<K>): Watch {
    const w: Watcher = {
      kind,
      opts: copy(opts),
      handlers: handlers as unknown as WatchHandlers<Kind>,
      fromRv: 0,
      started: false,
      stopped: false,
      queue: [],
      scheduled: false,
    };
    const handle: Watch = {
      stop: () => {
        w.stopped = true;
        w.queue.length = 0;
        this.watchers.delete(w);
      },
    };
    try {
      this.usable();
      this.table(kind);
      if (opts.namespace !== undefined && !KINDS[kind].namespaced)
        throw new InvalidError(`${kind} is cluster-scoped: no namespace in a watch`);
    } catch (err) {
      this.watchers.add(w);
      this.fail(w, err as Error);
      return handle;
    }
    this.watchers.add(w);
    const rvText = opts.resourceVersion;
    if (rvText === undefined || rvText === '' || rvText === '0') {
      // Current state first: wait for in-flight writes, then snapshot and follow from here.
      void (async () => {
        while (this.pending > 0) await this.idleOnce();
        if (w.stopped) return;
        w.fromRv = this.rv;
        for (const obj of this.table(kind).values()) {
          if (matches(obj, opts)) this.enqueue(w, { type: 'ADDED', object: copy(obj) as ObjectOfKind<Kind> });
        }
        w.started = true;
      })();
      return handle;
    }
    let from: number;
    try {
      from = parseRv(rvText);
    } catch (err) {
      this.fail(w, err as Error);
      return handle;
    }
    const oldest = this.history[0]?.rv ?? this.deliveredRv() + 1;
    if (from < oldest - 1) {
      this.fail(w, new GoneError(`too old resource version: ${from} (oldest kept ${oldest - 1}); list again`));
      return handle;
    }
    w.fromRv = from;
    for (const ev of this.history) this.offer(w, ev);
    w.started = true;
    return handle;
  }

  /** The newest version whose event has been delivered (everything up to it is durable). */
  private deliveredRv(): number {
    return this.history[this.history.length - 1]?.rv ?? this.rv - this.pending;
  }

  /** Namespaces are implicit here: any valid name is usable. */
  async ensureNamespace(name: string): Promise<void> {
    validateKey('Lease', { name: 'x', namespace: name });
  }

  async ping(): Promise<void> {
    this.usable();
  }

  async close(): Promise<void> {
    if (this.closed) return;
    while (this.pending > 0) await this.idleOnce();
    this.closed = true;
    for (const w of this.watchers) {
      w.stopped = true;
      w.queue.length = 0;
    }
    this.watchers.clear();
  }
}
