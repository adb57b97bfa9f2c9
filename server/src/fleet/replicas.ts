// The hub's replicas, through the store: each proxy server holds a Lease
// `cluster-proxy-server-<serverID>` in the hub namespace and renews it; the live replicas are the
// leases not yet expired (ANP's lease counting). Agents get the count in the serverCount header and
// the list from `GET /v1/replicas`, so they hold one tunnel per live replica and drop tunnels to
// replicas that are gone. A graceful stop deletes the lease at once.
import { gunzipSync, gzipSync } from 'node:zlib';
import type { Logger } from 'pino';
import type { HubApi } from './hub-api.js';
import type { Lease } from '../store/objects.js';
import { NotFoundError, StoreError, type Store } from '../store/store.js';
import { WatchCache } from '../store/watch-cache.js';
import { leaseHeld, microTime, writeLease } from './lease.js';

export const REPLICA_LEASE_PREFIX = 'cluster-proxy-server-';
export const REPLICA_LABEL = 'proxy.open-cluster-management.io/server-replica';
/** On a replica's lease: the clusters it holds agent tunnels for (comma-separated), as of its last renewal. */
export const REPLICA_CLUSTERS_ANNOTATION = 'proxy.open-cluster-management.io/tunnel-clusters';
/** The same list gzipped and base64-encoded, instead of the plain one when that is over PLAIN_CLUSTERS_MAX_BYTES. */
export const REPLICA_CLUSTERS_GZIP_ANNOTATION = 'proxy.open-cluster-management.io/tunnel-clusters-gzip';
/**
 * Up to this size the list is plain text (readable with kubectl, and by replicas of earlier versions during
 * an upgrade): about 2,300 clusters named like `cluster-00001`.
 */
const PLAIN_CLUSTERS_MAX_BYTES = 32 * 1024;
/**
 * The encoded list is cut to this size: Kubernetes refuses an object whose annotations exceed 256 KiB in
 * all, and a refused renewal would make this replica look gone. Compressed, that is ~65,000 clusters named
 * like `cluster-00001`, ~25,000 like `prod-eu-west-1-3f9a1c2b`, ~7,500 named by UUID (docs/goals.md).
 */
export const MAX_CLUSTERS_ANNOTATION_BYTES = 200 * 1024;

/**
 * The annotations that publish `clusters` on a replica lease (the other of the two set to ''), and how many
 * clusters had to be left out to stay within MAX_CLUSTERS_ANNOTATION_BYTES (0 unless the fleet is beyond it).
 */
export function encodeTunnelClusters(clusters: readonly string[]): { annotations: Record<string, string>; omitted: number } {
  let names = [...new Set(clusters)].sort();
  const plain = names.join(',');
  if (plain.length <= PLAIN_CLUSTERS_MAX_BYTES)
    return { annotations: { [REPLICA_CLUSTERS_ANNOTATION]: plain, [REPLICA_CLUSTERS_GZIP_ANNOTATION]: '' }, omitted: 0 };
  const all = names.length;
  let gz = gzipSync(plain).toString('base64');
  // Beyond the bound: drop the tail until it fits (a few rounds; each shrinks by the overshoot and 5 %).
  for (let i = 0; i < 8 && gz.length > MAX_CLUSTERS_ANNOTATION_BYTES; i++) {
    names = names.slice(0, Math.floor((names.length * MAX_CLUSTERS_ANNOTATION_BYTES * 0.95) / gz.length));
    gz = gzipSync(names.join(',')).toString('base64');
  }
  return { annotations: { [REPLICA_CLUSTERS_ANNOTATION]: '', [REPLICA_CLUSTERS_GZIP_ANNOTATION]: gz }, omitted: all - names.length };
}

/** The clusters a replica lease publishes (either annotation; an unreadable one counts as none). */
export function decodeTunnelClusters(annotations: Readonly<Record<string, string>> | undefined): string[] {
  const gz = annotations?.[REPLICA_CLUSTERS_GZIP_ANNOTATION];
  let list = annotations?.[REPLICA_CLUSTERS_ANNOTATION] ?? '';
  if (gz) {
    try {
      list = gunzipSync(Buffer.from(gz, 'base64'), { maxOutputLength: 16 * 1024 * 1024 }).toString('utf8');
    } catch {
      list = '';
    }
  }
  return list ? list.split(',') : [];
}

/** `GET /v1/replicas` answers from a reading of the replica leases' mirror at most this old. */
const LIST_MAX_AGE_MS = 1000;
/**
 * Replica-list requests a second this hub asks its agents to stay under, all together: each agent asks
 * every max(its interval, agents / this) seconds (the answer's syncIntervalSeconds). At 5,000 agents that
 * is every 200 s instead of every 10 s; a new replica is still found by every agent within it. An agent
 * that renews its lease asks for the list with a renewal (whose answer carries it), not a request of its own.
 */
export const REPLICA_SYNC_BUDGET_PER_SECOND = 25;
/**
 * Tunnel reconnects a second this hub asks its agents to stay under when they all lose it at once (a
 * restart): an agent left without any tunnel waits a random part of reconnectSpreadSeconds =
 * agents / this before it dials again (at 5,000 agents 34 s: 200 a second was 9.3 % in the busiest second
 * of the fleet bench, the first ones queued while the hub started; this leaves room).
 */
export const RECONNECT_BUDGET_PER_SECOND = 150;
/** The spread is at most this, so a fleet is back within a minute whatever its size. */
export const MAX_RECONNECT_SPREAD_SECONDS = 45;

/** The live replicas and the pacing hints, as `GET /v1/replicas` and lease renewals give them to agents. */
export interface ReplicaAnswer {
  serverCount: number;
  replicas: { serverID: string }[];
  syncIntervalSeconds: number;
  reconnectSpreadSeconds: number;
}

/** What `GET /v1/replicas` tells an agent about pacing, from this replica's agent count. */
export function pacingHints(agents: number): { syncIntervalSeconds: number; reconnectSpreadSeconds: number } {
  return {
    syncIntervalSeconds: Math.ceil(agents / REPLICA_SYNC_BUDGET_PER_SECOND),
    reconnectSpreadSeconds: Math.min(MAX_RECONNECT_SPREAD_SECONDS, Math.ceil(agents / RECONNECT_BUDGET_PER_SECOND)),
  };
}

/** stop() waits this long at most for a renewal in flight. */
const STOP_WAIT_MS = 2000;

export interface ReplicaRegistryOptions {
  store: Store;
  namespace: string;
  serverID: string;
  /** A replica that has not renewed for this long is gone (default 30 s); renewed every third of it. */
  leaseDurationMs?: number;
  log: Logger;
  now?: () => number;
  /** Clusters this replica holds agent tunnels for, published on its lease for the addon manager's leader. */
  tunnelClusters?: () => readonly string[];
  /**
   * Clusters whose agents may come to this replica (e.g. the registered ones), when more than hold tunnels
   * now: after a restart all of them come back at once, so the pacing hints are sized for them.
   */
  fleetSize?: () => number;
  /** Each list of the replica leases: seconds it took, HTTP status (200 when it worked) and reason (ANP's lease_list metrics). */
  onLeaseList?: (seconds: number, httpStatusCode: number, reason: string) => void;
}

/** A store error as the HTTP status and Kubernetes reason of the call that failed. */
export function storeErrorStatus(err: StoreError): { code: number; reason: string } {
  switch (err.code) {
    case 'NotFound':
      return { code: 404, reason: 'NotFound' };
    case 'AlreadyExists':
      return { code: 409, reason: 'AlreadyExists' };
    case 'Conflict':
      return { code: 409, reason: 'Conflict' };
    case 'Gone':
      return { code: 410, reason: 'Expired' };
    case 'Invalid':
      return { code: 422, reason: 'Invalid' };
    case 'Unavailable':
      return { code: 503, reason: 'ServiceUnavailable' };
  }
}

/**
 * Tunnels per cluster held by the *other* live replicas, from their leases: the replica that writes
 * addon status must not call a cluster's tunnel lost because the agent reaches only other replicas.
 */
export function tunnelsOnOtherReplicas(leases: readonly Lease[], selfID: string, now: number): Map<string, number> {
  const counts = new Map<string, number>();
  for (const l of leases) {
    if (l.metadata.labels?.[REPLICA_LABEL] !== 'true' || l.spec.holderIdentity === selfID) continue;
    if (!leaseHeld(l, now, { defaultDurationS: 30 })) continue;
    for (const c of decodeTunnelClusters(l.metadata.annotations)) if (c) counts.set(c, (counts.get(c) ?? 0) + 1);
  }
  return counts;
}

export class ReplicaRegistry {
  private timer: NodeJS.Timeout | null = null;
  private live: string[] = [];
  private elsewhere: ReadonlySet<string> = new Set();
  private stopped = false;
  private readonly durationMs: number;
  private readonly now: () => number;
  private readonly leaseName: string;

  constructor(private readonly opts: ReplicaRegistryOptions) {
    this.durationMs = opts.leaseDurationMs ?? 30_000;
    this.now = opts.now ?? Date.now;
    this.mirror = new WatchCache({
      store: opts.store,
      kind: 'Lease',
      select: { namespace: opts.namespace, labels: { [REPLICA_LABEL]: 'true' } },
      log: opts.log,
      // As ANP: a failure counts with its status when it has one.
      onList: (seconds, err) => {
        if (!err) this.opts.onLeaseList?.(seconds, 200, '');
        else if (err instanceof StoreError) {
          const { code, reason } = storeErrorStatus(err);
          this.opts.onLeaseList?.(seconds, code, reason);
        }
      },
    });
    this.leaseName = `${REPLICA_LEASE_PREFIX}${opts.serverID
      .toLowerCase()
      .replace(/[^a-z0-9-]/g, '-')
      .slice(0, 200)}`;
  }

  /** Live replicas as last read; this one always, until it stops (it knows it is alive before its lease is read back). */
  get serverIDs(): readonly string[] {
    if (this.stopped || this.live.includes(this.opts.serverID)) return this.live;
    return [...this.live, this.opts.serverID].sort();
  }

  get count(): number {
    return Math.max(1, this.serverIDs.length);
  }

  /**
   * Clusters another live replica holds an agent tunnel to, as of the last reading of the replica leases (every third of
   * the lease duration, and on agents' replica-list requests): a dial for one of them that finds no
   * agent here waits for it to connect (dataplane/agent-wait.ts). The same set object until it changes.
   */
  get clustersElsewhere(): ReadonlySet<string> {
    return this.elsewhere;
  }

  /** Whether the store has been read at least once (until then the configured count stands). */
  get known(): boolean {
    return this.refreshedAt > 0;
  }

  registerRoutes(hubApi: HubApi): void {
    hubApi.route('GET', '/v1/replicas', async () => ({ status: 200, body: await this.answer() }), { agentOnly: true });
  }

  /** What `GET /v1/replicas` answers, and lease renewals carry (`replicas`): the live list and the pacing hints. */
  async answer(): Promise<ReplicaAnswer> {
    // Agents drop tunnels to replicas missing from this list, so answer from a fresh reading: a list
    // from before a replica (re)started would make them close the tunnel they just opened to it.
    if (this.now() - this.refreshedAt > LIST_MAX_AGE_MS) await this.refreshOnce().catch(() => {});
    return {
      serverCount: this.count,
      replicas: this.serverIDs.map((serverID) => ({ serverID })),
      ...pacingHints(Math.max(this.agents, this.opts.fleetSize?.() ?? 0)),
    };
  }

  private ticking: Promise<void> | null = null;

  async start(): Promise<void> {
    await this.runTick();
  }

  /** Stops renewing and deletes our lease, so agents drop us at their next sync. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.mirror.stop();
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    // A renewal in flight could otherwise create the lease again right after the delete (bounded:
    // a store that hangs must not hold up the shutdown).
    if (this.ticking) {
      let t: NodeJS.Timeout | undefined;
      await Promise.race([
        this.ticking,
        new Promise<void>((r) => {
          t = setTimeout(r, STOP_WAIT_MS);
        }),
      ]);
      clearTimeout(t);
    }
    await this.opts.store.delete('Lease', { name: this.leaseName, namespace: this.opts.namespace }).catch((err: unknown) => {
      if (!(err instanceof NotFoundError))
        this.opts.log.warn({ err: (err as Error).message }, "cannot delete this replica's lease; it expires by itself");
    });
  }

  private async tick(): Promise<void> {
    try {
      await this.renew();
      await this.refreshOnce();
    } catch (err) {
      this.opts.log.warn({ err: (err as Error).message }, 'replica lease renewal failed; retrying');
    }
    if (this.stopped) return;
    this.timer = setTimeout(
      () => {
        this.timer = null;
        void this.runTick();
      },
      Math.max(200, Math.floor(this.durationMs / 3)),
    );
  }

  private runTick(): Promise<void> {
    this.ticking = this.tick().finally(() => {
      this.ticking = null;
    });
    return this.ticking;
  }

  private async renew(): Promise<void> {
    const renewTime = microTime(this.now());
    const spec = { holderIdentity: this.opts.serverID, leaseDurationSeconds: Math.max(1, Math.ceil(this.durationMs / 1000)), renewTime };
    const { annotations: clusters, omitted } = this.encodedClusters();
    if (omitted > 0 && !this.warnedOmitted)
      this.opts.log.warn(
        { omitted, maxBytes: MAX_CLUSTERS_ANNOTATION_BYTES },
        'too many tunnelled clusters to publish on the replica lease; the others are left out (the addon leader may report them unavailable if they reach only this replica)',
      );
    this.warnedOmitted = omitted > 0;
    // Losing a race to another write of our own lease is harmless: the next tick renews again.
    await writeLease(this.opts.store, { name: this.leaseName, namespace: this.opts.namespace }, (current) => ({
      labels: { [REPLICA_LABEL]: 'true' },
      annotations: { ...current?.metadata.annotations, ...clusters },
      spec: current ? { ...current.spec, ...spec } : { ...spec, acquireTime: renewTime },
    }));
  }

  private warnedOmitted = false;
  /** The last list published and its encoding: at 5,000 clusters gzip took 2 % of an idle hub's thread, every renewal. */
  private published: { plain: string; encoded: ReturnType<typeof encodeTunnelClusters> } | null = null;

  private encodedClusters(): ReturnType<typeof encodeTunnelClusters> {
    const names = [...new Set(this.opts.tunnelClusters?.() ?? [])].sort();
    const plain = names.join(',');
    if (this.published?.plain !== plain) this.published = { plain, encoded: encodeTunnelClusters(names) };
    return this.published.encoded;
  }
  /**
   * The replica leases, mirrored by a watch: agents' renewals ask for the list about once a second in a big fleet,
   * which cost the apiserver a list each (60 a minute of a hub's requests at 1,000 clusters on OCM itself).
   */
  private readonly mirror: WatchCache<'Lease'>;
  private refreshedAt = 0;
  /** Agents connected here, as of the last refresh (counting them per request would cost O(agents) each). */
  private agents = 0;
  private refreshing: Promise<void> | null = null;

  /** One reading at a time, shared by the renewal loop and concurrent API requests. */
  private refreshOnce(): Promise<void> {
    this.refreshing ??= this.refresh().finally(() => {
      this.refreshing = null;
    });
    return this.refreshing;
  }

  private async refresh(): Promise<void> {
    // The mirror lists once and then follows a watch (its first list is retried here until it works).
    await this.mirror.start();
    const items = [...this.mirror.values()];
    const now = this.now();
    const live = items
      .filter((l) => leaseHeld(l, now, { defaultDurationS: 30 }))
      .map((l) => l.spec.holderIdentity ?? '')
      .filter(Boolean)
      .sort();
    if (live.join(',') !== this.live.join(',')) this.opts.log.info({ replicas: live }, `live proxy server replicas: ${live.length}`);
    this.live = live;
    const elsewhere = [...tunnelsOnOtherReplicas(items, this.opts.serverID, now).keys()].sort();
    if (elsewhere.join(',') !== [...this.elsewhere].join(',')) this.elsewhere = new Set(elsewhere);
    this.agents = this.opts.tunnelClusters?.().length ?? 0;
    this.refreshedAt = now;
  }
}
