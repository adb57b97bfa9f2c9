// The agent's ManifestWork for one cluster: the same objects `join` renders (manifests.ts), with OCM's
// identity (no bootstrap token: the certificate comes through OCM's CSR flow) and OCM's names, the
// settings of the ManagedProxyConfiguration and the cluster's AddOnDeploymentConfig, and a hash of it
// all on the pod template so that any change rolls the agent. Pure: same inputs, same work.
// What addon-framework puts on every deploy work (pkg/addonmanager/controllers/agentdeploy/utils.go),
// we put too: the addon as controller owner, `deleteOption: SelectivelyOrphan` with a rule for each
// object annotated `deletion-orphan` (the install namespace: other addons may live in it), and the
// `config-spec-hash` annotation from the addon's status.configReferences (OCM's rollout reads it).
import { createHash } from 'node:crypto';
import { clusterFacts } from '../addon/join.js';
import {
  AGENT_DEPLOYMENT_NAME,
  ManifestInputError,
  renderAgentInstall,
  type KubeManifest,
  type ResourceRequirements,
} from '../addon/manifests.js';
import {
  KINDS,
  type AddOnDeploymentConfig,
  type ConfigReference,
  type ManagedCluster,
  type ManagedClusterAddOn,
  type ManagedProxyConfiguration,
  type ManifestWork,
  type ManifestWorkDeleteOption,
} from '../store/objects.js';
import {
  ADDON_NAME_LABEL,
  AGENT_WORK_NAME,
  CONFIG_HASH_ANNOTATION,
  CONFIG_SPEC_HASH_ANNOTATION,
  CONFIGURATION_GENERATION_ANNOTATION,
  DELETION_ORPHAN_ANNOTATION,
} from './names.js';
import { sameJson } from '../store/same-json.js';

export interface AgentWorkInput {
  addon: ManagedClusterAddOn;
  cluster: ManagedCluster;
  mpc: ManagedProxyConfiguration | null;
  /** The AddOnDeploymentConfig that applies to this cluster, if any. */
  adc: AddOnDeploymentConfig | null;
  caBundle: string;
  /** HOST:PORT agents dial when the ManagedProxyConfiguration names no Hostname entrypoint. */
  agentEntrypoint: string;
  serverName?: string;
  /** Our agent image (the hub's --agent-image); a different image named by the MPC is never run with our arguments. */
  image?: string;
  defaultInstallNamespace: string;
  /** The hub serves the HTTP gateway: the agent may impersonate. */
  gateway?: boolean;
}

/**
 * The agent install namespace: the ADC's agentInstallNamespace, else the hub's default, as OCM's
 * cluster-proxy decides it (agentInstallNamespaceFunc in pkg/proxyagent/agent/agent.go). The addon's
 * deprecated spec.installNamespace is ignored there too (`clusteradm addon enable` fills it with the
 * klusterlet's shared namespace).
 */
export function installNamespaceOf(i: Pick<AgentWorkInput, 'adc' | 'defaultInstallNamespace'>): string {
  return i.adc?.spec.agentInstallNamespace || i.defaultInstallNamespace;
}

/**
 * Where agents dial: the MPC's Hostname entrypoint, else the hub's own agent entrypoint. OCM's other
 * types need what our agent does not do (PortForward: a port-forward through the hub's API server with a
 * hub kubeconfig) or a hub Service we do not watch (LoadBalancerService): refused, so the addon says why.
 */
function entrypointOf(i: AgentWorkInput): string {
  const e = i.mpc?.spec.proxyServer.entrypoint;
  if (!e) return i.agentEntrypoint;
  if (e.type === 'Hostname' && e.hostname?.value) return `${e.hostname.value}:${e.port ?? 8091}`;
  if (e.type === 'Hostname')
    throw new ManifestInputError('ManagedProxyConfiguration spec.proxyServer.entrypoint.hostname.value', 'is empty');
  throw new ManifestInputError(
    'ManagedProxyConfiguration spec.proxyServer.entrypoint.type',
    `${JSON.stringify(e.type)} is not supported by cluster-proxy (TypeScript); use "Hostname" with the address agents dial, or remove the entrypoint to use the hub's --agent-entrypoint`,
  );
}

/** addon-framework's ConfigsToMap: `<resource>.<group>/<namespace>/<name>` → desired spec hash. */
export function configSpecHashes(refs: readonly ConfigReference[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const r of refs) {
    if (!r.desiredConfig) continue;
    out[`${r.resource}${r.group ? `.${r.group}` : ''}/${r.desiredConfig.namespace ?? ''}/${r.desiredConfig.name}`] =
      r.desiredConfig.specHash;
  }
  return out;
}

/** SelectivelyOrphan with one rule per object annotated deletion-orphan (addon-framework getDeletionOrphaningRule). */
function deleteOptionOf(manifests: KubeManifest[]): ManifestWorkDeleteOption | undefined {
  const rules = manifests
    .filter((m) => m.metadata.annotations?.[DELETION_ORPHAN_ANNOTATION] !== undefined)
    .map((m) => {
      const group = m.apiVersion.includes('/') ? m.apiVersion.split('/')[0]! : '';
      return {
        group,
        resource: `${m.kind.toLowerCase()}s`,
        name: m.metadata.name,
        ...(m.metadata.namespace ? { namespace: m.metadata.namespace } : {}),
      };
    });
  return rules.length > 0 ? { propagationPolicy: 'SelectivelyOrphan', selectivelyOrphans: { orphaningRules: rules } } : undefined;
}

/** ADC `registries`: the first mirror whose source prefixes the image wins (OCM's rule). */
function mirrored(image: string | undefined, adc: AddOnDeploymentConfig | null): string | undefined {
  if (!image) return image;
  for (const r of adc?.spec.registries ?? []) if (r.source && image.startsWith(r.source)) return r.mirror + image.slice(r.source.length);
  return image;
}

/** ADC `resourceRequirements` for the proxy-agent container (`*` matches any part of the ID). */
function resourcesOf(adc: AddOnDeploymentConfig | null): ResourceRequirements | undefined {
  const want = ['deployments', AGENT_DEPLOYMENT_NAME, 'proxy-agent'];
  for (const r of adc?.spec.resourceRequirements ?? []) {
    const parts = r.containerID.split(':');
    if (parts.length === 3 && parts.every((p, n) => p === '*' || p === want[n])) return r.resources;
  }
  return undefined;
}

export function renderAgentWork(i: AgentWorkInput): ManifestWork {
  const cluster = i.cluster.metadata.name;
  const resources = resourcesOf(i.adc);
  const manifests: KubeManifest[] = renderAgentInstall({
    identity: 'ocm-csr',
    cluster,
    installNamespace: installNamespaceOf(i),
    agentEntrypoint: entrypointOf(i),
    ...(i.serverName ? { serverName: i.serverName } : {}),
    caBundle: i.caBundle,
    image: mirrored(i.image, i.adc),
    agentReplicas: i.mpc?.spec.proxyAgent.replicas ?? 1,
    facts: clusterFacts(i.cluster),
    ...(i.adc?.spec.proxyConfig ? { proxyConfig: i.adc.spec.proxyConfig } : {}),
    ...(i.adc?.spec.nodePlacement ? { nodePlacement: i.adc.spec.nodePlacement } : {}),
    ...(i.mpc?.spec.proxyAgent.imagePullSecrets ? { imagePullSecrets: i.mpc.spec.proxyAgent.imagePullSecrets } : {}),
    ...(resources ? { resources } : {}),
    ...(i.gateway ? { gateway: true } : {}),
  });
  const hash = createHash('sha256').update(JSON.stringify(manifests)).digest('hex').slice(0, 16);
  const deleteOption = deleteOptionOf(manifests);
  const specHashes = configSpecHashes(i.addon.status?.configReferences ?? []);
  const deployment = manifests.find((m) => m.kind === 'Deployment') as KubeManifest & {
    spec: { template: { metadata: { annotations?: Record<string, string> } } };
  };
  deployment.metadata.annotations = { [CONFIGURATION_GENERATION_ANNOTATION]: String(i.mpc?.metadata.generation ?? 0) };
  deployment.spec.template.metadata.annotations = { [CONFIG_HASH_ANNOTATION]: hash };
  return {
    apiVersion: KINDS.ManifestWork.apiVersion,
    kind: 'ManifestWork',
    metadata: {
      name: AGENT_WORK_NAME,
      namespace: cluster,
      labels: { [ADDON_NAME_LABEL]: i.addon.metadata.name },
      ...(Object.keys(specHashes).length > 0
        ? { annotations: { [CONFIG_SPEC_HASH_ANNOTATION]: JSON.stringify(sortedKeys(specHashes)) } }
        : {}),
      ownerReferences: [
        {
          apiVersion: KINDS.ManagedClusterAddOn.apiVersion,
          kind: 'ManagedClusterAddOn',
          name: i.addon.metadata.name,
          uid: i.addon.metadata.uid ?? '',
          controller: true,
          blockOwnerDeletion: true,
        },
      ],
    },
    spec: { workload: { manifests: manifests as unknown as Record<string, unknown>[] }, ...(deleteOption ? { deleteOption } : {}) },
  };
}

/**
 * The work to write over `existing`: `desired`, except that a Namespace the existing work holds and the
 * desired one drops (the install namespace moved, or a work written before we orphaned namespaces) is first
 * kept with an orphaning rule, until the work agent has applied that. OCM's work agent decides at apply time
 * whether it owns an object (deleteOption), and deletes an owned object that leaves the work: dropping the
 * namespace straight away would delete it, and every other addon's agent in it.
 */
export function releasingNamespaces(desired: ManifestWork, existing: ManifestWork | null): ManifestWork {
  if (!existing) return desired;
  const isNs = (m: Record<string, unknown>): boolean => m['kind'] === 'Namespace' && m['apiVersion'] === 'v1';
  const nameOf = (m: Record<string, unknown>): string => (m['metadata'] as { name: string }).name;
  const wanted = new Set(desired.spec.workload.manifests.filter(isNs).map(nameOf));
  const dropped = existing.spec.workload.manifests.filter((m) => isNs(m) && !wanted.has(nameOf(m)));
  const applied =
    existing.status?.conditions?.some(
      (c) => c.type === 'Applied' && c.status === 'True' && c.observedGeneration === existing.metadata.generation,
    ) ?? false;
  const orphanedBy = (w: ManifestWork, name: string): boolean =>
    w.spec.deleteOption?.propagationPolicy === 'Orphan' ||
    (w.spec.deleteOption?.propagationPolicy === 'SelectivelyOrphan' &&
      (w.spec.deleteOption.selectivelyOrphans?.orphaningRules ?? []).some(
        (r) => r.group === '' && r.resource === 'namespaces' && r.name === name,
      ));
  const keep = dropped.filter((m) => !(applied && orphanedBy(existing, nameOf(m))));
  if (keep.length === 0) return desired;
  const rules = [
    ...(desired.spec.deleteOption?.selectivelyOrphans?.orphaningRules ?? []),
    ...keep.map((m) => ({ group: '', resource: 'namespaces', name: nameOf(m) })),
  ];
  return {
    ...desired,
    spec: {
      workload: { manifests: [...keep, ...desired.spec.workload.manifests] },
      deleteOption: { propagationPolicy: 'SelectivelyOrphan', selectivelyOrphans: { orphaningRules: rules } },
    },
  };
}

/**
 * The work to write over `existing`, keeping the selector of a Deployment the existing work already holds
 * under the same namespace and name. A Deployment's selector is immutable: an earlier layout of ours selected
 * the agent by `app.kubernetes.io/name` only, and updating that Deployment to OCM's selector in place (an
 * upgrade that keeps the install namespace) fails in the work agent for good. The pod template carries every
 * label of both selectors, so keeping the old one selects the same pods and the upgrade rolls in place.
 */
export function keepingDeploymentSelectors(desired: ManifestWork, existing: ManifestWork | null): ManifestWork {
  if (!existing) return desired;
  type Dep = {
    kind?: unknown;
    apiVersion?: unknown;
    metadata: { name: string; namespace?: string };
    spec: { selector: { matchLabels?: Record<string, string> }; template: { metadata?: { labels?: Record<string, string> } } };
  };
  const isDeployment = (m: Record<string, unknown>): boolean => m['kind'] === 'Deployment' && m['apiVersion'] === 'apps/v1';
  const key = (m: Dep): string => `${m.metadata.namespace ?? ''}/${m.metadata.name}`;
  const held = new Map(existing.spec.workload.manifests.filter(isDeployment).map((m) => [key(m as unknown as Dep), m as unknown as Dep]));
  let changed = false;
  const manifests = desired.spec.workload.manifests.map((m) => {
    if (!isDeployment(m)) return m;
    const d = m as unknown as Dep;
    const old = held.get(key(d))?.spec.selector;
    if (!old || sameJson(old, d.spec.selector)) return m;
    changed = true;
    const labels = { ...d.spec.template.metadata?.labels, ...old.matchLabels };
    return {
      ...m,
      spec: { ...d.spec, selector: old, template: { ...d.spec.template, metadata: { ...d.spec.template.metadata, labels } } },
    } as unknown as Record<string, unknown>;
  });
  return changed ? { ...desired, spec: { ...desired.spec, workload: { manifests } } } : desired;
}

/** Go's json.Marshal of a map sorts its keys; so do we, so the annotation is byte-equal to OCM's. */
function sortedKeys(m: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(m).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}
