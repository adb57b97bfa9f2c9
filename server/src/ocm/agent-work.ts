// The agent's ManifestWork for one cluster: the same objects `join` renders (manifests.ts), with OCM's
// identity (no bootstrap token: the certificate comes through OCM's CSR flow) and OCM's names, the
// settings of the ManagedProxyConfiguration and the cluster's AddOnDeploymentConfig, and a hash of it
// all on the pod template so that any change rolls the agent. Pure: same inputs, same work.
import { createHash } from 'node:crypto';
import { clusterFacts } from '../addon/join.js';
import { AGENT_DEPLOYMENT_NAME, renderAgentInstall, type KubeManifest, type ResourceRequirements } from '../addon/manifests.js';
import { KINDS, type AddOnDeploymentConfig, type ManagedCluster, type ManagedClusterAddOn, type ManagedProxyConfiguration, type ManifestWork } from '../store/objects.js';
import { ADDON_NAME_LABEL, AGENT_WORK_NAME, CONFIG_HASH_ANNOTATION, CONFIGURATION_GENERATION_ANNOTATION } from './names.js';

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
  image?: string;
  defaultInstallNamespace: string;
}

/** The agent install namespace: the ADC's, else the addon's, else the hub's default. */
export function installNamespaceOf(i: Pick<AgentWorkInput, 'addon' | 'adc' | 'defaultInstallNamespace'>): string {
  return i.adc?.spec.agentInstallNamespace || i.addon.spec.installNamespace || i.defaultInstallNamespace;
}

function entrypointOf(i: AgentWorkInput): string {
  const e = i.mpc?.spec.proxyServer.entrypoint;
  if (e?.type === 'Hostname' && e.hostname?.value) return `${e.hostname.value}:${e.port ?? 8091}`;
  return i.agentEntrypoint;
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
    image: mirrored(i.mpc?.spec.proxyAgent.image || i.image, i.adc),
    agentReplicas: i.mpc?.spec.proxyAgent.replicas ?? 1,
    facts: clusterFacts(i.cluster),
    ...(i.adc?.spec.proxyConfig ? { proxyConfig: i.adc.spec.proxyConfig } : {}),
    ...(i.adc?.spec.nodePlacement ? { nodePlacement: i.adc.spec.nodePlacement } : {}),
    ...(i.mpc?.spec.proxyAgent.imagePullSecrets ? { imagePullSecrets: i.mpc.spec.proxyAgent.imagePullSecrets } : {}),
    ...(resources ? { resources } : {}),
  });
  const hash = createHash('sha256').update(JSON.stringify(manifests)).digest('hex').slice(0, 16);
  const deployment = manifests.find((m) => m.kind === 'Deployment') as KubeManifest & { spec: { template: { metadata: { annotations?: Record<string, string> } } } };
  deployment.metadata.annotations = { [CONFIGURATION_GENERATION_ANNOTATION]: String(i.mpc?.metadata.generation ?? 0) };
  deployment.spec.template.metadata.annotations = { [CONFIG_HASH_ANNOTATION]: hash };
  return {
    apiVersion: KINDS.ManifestWork.apiVersion,
    kind: 'ManifestWork',
    metadata: {
      name: AGENT_WORK_NAME,
      namespace: cluster,
      labels: { [ADDON_NAME_LABEL]: i.addon.metadata.name },
      ownerReferences: [{ apiVersion: KINDS.ManagedClusterAddOn.apiVersion, kind: 'ManagedClusterAddOn', name: i.addon.metadata.name, uid: i.addon.metadata.uid ?? '', blockOwnerDeletion: true }],
    },
    spec: { workload: { manifests: manifests as unknown as Record<string, unknown>[] } },
  };
}

/** Key-order-independent JSON, to compare what we want with what the API gives back. */
export function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`;
  if (v && typeof v === 'object') {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonicalJson((v as Record<string, unknown>)[k])}`).join(',')}}`;
  }
  return JSON.stringify(v);
}
