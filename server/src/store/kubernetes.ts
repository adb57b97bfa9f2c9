// The Kubernetes store: the hub's objects as CRs (deploy/ holds the CRDs), Leases and Secrets, through
// @kubernetes/client-node: CustomObjectsApi for OCM's kinds, CoordinationV1Api for Lease, CoreV1Api
// for Secret, Watch for watches (which resume from the last version seen after a disconnect).
import { createHash } from 'node:crypto';
import { http } from '@cluster-proxy/proto';
import https from 'node:https';
import {
  ApiException,
  CertificatesV1Api,
  CoordinationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  KubeConfig,
  ServerConfiguration,
  Watch as KubeWatch,
  createConfiguration,
  type RequestContext,
  type SecurityAuthentication,
  type V1CertificateSigningRequest,
  type V1Lease,
  type V1Secret,
} from '@kubernetes/client-node';
import { KINDS, type HubObject, type Kind, type ObjectOfKind } from './objects.js';
import { checkSubresource, validateKey } from './memory.js';
import {
  AlreadyExistsError,
  ConflictError,
  GoneError,
  InvalidError,
  NotFoundError,
  StoreError,
  UnavailableError,
  describeKey,
  type ListOptions,
  type ListResult,
  type ObjectKey,
  type StatusOptions,
  type Store,
  type Watch,
  type WatchEventType,
  type WatchHandlers,
  type WatchOptions,
} from './store.js';
import type * as HttpTypes from 'node:http';

export interface KubernetesStoreOptions {
  /** Path of a kubeconfig; default: $KUBECONFIG, ~/.kube/config, then in-cluster. */
  kubeconfig?: string;
  context?: string;
  /** Watch reconnect backoff (ms): first delay, doubled up to max. Defaults 200 / 10000. */
  watchBackoffMs?: { initial: number; max: number };
}

interface KubeStatus {
  kind?: string;
  code?: number;
  reason?: string;
  message?: string;
}

function parseBody(body: unknown): KubeStatus | null {
  if (typeof body === 'string') {
    try {
      return JSON.parse(body) as KubeStatus;
    } catch {
      return null;
    }
  }
  return body && typeof body === 'object' ? (body as KubeStatus) : null;
}

/** How often a request the apiserver answered 429 is sent again (client-go: 10), and the longest wait between. */
export const THROTTLED_RETRIES = 10;
const MAX_RETRY_AFTER_MS = 5_000;

/**
 * `api` with each method sent again when the apiserver answers 429 Too Many Requests, after its Retry-After
 * (whole seconds; 1 s when absent, at most MAX_RETRY_AFTER_MS), at most THROTTLED_RETRIES times, as client-go
 * does. A real apiserver says 429 when API Priority and Fairness sheds load, and for a custom resource whose
 * CRD was just established ("storage is (re)initializing"): a hub starting beside a fresh install saw that
 * and exited.
 */
export function retryingThrottled<T extends object>(api: T, stopped: () => boolean = () => false): T {
  return new Proxy(api, {
    get(target, prop, receiver) {
      const v = Reflect.get(target, prop, receiver) as unknown;
      if (typeof v !== 'function') return v;
      return async (...args: unknown[]) => {
        for (let attempt = 0; ; attempt++) {
          try {
            return await (v as (...a: unknown[]) => Promise<unknown>).apply(target, args);
          } catch (err) {
            if (!(err instanceof ApiException) || err.code !== 429 || attempt >= THROTTLED_RETRIES || stopped()) throw err;
            const header = Number((err.headers as Record<string, string | undefined>)['retry-after']);
            const ms = Math.min(MAX_RETRY_AFTER_MS, Number.isFinite(header) && header >= 0 ? header * 1000 : 1000);
            await new Promise((r) => setTimeout(r, ms));
          }
        }
      };
    },
  });
}

/** The API's errors as the store's classes (404 NotFound, 409 AlreadyExists|Conflict, 410 Gone, 400/422 Invalid). */
export function mapKubeError(err: unknown, what: string): Error {
  if (err instanceof StoreError) return err;
  if (err instanceof ApiException) {
    const status = parseBody(err.body);
    const msg = `${what}: ${status?.message ?? `HTTP ${err.code}`}`;
    switch (err.code) {
      case 404:
        return new NotFoundError(msg);
      case 409:
        return status?.reason === 'AlreadyExists' ? new AlreadyExistsError(msg) : new ConflictError(msg);
      case 410:
        return new GoneError(msg);
      case 400:
      case 422:
        return new InvalidError(msg);
      default:
        return new UnavailableError(msg);
    }
  }
  const e = err instanceof Error ? err : new Error(String(err));
  return new UnavailableError(`${what}: ${e.message}`);
}

/** Plain JSON in our shapes: typed clients hand back class instances with Date fields. */
/** A copy of `obj` (a typed client's object, with Date fields, or a body of ours) as the API's plain JSON. */
function toPlain<K extends Kind>(kind: K, obj: unknown): ObjectOfKind<K> {
  return fromJson(kind, JSON.parse(JSON.stringify(obj)));
}

/**
 * A body to send for `obj` (ours, plain JSON): a copy of its top level and metadata, which a request changes
 * (resourceVersion), without deep-copying the rest (a ManifestWork holds every manifest of an agent).
 */
function outgoing<K extends Kind>(kind: K, obj: ObjectOfKind<K>): ObjectOfKind<K> {
  const { managedFields: _m, ...metadata } = obj.metadata as ObjectOfKind<K>['metadata'] & { managedFields?: unknown };
  return { ...obj, apiVersion: KINDS[kind].apiVersion, kind, metadata } as ObjectOfKind<K>;
}

/**
 * An object parsed from the API's JSON (a watch event, a custom object's answer), which nothing else holds:
 * normalized in place, without the deep copy toPlain makes (a watch over thousands of ManifestWorks copied each
 * event's whole object).
 */
function fromJson<K extends Kind>(kind: K, obj: unknown): ObjectOfKind<K> {
  const { apiVersion: _a, kind: _k, ...rest } = obj as HubObject;
  const m = rest.metadata;
  for (const f of ['creationTimestamp', 'deletionTimestamp'] as const) {
    const v = m[f];
    if (typeof v === 'string') m[f] = v.replace(/\.000Z$/, 'Z');
  }
  delete (m as { managedFields?: unknown }).managedFields;
  // The typed CSR client hands back Date objects for condition times; the API sends whole seconds.
  for (const c of (rest as { status?: { conditions?: Record<string, unknown>[] } }).status?.conditions ?? []) {
    for (const f of ['lastUpdateTime', 'lastTransitionTime']) if (typeof c[f] === 'string') c[f] = (c[f] as string).replace(/\.000Z$/, 'Z');
  }
  return { apiVersion: KINDS[kind].apiVersion, kind, ...rest } as ObjectOfKind<K>;
}

function labelSelector(labels: Record<string, string> | undefined): string | undefined {
  if (!labels || Object.keys(labels).length === 0) return undefined;
  return Object.entries(labels)
    .map(([k, v]) => `${k}=${v}`)
    .join(',');
}

/** API path of a kind's collection (for watches). */
export function collectionPath(kind: Kind, namespace?: string): string {
  const info = KINDS[kind];
  const base = info.group === '' ? `/api/${info.version}` : `/apis/${info.group}/${info.version}`;
  return `${base}${namespace ? `/namespaces/${encodeURIComponent(namespace)}` : ''}/${info.plural}`;
}

const UNCONDITIONAL_RETRIES = 5;
/** Objects per page of a list (client-go's reflector: 500). */
export const LIST_PAGE = 500;
/** How often a paged list starts over after its continue token expired. */
const LIST_RESTARTS = 2;

export class KubernetesStore implements Store {
  readonly kind = 'kubernetes' as const;
  private readonly custom: CustomObjectsApi;
  private readonly coord: CoordinationV1Api;
  private readonly core: CoreV1Api;
  private readonly certificates: CertificatesV1Api;
  private readonly watcher: KubeWatch;
  private readonly watches = new Set<Watch>();
  private readonly backoff: { initial: number; max: number };
  private closed = false;

  private readonly auth: KeepAliveAuth;

  constructor(
    readonly kubeConfig: KubeConfig,
    opts: Pick<KubernetesStoreOptions, 'watchBackoffMs'> = {},
  ) {
    // As kubeConfig.makeApiClient() does, with connections kept between requests (KeepAliveAuth).
    const cluster = kubeConfig.getCurrentCluster();
    if (!cluster) throw new Error('No active cluster!');
    this.auth = new KeepAliveAuth(kubeConfig);
    const config = createConfiguration({ baseServer: new ServerConfiguration(cluster.server, {}), authMethods: { default: this.auth } });
    const stopped = (): boolean => this.closed;
    this.custom = retryingThrottled(new CustomObjectsApi(config), stopped);
    this.coord = retryingThrottled(new CoordinationV1Api(config), stopped);
    this.core = retryingThrottled(new CoreV1Api(config), stopped);
    this.certificates = retryingThrottled(new CertificatesV1Api(config), stopped);
    this.watcher = new KubeWatch(kubeConfig);
    this.backoff = opts.watchBackoffMs ?? { initial: 200, max: 10_000 };
  }

  private usable(): void {
    if (this.closed) throw new UnavailableError('store is closed');
  }

  async get<K extends Kind>(kind: K, key: ObjectKey): Promise<ObjectOfKind<K> | null> {
    this.usable();
    validateKey(kind, key);
    try {
      return await this.read(kind, key);
    } catch (err) {
      const e = mapKubeError(err, `get ${describeKey(kind, key)}`);
      if (e instanceof NotFoundError) return null;
      throw e;
    }
  }

  private async read<K extends Kind>(kind: K, key: ObjectKey): Promise<ObjectOfKind<K>> {
    const info = KINDS[kind];
    const ns = key.namespace ?? '';
    if (kind === 'Lease') return toPlain(kind, await this.coord.readNamespacedLease({ name: key.name, namespace: ns }));
    if (kind === 'Secret') return toPlain(kind, await this.core.readNamespacedSecret({ name: key.name, namespace: ns }));
    const g = { group: info.group, version: info.version, plural: info.plural, name: key.name };
    const raw: unknown = info.namespaced
      ? await this.custom.getNamespacedCustomObject({ ...g, namespace: ns })
      : await this.custom.getClusterCustomObject(g);
    return fromJson(kind, raw);
  }

  async list<K extends Kind>(kind: K, opts: ListOptions = {}): Promise<ListResult<K>> {
    this.usable();
    const info = KINDS[kind];
    if (opts.namespace !== undefined && !info.namespaced) throw new InvalidError(`${kind} is cluster-scoped: no namespace in a list`);
    const sel = labelSelector(opts.labels);
    const q = sel ? { labelSelector: sel } : {};
    try {
      // Leases too as plain JSON (CustomObjectsApi addresses built-in groups by the same paths): the typed
      // client's model objects for 5,000 of them, and the copy back, held a restarted hub's thread 0.7 s. Their
      // times stay as the API wrote them (microseconds), as the watch delivers them.
      if (kind !== 'Secret') return await this.listPages(kind, opts.namespace, q);
      const res = opts.namespace
        ? await this.core.listNamespacedSecret({ namespace: opts.namespace, ...q })
        : await this.core.listSecretForAllNamespaces(q);
      return { items: (res.items ?? []).map((o) => toPlain(kind, o)), resourceVersion: res.metadata?.resourceVersion ?? '' };
    } catch (err) {
      throw mapKubeError(err, `list ${kind}`);
    }
  }

  /**
   * A list in pages of LIST_PAGE, as client-go's reflector lists: each page is parsed on its own, with the event
   * loop turning between, where one answer of 5,000 ManifestWorks held a restarted hub's thread 0.7 s and its
   * memory for the whole body. A continue token the API no longer has (410 Expired, minutes later) starts over.
   */
  private async listPages<K extends Kind>(kind: K, namespace: string | undefined, q: { labelSelector?: string }): Promise<ListResult<K>> {
    const info = KINDS[kind];
    const g = { group: info.group, version: info.version, plural: info.plural, ...q, limit: LIST_PAGE };
    for (let attempt = 0; ; attempt++) {
      const items: ObjectOfKind<K>[] = [];
      let resourceVersion: string | undefined;
      let token: string | undefined;
      try {
        do {
          const page = { ...g, ...(token ? { _continue: token } : {}) };
          const res = (
            namespace
              ? await this.custom.listNamespacedCustomObject({ ...page, namespace })
              : await this.custom.listClusterCustomObject(page)
          ) as { items?: unknown[]; metadata?: { resourceVersion?: string; continue?: string } };
          for (const o of res.items ?? []) items.push(fromJson(kind, o));
          resourceVersion ??= res.metadata?.resourceVersion;
          token = res.metadata?.continue || undefined;
        } while (token);
        return { items, resourceVersion: resourceVersion ?? '' };
      } catch (err) {
        if (!(token && err instanceof ApiException && err.code === 410 && attempt < LIST_RESTARTS)) throw err;
      }
    }
  }

  async create<K extends Kind>(kind: K, obj: ObjectOfKind<K>): Promise<ObjectOfKind<K>> {
    this.usable();
    validateKey(kind, obj.metadata);
    const info = KINDS[kind];
    const body = outgoing(kind, obj);
    const ns = body.metadata.namespace ?? '';
    try {
      if (kind === 'Lease')
        return toPlain(kind, await this.coord.createNamespacedLease({ namespace: ns, body: body as unknown as V1Lease }));
      if (kind === 'Secret')
        return toPlain(kind, await this.core.createNamespacedSecret({ namespace: ns, body: body as unknown as V1Secret }));
      const g = { group: info.group, version: info.version, plural: info.plural, body };
      return fromJson(
        kind,
        info.namespaced
          ? await this.custom.createNamespacedCustomObject({ ...g, namespace: ns })
          : await this.custom.createClusterCustomObject(g),
      );
    } catch (err) {
      throw mapKubeError(err, `create ${describeKey(kind, obj.metadata)}`);
    }
  }

  update<K extends Kind>(kind: K, obj: ObjectOfKind<K>): Promise<ObjectOfKind<K>> {
    return this.replace(kind, obj, false);
  }

  updateStatus<K extends Kind>(kind: K, obj: ObjectOfKind<K>, opts: StatusOptions = {}): Promise<ObjectOfKind<K>> {
    if (!KINDS[kind]?.hasStatus) return Promise.reject(new InvalidError(`${kind} has no status subresource; use update`));
    try {
      checkSubresource(kind, opts);
    } catch (err) {
      return Promise.reject(err);
    }
    return this.replace(kind, obj, opts.subresource ?? 'status');
  }

  /**
   * PUT. Without a resourceVersion the store promises last-write-wins, but the API refuses
   * unconditional updates of custom resources: read the current version and retry on conflict.
   */
  private async replace<K extends Kind>(kind: K, obj: ObjectOfKind<K>, status: false | 'status' | 'approval'): Promise<ObjectOfKind<K>> {
    this.usable();
    validateKey(kind, obj.metadata);
    const body = outgoing(kind, obj);
    const what = `${status ? `update ${status} of` : 'update'} ${describeKey(kind, obj.metadata)}`;
    const unconditional = !body.metadata.resourceVersion;
    for (let attempt = 0; ; attempt++) {
      try {
        if (unconditional) {
          const current = await this.read(kind, body.metadata);
          body.metadata.resourceVersion = current.metadata.resourceVersion;
        }
        return await this.put(kind, body, status);
      } catch (err) {
        const e = mapKubeError(err, what);
        if (!(unconditional && e instanceof ConflictError && attempt < UNCONDITIONAL_RETRIES)) throw e;
      }
    }
  }

  private async put<K extends Kind>(kind: K, body: ObjectOfKind<K>, status: false | 'status' | 'approval'): Promise<ObjectOfKind<K>> {
    const info = KINDS[kind];
    const name = body.metadata.name;
    const ns = body.metadata.namespace ?? '';
    // CustomObjectsApi addresses built-in groups too (same REST paths), but has no approval subresource.
    if (status === 'approval')
      return toPlain(
        kind,
        await this.certificates.replaceCertificateSigningRequestApproval({ name, body: body as unknown as V1CertificateSigningRequest }),
      );
    if (kind === 'Lease')
      return toPlain(kind, await this.coord.replaceNamespacedLease({ name, namespace: ns, body: body as unknown as V1Lease }));
    if (kind === 'Secret')
      return toPlain(kind, await this.core.replaceNamespacedSecret({ name, namespace: ns, body: body as unknown as V1Secret }));
    const g = { group: info.group, version: info.version, plural: info.plural, name, body };
    let raw: unknown;
    if (info.namespaced) {
      raw = status
        ? await this.custom.replaceNamespacedCustomObjectStatus({ ...g, namespace: ns })
        : await this.custom.replaceNamespacedCustomObject({ ...g, namespace: ns });
    } else {
      raw = status ? await this.custom.replaceClusterCustomObjectStatus(g) : await this.custom.replaceClusterCustomObject(g);
    }
    return fromJson(kind, raw);
  }

  async delete<K extends Kind>(kind: K, key: ObjectKey, opts: { resourceVersion?: string } = {}): Promise<void> {
    this.usable();
    validateKey(kind, key);
    const info = KINDS[kind];
    const ns = key.namespace ?? '';
    const body = opts.resourceVersion ? { preconditions: { resourceVersion: opts.resourceVersion } } : {};
    try {
      if (kind === 'Lease') await this.coord.deleteNamespacedLease({ name: key.name, namespace: ns, body });
      else if (kind === 'Secret') await this.core.deleteNamespacedSecret({ name: key.name, namespace: ns, body });
      else {
        const g = { group: info.group, version: info.version, plural: info.plural, name: key.name, body };
        if (info.namespaced) await this.custom.deleteNamespacedCustomObject({ ...g, namespace: ns });
        else await this.custom.deleteClusterCustomObject(g);
      }
    } catch (err) {
      throw mapKubeError(err, `delete ${describeKey(kind, key)}`);
    }
  }

  watch<K extends Kind>(kind: K, opts: WatchOptions, handlers: WatchHandlers<K>): Watch {
    const w = new ResumingWatch(this, this.watcher, kind, opts, handlers, this.backoff, () => this.watches.delete(handle));
    const handle: Watch = { stop: () => w.stop() };
    this.watches.add(handle);
    w.start();
    return handle;
  }

  async ensureNamespace(name: string): Promise<void> {
    this.usable();
    // Read first: a real apiserver checks RBAC before existence, so a create of an existing
    // namespace by a hub allowed only to read it would be refused (403) instead of "exists".
    try {
      await this.core.readNamespace({ name });
      return;
    } catch (err) {
      const e = mapKubeError(err, `get Namespace ${name}`);
      if (!(e instanceof NotFoundError)) throw e;
    }
    try {
      await this.core.createNamespace({ body: { apiVersion: 'v1', kind: 'Namespace', metadata: { name } } });
    } catch (err) {
      const e = mapKubeError(err, `create Namespace ${name}`);
      if (!(e instanceof AlreadyExistsError)) throw e;
    }
  }

  async ping(): Promise<void> {
    this.usable();
    const info = KINDS.ManagedProxyConfiguration;
    try {
      await this.custom.listClusterCustomObject({ group: info.group, version: info.version, plural: info.plural, limit: 1 });
    } catch (err) {
      throw mapKubeError(err, 'ping (list ManagedProxyConfiguration)');
    }
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const w of [...this.watches]) w.stop();
    this.auth.close();
  }
}

/**
 * The client library's authentication with one kept-alive agent: the library makes a new agent for every
 * request, so every store request was a new connection (and against a real API server a full TLS handshake;
 * `internalConnect` alone was 10 % of an OCM hub's busy time on the plain-HTTP fixture while 1,000 agents
 * connected). The agent is made again when the TLS options change (a rotated client certificate).
 */
class KeepAliveAuth implements SecurityAuthentication {
  private cached: { key: string; agent: HttpTypes.Agent } | null = null;

  constructor(private readonly kc: KubeConfig) {}

  getName(): string {
    return this.kc.getName();
  }

  async applySecurityAuthentication(context: RequestContext): Promise<void> {
    await this.kc.applySecurityAuthentication(context);
    const made = context.getAgent();
    // Proxy agents (a proxy-url in the kubeconfig) keep the library's own.
    const tls = made?.constructor === https.Agent;
    if (!made || (!tls && made.constructor !== http.Agent)) return;
    const o = (made as https.Agent).options;
    const key = createHash('sha256')
      .update(
        JSON.stringify(
          [tls, o.ca, o.cert, o.key, o.pfx, o.passphrase, o.servername, o.rejectUnauthorized].map((v) =>
            v === undefined ? null : String(v),
          ),
        ),
      )
      .digest('base64');
    if (this.cached?.key !== key) {
      this.cached?.agent.destroy();
      // Idle connections are closed after 30 s; a few stay open for the next requests.
      const options = { ...o, keepAlive: true, maxFreeSockets: 4, timeout: 30_000 };
      this.cached = { key, agent: tls ? new https.Agent(options) : new http.Agent(options) };
    }
    made.destroy();
    context.setAgent(this.cached.agent);
  }

  close(): void {
    this.cached?.agent.destroy();
    this.cached = null;
  }
}

/**
 * One logical watch over many HTTP watch requests: each reconnect resumes from the last version seen
 * (events and bookmarks), with backoff. Without a starting version it lists first and emits ADDED for
 * the current objects, so a reconnect never replays them. 410 Gone → onError(GoneError).
 */
class ResumingWatch<K extends Kind> {
  private stopped = false;
  private rv: string | undefined;
  private controller: AbortController | null = null;
  private timer: NodeJS.Timeout | null = null;
  private delay: number;
  /** Connection generation: callbacks of an old connection are ignored. */
  private gen = 0;

  constructor(
    private readonly store: KubernetesStore,
    private readonly kw: KubeWatch,
    private readonly kind: K,
    private readonly opts: WatchOptions,
    private readonly handlers: WatchHandlers<K>,
    private readonly backoff: { initial: number; max: number },
    private readonly onEnd: () => void,
  ) {
    this.rv = opts.resourceVersion || undefined;
    this.delay = backoff.initial;
  }

  start(): void {
    if (this.rv === undefined) {
      void this.store.list(this.kind, this.opts).then(
        (res) => {
          if (this.stopped) return;
          for (const object of res.items) {
            if (this.stopped) return;
            this.handlers.onEvent({ type: 'ADDED', object });
          }
          this.rv = res.resourceVersion;
          this.connect();
        },
        (err: unknown) => {
          if (err instanceof UnavailableError) this.retry();
          else this.fail(err as Error);
        },
      );
    } else this.connect();
  }

  private connect(): void {
    if (this.stopped) return;
    const gen = ++this.gen;
    const query: Record<string, string> = { allowWatchBookmarks: 'true' };
    if (this.rv) query.resourceVersion = this.rv;
    const sel = labelSelector(this.opts.labels);
    if (sel) query.labelSelector = sel;
    const path = collectionPath(this.kind, this.opts.namespace);
    const onLine = (type: string, obj: unknown): void => {
      if (this.stopped || gen !== this.gen) return;
      if (type === 'ERROR') {
        const st = obj as KubeStatus;
        if (st.code === 410) this.fail(new GoneError(`watch ${this.kind} from ${this.rv ?? '?'}: ${st.message ?? 'Gone'}`));
        // Other errors end this connection; the done callback reconnects.
        return;
      }
      const o = obj as HubObject;
      const rv = o?.metadata?.resourceVersion;
      if (rv) this.rv = rv;
      this.delay = this.backoff.initial;
      if (type === 'BOOKMARK') return;
      if (type !== 'ADDED' && type !== 'MODIFIED' && type !== 'DELETED') return;
      this.handlers.onEvent({ type: type as WatchEventType, object: fromJson(this.kind, o) });
    };
    const onDone = (err: unknown): void => {
      if (this.stopped || gen !== this.gen) return;
      this.controller = null;
      const code = (err as { statusCode?: number } | null)?.statusCode;
      if (code === 410) this.fail(new GoneError(`watch ${this.kind} from ${this.rv ?? '?'}: Gone`));
      else if (code === 400 || code === 422 || code === 404) this.fail(new InvalidError(`watch ${this.kind}: HTTP ${code}`));
      else this.retry();
    };
    this.kw.watch(path, query, onLine, onDone).then(
      (controller) => {
        if (this.stopped || gen !== this.gen) controller.abort();
        else this.controller = controller;
      },
      (err: unknown) => onDone(err),
    );
  }

  private retry(): void {
    if (this.stopped || this.timer) return;
    const d = this.delay;
    this.delay = Math.min(this.delay * 2, this.backoff.max);
    this.timer = setTimeout(() => {
      this.timer = null;
      if (this.rv === undefined) this.start();
      else this.connect();
    }, d);
  }

  private fail(err: Error): void {
    if (this.stopped) return;
    this.stop();
    this.handlers.onError?.(err);
  }

  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.gen++;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.controller?.abort();
    this.controller = null;
    this.onEnd();
  }
}

/** Loads a kubeconfig (file, context) the way kubectl does, or in-cluster when none is found. */
export function loadKubeConfig(opts: Pick<KubernetesStoreOptions, 'kubeconfig' | 'context'> = {}): KubeConfig {
  const kc = new KubeConfig();
  if (opts.kubeconfig) kc.loadFromFile(opts.kubeconfig);
  else kc.loadFromDefault();
  if (opts.context) {
    if (!kc.getContexts().some((c) => c.name === opts.context)) {
      throw new InvalidError(`kubeconfig has no context ${JSON.stringify(opts.context)}`);
    }
    kc.setCurrentContext(opts.context);
  }
  if (!kc.getCurrentCluster()) throw new InvalidError('kubeconfig has no current cluster');
  return kc;
}

export function openKubernetesStore(opts: KubernetesStoreOptions = {}): KubernetesStore {
  return new KubernetesStore(loadKubeConfig(opts), opts.watchBackoffMs ? { watchBackoffMs: opts.watchBackoffMs } : {});
}
