// The addon manager: one ManagedClusterAddOn `cluster-proxy` per ManagedCluster (in the cluster's
// namespace), the singleton ManagedProxyConfiguration and its status, the agents' lease renewals
// (hub API `POST /v1/lease`) and a status loop that keeps every addon's conditions true
// (conditions.ts). Admin views: `GET /v1/managedclusteraddons`, `GET /v1/managedclusters`.
import type { PeerCertificate } from 'node:tls';
import type { Logger } from 'pino';
import { HubApiError, type HubApi } from '../fleet/hub-api.js';
import type { ProxyCore } from '../dataplane/proxy-core.js';
import {
  ADDON_NAME,
  PROXY_CONFIGURATION_NAME,
  type AddonRegistration,
  type Lease,
  type ManagedCluster,
  type ConfigReference,
  type ManagedClusterAddOn,
  type ManagedProxyConfiguration,
} from '../store/objects.js';
import { AlreadyExistsError, ConflictError, NotFoundError, type Store, type Watch } from '../store/store.js';
import { WatchCache } from '../store/watch-cache.js';
import { inFlight, STORE_WRITES_IN_FLIGHT } from '../store/in-flight.js';
import { TurnBudget } from '../store/turns.js';
import { sameJson } from '../store/same-json.js';
import { tunnelsOnOtherReplicas, type ReplicaAnswer } from '../fleet/replicas.js';
import { leaseHeld, microTime, writeLease } from '../fleet/lease.js';
import {
  LEASE_GRACE_FACTOR,
  LEASE_NOT_FOUND_REASON,
  addonConditions,
  mergeConditions,
  type AgentReport,
  type ConditionSpec,
} from './conditions.js';
import { HUB_NAMESPACE } from './hub-namespace.js';
import { DEFAULT_INSTALL_NAMESPACE } from './join.js';
import { DEFAULT_AGENT_IMAGE } from './manifests.js';

/**
 * Installs agents for the addons (`--agent-install manifestwork`: ocm/installer.ts). Its pass runs on
 * the leader before the status pass; what it reports per cluster goes into the addon's status.
 */
/** What the addon manager mirrors and the installer reads too (one watch, one copy of every addon). */
export interface AddonMirrors {
  addons: WatchCache<'ManagedClusterAddOn'>;
  /** The ManagedProxyConfigurations (the manager writes the status of ours each pass it changes). */
  mpcs: WatchCache<'ManagedProxyConfiguration'>;
}

export interface AddonInstaller {
  /** Starts its watches; `kick` asks for a pass (the manager also asks after every addon change). */
  start(kick: () => void, mirrors: AddonMirrors): void;
  stop(): void;
  sync(): Promise<void>;
  /** The last pass left works unchecked (it checks a share of them per pass): the next status pass runs another. */
  behind(): boolean;
  statusOf(cluster: string): AddonInstallStatus | undefined;
  /** Conditions for the ManagedProxyConfiguration's status (e.g. an agent image that is not ours). */
  proxyConfigurationConditions(): ConditionSpec[];
  /**
   * For one status pass: the addon's status.configReferences with the config spec hashes the addon writes,
   * or null when they need no change (each config read once per pass).
   */
  configReferences(): (addon: ManagedClusterAddOn) => Promise<ConfigReference[] | null>;
}

/** What the installer's last pass found for a cluster's addon, written into the addon's status. */
export interface AddonInstallStatus {
  conditions: ConditionSpec[];
  registrations: AddonRegistration[];
  /** status.supportedConfigs: the config kinds the addon reads (the addon's half of OCM's contract). */
  supportedConfigs: { group: string; resource: string }[];
  /** The agent's install namespace (status.namespace, as OCM reports it). */
  namespace?: string;
}

export interface AddonManagerOptions {
  store: Store;
  core: ProxyCore;
  log: Logger;
  /** 'tunnel' (default): tunnel loss/recovery shows within `tunnelLossWindowMs`; 'lease': OCM's timing only. */
  healthMode?: 'tunnel' | 'lease';
  /** Longest time until a tunnel loss or recovery shows in the addon's status (default 30 s). */
  tunnelLossWindowMs?: number;
  /** The certificates whose expiry ManagedProxyConfiguration reports. */
  certificates?: () => { servingCertExpiry: Date | null; signerExpiry: Date | null };
  serverID: string;
  /** The CA bundle agents should trust, handed out with every lease renewal (CA rollover). */
  caBundle?: () => string;
  /** The agent image, named in the ManagedProxyConfiguration the hub creates (OCM's CRD requires one). */
  agentImage?: string;
  /** Whether an agent's certificate should be renewed now (signed by a CA that no longer signs). */
  shouldRenew?: (cert: PeerCertificate) => boolean;
  /**
   * The live replica list and pacing hints (ReplicaRegistry.answer), sent with every renewal's answer: an agent
   * then needs no replica-list request of its own, one TLS connection to the hub instead of two.
   */
  replicaList?: () => Promise<ReplicaAnswer>;
  now?: () => number;
}

/** What `get managedclusteraddons -o wide` adds per addon. */
export interface AddonWideInfo {
  leaseRenewTime: string | null;
  connectedServers: number | null;
  serverCount: number | null;
  agentVersion: string | null;
}

const REPORT_FIELDS: Record<keyof Omit<AgentReport, 'receivedAt' | 'apiserverError'>, 'string' | 'number' | 'boolean'> = {
  agentID: 'string',
  leaseDurationSeconds: 'number',
  connectedServers: 'number',
  serverCount: 'number',
  apiserverReachable: 'boolean',
  version: 'string',
  phase: 'string',
};
const MAX_AGENTS_PER_CLUSTER = 16;
/**
 * In 'tunnel' mode a renewal that reports what the stored lease already says is written only once the
 * stored one is this old (the tunnels say whether the agent is there): 5,000 agents renewing every
 * minute would otherwise cost the store 10,000 requests a minute. A change is written at once.
 */
export const LEASE_REFRESH_MS = 20 * 60_000;
/**
 * Lease renewals a second this hub asks its agents to stay under in 'tunnel' mode, all together: an agent
 * sends a changed report at its next tick and an unchanged one every renewIntervalSeconds = fleet / this (at
 * 5,000 clusters every 250 s instead of every 60 s; each is a TLS connection to the hub). At most half of
 * LEASE_REFRESH_MS, so the stored lease is still rewritten within it.
 */
export const LEASE_RENEWAL_BUDGET_PER_SECOND = 20;
/**
 * The installer's pass runs when something it watches changed, and otherwise this often (for what only time
 * changes: certificates due for renewal), not on every status pass: it lists the clusters, addons and works
 * and renders every agent's work, ~8 % of a 1,000-cluster OCM hub's CPU at a pass every 7.5 s.
 */
export const INSTALLER_RESYNC_MS = 60_000;
/** Addons a status pass judges between two turns of the event loop (a few milliseconds' work). */
const JUDGED_PER_TURN = 256;

export class AddonManager {
  private readonly mode: 'tunnel' | 'lease';
  private readonly windowMs: number;
  private readonly now: () => number;
  private clusterWatch: Watch | null = null;
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  private syncing: Promise<void> | null = null;
  /** A change arrived during a pass: run another after it (see pass()). */
  private again = false;
  /** The pause after a pass that was asked for again while it ran (see pass()). */
  private resting: NodeJS.Timeout | null = null;
  private installer: AddonInstaller | null = null;
  /** Something the installer watches changed since its last pass (or it never ran on this leader). */
  private installerDirty = true;
  private installerSyncedAt = 0;
  /** When this replica last renewed the leader lease it holds (lead()); null when it does not hold it. */
  private ledAt: number | null = null;
  /** Since when each cluster has had no tunnel to this hub. */
  private readonly downSince = new Map<string, number>();
  /**
   * Clusters whose ManagedCluster Available is Unknown (their klusterlet stopped renewing). OCM's hub then sets
   * every addon's Available to Unknown (ocm pkg/registration/hub/addon/healthcheck_controller.go), so on an OCM
   * hub we leave Available to it while that lasts, rather than writing it back every pass.
   */
  private readonly klusterletGone = new Set<string>();
  /** Per cluster/agent: what its last written renewal reported, and when it was written. */
  /** When start() ran: a cluster no replica has had a tunnel for since then is down from then on. */
  private startedAt = 0;
  /**
   * Every addon and lease, kept current by watches: the status pass reads them here instead of listing
   * (and copying) all of them from the store every pass.
   */
  private readonly addons: WatchCache<'ManagedClusterAddOn'>;
  private readonly leases: WatchCache<'Lease'>;
  private readonly mpcs: WatchCache<'ManagedProxyConfiguration'>;

  constructor(private readonly opts: AddonManagerOptions) {
    this.mode = opts.healthMode ?? 'tunnel';
    this.windowMs = opts.tunnelLossWindowMs ?? 30_000;
    this.now = opts.now ?? Date.now;
    this.addons = new WatchCache({
      store: opts.store,
      kind: 'ManagedClusterAddOn',
      log: opts.log,
      onChange: (addon, deleted, previous) => {
        if (!this.installer) return;
        // Our own status writes come back as events too: they change nothing the installer reads.
        if (deleted || !previous || !sameJson(installerView(previous), installerView(addon))) this.installerDirty = true;
        this.kick();
      },
    });
    this.mpcs = new WatchCache({
      store: opts.store,
      kind: 'ManagedProxyConfiguration',
      log: opts.log,
      onChange: (mpc, deleted, previous) => {
        if (!this.installer) return;
        // The installer reads its spec; our own status writes come back as events too (the generation stays).
        if (deleted || mpc.metadata.generation === undefined || previous?.metadata.generation !== mpc.metadata.generation)
          this.installerInputsChanged();
      },
    });
    // A cluster's lease written (by any replica: a renewal that changed something) asks for a status pass,
    // once the mirror holds it, so Available turns True at once.
    this.leases = new WatchCache({
      store: opts.store,
      kind: 'Lease',
      log: opts.log,
      onChange: (l) => {
        if (l.metadata.name === ADDON_NAME) this.kick();
      },
    });
  }

  /**
   * Clusters this hub serves, for pacing hints: the connected agents, or the addons when more (right after
   * a start, before the agents are back; they are what comes back at once after a restart).
   */
  get fleetSize(): number {
    return Math.max(this.opts.core.routes.size, this.addons.size);
  }

  /** How often an agent need send a renewal that changes nothing (0: every lease duration, as in OCM). */
  get renewIntervalSeconds(): number {
    if (this.mode !== 'tunnel') return 0;
    return Math.min(LEASE_REFRESH_MS / 2000, Math.ceil(this.fleetSize / LEASE_RENEWAL_BUDGET_PER_SECOND));
  }

  /** Status loop period: a quarter of the window, at most 10 s. */
  get periodMs(): number {
    return Math.max(250, Math.min(10_000, Math.floor(this.windowMs / 4)));
  }

  /**
   * With an installer, ManagedClusterAddOns come from admins or Placements (OCM's install strategies)
   * instead of one per registered cluster. Set before start().
   */
  setInstaller(installer: AddonInstaller): void {
    this.installer = installer;
  }

  registerRoutes(hubApi: HubApi, adminApi: HubApi): void {
    hubApi.route(
      'POST',
      '/v1/lease',
      async (req) => {
        const cluster = req.caller.agent!.cluster;
        const report = parseReport(req.body, this.now());
        // A written renewal asks for a status pass through the lease watch (leases' onChange): only when the
        // store changed, since at 5,000 agents renewals still come ~20 a second.
        await this.renewLease(cluster, report);
        const renew = req.caller.certificate && this.opts.shouldRenew ? this.opts.shouldRenew(req.caller.certificate) : false;
        const replicas = await this.opts.replicaList?.();
        return {
          status: 200,
          body: {
            leaseDurationSeconds: report.leaseDurationSeconds,
            renewIntervalSeconds: this.renewIntervalSeconds,
            ...(this.opts.caBundle ? { caBundle: this.opts.caBundle() } : {}),
            ...(renew ? { renewCertificate: true } : {}),
            ...(replicas ? { replicas } : {}),
          },
        };
      },
      { agentOnly: true },
    );

    adminApi.route(
      'GET',
      '/v1/managedclusteraddons',
      async () => {
        // From the watch-fed mirrors once they hold a list (no copy of every addon and lease per request).
        const cached = this.addons.ready && this.leases.ready;
        const items = cached
          ? [...this.addons.values()].sort(byNamespaceAndName)
          : (await this.opts.store.list('ManagedClusterAddOn')).items;
        const leaseItems = cached ? [...this.leases.values()] : (await this.opts.store.list('Lease')).items;
        const leases = new Map(leaseItems.filter((l) => l.metadata.name === ADDON_NAME).map((l) => [l.metadata.namespace!, l]));
        const wide: Record<string, AddonWideInfo> = {};
        for (const a of items) {
          const ns = a.metadata.namespace!;
          const r = latestReport(reportsOf(leases.get(ns) ?? null));
          wide[`${ns}/${a.metadata.name}`] = {
            leaseRenewTime: leases.get(ns)?.spec.renewTime ?? null,
            connectedServers: r?.connectedServers ?? null,
            serverCount: r?.serverCount ?? null,
            agentVersion: r?.version ?? null,
          };
        }
        return { status: 200, body: { apiVersion: 'v1', kind: 'List', items, wide } };
      },
      { agentOnly: false },
    );

    adminApi.route(
      'GET',
      '/v1/managedproxyconfigurations',
      async () => {
        const { items } = await this.opts.store.list('ManagedProxyConfiguration');
        return { status: 200, body: { apiVersion: 'v1', kind: 'List', items } };
      },
      { agentOnly: false },
    );

    adminApi.route(
      'GET',
      '/v1/managedclusters',
      async () => {
        const { items } = await this.opts.store.list('ManagedCluster');
        return { status: 200, body: { apiVersion: 'v1', kind: 'List', items } };
      },
      { agentOnly: false },
    );
  }

  async start(): Promise<void> {
    this.startedAt ||= this.now();
    await Promise.all([this.addons.start(), this.leases.start(), this.mpcs.start()]);
    await this.ensureProxyConfiguration();
    const list = await this.opts.store.list('ManagedCluster');
    for (const mc of list.items) this.noteClusterAvailability(mc);
    if (!this.installer) for (const mc of list.items) await this.ensureAddon(mc.metadata.name);
    await this.removeOrphans(new Set(list.items.map((m) => m.metadata.name)));
    this.installer?.start(() => this.installerInputsChanged(), { addons: this.addons, mpcs: this.mpcs });
    this.clusterWatch = this.opts.store.watch(
      'ManagedCluster',
      { resourceVersion: list.resourceVersion },
      {
        onEvent: (e) => {
          const name = e.object.metadata.name;
          if (e.type === 'DELETED') this.klusterletGone.delete(name);
          else if (this.noteClusterAvailability(e.object)) this.kick();
          const work = e.type === 'DELETED' ? this.removeAddon(name) : this.installer ? Promise.resolve() : this.ensureAddon(name);
          void work.catch((err: Error) =>
            this.opts.log.warn(
              { cluster: name, err: err.message },
              'addon manager could not reconcile the cluster; the status loop retries',
            ),
          );
        },
        onError: (err) => {
          this.opts.log.warn({ err: err.message }, 'ManagedCluster watch ended; restarting the addon manager watch');
          this.clusterWatch = null;
          if (!this.stopped)
            void this.start().catch((e: Error) => this.opts.log.error({ err: e.message }, 'addon manager cannot restart its watch'));
        },
      },
    );
    if (!this.timer) this.loop();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.clusterWatch?.stop();
    this.clusterWatch = null;
    this.installer?.stop();
    this.addons.stop();
    this.leases.stop();
    this.mpcs.stop();
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.resting) clearTimeout(this.resting);
    this.resting = null;
    await this.syncing?.catch(() => {});
    // Hand leadership over at once instead of letting the next replica wait for the lease to expire.
    const key = { name: MANAGER_LEASE, namespace: HUB_NAMESPACE };
    const lease = await this.opts.store.get('Lease', key).catch(() => null);
    if (lease?.spec.holderIdentity === this.opts.serverID) {
      await this.opts.store.delete('Lease', key, { resourceVersion: lease.metadata.resourceVersion }).catch(() => {});
    }
  }

  /**
   * Something the installer reads from outside the store changed (the hub's CA bundle or signer, at a CA
   * rollover): its pass runs at the next status pass instead of waiting for INSTALLER_RESYNC_MS.
   */
  installerInputsChanged(): void {
    this.installerDirty = true;
    this.kick();
  }

  /** Runs one status pass now (used after a lease renewal, so Available turns True at once). */
  private kick(): void {
    if (this.stopped) return;
    if (this.syncing || this.resting) this.again = true;
    else void this.pass();
  }

  /**
   * The pass running now, or a new one. A change seen during a pass (`again`) gets one more after a pause as long
   * as that pass took: a stream of changes (a big fleet converging, every addon and work written in turn) keeps the
   * manager at most half busy, with its passes growing with the fleet, instead of running them back to back.
   */
  private pass(): Promise<void> {
    if (this.syncing) return this.syncing;
    const began = performance.now();
    this.syncing = this.syncStatus()
      .catch((err: Error) => this.opts.log.warn({ err: err.message }, 'addon status pass failed; retrying'))
      .finally(() => {
        this.syncing = null;
        if (this.again && !this.stopped && !this.resting) {
          this.again = false;
          this.resting = setTimeout(
            () => {
              // Whatever changed during the pause, the next pass sees.
              this.resting = null;
              this.again = false;
              void this.pass();
            },
            Math.ceil(performance.now() - began),
          );
        }
      });
    return this.syncing;
  }

  private loop(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.pass().then(() => this.loop());
    }, this.periodMs);
  }

  /**
   * One manager writes addon status (the leader, by a Lease in the hub namespace), so replicas do not
   * fight over conditions; the others keep answering lease renewals and admin reads.
   */
  private async lead(now: number): Promise<boolean> {
    // A pass a change asked for soon after the last renewal leads on it: the lease, held for three periods, has at
    // least two left, and a fleet's stream of changes does not cost a read and a write of it per pass.
    if (this.ledAt !== null && now >= this.ledAt && now - this.ledAt < this.periodMs / 2) return true;
    this.ledAt = null;
    const durationS = Math.max(1, Math.ceil((this.periodMs * 3) / 1000));
    const renewTime = microTime(now);
    let tookOver = false;
    const led = await writeLease(this.opts.store, { name: MANAGER_LEASE, namespace: HUB_NAMESPACE }, (current) => {
      const spec = { holderIdentity: this.opts.serverID, leaseDurationSeconds: durationS, renewTime };
      if (!current) return { spec: { ...spec, acquireTime: renewTime, leaseTransitions: 0 } };
      const mine = current.spec.holderIdentity === this.opts.serverID;
      if (!mine && leaseHeld(current, now, { defaultDurationS: durationS })) return null;
      tookOver = !mine;
      return {
        spec: {
          ...current.spec,
          ...spec,
          ...(mine ? {} : { acquireTime: renewTime, leaseTransitions: (current.spec.leaseTransitions ?? 0) + 1 }),
        },
      };
    });
    if (led) this.ledAt = now;
    if (led && tookOver) {
      this.installerDirty = true;
      this.opts.log.info('this replica now writes addon status (leader)');
    }
    return led;
  }

  private async syncStatus(): Promise<void> {
    const now = this.now();
    // Before start() has the mirrors, there is nothing to judge (a kick can come that early, e.g. a TLS reload).
    if (!this.addons.ready || !this.leases.ready) return;
    if (!(await this.lead(now))) return;
    // A pass that held works back (FIRST_RENDERS_PER_PASS) is followed by another at each status pass until none is.
    if (this.installer && (this.installerDirty || this.installer.behind() || now - this.installerSyncedAt >= INSTALLER_RESYNC_MS)) {
      // Cleared first: a change during the pass marks it again for the next one.
      this.installerDirty = false;
      this.installerSyncedAt = now;
      try {
        await this.installer.sync();
      } catch (err) {
        this.installerDirty = true;
        throw err;
      }
    }
    // From the watch-fed mirrors: a write of ours shows there once its event arrives; until then a second
    // write of the same change meets a stale resourceVersion (ConflictError, skipped) rather than the store's copy.
    const leases = [...this.leases.values()];
    // Our own tunnels, plus those the other replicas published on their leases (an agent may reach only them).
    const tunnels = tunnelsOnOtherReplicas(leases, this.opts.serverID, now);
    for (const b of this.opts.core.routes.backends()) tunnels.set(b.cluster, (tunnels.get(b.cluster) ?? 0) + 1);
    const leaseOf = new Map<string, Lease>();
    for (const l of leases) if (l.metadata.name === ADDON_NAME) leaseOf.set(l.metadata.namespace!, l);
    const configReferencesOf = this.installer?.configReferences();
    // The judging is in order, JUDGED_PER_TURN addons (or TURN_SLICE_MS) between two turns of the event loop; the
    // writes go STORE_WRITES_IN_FLIGHT at a time, so a pass over a fleet that all changed (a restart, a CA rollover)
    // takes writes/16 round trips, not one per addon.
    const writes: (() => Promise<void>)[] = [];
    const budget = new TurnBudget(JUDGED_PER_TURN);
    for (const addon of [...this.addons.values()]) {
      if (addon.metadata.name !== ADDON_NAME) continue;
      // At 5,000 addons the judging held the thread for ~100 ms every pass: every dial meanwhile waited.
      await budget.spend();
      const cluster = addon.metadata.namespace!;
      const n = tunnels.get(cluster) ?? 0;
      if (n > 0) this.downSince.delete(cluster);
      // A loss counts from when this hub saw tunnels go; a cluster never seen up is judged by its lease alone,
      // except one that had a lease (an agent was there once) and no tunnel anywhere since two windows after our
      // start (time for a fleet to come back after a restart; its stored lease may be up to LEASE_REFRESH_MS old).
      else if (!this.downSince.has(cluster) && this.everSeen.has(cluster)) this.downSince.set(cluster, now);
      else if (!this.downSince.has(cluster) && this.mode === 'tunnel' && leaseOf.has(cluster))
        this.downSince.set(cluster, this.startedAt + 2 * this.windowMs);
      if (n > 0) this.everSeen.add(cluster);
      const lease = leaseOf.get(cluster) ?? null;
      const current = lease && this.countsForAddon(cluster, lease, addon) ? lease : null;
      let specs = addonConditions({
        lease: current,
        mode: this.mode,
        tunnels: n,
        tunnelDownSince: this.downSince.get(cluster) ?? null,
        tunnelLossGraceMs: Math.floor(this.windowMs / 2),
        report: worstReport(reportsOf(current), this.slackMs),
        now,
        leaseSlackMs: this.slackMs,
      });
      const installed = this.installer?.statusOf(cluster);
      // On an OCM hub, Progressing is OCM's addon-manager's (rollout from the work's config-spec-hash):
      // we never write it there; the installer's conditions (RegistrationApplied, ManifestApplied) join ours.
      if (this.installer) specs = specs.filter((c) => c.type !== 'Progressing');
      // The klusterlet is gone: OCM's hub says Available Unknown for every addon of the cluster; one writer. The
      // ManagedCluster and the addon come on two watches: an addon OCM already set Unknown while the cluster's event
      // has not arrived yet is checked against the cluster as the store has it now (an Unknown of OCM's: not ours).
      if (this.installer && !this.klusterletGone.has(cluster) && unknownOfOcm(addon)) {
        const mc = await this.opts.store.get('ManagedCluster', { name: cluster }).catch(() => null);
        if (mc) this.noteClusterAvailability(mc);
      }
      if (this.installer && this.klusterletGone.has(cluster)) specs = specs.filter((c) => c.type !== 'Available');
      if (installed) specs = [...specs.filter((c) => !installed.conditions.some((i) => i.type === c.type)), ...installed.conditions];
      // Without the installer nothing here waits for a lookup: an addon whose status stays as it is costs no task.
      if (!configReferencesOf) {
        const next = this.statusToWrite(addon, specs, now, installed, null);
        if (next) writes.push(() => this.writeStatus(next));
        continue;
      }
      writes.push(async () => {
        const next = this.statusToWrite(addon, specs, now, installed, await configReferencesOf(addon).catch(() => null));
        if (next) await this.writeStatus(next);
      });
    }
    await inFlight(writes, STORE_WRITES_IN_FLIGHT);
    await this.syncProxyConfigurationStatus(now);
  }

  private readonly everSeen = new Set<string>();

  /** Records whether the cluster's klusterlet is gone (Available Unknown); true if that changed. */
  private noteClusterAvailability(mc: ManagedCluster): boolean {
    const name = mc.metadata.name;
    const gone = mc.status?.conditions?.find((c) => c.type === 'ManagedClusterConditionAvailable')?.status === 'Unknown';
    if (gone === this.klusterletGone.has(name)) return false;
    if (gone) this.klusterletGone.add(name);
    else this.klusterletGone.delete(name);
    return true;
  }

  /** The addon with the status this pass gives it, or null when that is the status it has. */
  private statusToWrite(
    addon: ManagedClusterAddOn,
    specs: ConditionSpec[],
    now: number,
    installed: AddonInstallStatus | undefined,
    configReferences: ConfigReference[] | null,
  ): ManagedClusterAddOn | null {
    const { conditions, changed } = mergeConditions(addon.status?.conditions, specs, new Date(now));
    const registrations = installed?.registrations;
    const supportedConfigs = installed?.supportedConfigs;
    const namespace = installed ? (installed.namespace ?? addon.status?.namespace) : addon.spec.installNamespace;
    const differs = (a: unknown, b: unknown): boolean => a !== undefined && !sameJson(a, b ?? []);
    const extraChanged =
      differs(registrations, addon.status?.registrations) ||
      differs(supportedConfigs, addon.status?.supportedConfigs) ||
      configReferences !== null ||
      namespace !== addon.status?.namespace;
    if (!changed && !extraChanged) return null;
    // healthCheck Customized: OCM's registration agent then leaves Available to us. On an OCM hub always:
    // our agents renew their lease through the hub, not in the managed cluster where OCM would look.
    return {
      ...addon,
      status: {
        ...addon.status,
        conditions,
        namespace,
        healthCheck: { mode: this.mode === 'lease' && !this.installer ? 'Lease' : 'Customized' },
        ...(registrations ? { registrations } : {}),
        ...(supportedConfigs ? { supportedConfigs } : {}),
        ...(configReferences ? { configReferences } : {}),
      },
    };
  }

  private async writeStatus(addon: ManagedClusterAddOn): Promise<void> {
    try {
      await this.opts.store.updateStatus('ManagedClusterAddOn', addon);
      const available = addon.status?.conditions?.find((c) => c.type === 'Available');
      this.opts.log.info(
        { cluster: addon.metadata.namespace, available: available?.status, reason: available?.reason },
        'addon status updated',
      );
    } catch (err) {
      // Someone else wrote it meanwhile: the next pass reads it again.
      if (!(err instanceof ConflictError) && !(err instanceof NotFoundError)) throw err;
    }
  }

  /**
   * Whether the cluster's lease says anything about the addon there now: on an OCM hub addons come and go (disabled,
   * enabled again), and a lease not renewed after the addon was created belongs to an earlier one.
   * (creationTimestamp has whole seconds: a renewal within that second cannot be placed.)
   */
  private countsForAddon(cluster: string, lease: Lease | null, addon = this.addons.get({ name: ADDON_NAME, namespace: cluster })): boolean {
    if (!lease) return false;
    if (!this.installer || !addon) return true;
    return Date.parse(lease.spec.renewTime ?? '') >= Date.parse(addon.metadata.creationTimestamp ?? '') + 1000;
  }

  /** How much older than OCM's rule a stored lease may be: unchanged renewals are written every LEASE_REFRESH_MS in 'tunnel' mode. */
  private get slackMs(): number {
    return this.mode === 'tunnel' ? LEASE_REFRESH_MS : 0;
  }

  /** Writes the renewal into the cluster's Lease, unless it changes nothing and the stored one is recent enough; true if written. */
  private async renewLease(cluster: string, r: AgentReport): Promise<boolean> {
    // Unchanged since the report the store holds (whoever wrote it: with several replicas behind a balancer the
    // agent's renewals land on any of them) and recent enough: nothing to write.
    // On an OCM hub a lease counts for an addon only if renewed a second after the addon was created (syncStatus): one
    // renewed within that second is written again, or the addon would wait for a renewal that changes something.
    if (this.slackMs > 0 && this.leases.ready) {
      const lease = this.leases.get({ name: ADDON_NAME, namespace: cluster }) ?? null;
      const stored = reportsOf(lease).find((v) => v.agentID === r.agentID);
      if (stored && sameReport(stored, r) && r.receivedAt - stored.receivedAt < this.slackMs && this.countsForAddon(cluster, lease))
        return false;
    }
    const renewTime = microTime(r.receivedAt);
    const written = await writeLease(
      this.opts.store,
      { name: ADDON_NAME, namespace: cluster },
      (current) => ({
        annotations: withReport(current?.metadata.annotations ?? {}, r, this.slackMs),
        spec: current
          ? {
              ...current.spec,
              holderIdentity: r.agentID,
              leaseDurationSeconds: r.leaseDurationSeconds,
              renewTime,
              leaseTransitions: (current.spec.leaseTransitions ?? 0) + (current.spec.holderIdentity !== r.agentID ? 1 : 0),
            }
          : {
              holderIdentity: r.agentID,
              leaseDurationSeconds: r.leaseDurationSeconds,
              acquireTime: renewTime,
              renewTime,
              leaseTransitions: 0,
            },
      }),
      3,
    );
    if (!written) throw new HubApiError(503, 'lease is being updated concurrently; retry');
    return true;
  }

  private async ensureAddon(cluster: string): Promise<void> {
    const key = { name: ADDON_NAME, namespace: cluster };
    // Every ManagedCluster event asks (OCM writes their status many times a minute): the mirror answers most.
    if (this.addons.get(key) || (await this.opts.store.get('ManagedClusterAddOn', key))) return;
    await this.opts.store.ensureNamespace(cluster);
    const addon: ManagedClusterAddOn = {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'ManagedClusterAddOn',
      metadata: { name: ADDON_NAME, namespace: cluster },
      spec: { installNamespace: DEFAULT_INSTALL_NAMESPACE },
    };
    try {
      await this.opts.store.create('ManagedClusterAddOn', addon);
      this.opts.log.info({ cluster }, 'ManagedClusterAddOn cluster-proxy created');
    } catch (err) {
      if (!(err instanceof AlreadyExistsError)) throw err;
    }
  }

  private async removeAddon(cluster: string): Promise<void> {
    this.downSince.delete(cluster);
    this.everSeen.delete(cluster);
    // On an OCM hub the addon is OCM's addon-manager's to delete (the cluster namespace goes with the cluster).
    const ours = this.installer
      ? ([['Lease', ADDON_NAME]] as const)
      : ([
          ['ManagedClusterAddOn', ADDON_NAME],
          ['Lease', ADDON_NAME],
        ] as const);
    for (const [kind, name] of ours) {
      await this.opts.store.delete(kind, { name, namespace: cluster }).catch((err: unknown) => {
        if (!(err instanceof NotFoundError)) throw err;
      });
    }
  }

  private async removeOrphans(clusters: Set<string>): Promise<void> {
    for (const a of (await this.opts.store.list('ManagedClusterAddOn')).items) {
      if (a.metadata.name === ADDON_NAME && !clusters.has(a.metadata.namespace!)) await this.removeAddon(a.metadata.namespace!);
    }
  }

  private async ensureProxyConfiguration(): Promise<void> {
    if (await this.opts.store.get('ManagedProxyConfiguration', { name: PROXY_CONFIGURATION_NAME })) return;
    const mpc: ManagedProxyConfiguration = {
      apiVersion: 'proxy.open-cluster-management.io/v1alpha1',
      kind: 'ManagedProxyConfiguration',
      metadata: { name: PROXY_CONFIGURATION_NAME },
      // Valid against OCM's CRD (both images are required). No entrypoint: agents dial the hub's
      // --agent-entrypoint (OCM's PortForward would need a hub kubeconfig our agent does not use).
      // One agent replica, as `join` installs (OCM's CRD would default it to 3; our hub sees each agent's tunnels).
      spec: {
        authentication: { signer: { type: 'SelfSigned' } },
        proxyServer: { image: this.opts.agentImage ?? DEFAULT_AGENT_IMAGE },
        proxyAgent: { image: this.opts.agentImage ?? DEFAULT_AGENT_IMAGE, replicas: 1 },
      },
    };
    await this.opts.store.create('ManagedProxyConfiguration', mpc).catch((err: unknown) => {
      if (!(err instanceof AlreadyExistsError)) throw err;
    });
  }

  private async syncProxyConfigurationStatus(now: number): Promise<void> {
    // From the mirror: a write from a copy the watch has not caught up with meets a stale resourceVersion (skipped).
    const key = { name: PROXY_CONFIGURATION_NAME };
    const mpc = this.mpcs.ready ? this.mpcs.get(key) : await this.opts.store.get('ManagedProxyConfiguration', key);
    if (!mpc) return;
    const certs = this.opts.certificates?.() ?? { servingCertExpiry: null, signerExpiry: null };
    const signed = (type: string, expiry: Date | null): ConditionSpec =>
      expiry
        ? {
            type,
            status: expiry.getTime() > now ? 'True' : 'False',
            reason: expiry.getTime() > now ? 'Signed' : 'Expired',
            message: `Expiry: ${expiry.toISOString().replace(/\.\d{3}Z$/, 'Z')}`,
          }
        : { type, status: 'Unknown', reason: 'NotManaged', message: 'the certificate is provided from outside the hub' };
    const specs: ConditionSpec[] = [
      { type: 'ProxyServerDeployed', status: 'True', reason: 'Deployed', message: 'the proxy server is running' },
      signed('ProxyServerSecretSigned', certs.servingCertExpiry),
      signed('AgentServerSecretSigned', certs.signerExpiry),
      ...(this.installer?.proxyConfigurationConditions() ?? []),
    ];
    const { conditions, changed } = mergeConditions(mpc.status?.conditions, specs, new Date(now));
    if (!changed) return;
    await this.opts.store
      .updateStatus('ManagedProxyConfiguration', { ...mpc, status: { ...mpc.status, conditions } })
      .catch((err: unknown) => {
        if (!(err instanceof ConflictError)) throw err;
      });
  }
}

/** Each agent's latest report rides on the cluster's Lease, so every replica (and `kubectl get lease -o yaml`) sees it. */
const REPORT_ANNOTATION_PREFIX = 'agents.proxy.open-cluster-management.io/';
export const MANAGER_LEASE = 'cluster-proxy-addon-manager';

/** Whether two reports say the same, apart from when they were received. */
function sameReport(a: AgentReport, b: AgentReport): boolean {
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
  keys.delete('receivedAt');
  const x = a as unknown as Record<string, unknown>;
  const y = b as unknown as Record<string, unknown>;
  for (const k of keys) if (!sameJson(x[k], y[k])) return false;
  return true;
}

function withReport(annotations: Record<string, string>, r: AgentReport, slackMs: number): Record<string, string> {
  const out: Record<string, string> = {};
  const fresh = (v: AgentReport): boolean => r.receivedAt - v.receivedAt < LEASE_GRACE_FACTOR * v.leaseDurationSeconds * 1000 + slackMs;
  // Keep other annotations, and other agents' reports while they are recent; at most MAX_AGENTS_PER_CLUSTER.
  const others = Object.entries(annotations).filter(([k]) => !k.startsWith(REPORT_ANNOTATION_PREFIX));
  const reports = parseReports({ metadata: { annotations } } as Lease)
    .filter((v) => v.agentID !== r.agentID && fresh(v))
    .sort((a, b) => b.receivedAt - a.receivedAt)
    .slice(0, MAX_AGENTS_PER_CLUSTER - 1);
  for (const [k, v] of others) out[k] = v;
  for (const v of [r, ...reports])
    out[`${REPORT_ANNOTATION_PREFIX}${v.agentID.replace(/[^A-Za-z0-9_.-]/g, '-').slice(0, 63)}`] = JSON.stringify(v);
  return out;
}

/**
 * What the OCM installer reads of an addon (metadata, spec, the config references OCM resolved, Configured): an
 * event that changes none of it (a condition, the registrations) needs no installer pass.
 */
function installerView(addon: ManagedClusterAddOn): unknown {
  const { resourceVersion: _rv, ...metadata } = addon.metadata;
  return {
    metadata,
    spec: addon.spec,
    configReferences: addon.status?.configReferences,
    configured: addon.status?.conditions?.find((c) => c.type === 'Configured'),
  };
}

/** Available Unknown with a reason other than ours (OCM's registration hub copies the cluster's). */
function unknownOfOcm(addon: ManagedClusterAddOn): boolean {
  const a = addon.status?.conditions?.find((c) => c.type === 'Available');
  return a?.status === 'Unknown' && a.reason !== LEASE_NOT_FOUND_REASON;
}

function byNamespaceAndName(a: ManagedClusterAddOn, b: ManagedClusterAddOn): number {
  return (a.metadata.namespace ?? '').localeCompare(b.metadata.namespace ?? '') || a.metadata.name.localeCompare(b.metadata.name);
}

/** Parsed reports per lease object: the mirror's objects change identity only when the lease changes. */
const parsedReports = new WeakMap<Lease, AgentReport[]>();

function reportsOf(lease: Lease | null): AgentReport[] {
  if (!lease) return [];
  let out = parsedReports.get(lease);
  if (!out) parsedReports.set(lease, (out = parseReports(lease)));
  return out;
}

function parseReports(lease: Lease): AgentReport[] {
  const out: AgentReport[] = [];
  for (const [k, v] of Object.entries(lease.metadata.annotations ?? {})) {
    if (!k.startsWith(REPORT_ANNOTATION_PREFIX)) continue;
    try {
      out.push(JSON.parse(v) as AgentReport);
    } catch {
      // Not ours to fix: an edited annotation is skipped.
    }
  }
  return out;
}

function latestReport(all: AgentReport[]): AgentReport | null {
  let best: AgentReport | null = null;
  for (const r of all) if (!best || r.receivedAt > best.receivedAt) best = r;
  return best;
}

/** Worst recent report of the cluster's agents, so one agent short of servers makes the addon Degraded. */
function worstReport(all: AgentReport[], slackMs: number): AgentReport | null {
  const latest = latestReport(all);
  if (!latest) return null;
  const recent = all.filter((r) => latest.receivedAt - r.receivedAt < LEASE_GRACE_FACTOR * r.leaseDurationSeconds * 1000 + slackMs);
  return recent.find((r) => !r.apiserverReachable) ?? recent.find((r) => r.connectedServers < r.serverCount) ?? latest;
}

function parseReport(body: unknown, now: number): AgentReport {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new HubApiError(400, 'lease report must be a JSON object');
  const b = body as Record<string, unknown>;
  for (const [k, t] of Object.entries(REPORT_FIELDS))
    if (typeof b[k] !== t) throw new HubApiError(400, `lease report field "${k}" must be a ${t}`);
  if (b['apiserverError'] !== undefined && typeof b['apiserverError'] !== 'string')
    throw new HubApiError(400, 'lease report field "apiserverError" must be a string');
  const r = b as unknown as AgentReport;
  if (!Number.isInteger(r.leaseDurationSeconds) || r.leaseDurationSeconds < 1 || r.leaseDurationSeconds > 3600)
    throw new HubApiError(400, 'leaseDurationSeconds must be a whole number from 1 to 3600');
  if (
    !Number.isInteger(r.connectedServers) ||
    !Number.isInteger(r.serverCount) ||
    r.connectedServers < 0 ||
    r.serverCount < 0 ||
    r.serverCount > 1000
  )
    throw new HubApiError(400, 'connectedServers and serverCount must be small whole numbers');
  if (!['Running', 'Bootstrapping', 'RenewingCredentials'].includes(r.phase))
    throw new HubApiError(400, 'phase must be Running, Bootstrapping or RenewingCredentials');
  if (r.agentID.length > 128 || r.version.length > 64 || (r.apiserverError?.length ?? 0) > 512)
    throw new HubApiError(400, 'lease report field too long');
  return {
    agentID: r.agentID,
    leaseDurationSeconds: r.leaseDurationSeconds,
    connectedServers: r.connectedServers,
    serverCount: r.serverCount,
    apiserverReachable: r.apiserverReachable,
    ...(r.apiserverError ? { apiserverError: r.apiserverError } : {}),
    version: r.version,
    phase: r.phase,
    receivedAt: now,
  };
}
