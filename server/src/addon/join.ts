// Registration on the admin API: `POST /v1/clusters` (what `cluster-proxy join` calls) creates the
// ManagedCluster if needed, issues a single-use bootstrap token and renders the agent's install
// manifests; `DELETE /v1/clusters/NAME` removes the cluster, which revokes its agents (the revocation
// watcher closes their tunnels; admission refuses their certificates from then on).
// The cluster facts a join was given (pod/service CIDR, cluster domain, apiserver IP) are recorded as
// annotations on the ManagedCluster, so `GET /v1/proxy-config/NAME` can hand them to `proxy-config render`.
import { isDns1123Subdomain } from '../pki/agent-identity.js';
import { HubApiError, type HubApi } from '../fleet/hub-api.js';
import { AlreadyExistsError, ConflictError, NotFoundError, type Store } from '../store/store.js';
import { ADDON_NAME, type AddOnDeploymentConfig, type ManagedCluster } from '../store/objects.js';
import { ProxySettingsError, renderProxySettings, type ClusterProxyFacts } from '../egress/proxy-settings.js';
import { DEPLOYMENT_CONFIG } from './hub-namespace.js';
import type { ClusterProxyConfigResponse, JoinRequest, JoinResponse } from './join-api.js';

export const DEFAULT_INSTALL_NAMESPACE = 'open-cluster-management-agent-addon';
/**
 * With --agent-install manifestwork: OCM cluster-proxy's own namespace (pkg/config/agent.go), not the
 * klusterlet's shared addon namespace, so a migration keeps the agent where it was and nothing is shared.
 */
export const OCM_DEFAULT_INSTALL_NAMESPACE = 'open-cluster-management-cluster-proxy';

/** ManagedCluster annotations holding the facts of the cluster's latest join, by JoinRequest field. */
export const CLUSTER_FACT_ANNOTATIONS = {
  podCidr: 'proxy.open-cluster-management.io/pod-cidr',
  serviceCidr: 'proxy.open-cluster-management.io/service-cidr',
  clusterDomain: 'proxy.open-cluster-management.io/cluster-domain',
  apiserverIp: 'proxy.open-cluster-management.io/apiserver-ip',
} as const;
const DEFAULT_TOKEN_TTL_SECONDS = 3600;
const MAX_TOKEN_TTL_SECONDS = 7 * 24 * 3600;

/** The cluster's own ranges `join` recorded as ManagedCluster annotations (for NO_PROXY). */
export function clusterFacts(mc: ManagedCluster): ClusterProxyFacts & { podCidrs?: string[]; serviceCidrs?: string[] } {
  const a = mc.metadata.annotations ?? {};
  const facts: ClusterProxyFacts & { podCidrs?: string[]; serviceCidrs?: string[] } = {};
  const pods = a[CLUSTER_FACT_ANNOTATIONS.podCidr];
  const services = a[CLUSTER_FACT_ANNOTATIONS.serviceCidr];
  if (pods) facts.podCidrs = pods.split(',');
  if (services) facts.serviceCidrs = services.split(',');
  if (a[CLUSTER_FACT_ANNOTATIONS.clusterDomain]) facts.clusterDomain = a[CLUSTER_FACT_ANNOTATIONS.clusterDomain];
  if (a[CLUSTER_FACT_ANNOTATIONS.apiserverIp]) facts.apiserverIp = a[CLUSTER_FACT_ANNOTATIONS.apiserverIp];
  return facts;
}

export interface ManifestInput {
  cluster: string;
  installNamespace: string;
  agentEntrypoint: string;
  serverName?: string;
  caBundle: string;
  bootstrapToken: string;
  image?: string;
  agentReplicas: number;
  podCidr?: string;
  serviceCidr?: string;
  clusterDomain?: string;
  apiserverIp?: string;
}

export interface JoinDeps {
  store: Store;
  /** Issues a single-use token for the cluster; the token string is shown once. */
  issueBootstrapToken(cluster: string, ttlSeconds: number): Promise<{ token: string; expiresAt: Date }>;
  /** Removes every bootstrap token of the cluster (on delete). */
  revokeBootstrapTokens(cluster: string): Promise<void>;
  /** Multi-document YAML of the agent's install manifests. */
  renderManifests(input: ManifestInput): Promise<string> | string;
  /** The CA bundle agents trust (PEM; two CAs during a rollover). */
  caBundle(): string;
  /** Read per request: the agent port is only known once the server listens. */
  defaults(): { agentEntrypoint: string; serverName?: string; image?: string };
}

type StoredProxyConfig = NonNullable<AddOnDeploymentConfig['spec']['proxyConfig']>;

export function registerJoinRoutes(api: HubApi, deps: JoinDeps): void {
  api.route(
    'POST',
    '/v1/clusters',
    async (req) => {
      const body = parseJoinRequest(req.body);
      const cluster = body.cluster;
      let existed = true;
      const current = await deps.store.get('ManagedCluster', { name: cluster });
      if (!current) {
        existed = false;
        const mc: ManagedCluster = {
          apiVersion: 'cluster.open-cluster-management.io/v1',
          kind: 'ManagedCluster',
          metadata: { name: cluster, labels: { 'cluster.open-cluster-management.io/clusterset': 'default' } },
          spec: { hubAcceptsClient: true, leaseDurationSeconds: 60 },
        };
        await deps.store.create('ManagedCluster', mc);
      } else if (!current.spec.hubAcceptsClient) {
        throw new HubApiError(
          409,
          `cluster ${cluster} exists with hubAcceptsClient: false; set it to true before issuing a bootstrap token`,
        );
      }
      // The cluster's namespace holds its addon, lease and bootstrap tokens (as in OCM).
      await deps.store.ensureNamespace(cluster);
      const ttl = body.tokenTtlSeconds ?? DEFAULT_TOKEN_TTL_SECONDS;
      const { token, expiresAt } = await deps.issueBootstrapToken(cluster, ttl);
      const installNamespace = body.installNamespace ?? DEFAULT_INSTALL_NAMESPACE;
      const defaults = deps.defaults();
      const agentEntrypoint = body.agentEntrypoint ?? defaults.agentEntrypoint;
      const serverName = body.serverName ?? defaults.serverName;
      const caBundle = deps.caBundle();
      let manifests: string;
      try {
        manifests = await deps.renderManifests({
          cluster,
          installNamespace,
          agentEntrypoint,
          serverName,
          caBundle,
          bootstrapToken: token,
          image: body.image ?? defaults.image,
          agentReplicas: body.agentReplicas ?? 1,
          podCidr: body.podCidr,
          serviceCidr: body.serviceCidr,
          clusterDomain: body.clusterDomain,
          apiserverIp: body.apiserverIp,
        });
      } catch (err) {
        // Bad facts (a CIDR that is not one, say): the token must not outlive the failed join.
        await deps.revokeBootstrapTokens(cluster).catch(() => {});
        throw new HubApiError(400, (err as Error).message);
      }
      await recordInstallNamespace(deps.store, cluster, installNamespace);
      await recordClusterFacts(deps.store, cluster, body);
      const answer: JoinResponse = {
        cluster,
        existed,
        bootstrapToken: token,
        tokenExpiresAt: expiresAt.toISOString(),
        agentEntrypoint,
        ...(serverName ? { serverName } : {}),
        caBundle,
        installNamespace,
        manifests,
      };
      return { status: existed ? 200 : 201, body: answer };
    },
    { agentOnly: false },
  );

  api.route(
    'GET',
    '/v1/proxy-config/*',
    async (req) => {
      const cluster = decodeURIComponent(req.path.slice('/v1/proxy-config/'.length));
      if (!isDns1123Subdomain(cluster)) throw new HubApiError(400, `"${cluster}" is not a valid cluster name`);
      const mc = await deps.store.get('ManagedCluster', { name: cluster });
      if (!mc) throw new HubApiError(404, `cluster ${cluster} is not registered`);
      const facts: ClusterProxyConfigResponse['facts'] = clusterFacts(mc);
      const p: StoredProxyConfig = (await deps.store.get('AddOnDeploymentConfig', DEPLOYMENT_CONFIG))?.spec.proxyConfig ?? {};
      const proxyConfig: ClusterProxyConfigResponse['proxyConfig'] = {};
      if (p.httpProxy) proxyConfig.httpProxy = p.httpProxy;
      if (p.httpsProxy) proxyConfig.httpsProxy = p.httpsProxy;
      if (p.noProxy) proxyConfig.noProxy = p.noProxy;
      if (p.caBundle) proxyConfig.caBundle = p.caBundle;
      const answer: ClusterProxyConfigResponse = { cluster, proxyConfig, facts, agentEntrypoint: deps.defaults().agentEntrypoint };
      return { status: 200, body: answer };
    },
    { agentOnly: false },
  );

  // `cluster-proxy proxy-config set`: the install-wide settings, for hubs on the embedded store (on
  // Kubernetes, `kubectl apply` of the AddOnDeploymentConfig does the same). Empty fields are removed.
  api.route(
    'POST',
    '/v1/proxy-config',
    async (req) => {
      const proxyConfig = parseProxyConfigRequest(req.body);
      try {
        renderProxySettings(proxyConfig);
      } catch (err) {
        if (err instanceof ProxySettingsError) throw new HubApiError(400, err.message);
        throw err;
      }
      const written = await untilNotRaced(async () => {
        const current = await deps.store.get('AddOnDeploymentConfig', DEPLOYMENT_CONFIG);
        if (!current) {
          await deps.store.create('AddOnDeploymentConfig', {
            apiVersion: 'addon.open-cluster-management.io/v1alpha1',
            kind: 'AddOnDeploymentConfig',
            metadata: { ...DEPLOYMENT_CONFIG },
            spec: { proxyConfig },
          });
        } else {
          const { proxyConfig: _old, ...rest } = current.spec;
          await deps.store.update('AddOnDeploymentConfig', {
            ...current,
            spec: Object.keys(proxyConfig).length > 0 ? { ...rest, proxyConfig } : rest,
          });
        }
      });
      if (!written) throw new Error('the AddOnDeploymentConfig kept changing under us');
      return { status: 200, body: { proxyConfig } };
    },
    { agentOnly: false },
  );

  api.route(
    'DELETE',
    '/v1/clusters/*',
    async (req) => {
      const cluster = decodeURIComponent(req.path.slice('/v1/clusters/'.length));
      if (!isDns1123Subdomain(cluster)) throw new HubApiError(400, `"${cluster}" is not a valid cluster name`);
      try {
        await deps.store.delete('ManagedCluster', { name: cluster });
      } catch (err) {
        if (err instanceof NotFoundError) throw new HubApiError(404, `cluster ${cluster} is not registered`);
        throw err;
      }
      await deps.revokeBootstrapTokens(cluster);
      return { status: 200, body: { deleted: cluster } };
    },
    { agentOnly: false },
  );
}

/** Strict: unknown fields and wrong types are refused with the field's name. */
export function parseJoinRequest(body: unknown): JoinRequest {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new HubApiError(400, 'expected a JSON object');
  const b = body as Record<string, unknown>;
  const strings = [
    'cluster',
    'installNamespace',
    'agentEntrypoint',
    'serverName',
    'image',
    'podCidr',
    'serviceCidr',
    'clusterDomain',
    'apiserverIp',
  ] as const;
  const numbers = ['tokenTtlSeconds', 'agentReplicas'] as const;
  for (const k of Object.keys(b)) {
    if (!(strings as readonly string[]).includes(k) && !(numbers as readonly string[]).includes(k))
      throw new HubApiError(400, `unknown field "${k}"`);
  }
  for (const k of strings) if (b[k] !== undefined && typeof b[k] !== 'string') throw new HubApiError(400, `"${k}" must be a string`);
  for (const k of numbers) if (b[k] !== undefined && !Number.isInteger(b[k])) throw new HubApiError(400, `"${k}" must be a whole number`);
  const req = b as unknown as JoinRequest;
  // A DNS-1123 label: the name is also the cluster's namespace and the ExternalName Service's name.
  if (!req.cluster || !/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(req.cluster))
    throw new HubApiError(
      400,
      `cluster name ${JSON.stringify(req.cluster ?? '')} is not a DNS-1123 label (lowercase letters, digits and '-', at most 63; it also names the cluster's namespace)`,
    );
  if (req.installNamespace !== undefined && !/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(req.installNamespace))
    throw new HubApiError(400, `install namespace "${req.installNamespace}" is not a DNS-1123 label`);
  if (req.tokenTtlSeconds !== undefined && (req.tokenTtlSeconds < 60 || req.tokenTtlSeconds > MAX_TOKEN_TTL_SECONDS))
    throw new HubApiError(400, 'tokenTtlSeconds must be between 60 and 604800 (7 days)');
  if (req.agentReplicas !== undefined && (req.agentReplicas < 1 || req.agentReplicas > 10))
    throw new HubApiError(400, 'agentReplicas must be between 1 and 10');
  if (req.agentEntrypoint !== undefined && !/^(\[[0-9a-fA-F:.]+\]|[^\s:/[\]]+):\d{1,5}$/.test(req.agentEntrypoint))
    throw new HubApiError(400, `agentEntrypoint "${req.agentEntrypoint}" is not HOST:PORT`);
  return req;
}

/** `{httpProxy?, httpsProxy?, noProxy?, caBundle?}`, strings only; unknown fields refused; empty ones dropped. */
function parseProxyConfigRequest(body: unknown): StoredProxyConfig {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new HubApiError(400, 'expected a JSON object');
  const out: StoredProxyConfig = {};
  for (const [k, v] of Object.entries(body as Record<string, unknown>)) {
    if (k !== 'httpProxy' && k !== 'httpsProxy' && k !== 'noProxy' && k !== 'caBundle') throw new HubApiError(400, `unknown field "${k}"`);
    if (v === undefined || v === null) continue;
    if (typeof v !== 'string') throw new HubApiError(400, `"${k}" must be a string`);
    if (v.trim() !== '') out[k] = v;
  }
  return out;
}

/** The facts this join used replace the recorded ones (a fact left out of the join is dropped). */
async function recordClusterFacts(store: Store, cluster: string, body: JoinRequest): Promise<void> {
  await untilNotRaced(async () => {
    const mc = await store.get('ManagedCluster', { name: cluster });
    if (!mc) return;
    const annotations = { ...(mc.metadata.annotations ?? {}) };
    for (const [field, key] of Object.entries(CLUSTER_FACT_ANNOTATIONS)) {
      const value = body[field as keyof typeof CLUSTER_FACT_ANNOTATIONS]?.trim();
      if (value) annotations[key] = value;
      else delete annotations[key];
    }
    const before = mc.metadata.annotations ?? {};
    if (Object.keys(annotations).length === Object.keys(before).length && Object.entries(annotations).every(([k, v]) => before[k] === v))
      return;
    await store.update('ManagedCluster', { ...mc, metadata: { ...mc.metadata, annotations } });
  });
}

/** The addon's `spec.installNamespace` says where the agent was installed (the manager creates the addon with the default). */
async function recordInstallNamespace(store: Store, cluster: string, installNamespace: string): Promise<void> {
  await untilNotRaced(async () => {
    const addon = await store.get('ManagedClusterAddOn', { name: ADDON_NAME, namespace: cluster });
    if (!addon) {
      await store.create('ManagedClusterAddOn', {
        apiVersion: 'addon.open-cluster-management.io/v1alpha1',
        kind: 'ManagedClusterAddOn',
        metadata: { name: ADDON_NAME, namespace: cluster },
        spec: { installNamespace },
      });
    } else if (addon.spec.installNamespace !== installNamespace) {
      await store.update('ManagedClusterAddOn', { ...addon, spec: { ...addon.spec, installNamespace } });
    }
  });
}

/**
 * A read-modify-write `step`, run again when another writer got there first (the manager or another
 * replica: ConflictError or AlreadyExistsError), at most `attempts` times. Whether a step got through.
 */
async function untilNotRaced(step: () => Promise<void>, attempts = 3): Promise<boolean> {
  for (let attempt = 0; attempt < attempts; attempt++) {
    try {
      await step();
      return true;
    } catch (err) {
      if (!(err instanceof AlreadyExistsError) && !(err instanceof ConflictError)) throw err;
    }
  }
  return false;
}
