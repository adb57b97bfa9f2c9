// `--agent-install manifestwork`: the hub is OCM's addon manager for `cluster-proxy`. One pass (run by
// the addon manager's leader, after every change it watches and on its status period):
//   1. ClusterManagementAddOn `cluster-proxy` exists (created with installStrategy Manual if missing);
//      with installStrategy Placements, every cluster the Placements' decisions select has a
//      ManagedClusterAddOn (owned by the ClusterManagementAddOn) and a cluster leaving them loses it;
//   2. every ManagedClusterAddOn whose cluster accepts clients has ManifestWork
//      `addon-cluster-proxy-deploy-0` holding the agent (agent-work.ts), rewritten when it differs from
//      what the current configuration renders (a config change, or an edit by someone else); works of
//      addons or clusters that are gone are deleted;
//   3. CSRs the klusterlet makes for the addon are approved or denied (registrations.ts), and those of
//      the proxy-agent signer signed with the hub CA;
//   4. Secrets `proxy-server-ca` and `proxy-client` exist where OCM's hub clients read them.
// The addon's status conditions from all this (ManifestApplied, RegistrationApplied, Progressing) and
// its registrations are handed to the addon manager, which writes them with the health conditions.
import { X509Certificate } from 'node:crypto';
import type { Logger } from 'pino';
import { ManifestInputError } from '../addon/manifests.js';
import type { ConditionSpec } from '../addon/conditions.js';
import type { AddonInstallStatus } from '../addon/manager.js';
import { DEPLOYMENT_CONFIG, HUB_NAMESPACE } from '../addon/hub-namespace.js';
import { CLUSTER_UID_URI_PREFIX, issueClientCert, type PemPair } from '../pki/certificates.js';
import { renewalDue } from '../pki/rotation.js';
import {
  ADDON_NAME, KINDS, PROXY_CONFIGURATION_NAME, type AddOnDeploymentConfig, type CertificateSigningRequest, type ClusterManagementAddOn,
  type Condition, type CsrCondition, type Kind, type ManagedCluster, type ManagedClusterAddOn, type ManagedProxyConfiguration, type ManifestWork, type Secret,
} from '../store/objects.js';
import { AlreadyExistsError, ConflictError, NotFoundError, type Store, type Watch } from '../store/store.js';
import { canonicalJson, installNamespaceOf, renderAgentWork } from './agent-work.js';
import { signCertificateRequest } from './csr-signer.js';
import {
  ADDON_NAME_LABEL, AGENT_CERT_DAYS, AGENT_WORK_NAME, CLUSTER_NAME_LABEL, LIFECYCLE_ANNOTATION, PLACEMENT_LABEL, PROXY_AGENT_SIGNER, PROXY_CLIENT_COMMON_NAME, PROXY_CLIENT_GROUP,
  PROXY_CLIENT_SECRET, PROXY_SERVER_CA_SECRET,
} from './names.js';
import { addonRegistrations, reviewCsr } from './registrations.js';

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
  agentImage?: string;
  /** Where agents go when neither the AddOnDeploymentConfig nor the addon names a namespace. */
  defaultInstallNamespace: string;
  now?: () => number;
}

const DAY_MS = 86_400_000;
/** The kinds whose changes start a pass at once (the status period catches anything else). */
const WATCHED: Kind[] = ['ManagedClusterAddOn', 'ManifestWork', 'CertificateSigningRequest', 'AddOnDeploymentConfig', 'ManagedProxyConfiguration', 'ClusterManagementAddOn', 'PlacementDecision'];
const WATCH_RETRY_MS = 2000;

export class OcmInstaller {
  private status = new Map<string, AddonInstallStatus>();
  private readonly watches = new Map<Kind, Watch>();
  private readonly retries = new Set<NodeJS.Timeout>();
  private started = false;
  private stopped = false;
  private readonly now: () => number;
  private warnedNoSigner = false;
  /** Namespaces of the hub-side Secrets already made sure of (one read per namespace, not per pass). */
  private readonly ensuredNamespaces = new Set<string>();

  constructor(private readonly opts: OcmInstallerOptions) {
    this.now = opts.now ?? Date.now;
  }

  /** Watches what a pass depends on; `kick` asks the addon manager for a pass. Idempotent. */
  start(kick: () => void): void {
    if (this.started || this.stopped) return;
    this.started = true;
    for (const kind of WATCHED) this.watchKind(kind, kick);
  }

  private watchKind(kind: Kind, kick: () => void): void {
    if (this.stopped) return;
    // No resourceVersion: the first events replay what exists, which costs one extra pass at start only.
    this.watches.set(kind, this.opts.store.watch(kind, {}, {
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
    }));
  }

  stop(): void {
    this.stopped = true;
    for (const w of this.watches.values()) w.stop();
    this.watches.clear();
    for (const t of this.retries) clearTimeout(t);
    this.retries.clear();
  }

  statusOf(cluster: string): AddonInstallStatus | undefined {
    return this.status.get(cluster);
  }

  async sync(): Promise<void> {
    const signer = this.opts.signer();
    if (!signer) {
      if (!this.warnedNoSigner) this.opts.log.error('--agent-install manifestwork needs the CA key (--ca-key) to sign agent certificates; nothing is installed');
      this.warnedNoSigner = true;
      return;
    }
    const { store } = this.opts;
    const cma = await this.ensureClusterManagementAddOn();
    const [clusterList, addonList, workList] = await Promise.all([store.list('ManagedCluster'), store.list('ManagedClusterAddOn'), store.list('ManifestWork')]);
    const clusters = new Map(clusterList.items.map((c) => [c.metadata.name, c]));
    let addons = addonList.items.filter((a) => a.metadata.name === ADDON_NAME);
    if (cma.spec.installStrategy?.type === 'Placements') addons = await this.syncPlacements(cma, clusters, addons);
    const mpc = await store.get('ManagedProxyConfiguration', { name: PROXY_CONFIGURATION_NAME });
    const works = new Map(workList.items.filter((w) => w.metadata.name === AGENT_WORK_NAME).map((w) => [w.metadata.namespace!, w]));
    const configs = new Map<string, Promise<AddOnDeploymentConfig | null>>();
    const status = new Map<string, AddonInstallStatus>();
    for (const addon of addons) {
      const cluster = addon.metadata.namespace!;
      const existing = works.get(cluster) ?? null;
      works.delete(cluster);
      // One cluster's failure (a refused write, a broken object) is logged and retried next pass; the others go on.
      try {
        status.set(cluster, await this.syncAddon(addon, clusters.get(cluster) ?? null, existing, { cma, mpc, signer, configs }));
      } catch (err) {
        this.opts.log.warn({ cluster, err: (err as Error).message }, 'cannot install the agent of this cluster now; retrying next pass');
        const previous = this.status.get(cluster);
        if (previous) status.set(cluster, previous);
      }
    }
    // Works whose addon is gone (disabled, or the cluster left the Placement).
    for (const orphan of works.values()) await this.deleteWork(orphan, 'its ManagedClusterAddOn is gone');
    this.status = status;
    await this.reviewCsrs(clusters, new Set(addons.map((a) => a.metadata.namespace!)), signer);
    await this.ensureHubSecrets(mpc, signer);
  }

  private async syncAddon(addon: ManagedClusterAddOn, mc: ManagedCluster | null, existing: ManifestWork | null,
    ctx: { cma: ClusterManagementAddOn; mpc: ManagedProxyConfiguration | null; signer: PemPair; configs: Map<string, Promise<AddOnDeploymentConfig | null>> }): Promise<AddonInstallStatus> {
    const cluster = addon.metadata.namespace!;
    if (!mc?.spec.hubAcceptsClient) {
      if (existing) await this.deleteWork(existing, mc ? 'the cluster no longer accepts clients' : 'the cluster is gone');
      return { registrations: [], conditions: waiting(mc ? 'the cluster is not accepted by the hub (hubAcceptsClient is false)' : 'the managed cluster does not exist') };
    }
    const registrations = addonRegistrations(cluster, ctx.signer.certPem);
    let desired: ManifestWork;
    let namespace: string;
    try {
      const adc = await this.configOf(addon, ctx.cma, ctx.configs);
      namespace = installNamespaceOf({ addon, adc, defaultInstallNamespace: this.opts.defaultInstallNamespace });
      desired = renderAgentWork({
        addon, cluster: mc, mpc: ctx.mpc, adc, caBundle: this.opts.caBundle(), agentEntrypoint: this.opts.agentEntrypoint(),
        serverName: this.opts.serverName, image: this.opts.agentImage, defaultInstallNamespace: this.opts.defaultInstallNamespace,
      });
    } catch (err) {
      if (!(err instanceof ManifestInputError)) throw err;
      // The last good work stays in place; the addon says why nothing newer is rolled out.
      return { registrations, conditions: [...registered(), { type: 'Progressing', status: 'False', reason: 'ConfigurationUnsupported', message: `the configuration cannot be rendered: ${err.message}` }] };
    }
    const work = await this.applyWork(desired, existing);
    return { registrations, namespace, conditions: [...registered(), ...workConditions(work)] };
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

  /** installStrategy Placements: one addon per selected cluster; addons we created for a cluster no longer selected go. */
  private async syncPlacements(cma: ClusterManagementAddOn, clusters: Map<string, ManagedCluster>, addons: ManagedClusterAddOn[]): Promise<ManagedClusterAddOn[]> {
    const selected = new Set<string>();
    for (const p of cma.spec.installStrategy?.placements ?? []) {
      const { items } = await this.opts.store.list('PlacementDecision', { namespace: p.namespace, labels: { [PLACEMENT_LABEL]: p.name } });
      for (const d of items) for (const c of d.status?.decisions ?? []) if (c.clusterName) selected.add(c.clusterName);
    }
    const owned = (a: ManagedClusterAddOn): boolean => (a.metadata.ownerReferences ?? []).some((o) => o.kind === 'ClusterManagementAddOn' && o.name === ADDON_NAME);
    const out: ManagedClusterAddOn[] = [];
    for (const a of addons) {
      const cluster = a.metadata.namespace!;
      if (owned(a) && !selected.has(cluster)) {
        await this.opts.store.delete('ManagedClusterAddOn', { name: ADDON_NAME, namespace: cluster }).catch(ignore(NotFoundError));
        this.opts.log.info({ cluster }, 'cluster left the Placement: its cluster-proxy addon is removed');
      } else out.push(a);
    }
    const have = new Set(out.map((a) => a.metadata.namespace!));
    for (const cluster of [...selected].sort()) {
      if (have.has(cluster) || !clusters.has(cluster)) continue;
      const addon: ManagedClusterAddOn = {
        apiVersion: KINDS.ManagedClusterAddOn.apiVersion, kind: 'ManagedClusterAddOn',
        metadata: { name: ADDON_NAME, namespace: cluster, ownerReferences: [{ apiVersion: KINDS.ClusterManagementAddOn.apiVersion, kind: 'ClusterManagementAddOn', name: ADDON_NAME, uid: cma.metadata.uid ?? '' }] },
        spec: {},
      };
      try {
        out.push(await this.opts.store.create('ManagedClusterAddOn', addon));
        this.opts.log.info({ cluster }, 'cluster selected by a Placement: cluster-proxy addon created');
      } catch (err) {
        if (!(err instanceof AlreadyExistsError)) throw err;
      }
    }
    return out;
  }

  /** The cluster's AddOnDeploymentConfig: the addon's own config reference, the ClusterManagementAddOn's default, or the hub-wide one. */
  private configOf(addon: ManagedClusterAddOn, cma: ClusterManagementAddOn, cache: Map<string, Promise<AddOnDeploymentConfig | null>>): Promise<AddOnDeploymentConfig | null> {
    const isAdc = (c: { group: string; resource: string }): boolean => c.group === KINDS.AddOnDeploymentConfig.group && c.resource === KINDS.AddOnDeploymentConfig.plural;
    const ref = addon.spec.configs?.find(isAdc);
    const def = cma.spec.supportedConfigs?.find(isAdc)?.defaultConfig;
    const key = ref ? { name: ref.name, namespace: ref.namespace ?? addon.metadata.namespace! }
      : def ? { name: def.name, namespace: def.namespace ?? HUB_NAMESPACE } : DEPLOYMENT_CONFIG;
    const k = `${key.namespace}/${key.name}`;
    if (!cache.has(k)) cache.set(k, this.opts.store.get('AddOnDeploymentConfig', key));
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
      const sameSpec = canonicalJson(existing.spec) === canonicalJson(desired.spec);
      const sameMeta = canonicalJson(existing.metadata.ownerReferences ?? []) === canonicalJson(desired.metadata.ownerReferences)
        && Object.entries(desired.metadata.labels ?? {}).every(([k, v]) => existing.metadata.labels?.[k] === v);
      if (sameSpec && sameMeta) return existing;
      const updated = await store.update('ManifestWork', {
        ...existing,
        metadata: { ...existing.metadata, labels: { ...existing.metadata.labels, ...desired.metadata.labels }, ownerReferences: desired.metadata.ownerReferences! },
        spec: desired.spec,
      });
      log.info({ cluster, generation: updated.metadata.generation }, 'agent ManifestWork updated (configuration changed, or it was edited elsewhere)');
      return updated;
    } catch (err) {
      // Another writer got there first: the next pass compares again.
      if (err instanceof AlreadyExistsError || err instanceof ConflictError) return existing;
      throw err;
    }
  }

  private async deleteWork(work: ManifestWork, why: string): Promise<void> {
    await this.opts.store.delete('ManifestWork', { name: work.metadata.name, namespace: work.metadata.namespace! }, { resourceVersion: work.metadata.resourceVersion! })
      .then(() => this.opts.log.info({ cluster: work.metadata.namespace, why }, 'agent ManifestWork deleted'))
      .catch((err: unknown) => {
        if (!(err instanceof NotFoundError) && !(err instanceof ConflictError)) throw err;
      });
  }

  private async reviewCsrs(clusters: Map<string, ManagedCluster>, enabled: Set<string>, signer: PemPair): Promise<void> {
    // Only the addon's CSRs (the klusterlet labels them); a hub holds many others (kubelets', other addons').
    const { items } = await this.opts.store.list('CertificateSigningRequest', { labels: { [ADDON_NAME_LABEL]: ADDON_NAME } });
    for (const csr of items) {
      const conds = csr.status?.conditions ?? [];
      if (conds.some((c) => c.type === 'Denied' || c.type === 'Failed')) continue;
      const approved = conds.some((c) => c.type === 'Approved' && c.status === 'True');
      if (approved && (csr.spec.signerName !== PROXY_AGENT_SIGNER || csr.status?.certificate)) continue;
      const cluster = csr.metadata.labels?.[CLUSTER_NAME_LABEL] ?? '';
      const review = await reviewCsr(csr, { cluster: clusters.get(cluster) ?? null, addonEnabled: enabled.has(cluster), signingCaPem: signer.certPem });
      if (review.decision === 'ignore') continue;
      try {
        if (review.decision === 'deny') {
          await this.writeApproval(csr, { type: 'Denied', status: 'True', reason: review.reason, message: review.message });
          this.opts.log.warn({ csr: csr.metadata.name, cluster, reason: review.reason, why: review.message }, 'CSR denied');
          continue;
        }
        const current = approved ? csr : await this.writeApproval(csr, { type: 'Approved', status: 'True', reason: 'ClusterProxyAddonApproved', message: `approved by the cluster-proxy addon manager for cluster ${cluster}` });
        if (review.sign) await this.sign(current, signer, cluster, clusters.get(cluster)?.metadata.uid);
      } catch (err) {
        if (!(err instanceof ConflictError) && !(err instanceof NotFoundError)) throw err;
      }
    }
  }

  private writeApproval(csr: CertificateSigningRequest, c: Omit<CsrCondition, 'lastUpdateTime' | 'lastTransitionTime'>): Promise<CertificateSigningRequest> {
    const at = new Date(this.now()).toISOString().replace(/\.\d{3}Z$/, 'Z');
    const conditions = [...(csr.status?.conditions ?? []), { ...c, lastUpdateTime: at, lastTransitionTime: at }];
    return this.opts.store.updateStatus('CertificateSigningRequest', { ...csr, status: { ...csr.status, conditions } }, { subresource: 'approval' });
  }

  /** Signs with the cluster's uid as a URI SAN, as `join` certificates carry it: a re-created cluster does not admit old agents. */
  private async sign(csr: CertificateSigningRequest, signer: PemPair, cluster: string, clusterUid: string | undefined): Promise<void> {
    const now = this.now();
    const caExpiry = Date.parse(new X509Certificate(signer.certPem).validTo);
    const notAfter = new Date(Math.min(now + AGENT_CERT_DAYS * DAY_MS, caExpiry));
    const uris = clusterUid ? [`${CLUSTER_UID_URI_PREFIX}${clusterUid}`] : [];
    const pem = await signCertificateRequest(signer, Buffer.from(csr.spec.request, 'base64').toString('utf8'), notAfter, new Date(now), uris);
    await this.opts.store.updateStatus('CertificateSigningRequest', { ...csr, status: { ...csr.status, certificate: Buffer.from(pem).toString('base64') } });
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
    await this.putSecret({ name: PROXY_SERVER_CA_SECRET, namespace }, (cur) => (cur && b64d(cur.data?.['ca.crt']) === caBundle ? null : { type: 'Opaque', data: { 'ca.crt': b64(caBundle) } }));
    await this.putSecret({ name: PROXY_CLIENT_SECRET, namespace }, (cur) => {
      if (cur && !clientCertDue(b64d(cur.data?.['tls.crt']), signer, this.now()) && b64d(cur.data?.['ca.crt']) === caBundle) return null;
      const pair = issueClientCert(signer, { commonName: PROXY_CLIENT_COMMON_NAME, organization: [PROXY_CLIENT_GROUP], validityDays: AGENT_CERT_DAYS });
      this.opts.log.info({ namespace }, 'hub client certificate (Secret proxy-client) issued');
      return { type: 'kubernetes.io/tls', data: { 'tls.crt': b64(pair.certPem), 'tls.key': b64(pair.keyPem), 'ca.crt': b64(caBundle) } };
    });
  }

  private async putSecret(key: { name: string; namespace: string }, want: (cur: Secret | null) => Pick<Secret, 'type' | 'data'> | null): Promise<void> {
    const cur = await this.opts.store.get('Secret', key);
    const next = want(cur);
    if (!next) return;
    try {
      if (cur) await this.opts.store.update('Secret', { ...cur, ...next });
      else await this.opts.store.create('Secret', { apiVersion: 'v1', kind: 'Secret', metadata: { ...key, labels: { 'app.kubernetes.io/part-of': 'cluster-proxy' } }, ...next });
    } catch (err) {
      if (!(err instanceof AlreadyExistsError) && !(err instanceof ConflictError)) throw err;
    }
  }
}

/** The ClusterManagementAddOn the hub creates when none exists (installStrategy Manual). */
export function clusterManagementAddOn(): ClusterManagementAddOn {
  return {
    apiVersion: KINDS.ClusterManagementAddOn.apiVersion, kind: 'ClusterManagementAddOn',
    metadata: { name: ADDON_NAME, annotations: { [LIFECYCLE_ANNOTATION]: 'addon-manager' } },
    spec: {
      addOnMeta: { displayName: 'cluster-proxy', description: 'reverse tunnels from the hub into managed clusters' },
      supportedConfigs: [
        { group: KINDS.ManagedProxyConfiguration.group, resource: KINDS.ManagedProxyConfiguration.plural, defaultConfig: { name: PROXY_CONFIGURATION_NAME } },
        { group: KINDS.AddOnDeploymentConfig.group, resource: KINDS.AddOnDeploymentConfig.plural },
      ],
      installStrategy: { type: 'Manual' },
    },
  };
}

const b64 = (s: string): string => Buffer.from(s).toString('base64');
const b64d = (s: string | undefined): string => (s ? Buffer.from(s, 'base64').toString('utf8') : '');

function ignore(cls: new (...a: never[]) => Error): (err: unknown) => void {
  return (err) => {
    if (!(err instanceof cls)) throw err;
  };
}

/** Missing, unreadable, not from the current signer, or 80 % of its life gone (OCM's rotation rule). */
function clientCertDue(pem: string, signer: PemPair, now: number): boolean {
  try {
    return !new X509Certificate(pem).checkIssued(new X509Certificate(signer.certPem)) || renewalDue(pem, now);
  } catch {
    return true;
  }
}

function registered(): ConditionSpec[] {
  return [{ type: 'RegistrationApplied', status: 'True', reason: 'SetPermissionApplied', message: 'Registration of the addon agent is configured' }];
}

function waiting(why: string): ConditionSpec[] {
  return [
    { type: 'ManifestApplied', status: 'False', reason: 'ManifestWorkNotCreated', message: `no ManifestWork: ${why}` },
    { type: 'Progressing', status: 'False', reason: 'WaitingForManifestApplied', message: why },
  ];
}

/** ManifestApplied and Progressing from the work agent's own status (OCM's reasons). */
export function workConditions(work: ManifestWork | null): ConditionSpec[] {
  const find = (t: string): Condition | undefined => work?.status?.conditions?.find((c) => c.type === t);
  const applied = find('Applied');
  const available = find('Available');
  const current = (c: Condition | undefined): boolean => c?.observedGeneration === undefined || c.observedGeneration === work?.metadata.generation;
  if (applied?.status === 'False' && current(applied)) {
    return [
      { type: 'ManifestApplied', status: 'False', reason: 'ManifestWorkApplyFailed', message: applied.message },
      { type: 'Progressing', status: 'False', reason: 'Failed', message: `failed: ${applied.message}` },
    ];
  }
  const manifestApplied: ConditionSpec = applied?.status === 'True'
    ? { type: 'ManifestApplied', status: 'True', reason: 'AddonManifestApplied', message: 'no error for manifest applied' }
    : { type: 'ManifestApplied', status: 'False', reason: 'ManifestWorkNotApplied', message: 'the ManifestWork is not applied in the managed cluster yet' };
  const done = applied?.status === 'True' && available?.status === 'True' && current(applied) && current(available);
  return [
    manifestApplied,
    done ? { type: 'Progressing', status: 'False', reason: 'Completed', message: 'completed with no errors.' }
      : { type: 'Progressing', status: 'True', reason: 'Progressing', message: 'progressing... work is not ready' },
  ];
}
