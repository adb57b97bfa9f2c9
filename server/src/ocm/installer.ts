// `--agent-install manifestwork`: the hub is the addon's half of OCM's addon-framework contract for
// `cluster-proxy`, and nothing of OCM's half. OCM's hub addon-manager (ClusterManagementAddOn lifecycle
// `addon-manager`) owns install strategy (which clusters get a ManagedClusterAddOn), config resolution
// (status.configReferences) and rollout (the Progressing condition); OCM's klusterlet
// owns CSRs, Secrets, applying the work. One pass (run by the addon manager's leader, after every change
// it watches and on its status period):
//   1. ClusterManagementAddOn `cluster-proxy` exists (created with installStrategy Manual if missing), with the
//      spec hashes of its default configs in its status (config-hashes.ts);
//   2. every ManagedClusterAddOn whose cluster accepts clients and whose configs OCM resolved (Configured) has ManifestWork
//      `addon-cluster-proxy-deploy-0` holding the agent (agent-work.ts), rendered from the configs OCM
//      resolved into the addon's status.configReferences, rewritten when it differs (a config change, or
//      an edit by someone else); works of addons or clusters that are gone are deleted;
//   3. CSRs the klusterlet makes for the addon are approved or left pending, never denied
//      (registrations.ts), and approved ones signed with the hub CA;
//   4. Secrets `proxy-server-ca` and `proxy-client` exist where OCM's hub clients read them.
// What the addon writes on its ManagedClusterAddOn (addon-framework's registration and agentdeploy
// controllers): status.supportedConfigs, status.registrations, status.namespace, RegistrationApplied and
// ManifestApplied, and (addonconfig) the spec hashes and observed generations in status.configReferences. The
// addon manager writes them with the health condition (Available).
import { X509Certificate, createHash } from 'node:crypto';
import type { Logger } from 'pino';
import { ManifestInputError } from '../addon/manifests.js';
import { CLUSTER_FACT_ANNOTATIONS, clusterFacts } from '../addon/join.js';
import type { ConditionSpec } from '../addon/conditions.js';
import type { AddonInstallStatus, AddonMirrors } from '../addon/manager.js';
import { WatchCache } from '../store/watch-cache.js';
import { inFlight } from '../store/in-flight.js';
import { HUB_NAMESPACE } from '../addon/hub-namespace.js';
import { CLUSTER_UID_URI_PREFIX, issueClientCert, type PemPair } from '../pki/certificates.js';
import { renewalDue } from '../pki/rotation.js';
import {
  ADDON_NAME,
  KINDS,
  PROXY_CONFIGURATION_NAME,
  type AddOnDeploymentConfig,
  type CertificateSigningRequest,
  type ClusterManagementAddOn,
  type ConfigReference,
  type CsrCondition,
  type Kind,
  type ManagedCluster,
  type ManagedClusterAddOn,
  type ManagedProxyConfiguration,
  type ManifestWork,
  type Secret,
} from '../store/objects.js';
import { AlreadyExistsError, ConflictError, NotFoundError, type Store, type Watch } from '../store/store.js';
import { installNamespaceOf, keepingDeploymentSelectors, releasingNamespaces, renderAgentWork } from './agent-work.js';
import { canonicalJson, sameJson } from '../store/same-json.js';
import { ClusterProfileWriter, type ClusterProfileOptions } from './cluster-profiles.js';
import { signCertificateRequest } from './csr-signer.js';
import {
  ADDON_NAME_LABEL,
  AGENT_CERT_DAYS,
  AGENT_WORK_NAME,
  CLUSTER_NAME_LABEL,
  CONFIG_SPEC_HASH_ANNOTATION,
  LIFECYCLE_ANNOTATION,
  PROXY_AGENT_SIGNER,
  PROXY_CLIENT_COMMON_NAME,
  PROXY_CLIENT_GROUP,
  PROXY_CLIENT_SECRET,
  PROXY_SERVER_CA_SECRET,
} from './names.js';
import { addonRegistrations, reviewCsr } from './registrations.js';
import { addonConfigReferences, clusterManagementAddOnStatus, memoLookup, type ConfigLookup, type ConfigObject } from './config-hashes.js';

export interface OcmInstallerOptions {
  store: Store;
  log: Logger;
  /** The CA that signs agent certificates (the hub's signer; it changes at a CA rollover's promote). */
  signer: () => PemPair | undefined;
  /** The CA bundle agents trust (two CAs during a rollover). */
  caBundle: () => string;
  /** HOST:PORT agents dial (read per pass: the port is known once the hub listens). */
  agentEntrypoint: () => string;
  serverName?: string;
  /** Our agent image; the only one we ever run (an MPC naming another is reported, not followed). */
  agentImage: string;
  /** Where agents go when neither the AddOnDeploymentConfig nor the addon names a namespace. */
  defaultInstallNamespace: string;
  /** The hub serves the HTTP gateway: agents get the right to impersonate (manifests.ts). */
  gateway?: boolean;
  /** Write the gateway as an access provider into OCM's ClusterProfiles (cluster-profiles.ts). */
  clusterProfiles?: ClusterProfileOptions;
  now?: () => number;
  /** Existing works checked against a render per pass before this hub has rendered them (FIRST_RENDERS_PER_PASS). */
  firstRendersPerPass?: number;
}

const DAY_MS = 86_400_000;
/**
 * The kinds whose changes start a pass at once (the status period catches anything else). Addons, clusters and
 * our works are mirrored (watch-fed, below) and kick a pass from there.
 */
const WATCHED: Kind[] = ['CertificateSigningRequest', 'ClusterManagementAddOn'];
/** The config kinds the addon reads (status.supportedConfigs; OCM's addon-manager resolves only these). */
export const SUPPORTED_CONFIGS = [
  { group: KINDS.ManagedProxyConfiguration.group, resource: KINDS.ManagedProxyConfiguration.plural },
  { group: KINDS.AddOnDeploymentConfig.group, resource: KINDS.AddOnDeploymentConfig.plural },
];
const WATCH_RETRY_MS = 2000;
/**
 * Existing works a pass renders and compares, at most, among those this hub has not rendered yet (after a start, a
 * new leader, a write); the rest report their work's conditions as stored, and the passes that follow (one per
 * status pass while any is left) check them. A restarted hub at 5,000 clusters rendered and compared every work in
 * its first pass, seconds of its thread while the whole fleet reconnected to it. New works, and works whose inputs
 * changed since this hub rendered them, are not held back.
 */
export const FIRST_RENDERS_PER_PASS = 500;

export class OcmInstaller {
  private status = new Map<string, AddonInstallStatus>();
  private readonly watches = new Map<Kind, Watch>();
  private readonly retries = new Set<NodeJS.Timeout>();
  private started = false;
  private stopped = false;
  private readonly now: () => number;
  private warnedNoSigner = false;
  /**
   * Per cluster, what its work was last rendered from (objects by identity: the mirrors replace an object when it
   * changes) and the spec and metadata that render came to, once the stored work held them: a pass whose inputs
   * did not change, over a work that did not either, renders and serializes nothing. The spec is the hash of the
   * stored work's canonical spec.
   */
  private renders = new Map<string, { inputs: readonly unknown[]; spec: string; metadata: ManifestWork['metadata'] }>();
  /** Namespaces of the hub-side Secrets already made sure of (one read per namespace, not per pass). */
  private readonly ensuredNamespaces = new Set<string>();
  /** Pending CSRs already logged (a CSR left pending is logged once, not every pass). */
  private loggedPending = new Set<string>();
  private mpcConditions: ConditionSpec[] = [];
  /** The last pass left existing works unchecked (FIRST_RENDERS_PER_PASS): the next status pass runs one more. */
  private unchecked = false;

  private readonly profiles: ClusterProfileWriter | null;
  /**
   * Watch-fed mirrors a pass reads instead of listing every cluster, addon and work (three copies of each); the
   * addons and ManagedProxyConfigurations are the addon manager's, the others this installer's.
   */
  private mirrors: {
    addons: WatchCache<'ManagedClusterAddOn'>;
    clusters: WatchCache<'ManagedCluster'>;
    works: WatchCache<'ManifestWork'>;
    /** The configs (read per addon, and hashed in every status pass: from here, not one GET each). */
    adcs: WatchCache<'AddOnDeploymentConfig'>;
    mpcs: WatchCache<'ManagedProxyConfiguration'>;
  } | null = null;
  /** The mirrors' first lists; dropped when one failed, so the next pass lists again. */
  private mirrorsListed: Promise<void> | null = null;

  constructor(private readonly opts: OcmInstallerOptions) {
    this.now = opts.now ?? Date.now;
    this.profiles = opts.clusterProfiles ? new ClusterProfileWriter(opts.store, opts.log, opts.clusterProfiles) : null;
  }

  /** The mirrors hold their lists (a cache already listed and watching returns at once from start()). */
  private mirrorsReady(): Promise<void> {
    const m = this.mirrors;
    if (!m) return Promise.reject(new Error('the OCM installer was not started'));
    this.mirrorsListed ??= Promise.all([m.clusters.start(), m.works.start(), m.adcs.start(), m.mpcs.start()]).then(
      () => undefined,
      (err: unknown) => {
        this.mirrorsListed = null;
        throw err;
      },
    );
    return this.mirrorsListed;
  }

  /** Watches what a pass depends on; `kick` asks the addon manager for a pass. Idempotent. */
  start(kick: () => void, mirrors: AddonMirrors): void {
    if (this.started || this.stopped) return;
    this.started = true;
    const { store, log } = this.opts;
    // OCM's registration controllers write every cluster's status (conditions, leases, clock) many times a minute:
    // only a change to what a pass reads of a cluster (clusterInputs) asks for one.
    const clusters = new WatchCache({
      store,
      kind: 'ManagedCluster',
      log,
      project: slimCluster,
      onChange: (mc, deleted, previous) => {
        if (deleted || !previous || clusterInputs(previous) !== clusterInputs(mc)) kick();
      },
    });
    // Only our works (the addon-name label every version of ours and OCM's cluster-proxy put on them), kept slim.
    const works = new WatchCache({
      store,
      kind: 'ManifestWork',
      log,
      select: { labels: { [ADDON_NAME_LABEL]: ADDON_NAME } },
      project: slimWork,
      onChange: () => kick(),
    });
    const adcs = new WatchCache({ store, kind: 'AddOnDeploymentConfig', log, onChange: () => kick() });
    this.mirrors = { addons: mirrors.addons, clusters, works, adcs, mpcs: mirrors.mpcs };
    // Listed now; a failure is said by the first pass, and the pass after it lists again.
    this.mirrorsReady().catch(() => {});
    for (const kind of WATCHED) this.watchKind(kind, kick);
    if (this.profiles) this.watchKind('ClusterProfile', kick);
  }

  private watchKind(kind: Kind, kick: () => void): void {
    if (this.stopped) return;
    // No resourceVersion: the first events replay what exists, which costs one extra pass at start only.
    this.watches.set(
      kind,
      this.opts.store.watch(
        kind,
        {},
        {
          onEvent: () => kick(),
          onError: (err) => {
            this.watches.delete(kind);
            this.opts.log.warn({ kind, err: err.message }, 'OCM install watch ended; restarting it');
            const t = setTimeout(() => {
              this.retries.delete(t);
              this.watchKind(kind, kick);
            }, WATCH_RETRY_MS);
            this.retries.add(t);
          },
        },
      ),
    );
  }

  stop(): void {
    this.stopped = true;
    this.mirrors?.clusters.stop();
    this.mirrors?.works.stop();
    this.mirrors?.adcs.stop();
    for (const w of this.watches.values()) w.stop();
    this.watches.clear();
    for (const t of this.retries) clearTimeout(t);
    this.retries.clear();
  }

  /** Whether the last pass left works to check: the addon manager runs another at its next status pass. */
  behind(): boolean {
    return this.unchecked;
  }

  statusOf(cluster: string): AddonInstallStatus | undefined {
    return this.status.get(cluster);
  }

  /** status.configReferences with addon-framework's addonconfig hashes (config-hashes.ts), for one status pass. */
  configReferences(): (addon: ManagedClusterAddOn) => Promise<ConfigReference[] | null> {
    const lookup = this.configLookup();
    return (addon) => addonConfigReferences(addon, lookup);
  }

  /** The configs the addon reads (SUPPORTED_CONFIGS), from the mirrors; undefined for any other kind. */
  private configLookup(): ConfigLookup {
    return memoLookup(async ({ group, resource, name, namespace }) => {
      if (group === KINDS.AddOnDeploymentConfig.group && resource === KINDS.AddOnDeploymentConfig.plural)
        return (await this.adcOf({ name, namespace: namespace ?? '' })) as ConfigObject | null;
      if (group === KINDS.ManagedProxyConfiguration.group && resource === KINDS.ManagedProxyConfiguration.plural)
        return (await this.mpcOf(name)) as ConfigObject | null;
      return undefined;
    });
  }

  /** An AddOnDeploymentConfig from its mirror (from the store while the mirror has no list yet). */
  private async adcOf(key: { name: string; namespace: string }): Promise<AddOnDeploymentConfig | null> {
    const m = this.mirrors?.adcs;
    return m?.ready ? (m.get(key) ?? null) : this.opts.store.get('AddOnDeploymentConfig', key);
  }

  private async mpcOf(name: string): Promise<ManagedProxyConfiguration | null> {
    const m = this.mirrors?.mpcs;
    return m?.ready ? (m.get({ name }) ?? null) : this.opts.store.get('ManagedProxyConfiguration', { name });
  }

  /** cmaconfig's hashes in the ClusterManagementAddOn's status (OCM's addon-manager copies them into each addon). */
  private async syncClusterManagementAddOnHashes(cma: ClusterManagementAddOn): Promise<void> {
    const status = await clusterManagementAddOnStatus(cma, this.configLookup());
    if (!status) return;
    try {
      await this.opts.store.updateStatus('ClusterManagementAddOn', { ...cma, status });
      this.opts.log.info('ClusterManagementAddOn cluster-proxy: config spec hashes written');
    } catch (err) {
      // OCM's addon-manager wrote it meanwhile (its watch kicks the next pass), or it is gone.
      if (!(err instanceof ConflictError) && !(err instanceof NotFoundError)) throw err;
    }
  }

  /** What the last pass found about the ManagedProxyConfiguration (written on its status by the manager). */
  proxyConfigurationConditions(): ConditionSpec[] {
    return this.mpcConditions;
  }

  async sync(): Promise<void> {
    const signer = this.opts.signer();
    if (!signer) {
      if (!this.warnedNoSigner)
        this.opts.log.error('--agent-install manifestwork needs the CA key (--ca-key) to sign agent certificates; nothing is installed');
      this.warnedNoSigner = true;
      return;
    }
    const mirrors = this.mirrors;
    if (!mirrors) throw new Error('the OCM installer was not started');
    await this.mirrorsReady();
    await this.syncClusterManagementAddOnHashes(await this.ensureClusterManagementAddOn());
    const clusters = new Map([...mirrors.clusters.values()].map((c) => [c.metadata.name, c]));
    const addons = [...mirrors.addons.values()].filter((a) => a.metadata.name === ADDON_NAME);
    const mpc = await this.mpcOf(PROXY_CONFIGURATION_NAME);
    this.mpcConditions = [agentImageCondition(mpc, this.opts.agentImage)];
    const works = new Map(
      [...mirrors.works.values()].filter((w) => w.metadata.name === AGENT_WORK_NAME).map((w) => [w.metadata.namespace!, w]),
    );
    const configs = new Map<string, Promise<AddOnDeploymentConfig | null>>();
    const status = new Map<string, AddonInstallStatus>();
    const firstRenders = { left: this.opts.firstRendersPerPass ?? FIRST_RENDERS_PER_PASS };
    this.unchecked = false;
    // Each addon's work is written STORE_WRITES_IN_FLIGHT at a time: a first install over a fleet is one create per
    // cluster, each a round trip to the API server.
    const tasks = addons.map((addon) => {
      const cluster = addon.metadata.namespace!;
      const existing = works.get(cluster) ?? null;
      works.delete(cluster);
      return async (): Promise<void> => {
        // One cluster's failure (a refused write, a broken object) is logged and retried next pass; the others go on.
        try {
          status.set(cluster, await this.syncAddon(addon, clusters.get(cluster) ?? null, existing, { mpc, signer, configs, firstRenders }));
        } catch (err) {
          this.opts.log.warn({ cluster, err: (err as Error).message }, 'cannot install the agent of this cluster now; retrying next pass');
          // The next status pass runs the installer again (behind()): nothing else may ask for one for a minute.
          this.unchecked = true;
          const previous = this.status.get(cluster);
          if (previous) status.set(cluster, previous);
        }
      };
    });
    // Works whose addon is gone (disabled, or the cluster left the Placement).
    for (const orphan of works.values()) tasks.push(() => this.deleteWork(orphan, 'its ManagedClusterAddOn is gone'));
    await inFlight(tasks);
    for (const cluster of this.renders.keys()) if (!status.has(cluster)) this.renders.delete(cluster);
    this.status = status;
    await this.reviewCsrs(clusters, new Set(addons.map((a) => a.metadata.namespace!)), signer);
    await this.ensureHubSecrets(mpc, signer);
    await this.profiles?.sync();
  }

  private async syncAddon(
    addon: ManagedClusterAddOn,
    mc: ManagedCluster | null,
    existing: ManifestWork | null,
    ctx: {
      mpc: ManagedProxyConfiguration | null;
      signer: PemPair;
      configs: Map<string, Promise<AddOnDeploymentConfig | null>>;
      firstRenders: { left: number };
    },
  ): Promise<AddonInstallStatus> {
    const cluster = addon.metadata.namespace!;
    if (!mc?.spec.hubAcceptsClient) {
      if (existing) await this.deleteWork(existing, mc ? 'the cluster no longer accepts clients' : 'the cluster is gone');
      return {
        registrations: [],
        supportedConfigs: SUPPORTED_CONFIGS,
        conditions: waiting(
          mc ? 'the cluster is not accepted by the hub (hubAcceptsClient is false)' : 'the managed cluster does not exist',
        ),
      };
    }
    const registrations = addonRegistrations(cluster, ctx.signer.certPem);
    if (!configured(addon)) {
      // OCM's cluster-proxy turns on addon-framework's config check (agentdeploy/controller.go): no work is built
      // or changed until OCM's addon-manager has resolved the addon's configs (Configured True), so an addon
      // outside a rollout's batch keeps the work it has, and a new one gets none with defaults first.
      // The registration half still runs (addon-framework's registration controller does not wait): status.namespace
      // from the configs resolved so far, so the klusterlet's CSR is made once, for the namespace the agent gets.
      const namespace = installNamespaceOf({
        adc: await this.configOf(addon, ctx.configs).catch(() => null),
        defaultInstallNamespace: this.opts.defaultInstallNamespace,
      });
      return {
        registrations,
        supportedConfigs: SUPPORTED_CONFIGS,
        namespace,
        conditions: [...registered(), ...(existing ? workConditions(existing) : [])],
      };
    }
    let desired: ManifestWork;
    let inputsOfDesired: readonly unknown[];
    let namespace: string;
    try {
      const adc = await this.configOf(addon, ctx.configs);
      namespace = installNamespaceOf({ adc, defaultInstallNamespace: this.opts.defaultInstallNamespace });
      const input = {
        addon,
        cluster: mc,
        mpc: ctx.mpc,
        adc,
        caBundle: this.opts.caBundle(),
        agentEntrypoint: this.opts.agentEntrypoint(),
        serverName: this.opts.serverName,
        image: this.opts.agentImage,
        defaultInstallNamespace: this.opts.defaultInstallNamespace,
        gateway: this.opts.gateway === true,
      };
      // What renderAgentWork reads of the addon: its name, uid and config references (its status changes with
      // every condition written, which changes nothing in the work).
      const addonKey = JSON.stringify([addon.metadata.name, addon.metadata.uid, addon.status?.configReferences ?? []]);
      const inputs = [
        addonKey,
        clusterInputs(mc),
        ctx.mpc,
        adc,
        input.caBundle,
        input.agentEntrypoint,
        input.serverName,
        input.image,
        input.gateway,
      ];
      const last = this.renders.get(cluster);
      const asRendered =
        existing !== null &&
        last !== undefined &&
        last.inputs.length === inputs.length &&
        last.inputs.every((v, n) => v === inputs[n]) &&
        specHashOf(existing) === last.spec &&
        sameWorkMetadata(existing, last.metadata);
      // Not rendered by this hub yet, and this pass has checked its share of those: reported as stored, for now.
      const heldBack = !asRendered && existing !== null && last === undefined && ctx.firstRenders.left-- <= 0;
      if (heldBack) this.unchecked = true;
      if (existing && (asRendered || heldBack)) {
        return {
          registrations,
          supportedConfigs: SUPPORTED_CONFIGS,
          namespace,
          conditions: [...registered(), ...workConditions(existing)],
        };
      }
      this.renders.delete(cluster);
      desired = renderAgentWork(input);
      inputsOfDesired = inputs;
    } catch (err) {
      if (!(err instanceof ManifestInputError)) throw err;
      // The last good work stays in place; ManifestApplied says why nothing newer is rolled out, with
      // addon-framework's reason for manifests the addon cannot produce (agentdeploy/controller.go).
      return {
        registrations,
        supportedConfigs: SUPPORTED_CONFIGS,
        conditions: [
          ...registered(),
          {
            type: 'ManifestApplied',
            status: 'False',
            reason: 'ManifestWorkApplyFailed',
            message: `failed to get manifest from agent interface: ${err.message}`,
          },
        ],
      };
    }
    let released = releasingNamespaces(desired, existing);
    if (released !== desired && existing) {
      // A namespace is held back until the work agent applied that: asked of the store, not the mirror, whose
      // copy may lag the agent's status write (rare: only while a namespace moves).
      const stored = await this.opts.store.get('ManifestWork', { name: existing.metadata.name, namespace: cluster });
      if (stored) {
        existing = stored;
        released = releasingNamespaces(desired, stored);
      }
    }
    // Still held back: each status pass looks again until the work agent has applied it.
    if (released !== desired) this.unchecked = true;
    const toWrite = keepingDeploymentSelectors(released, existing);
    const work = await this.applyWork(toWrite, existing);
    // Remembered only when no namespace is held back: letting one go waits for the work's status (applied), which
    // the inputs do not cover. A work just written is remembered as the store answered it, so the next pass does
    // not check it again.
    if (work && released === desired)
      this.renders.set(cluster, { inputs: inputsOfDesired, spec: specHashOf(work), metadata: toWrite.metadata });
    return { registrations, supportedConfigs: SUPPORTED_CONFIGS, namespace, conditions: [...registered(), ...workConditions(work)] };
  }

  private async ensureClusterManagementAddOn(): Promise<ClusterManagementAddOn> {
    const current = await this.opts.store.get('ClusterManagementAddOn', { name: ADDON_NAME });
    if (current) return current;
    const cma = clusterManagementAddOn();
    try {
      const created = await this.opts.store.create('ClusterManagementAddOn', cma);
      this.opts.log.info('ClusterManagementAddOn cluster-proxy created (installStrategy Manual)');
      return created;
    } catch (err) {
      if (!(err instanceof AlreadyExistsError)) throw err;
      return (await this.opts.store.get('ClusterManagementAddOn', { name: ADDON_NAME }))!;
    }
  }

  /**
   * The cluster's AddOnDeploymentConfig: the one OCM's addon-manager resolved into the addon's
   * status.configReferences (addon-framework's GetAddOnDeploymentConfigValues reads only that), or none.
   */
  private configOf(
    addon: ManagedClusterAddOn,
    cache: Map<string, Promise<AddOnDeploymentConfig | null>>,
  ): Promise<AddOnDeploymentConfig | null> {
    const ref = addon.status?.configReferences?.find(
      (c) => c.group === KINDS.AddOnDeploymentConfig.group && c.resource === KINDS.AddOnDeploymentConfig.plural,
    )?.desiredConfig;
    if (!ref) return Promise.resolve(null);
    const key = { name: ref.name, namespace: ref.namespace ?? '' };
    const k = `${key.namespace}/${key.name}`;
    if (!cache.has(k)) cache.set(k, this.adcOf(key));
    return cache.get(k)!;
  }

  /** Creates or rewrites the work when it differs from what we want; returns what is stored now. */
  private async applyWork(desired: ManifestWork, existing: ManifestWork | null): Promise<ManifestWork | null> {
    const { store, log } = this.opts;
    const cluster = desired.metadata.namespace!;
    try {
      if (!existing) {
        const created = await store.create('ManifestWork', desired);
        log.info({ cluster }, 'agent ManifestWork created');
        return created;
      }
      if (specHashOf(existing) === specHashOf(desired) && sameWorkMetadata(existing, desired.metadata)) return existing;
      const annotations = { ...existing.metadata.annotations };
      delete annotations[CONFIG_SPEC_HASH_ANNOTATION];
      Object.assign(annotations, desired.metadata.annotations);
      const updated = await store.update('ManifestWork', {
        ...existing,
        metadata: {
          ...existing.metadata,
          labels: { ...existing.metadata.labels, ...desired.metadata.labels },
          annotations,
          ownerReferences: desired.metadata.ownerReferences!,
        },
        spec: desired.spec,
      });
      log.info(
        { cluster, generation: updated.metadata.generation },
        'agent ManifestWork updated (configuration changed, or it was edited elsewhere)',
      );
      return updated;
    } catch (err) {
      // Another writer got there first: the next status pass compares again (its event may have come already).
      if (err instanceof AlreadyExistsError || err instanceof ConflictError) {
        this.unchecked = true;
        return existing;
      }
      throw err;
    }
  }

  private async deleteWork(work: ManifestWork, why: string): Promise<void> {
    await this.opts.store
      .delete(
        'ManifestWork',
        { name: work.metadata.name, namespace: work.metadata.namespace! },
        { resourceVersion: work.metadata.resourceVersion! },
      )
      .then(() => this.opts.log.info({ cluster: work.metadata.namespace, why }, 'agent ManifestWork deleted'))
      .catch((err: unknown) => {
        if (!(err instanceof NotFoundError) && !(err instanceof ConflictError)) throw err;
      });
  }

  private async reviewCsrs(clusters: Map<string, ManagedCluster>, enabled: Set<string>, signer: PemPair): Promise<void> {
    // Only the addon's CSRs (the klusterlet labels them); a hub holds many others (kubelets', other addons').
    const { items } = await this.opts.store.list('CertificateSigningRequest', { labels: { [ADDON_NAME_LABEL]: ADDON_NAME } });
    const stillPending = new Set<string>();
    for (const csr of items) {
      const conds = csr.status?.conditions ?? [];
      if (conds.some((c) => c.type === 'Denied' || c.type === 'Failed')) continue;
      const approved = conds.some((c) => c.type === 'Approved' && c.status === 'True');
      if (approved && (csr.spec.signerName !== PROXY_AGENT_SIGNER || csr.status?.certificate)) continue;
      const cluster = csr.metadata.labels?.[CLUSTER_NAME_LABEL] ?? '';
      const review = await reviewCsr(csr, {
        cluster: clusters.get(cluster) ?? null,
        addonEnabled: enabled.has(cluster),
        signingCaPem: signer.certPem,
      });
      if (review.decision === 'ignore') continue;
      try {
        if (review.decision === 'pending') {
          // As OCM's approver: not approved, never denied (a denied CSR is a dead end for the klusterlet).
          stillPending.add(csr.metadata.name);
          if (!this.loggedPending.has(csr.metadata.name))
            this.opts.log.warn(
              { csr: csr.metadata.name, cluster, reason: review.reason, why: review.message },
              'CSR left pending (not approvable)',
            );
          continue;
        }
        const current = approved
          ? csr
          : await this.writeApproval(csr, {
              type: 'Approved',
              status: 'True',
              reason: 'ClusterProxyAddonApproved',
              message: `approved by the cluster-proxy addon manager for cluster ${cluster}`,
            });
        if (review.sign) await this.sign(current, signer, cluster, clusters.get(cluster)?.metadata.uid);
      } catch (err) {
        if (!(err instanceof ConflictError) && !(err instanceof NotFoundError)) throw err;
      }
    }
    this.loggedPending = stillPending;
  }

  private writeApproval(
    csr: CertificateSigningRequest,
    c: Omit<CsrCondition, 'lastUpdateTime' | 'lastTransitionTime'>,
  ): Promise<CertificateSigningRequest> {
    const at = new Date(this.now()).toISOString().replace(/\.\d{3}Z$/, 'Z');
    const conditions = [...(csr.status?.conditions ?? []), { ...c, lastUpdateTime: at, lastTransitionTime: at }];
    return this.opts.store.updateStatus(
      'CertificateSigningRequest',
      { ...csr, status: { ...csr.status, conditions } },
      { subresource: 'approval' },
    );
  }

  /** Signs with the cluster's uid as a URI SAN, as `join` certificates carry it: a re-created cluster does not admit old agents. */
  private async sign(csr: CertificateSigningRequest, signer: PemPair, cluster: string, clusterUid: string | undefined): Promise<void> {
    const now = this.now();
    const caExpiry = Date.parse(new X509Certificate(signer.certPem).validTo);
    const notAfter = new Date(Math.min(now + AGENT_CERT_DAYS * DAY_MS, caExpiry));
    const uris = clusterUid ? [`${CLUSTER_UID_URI_PREFIX}${clusterUid}`] : [];
    const pem = await signCertificateRequest(
      signer,
      Buffer.from(csr.spec.request, 'base64').toString('utf8'),
      notAfter,
      new Date(now),
      uris,
    );
    await this.opts.store.updateStatus('CertificateSigningRequest', {
      ...csr,
      status: { ...csr.status, certificate: Buffer.from(pem).toString('base64') },
    });
    this.opts.log.info({ csr: csr.metadata.name, cluster, notAfter: notAfter.toISOString() }, 'agent certificate signed (OCM CSR flow)');
  }

  /** `proxy-server-ca` (ca.crt) and `proxy-client` (a client certificate for hub components), where OCM puts them. */
  private async ensureHubSecrets(mpc: ManagedProxyConfiguration | null, signer: PemPair): Promise<void> {
    const namespace = mpc?.spec.proxyServer.namespace || HUB_NAMESPACE;
    const caBundle = this.opts.caBundle();
    if (!this.ensuredNamespaces.has(namespace)) {
      await this.opts.store.ensureNamespace(namespace);
      this.ensuredNamespaces.add(namespace);
    }
    await this.putSecret({ name: PROXY_SERVER_CA_SECRET, namespace }, (cur) =>
      cur && b64d(cur.data?.['ca.crt']) === caBundle ? null : { type: 'Opaque', data: { 'ca.crt': b64(caBundle) } },
    );
    await this.putSecret({ name: PROXY_CLIENT_SECRET, namespace }, (cur) => {
      if (cur && !clientCertDue(b64d(cur.data?.['tls.crt']), signer, this.now()) && b64d(cur.data?.['ca.crt']) === caBundle) return null;
      const pair = issueClientCert(signer, {
        commonName: PROXY_CLIENT_COMMON_NAME,
        organization: [PROXY_CLIENT_GROUP],
        validityDays: AGENT_CERT_DAYS,
      });
      this.opts.log.info({ namespace }, 'hub client certificate (Secret proxy-client) issued');
      return { type: 'kubernetes.io/tls', data: { 'tls.crt': b64(pair.certPem), 'tls.key': b64(pair.keyPem), 'ca.crt': b64(caBundle) } };
    });
  }

  private async putSecret(
    key: { name: string; namespace: string },
    want: (cur: Secret | null) => Pick<Secret, 'type' | 'data'> | null,
  ): Promise<void> {
    const cur = await this.opts.store.get('Secret', key);
    const next = want(cur);
    if (!next) return;
    try {
      if (cur) await this.opts.store.update('Secret', { ...cur, ...next });
      else
        await this.opts.store.create('Secret', {
          apiVersion: 'v1',
          kind: 'Secret',
          metadata: { ...key, labels: { 'app.kubernetes.io/part-of': 'cluster-proxy' } },
          ...next,
        });
    } catch (err) {
      if (!(err instanceof AlreadyExistsError) && !(err instanceof ConflictError)) throw err;
    }
  }
}

/** The ClusterManagementAddOn the hub creates when none exists (installStrategy Manual). */
export function clusterManagementAddOn(): ClusterManagementAddOn {
  return {
    apiVersion: KINDS.ClusterManagementAddOn.apiVersion,
    kind: 'ClusterManagementAddOn',
    metadata: { name: ADDON_NAME, annotations: { [LIFECYCLE_ANNOTATION]: 'addon-manager' } },
    spec: {
      addOnMeta: { displayName: 'cluster-proxy', description: 'reverse tunnels from the hub into managed clusters' },
      supportedConfigs: [{ ...SUPPORTED_CONFIGS[0]!, defaultConfig: { name: PROXY_CONFIGURATION_NAME } }, { ...SUPPORTED_CONFIGS[1]! }],
      installStrategy: { type: 'Manual' },
    },
  };
}

const b64 = (s: string): string => Buffer.from(s).toString('base64');
const b64d = (s: string | undefined): string => (s ? Buffer.from(s, 'base64').toString('utf8') : '');

/** Missing, unreadable, not from the current signer, or 80 % of its life gone (OCM's rotation rule). */
function clientCertDue(pem: string, signer: PemPair, now: number): boolean {
  try {
    return !new X509Certificate(pem).checkIssued(new X509Certificate(signer.certPem)) || renewalDue(pem, now);
  } catch {
    return true;
  }
}

/**
 * The agent image is ours whatever the MPC says: an MPC made by OCM's chart names OCM's proxy-agent image,
 * which would crash-loop on our arguments. Mirrors still apply (AddOnDeploymentConfig registries).
 */
function agentImageCondition(mpc: ManagedProxyConfiguration | null, ours: string): ConditionSpec {
  const named = mpc?.spec.proxyAgent.image;
  if (!named || named === ours) return { type: 'AgentImageAccepted', status: 'True', reason: 'OwnImage', message: `agents run ${ours}` };
  return {
    type: 'AgentImageAccepted',
    status: 'False',
    reason: 'NotClusterProxyImage',
    message: `spec.proxyAgent.image ${named} is not this hub's agent image; agents run ${ours} (set the hub's --agent-image to change it)`,
  };
}

/**
 * The hash of each mirrored work's spec as canonical JSON (what applyWork compares), by the slim object that
 * stands for it. A hash, not the JSON: 44 bytes a work instead of its spec (~7 KB rendered, 35 MB at 5,000 clusters).
 */
const SPEC_OF = new WeakMap<ManifestWork, string>();

/** Whether the stored work has the metadata we would write: our owner, our labels and the config spec hashes. */
function sameWorkMetadata(existing: ManifestWork, desired: ManifestWork['metadata']): boolean {
  const hashes = (m: ManifestWork['metadata']): string => m.annotations?.[CONFIG_SPEC_HASH_ANNOTATION] ?? '';
  return (
    sameJson(existing.metadata.ownerReferences ?? [], desired.ownerReferences) &&
    Object.entries(desired.labels ?? {}).every(([k, v]) => existing.metadata.labels?.[k] === v) &&
    hashes(existing.metadata) === hashes(desired)
  );
}

function specHashOf(work: ManifestWork): string {
  let spec = SPEC_OF.get(work);
  if (spec === undefined) SPEC_OF.set(work, (spec = hashOfSpec(work.spec)));
  return spec;
}

function hashOfSpec(spec: ManifestWork['spec']): string {
  return createHash('sha256').update(canonicalJson(spec)).digest('base64');
}

/**
 * What a pass reads of a ManagedCluster: whether it exists and is accepted (installs, CSR reviews), its uid
 * (signed into agent certificates) and the facts `join` recorded in its annotations (rendered into the work).
 */
function clusterInputs(mc: ManagedCluster): string {
  return JSON.stringify([mc.metadata.name, mc.metadata.uid ?? '', mc.spec.hubAcceptsClient === true, clusterFacts(mc)]);
}

const FACT_ANNOTATIONS: ReadonlySet<string> = new Set(Object.values(CLUSTER_FACT_ANNOTATIONS));

/** A cluster as the installer's mirror keeps it: clusterInputs' fields, not its status (most of a ManagedCluster). */
function slimCluster(mc: ManagedCluster): ManagedCluster {
  const { name, uid, resourceVersion, annotations } = mc.metadata;
  const kept = Object.entries(annotations ?? {}).filter(([k]) => FACT_ANNOTATIONS.has(k));
  return {
    apiVersion: mc.apiVersion,
    kind: mc.kind,
    metadata: {
      name,
      ...(uid !== undefined ? { uid } : {}),
      ...(resourceVersion !== undefined ? { resourceVersion } : {}),
      ...(kept.length > 0 ? { annotations: Object.fromEntries(kept) } : {}),
    },
    spec: { hubAcceptsClient: mc.spec.hubAcceptsClient },
  };
}

/**
 * What a pass needs of a work: its metadata and conditions, its deleteOption, the Namespaces it holds and its
 * Deployments' selectors (releasingNamespaces, keepingDeploymentSelectors), and the hash of its spec, not
 * the rendered Secrets and Deployments themselves (at fleet scale most of the hub's memory).
 */
function slimWork(work: ManifestWork, previous: ManifestWork | undefined): ManifestWork {
  const keep = (m: Record<string, unknown>): Record<string, unknown> | null => {
    if (m['kind'] === 'Namespace') return m;
    if (m['kind'] === 'Deployment')
      return {
        apiVersion: m['apiVersion'],
        kind: m['kind'],
        metadata: m['metadata'],
        spec: { selector: (m['spec'] as { selector?: unknown } | undefined)?.selector },
      };
    return null;
  };
  const slim: ManifestWork = {
    ...work,
    spec: {
      ...(work.spec.deleteOption ? { deleteOption: work.spec.deleteOption } : {}),
      workload: { manifests: work.spec.workload.manifests.map(keep).filter((m): m is Record<string, unknown> => m !== null) },
    },
    status: { conditions: work.status?.conditions ?? [] },
  };
  // A status update (the work agent's, every few seconds per work) keeps the generation: the spec is the same.
  const same =
    work.metadata.generation !== undefined &&
    previous?.metadata.uid === work.metadata.uid &&
    previous?.metadata.generation === work.metadata.generation;
  const spec = same && previous ? SPEC_OF.get(previous) : undefined;
  SPEC_OF.set(slim, spec ?? hashOfSpec(work.spec));
  return slim;
}

/** OCM's addon-manager has resolved the addon's configs for the current rollout (addonconfiguration controller). */
function configured(addon: ManagedClusterAddOn): boolean {
  return addon.status?.conditions?.some((c) => c.type === 'Configured' && c.status === 'True') === true;
}

function registered(): ConditionSpec[] {
  return [
    {
      type: 'RegistrationApplied',
      status: 'True',
      reason: 'SetPermissionApplied',
      message: 'Registration of the addon agent is configured',
    },
  ];
}

function waiting(why: string): ConditionSpec[] {
  return [{ type: 'ManifestApplied', status: 'False', reason: 'ManifestWorkNotCreated', message: `no ManifestWork: ${why}` }];
}

/**
 * ManifestApplied from the work agent's Applied condition, as addon-framework's agentdeploy controller
 * sets it (applyWork in controllers/agentdeploy/controller.go). Progressing is OCM's hub addon-manager's.
 */
export function workConditions(work: ManifestWork | null): ConditionSpec[] {
  const applied = work?.status?.conditions?.find((c) => c.type === 'Applied');
  if (!applied) return [];
  return applied.status === 'True'
    ? [{ type: 'ManifestApplied', status: 'True', reason: 'AddonManifestApplied', message: 'manifests of addon are applied successfully' }]
    : [
        {
          type: 'ManifestApplied',
          status: 'False',
          reason: 'AddonManifestAppliedFailed',
          message: 'failed to apply the manifests of addon',
        },
      ];
}
