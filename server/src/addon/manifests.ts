// The agent's install manifests for one managed cluster (contract §4, §8), with OCM's names where OCM has
// them: Namespace, ServiceAccount, Role/RoleBinding (its lease and its credentials Secret), the hub CA
// and bootstrap Secrets, the agent Deployment (proxy env on every container, probes on the health
// port, locked-down security context, node placement) and the ExternalName Service CLUSTER → the
// apiserver. Pure: plain objects in a fixed order, no I/O, no clock, so re-rendering an unchanged
// input gives byte-identical YAML (an unchanged cluster is never rolled).
//
// Every input is checked before anything is rendered; a bad one is a ManifestInputError whose message
// starts with the field's name (and never contains the bootstrap token or a proxy password).
import { isIP } from 'node:net';
import {
  caCertificates,
  clusterNoProxyEntries,
  DEFAULT_CLUSTER_DOMAIN,
  ProxySettingsError,
  renderProxySettings,
  trustBundle,
  type ClusterProxyFacts,
  type EnvVar,
  type ProxyConfig,
} from '../egress/proxy-settings.js';
import type { ManifestInput } from './join.js';
import { yamlLib } from '../kube-yaml.js';

export const AGENT_DEPLOYMENT_NAME = 'cluster-proxy-proxy-agent';
export const AGENT_SERVICE_ACCOUNT = 'cluster-proxy';
export const AGENT_ROLE = 'cluster-proxy';
export const AGENT_LEASE = 'cluster-proxy';
export const HUB_CA_SECRET = 'cluster-proxy-hub-ca';
/** OCM's names, used when the agent is installed through a ManifestWork (identity from OCM's CSR flow). */
export const OCM_HUB_CA_SECRET = 'cluster-proxy-ca';
export const OCM_CLIENT_CERT_SECRET = 'cluster-proxy-open-cluster-management.io-proxy-agent-signer-client-cert';
export const BOOTSTRAP_SECRET = 'cluster-proxy-bootstrap';
export const CREDENTIALS_SECRET = 'cluster-proxy-agent-credentials';
export const DEFAULT_AGENT_IMAGE = 'quay.io/cluster-proxy-ts/cluster-proxy:0.1.0';
export const AGENT_HEALTH_PORT = 8093;
/** The image's non-root user (deploy/Dockerfile: USER 65532). */
/** OCM cluster-proxy's agent Deployment selector (addon-agent-deployment.yaml). */
const OCM_AGENT_SELECTOR = {
  'open-cluster-management.io/addon': 'cluster-proxy',
  'proxy.open-cluster-management.io/component-name': 'proxy-agent',
};
const MAX_AGENT_REPLICAS = 100;

const HUB_CA_DIR = '/etc/cluster-proxy/hub-ca';
const BOOTSTRAP_DIR = '/etc/cluster-proxy/bootstrap';
const CREDENTIALS_DIR = '/var/lib/cluster-proxy/credentials';
const OCM_CLIENT_CERT_DIR = '/etc/cluster-proxy/client-cert';

export type KubeManifest = {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
} & Record<string, unknown>;

/** core/v1 Toleration (the fields Kubernetes has). */
export interface Toleration {
  key?: string;
  operator?: 'Exists' | 'Equal';
  value?: string;
  effect?: 'NoSchedule' | 'PreferNoSchedule' | 'NoExecute';
  tolerationSeconds?: number;
}

/** OCM's AddOnDeploymentConfig.spec.nodePlacement. */
export interface NodePlacement {
  nodeSelector?: Record<string, string>;
  tolerations?: readonly unknown[];
}

export interface ResourceRequirements {
  requests?: Record<string, string>;
  limits?: Record<string, string>;
}

export interface AgentInstallInput extends ManifestInput {
  /** Install-wide egress proxy settings (AddOnDeploymentConfig.spec.proxyConfig). */
  proxyConfig?: ProxyConfig;
  /**
   * The cluster's own ranges for NO_PROXY. The flat `podCidr`/`serviceCidr`/`clusterDomain`/`apiserverIp`
   * of ManifestInput (what `join` takes) are used for the fields this leaves unset.
   */
  facts?: ClusterProxyFacts;
  /** AddOnDeploymentConfig.spec.nodePlacement. */
  nodePlacement?: NodePlacement;
  /** ManagedProxyConfiguration.spec.proxyAgent.imagePullSecrets: Secret names in the install namespace. */
  imagePullSecrets?: readonly string[];
  /** Replaces the default requests/limits of the agent container. */
  resources?: ResourceRequirements;
  /**
   * The hub serves the HTTP gateway: the agent's service account may impersonate users, groups and
   * uids (docs/gateway.md), so the cluster's own RBAC decides what the hub's users may do. Only then:
   * impersonation is a strong right to grant.
   */
  gateway?: boolean;
  /**
   * `--credentials-secret`: the agent also keeps its key, certificate and hub CA bundle in Secret
   * `cluster-proxy-agent-credentials`, so a rescheduled pod or a second replica reuses them (the
   * bootstrap token is single use and the credentials directory is an emptyDir). Default true.
   */
  persistCredentials?: boolean;
}

/**
 * The same agent installed by the hub through OCM (`--agent-install manifestwork`): no bootstrap token;
 * the klusterlet gets the agent's certificate through OCM's CSR flow and writes it into Secret
 * OCM_CLIENT_CERT_SECRET, which the agent reads (and re-reads when it is renewed).
 */
export interface OcmAgentInstallInput extends Omit<AgentInstallInput, 'bootstrapToken' | 'persistCredentials'> {
  identity: 'ocm-csr';
}

/** A bad install input; the message starts with the field's name. */
export class ManifestInputError extends Error {
  override name = 'ManifestInputError';
  constructor(
    readonly field: string,
    message: string,
  ) {
    super(`${field}: ${message}`);
  }
}

const b64 = (s: string): string => Buffer.from(s).toString('base64');
const shown = (v: unknown): string => JSON.stringify(v);

// --- validation ---------------------------------------------------------------------------------------

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
/** RFC 1035 label: what a Service name must be. */
const DNS1035_LABEL = /^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$/;

function isDnsSubdomain(v: string): boolean {
  return v.length <= 253 && v.split('.').every((l) => DNS_LABEL.test(l));
}

function str(field: string, v: unknown): string {
  if (typeof v !== 'string' || v === '') throw new ManifestInputError(field, 'is required (a non-empty string)');
  return v;
}

function checkCluster(v: unknown): string {
  const c = str('cluster', v);
  if (!DNS1035_LABEL.test(c)) {
    throw new ManifestInputError(
      'cluster',
      `${shown(c)} cannot be installed: the cluster name names its ExternalName Service, so it must be a DNS label (lower-case letters, digits and '-', starting with a letter, at most 63 characters)`,
    );
  }
  return c;
}

function checkNamespace(v: unknown): string {
  const ns = str('installNamespace', v);
  if (!DNS_LABEL.test(ns))
    throw new ManifestInputError(
      'installNamespace',
      `${shown(ns)} is not a namespace name (lower-case letters, digits and '-', at most 63 characters)`,
    );
  return ns;
}

/** HOST:PORT, with [IPv6]:PORT. Returns it unchanged when valid. */
function checkHostPort(v: unknown): string {
  const hp = str('agentEntrypoint', v);
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]\s]+)):(\d{1,5})$/.exec(hp);
  const example = 'HOST:PORT such as proxy.hub.example.com:8091 or [fd00::1]:8091';
  if (!m) throw new ManifestInputError('agentEntrypoint', `${shown(hp)} is not ${example}`);
  const host = m[1] ?? m[2]!;
  const port = Number(m[3]);
  if (port < 1 || port > 65535) throw new ManifestInputError('agentEntrypoint', `${shown(hp)}: port ${port} is out of range 1-65535`);
  if (m[1] !== undefined ? isIP(host) !== 6 : isIP(host) === 0 && !isDnsSubdomain(host.toLowerCase())) {
    throw new ManifestInputError('agentEntrypoint', `${shown(hp)}: ${shown(host)} is not a host name or IP address (${example})`);
  }
  return hp;
}

function checkServerName(v: unknown): string | undefined {
  if (v === undefined || v === '') return undefined;
  const s = str('serverName', v);
  if (isIP(s) === 0 && !isDnsSubdomain(s.toLowerCase()))
    throw new ManifestInputError('serverName', `${shown(s)} is not a DNS name or IP address`);
  return s;
}

function checkToken(v: unknown): string {
  // Never echo the token: an error message may end up in a log.
  if (typeof v !== 'string' || v === '')
    throw new ManifestInputError('bootstrapToken', 'is required (the token "cluster-proxy join" issued)');
  if (!/^[\x21-\x7e]{1,1024}$/.test(v))
    throw new ManifestInputError('bootstrapToken', 'must be printable ASCII without spaces, at most 1024 characters');
  return v;
}

function checkImage(v: unknown): string {
  if (v === undefined || v === '') return DEFAULT_AGENT_IMAGE;
  const img = str('image', v);
  if (img.length > 512 || !/^[a-z0-9][\x21-\x7e]*$/i.test(img))
    throw new ManifestInputError('image', `${shown(img)} is not an image reference such as quay.io/org/cluster-proxy:0.1.0`);
  return img;
}

function checkReplicas(v: unknown): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > MAX_AGENT_REPLICAS) {
    throw new ManifestInputError('agentReplicas', `${shown(v)} is not a whole number from 1 to ${MAX_AGENT_REPLICAS}`);
  }
  return v;
}

/** The last bundle that parsed: every agent's manifests carry the same one, parsed once rather than per cluster. */
let usableCaBundle: string | null = null;

function checkCaBundle(v: unknown): string {
  const pem = str('caBundle', v);
  if (pem === usableCaBundle) return pem;
  try {
    caCertificates(pem);
  } catch (err) {
    throw new ManifestInputError('caBundle', `the hub CA bundle is not usable: ${(err as Error).message.replace(/^caBundle /, '')}`);
  }
  usableCaBundle = pem;
  return pem;
}

const LABEL_KEY = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[a-zA-Z0-9]([-a-zA-Z0-9_.]{0,61}[a-zA-Z0-9])?$/;
const LABEL_VALUE = /^([a-zA-Z0-9]([-a-zA-Z0-9_.]{0,61}[a-zA-Z0-9])?)?$/;

function checkNodeSelector(v: unknown): Record<string, string> | undefined {
  if (v === undefined) return undefined;
  const field = 'nodePlacement.nodeSelector';
  if (v === null || typeof v !== 'object' || Array.isArray(v)) throw new ManifestInputError(field, 'must be a map of label keys to values');
  const out: Record<string, string> = {};
  // Sorted: the same selector written in another order renders the same Deployment.
  for (const key of Object.keys(v).sort()) {
    const value = (v as Record<string, unknown>)[key];
    if (!LABEL_KEY.test(key) || key.length > 316) throw new ManifestInputError(field, `${shown(key)} is not a label key`);
    if (typeof value !== 'string' || !LABEL_VALUE.test(value))
      throw new ManifestInputError(field, `${shown(key)}: ${shown(value)} is not a label value`);
    out[key] = value;
  }
  return Object.keys(out).length > 0 ? out : undefined;
}

function checkTolerations(v: unknown): Toleration[] | undefined {
  if (v === undefined) return undefined;
  if (!Array.isArray(v)) throw new ManifestInputError('nodePlacement.tolerations', 'must be a list');
  const out = v.map((t: unknown, i): Toleration => {
    const field = `nodePlacement.tolerations[${i}]`;
    if (t === null || typeof t !== 'object' || Array.isArray(t))
      throw new ManifestInputError(field, 'must be an object with key, operator, value, effect, tolerationSeconds');
    const r = t as Record<string, unknown>;
    const unknownKey = Object.keys(r).find((k) => !['key', 'operator', 'value', 'effect', 'tolerationSeconds'].includes(k));
    if (unknownKey !== undefined) throw new ManifestInputError(field, `unknown field ${shown(unknownKey)}`);
    const tol: Toleration = {};
    if (r['key'] !== undefined) {
      if (typeof r['key'] !== 'string' || (r['key'] !== '' && !LABEL_KEY.test(r['key'])))
        throw new ManifestInputError(`${field}.key`, `${shown(r['key'])} is not a taint key`);
      tol.key = r['key'];
    }
    if (r['operator'] !== undefined) {
      if (r['operator'] !== 'Exists' && r['operator'] !== 'Equal')
        throw new ManifestInputError(`${field}.operator`, `${shown(r['operator'])} is not Exists or Equal`);
      tol.operator = r['operator'];
    }
    if (r['value'] !== undefined) {
      if (typeof r['value'] !== 'string') throw new ManifestInputError(`${field}.value`, 'must be a string');
      if (tol.operator === 'Exists' && r['value'] !== '')
        throw new ManifestInputError(`${field}.value`, 'must be empty with operator Exists');
      tol.value = r['value'];
    }
    if (r['effect'] !== undefined && r['effect'] !== '') {
      if (r['effect'] !== 'NoSchedule' && r['effect'] !== 'PreferNoSchedule' && r['effect'] !== 'NoExecute')
        throw new ManifestInputError(`${field}.effect`, `${shown(r['effect'])} is not NoSchedule, PreferNoSchedule or NoExecute`);
      tol.effect = r['effect'];
    }
    if (r['tolerationSeconds'] !== undefined) {
      if (typeof r['tolerationSeconds'] !== 'number' || !Number.isInteger(r['tolerationSeconds']))
        throw new ManifestInputError(`${field}.tolerationSeconds`, 'must be a whole number');
      if (tol.effect !== 'NoExecute') throw new ManifestInputError(`${field}.tolerationSeconds`, 'only applies with effect NoExecute');
      tol.tolerationSeconds = r['tolerationSeconds'];
    }
    if (tol.key === undefined && tol.operator !== 'Exists')
      throw new ManifestInputError(field, 'a toleration without a key must use operator Exists');
    return tol;
  });
  return out.length > 0 ? out : undefined;
}

function checkPullSecrets(v: unknown): string[] | undefined {
  if (v === undefined) return undefined;
  if (!Array.isArray(v)) throw new ManifestInputError('imagePullSecrets', 'must be a list of Secret names');
  for (const name of v)
    if (typeof name !== 'string' || !isDnsSubdomain(name))
      throw new ManifestInputError('imagePullSecrets', `${shown(name)} is not a Secret name`);
  return v.length > 0 ? [...(v as string[])] : undefined;
}

const QUANTITY = /^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?$/;

/**
 * What the agent needs besides the data it holds for the hub, as the pod is charged (cgroup v2: anonymous
 * memory, the kernel's socket buffers, and the file pages it touches). Measured on Node 24
 * (`pnpm bench -- --only idle-rss,stuck-destination`, docs/goals.md): anonymous memory idle ~20 MiB, ~24
 * after a bulk transfer; the node binary's file-backed pages ~52 MiB (reclaimable, but its working set);
 * 96 = 24 + 52 + 20 to spare.
 */
const AGENT_BASE_MIB = 96;
/** The agent's own default --memory-budget. */
const AGENT_DEFAULT_BUDGET_MIB = 64;

/**
 * Memory per byte of budget, with room to spare. With 1,024 stuck connections and the default 64 MiB
 * budget the agent's anonymous memory grew 56–60 MiB (24 → 80–84) and its sockets held 56–60 MiB in the
 * kernel (skmem), which cgroup v2 charges to the pod too: at most 60 + 60 = 120 MiB for 64 MiB of budget,
 * 1.9 per byte; 2.5 leaves a third more. So the default limit, 96 + 2.5 × 64 = 256 MiB, covers the worst
 * path measured then (anonymous 84 + sockets 60 + the binary's pages 52 = 196 MiB) with 30 % to spare.
 * Since the agent returns a stuck destination's credit only once its kernel has sent the bytes, the worst
 * path is anonymous 74 (its peak during a bulk beside them) + sockets 22 + 52 = 148 MiB: the limit is kept
 * for bursts the bench does not make.
 */
const AGENT_MEMORY_PER_BUDGET = 2.5;

/**
 * The agent's memory budget follows from its memory limit: what is left after its base, divided by
 * what a budget's worth of buffers costs (in RSS and in kernel socket buffers). The default limit
 * (256Mi) gives the agent's default budget (64 MiB).
 */
export function agentBudgetMiB(resources: ResourceRequirements): number {
  const limit = memoryMiB(resources.limits?.['memory']);
  if (limit === null) return AGENT_DEFAULT_BUDGET_MIB;
  return Math.max(8, Math.floor((limit - AGENT_BASE_MIB) / AGENT_MEMORY_PER_BUDGET));
}

/** A memory quantity in MiB, or null for none (or a form we do not read: plain numbers with e). */
function memoryMiB(q: string | undefined): number | null {
  const m = q === undefined ? null : /^(\d+(?:\.\d*)?)([KMGTPE]i|[kMGTPE])?$/.exec(q);
  if (!m) return null;
  const unit = m[2] ?? '';
  const factor: Record<string, number> = {
    '': 1,
    k: 1e3,
    M: 1e6,
    G: 1e9,
    T: 1e12,
    P: 1e15,
    E: 1e18,
    Ki: 2 ** 10,
    Mi: 2 ** 20,
    Gi: 2 ** 30,
    Ti: 2 ** 40,
    Pi: 2 ** 50,
    Ei: 2 ** 60,
  };
  return (Number(m[1]) * factor[unit]!) / 2 ** 20;
}

function checkResources(v: ResourceRequirements | undefined): ResourceRequirements {
  if (v === undefined)
    return {
      requests: { cpu: '50m', memory: '64Mi' },
      limits: { memory: `${AGENT_BASE_MIB + AGENT_MEMORY_PER_BUDGET * AGENT_DEFAULT_BUDGET_MIB}Mi` },
    };
  const out: ResourceRequirements = {};
  for (const part of ['requests', 'limits'] as const) {
    const m = v[part];
    if (m === undefined) continue;
    const sorted: Record<string, string> = {};
    for (const k of Object.keys(m).sort()) {
      const q = m[k];
      if (typeof q !== 'string' || !QUANTITY.test(q))
        throw new ManifestInputError(`resources.${part}.${k}`, `${shown(q)} is not a quantity such as 100m or 128Mi`);
      sorted[k] = q;
    }
    out[part] = sorted;
  }
  return out;
}

function factsOf(input: AgentInstallInput | OcmAgentInstallInput): ClusterProxyFacts {
  const f = input.facts ?? {};
  const facts: ClusterProxyFacts = {};
  const pods = f.podCidrs ?? (input.podCidr ? [input.podCidr] : undefined);
  const services = f.serviceCidrs ?? (input.serviceCidr ? [input.serviceCidr] : undefined);
  const domain = f.clusterDomain ?? input.clusterDomain;
  const apiserver = f.apiserverIp ?? input.apiserverIp;
  if (pods) facts.podCidrs = pods;
  if (services) facts.serviceCidrs = services;
  if (domain) facts.clusterDomain = domain;
  if (apiserver) facts.apiserverIp = apiserver;
  // Validates now, so a broken fact is reported as a fact and not as a proxy setting.
  try {
    clusterNoProxyEntries(facts);
  } catch (err) {
    if (err instanceof ProxySettingsError)
      throw new ManifestInputError(`facts.${err.message.split(/[ :]/)[0]}`, err.message.replace(/^\w+:? /, ''));
    throw err;
  }
  return facts;
}

function proxyField<T>(fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    if (err instanceof ProxySettingsError)
      throw new ManifestInputError(`proxyConfig.${err.message.split(/[ :]/)[0]}`, err.message.replace(/^\w+:? /, ''));
    throw err;
  }
}

// --- rendering ------------------------------------------------------------------------------------------

/**
 * The objects to `kubectl apply` in the managed cluster, in apply order (Namespace first). Deterministic:
 * the same input renders the same objects in the same order. Throws ManifestInputError on bad input.
 */
/** Cluster-wide: impersonation has no namespace. Named for the install namespace, which is one per cluster. */
export const GATEWAY_IMPERSONATOR = 'cluster-proxy-gateway-impersonator';

/** The right to call the apiserver as a hub user: impersonate users, groups and uids, nothing else. */
function gatewayImpersonation(ns: string, labels: Record<string, string>): KubeManifest[] {
  const metadata = { name: GATEWAY_IMPERSONATOR, labels };
  return [
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRole',
      metadata,
      rules: [
        { apiGroups: [''], resources: ['users', 'groups'], verbs: ['impersonate'] },
        // uids and every userextras/<key> (RBAC has no `userextras/*`: the group's resources are only these two).
        { apiGroups: ['authentication.k8s.io'], resources: ['*'], verbs: ['impersonate'] },
      ],
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRoleBinding',
      metadata,
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: GATEWAY_IMPERSONATOR },
      subjects: [{ kind: 'ServiceAccount', name: AGENT_SERVICE_ACCOUNT, namespace: ns }],
    },
  ];
}

export function renderAgentInstall(input: AgentInstallInput | OcmAgentInstallInput): KubeManifest[] {
  const cluster = checkCluster(input.cluster);
  const ns = checkNamespace(input.installNamespace);
  const agentEntrypoint = checkHostPort(input.agentEntrypoint);
  const serverName = checkServerName(input.serverName);
  const hubCa = checkCaBundle(input.caBundle);
  const ocm = 'identity' in input;
  const token = ocm ? null : checkToken(input.bootstrapToken);
  const persist = !ocm && input.persistCredentials !== false;
  const caSecret = ocm ? OCM_HUB_CA_SECRET : HUB_CA_SECRET;
  const image = checkImage(input.image);
  const replicas = checkReplicas(input.agentReplicas);
  const nodeSelector = checkNodeSelector(input.nodePlacement?.nodeSelector);
  const tolerations = checkTolerations(input.nodePlacement?.tolerations);
  const pullSecrets = checkPullSecrets(input.imagePullSecrets);
  const resources = checkResources(input.resources);
  const facts = factsOf(input);
  const proxy = input.proxyConfig ?? {};
  const { env } = proxyField(() => renderProxySettings(proxy, facts));
  const caBundle = proxyField(() => trustBundle(hubCa, proxy));
  const httpsProxy = env.some((e) => e.name === 'HTTPS_PROXY' && /^https:\/\//i.test(e.value));
  // Validated by factsOf; written as NO_PROXY writes it.
  const clusterDomain = (facts.clusterDomain ?? DEFAULT_CLUSTER_DOMAIN)
    .trim()
    .toLowerCase()
    .replace(/^\.+|\.+$/g, '');

  // No secret in labels: only names everybody may see.
  const labels = {
    'app.kubernetes.io/name': 'cluster-proxy-agent',
    'app.kubernetes.io/part-of': 'cluster-proxy',
    'open-cluster-management.io/cluster-name': cluster,
  };
  // OCM's pod labels (other tools select agent pods by them).
  const podLabels = {
    ...labels,
    'open-cluster-management.io/addon': 'cluster-proxy',
    'proxy.open-cluster-management.io/component-name': 'proxy-agent',
  };
  const meta = (name: string) => ({ name, namespace: ns, labels });

  const args = [
    'agent',
    `--cluster=${cluster}`,
    `--namespace=${ns}`,
    `--hub=${agentEntrypoint}`,
    ...(serverName ? [`--server-name=${serverName}`] : []),
    `--ca-cert=${HUB_CA_DIR}/ca.crt`,
    // The trust bundle holds the https proxy's CA too (OCM merges it the same way).
    ...(httpsProxy ? [`--proxy-ca=${HUB_CA_DIR}/ca.crt`] : []),
    ...(ocm
      ? [`--cert=${OCM_CLIENT_CERT_DIR}/tls.crt`, `--key=${OCM_CLIENT_CERT_DIR}/tls.key`]
      : [`--bootstrap-token-file=${BOOTSTRAP_DIR}/token`, `--credentials-dir=${CREDENTIALS_DIR}`]),
    ...(persist ? [`--credentials-secret=${CREDENTIALS_SECRET}`] : []),
    '--apiserver=kubernetes.default.svc:443',
    `--health-port=${AGENT_HEALTH_PORT}`,
    `--memory-budget=${agentBudgetMiB(resources)}Mi`,
  ];
  const probe = (path: string) => ({
    httpGet: { path, port: AGENT_HEALTH_PORT },
    periodSeconds: 10,
    timeoutSeconds: 3,
    failureThreshold: 3,
  });
  const container = {
    name: 'proxy-agent',
    image,
    args,
    env: env.map((e: EnvVar) => ({ name: e.name, value: e.value })),
    ports: [{ name: 'health', containerPort: AGENT_HEALTH_PORT, protocol: 'TCP' }],
    livenessProbe: probe('/healthz'),
    readinessProbe: probe('/readyz'),
    resources,
    securityContext: { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, runAsNonRoot: true, capabilities: { drop: ['ALL'] } },
    volumeMounts: [
      { name: 'hub-ca', mountPath: HUB_CA_DIR, readOnly: true },
      ...(ocm
        ? [{ name: 'client-cert', mountPath: OCM_CLIENT_CERT_DIR, readOnly: true }]
        : [
            { name: 'bootstrap', mountPath: BOOTSTRAP_DIR, readOnly: true },
            { name: 'credentials', mountPath: CREDENTIALS_DIR },
          ]),
      // Read-only root filesystem: Node and libraries may still want a scratch directory.
      { name: 'tmp', mountPath: '/tmp' },
    ],
  };

  // OCM leaves the namespace behind when the work goes (other addons may share it).
  const nsMeta = ocm ? { name: ns, labels, annotations: { 'addon.open-cluster-management.io/deletion-orphan': '' } } : { name: ns, labels };
  const secretRules = persist
    ? [
        { apiGroups: [''], resources: ['secrets'], verbs: ['create'] },
        { apiGroups: [''], resources: ['secrets'], resourceNames: [CREDENTIALS_SECRET], verbs: ['get', 'update', 'patch'] },
      ]
    : [];
  return [
    { apiVersion: 'v1', kind: 'Namespace', metadata: nsMeta },
    { apiVersion: 'v1', kind: 'ServiceAccount', metadata: meta(AGENT_SERVICE_ACCOUNT) },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'Role',
      metadata: meta(AGENT_ROLE),
      // `create` cannot be limited to a name (the name is not known to RBAC before the object exists).
      rules: [
        { apiGroups: ['coordination.k8s.io'], resources: ['leases'], verbs: ['create'] },
        { apiGroups: ['coordination.k8s.io'], resources: ['leases'], resourceNames: [AGENT_LEASE], verbs: ['get', 'update', 'patch'] },
        ...secretRules,
      ],
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: meta(AGENT_ROLE),
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: AGENT_ROLE },
      subjects: [{ kind: 'ServiceAccount', name: AGENT_SERVICE_ACCOUNT, namespace: ns }],
    },
    ...(input.gateway ? gatewayImpersonation(ns, labels) : []),
    { apiVersion: 'v1', kind: 'Secret', metadata: meta(caSecret), type: 'Opaque', data: { 'ca.crt': b64(caBundle) } },
    ...(token !== null
      ? [{ apiVersion: 'v1', kind: 'Secret', metadata: meta(BOOTSTRAP_SECRET), type: 'Opaque', data: { token: b64(token) } }]
      : []),
    {
      apiVersion: 'apps/v1',
      kind: 'Deployment',
      // OCM's labels on the Deployment too: its tooling selects the agent by them.
      metadata: ocm
        ? {
            ...meta(AGENT_DEPLOYMENT_NAME),
            labels: {
              ...labels,
              'open-cluster-management.io/addon': 'cluster-proxy',
              'proxy.open-cluster-management.io/component-name': 'proxy-agent',
            },
          }
        : meta(AGENT_DEPLOYMENT_NAME),
      spec: {
        replicas,
        // On OCM, OCM cluster-proxy's selector (immutable on a Deployment): taking over its Deployment updates it in place.
        selector: { matchLabels: ocm ? OCM_AGENT_SELECTOR : { 'app.kubernetes.io/name': 'cluster-proxy-agent' } },
        template: {
          metadata: { labels: podLabels },
          spec: {
            serviceAccountName: AGENT_SERVICE_ACCOUNT,
            // SIGTERM drains: open connections get --drain-grace (30 s) to finish.
            terminationGracePeriodSeconds: 40,
            // No fixed UID: OpenShift's restricted-v2 assigns one from the namespace's range (the image runs as any UID).
            securityContext: { runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } },
            ...(pullSecrets ? { imagePullSecrets: pullSecrets.map((name) => ({ name })) } : {}),
            ...(nodeSelector ? { nodeSelector } : {}),
            ...(tolerations ? { tolerations } : {}),
            containers: [container],
            volumes: [
              { name: 'hub-ca', secret: { secretName: caSecret } },
              ...(ocm
                ? [{ name: 'client-cert', secret: { secretName: OCM_CLIENT_CERT_SECRET } }]
                : [
                    { name: 'bootstrap', secret: { secretName: BOOTSTRAP_SECRET } },
                    { name: 'credentials', emptyDir: {} },
                  ]),
              { name: 'tmp', emptyDir: { sizeLimit: '16Mi' } },
            ],
          },
        },
      },
    },
    {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: meta(cluster),
      spec: { type: 'ExternalName', externalName: `kubernetes.default.svc.${clusterDomain}` },
    },
  ];
}

/** Multi-document YAML, as `kubectl apply -f` takes it. */
export function toYaml(objects: readonly KubeManifest[]): string {
  return objects.map((o) => `---\n${yamlLib().stringify(o, { lineWidth: 0 })}`).join('');
}

/** The name `hub.ts` and `join` use; same as toYaml. */
export const manifestsToYaml = toYaml;
