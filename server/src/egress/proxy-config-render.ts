// `cluster-proxy proxy-config render`: the egress-proxy settings a whole managed cluster needs, not only
// the agent (docs/egress-proxy.md). containerd must pull images through the proxy, kubelet and kubeadm need it, and
// every pod that talks outside needs a NO_PROXY with the cluster's own ranges. The values are the agent's
// (proxy-settings.ts merges the install-wide ADC `proxyConfig` with the cluster part, in the same order and
// de-duplication); this file only writes them in the shape each consumer reads. Pure functions: no I/O.
//
// Formats:
//   systemd      drop-ins `http-proxy.conf` for containerd.service.d and kubelet.service.d
//   kubeadm      `files:` + `preKubeadmCommands` for a KubeadmControlPlane and a KubeadmConfigTemplate
//                (CAPI v1beta1), rendered as merge patches: the user's objects keep everything else
//   kyverno      a ClusterPolicy adding the env to every container of every Pod, except where the
//                container already sets the variable, with its namespace exclusions spelled out
//   env          KEY=value lines (docker --env-file, systemd EnvironmentFile=)
//   helm-values  a `proxy:` values block for charts installed before the policy exists
//   json         the merged settings, machine-readable
//
// Secrets: a proxy URL may carry `user:password@`. Callers render twice when they print: with the
// password masked for stdout, and unmasked for files written with mode 0600 (`RenderedFile.secret`).
import { toYaml, type YamlValue } from '../kube-yaml.js';
import {
  caCertificates,
  maskProxyPassword,
  renderProxySettings,
  type ClusterProxyFacts,
  type EnvVar,
  type ProxyConfig,
} from './proxy-settings.js';

export const PROXY_CONFIG_FORMATS = ['systemd', 'kubeadm', 'kyverno', 'env', 'helm-values', 'json'] as const;
export type ProxyConfigFormat = (typeof PROXY_CONFIG_FORMATS)[number];

export function isProxyConfigFormat(value: string): value is ProxyConfigFormat {
  return (PROXY_CONFIG_FORMATS as readonly string[]).includes(value);
}

/** Namespaces the Kyverno policy leaves alone unless told otherwise (the policy engine's own included). */
export const DEFAULT_POLICY_EXCLUDED_NAMESPACES: readonly string[] = ['kube-system', 'kyverno'];

/** Where the systemd drop-ins go on a node. */
export const SYSTEMD_DROP_INS: readonly { unit: string; path: string }[] = [
  { unit: 'containerd', path: '/etc/systemd/system/containerd.service.d/http-proxy.conf' },
  { unit: 'kubelet', path: '/etc/systemd/system/kubelet.service.d/http-proxy.conf' },
];

/** Where the kubeadm format puts an https proxy's CA bundle on a node (Debian/Ubuntu trust store). */
export const NODE_PROXY_CA_PATH = '/usr/local/share/ca-certificates/cluster-proxy-egress-ca.crt';

export interface ProxyConfigRenderOptions {
  /** Names the rendered objects (KubeadmControlPlane `NAME-control-plane`, …); default "cluster". */
  clusterName?: string;
  /** Kyverno: namespaces the policy skips (default DEFAULT_POLICY_EXCLUDED_NAMESPACES). */
  excludeNamespaces?: readonly string[];
  /** Replace a proxy URL's password with "***" (for stdout). */
  maskSecrets?: boolean;
}

/** One file of a render: `path` is where it belongs (absolute for node files, a plain name otherwise). */
export interface RenderedFile {
  path: string;
  /** The mode the file is written with: 0600 when it holds a proxy password, else 0644. */
  mode: number;
  content: string;
}

export interface ProxyConfigRender {
  format: ProxyConfigFormat;
  files: RenderedFile[];
  /** Whether any proxy URL carries a password (masked in `files` when maskSecrets was set). */
  hasSecrets: boolean;
  /** What the user must do or know next, one line each (daemon-reload, what a format cannot cover). */
  notes: string[];
}

/** The merged settings every format is written from. */
export interface MergedProxySettings {
  httpProxy?: string;
  httpsProxy?: string;
  /** The merged NO_PROXY entries, in order. */
  noProxy: string[];
  /** The https proxy's CA bundle (PEM), kept only when the https proxy is an https:// URL (as the agent does). */
  caBundle?: string;
  /** HTTP_PROXY, http_proxy, HTTPS_PROXY, https_proxy, NO_PROXY, no_proxy (those with a value). */
  env: EnvVar[];
}

export class ProxyConfigRenderError extends Error {
  override name = 'ProxyConfigRenderError';
}

function hasPassword(url: string | undefined): boolean {
  if (url === undefined) return false;
  try {
    return new URL(url).password !== '';
  } catch {
    return false;
  }
}

/**
 * Merges and validates (ProxySettingsError on a bad URL, CIDR, domain or CA bundle). Throws
 * ProxyConfigRenderError when no proxy is set: NO_PROXY alone has nothing to bypass.
 */
export function mergeProxySettings(proxy: ProxyConfig, facts: ClusterProxyFacts = {}): MergedProxySettings {
  const rendered = renderProxySettings(proxy, facts);
  if (rendered.env.length === 0)
    throw new ProxyConfigRenderError('no proxy to render: set httpProxy and/or httpsProxy (--http-proxy, --https-proxy)');
  const value = (name: string): string | undefined => rendered.env.find((e) => e.name === name)?.value;
  const httpsProxy = value('HTTPS_PROXY');
  const merged: MergedProxySettings = { noProxy: rendered.noProxy, env: rendered.env };
  const httpProxy = value('HTTP_PROXY');
  if (httpProxy !== undefined) merged.httpProxy = httpProxy;
  if (httpsProxy !== undefined) merged.httpsProxy = httpsProxy;
  if (proxy.caBundle !== undefined && httpsProxy !== undefined && /^https:\/\//i.test(httpsProxy)) {
    merged.caBundle = caCertificates(proxy.caBundle).join('');
  }
  return merged;
}

/** The settings with every proxy password as "***" (NO_PROXY is not a URL and stays as it is). */
function masked(s: MergedProxySettings): MergedProxySettings {
  const out: MergedProxySettings = {
    ...s,
    env: s.env.map((e) => (/^https?_proxy$/i.test(e.name) ? { ...e, value: maskProxyPassword(e.value) } : e)),
  };
  if (s.httpProxy !== undefined) out.httpProxy = maskProxyPassword(s.httpProxy);
  if (s.httpsProxy !== undefined) out.httpsProxy = maskProxyPassword(s.httpsProxy);
  return out;
}

/** Writes `settings` in `format`. */
export function renderProxyConfig(
  format: ProxyConfigFormat,
  settings: MergedProxySettings,
  opts: ProxyConfigRenderOptions = {},
): ProxyConfigRender {
  const hasSecrets = hasPassword(settings.httpProxy) || hasPassword(settings.httpsProxy);
  const s = opts.maskSecrets ? masked(settings) : settings;
  const mode = hasSecrets ? 0o600 : 0o644;
  const cluster = opts.clusterName ?? 'cluster';
  switch (format) {
    case 'systemd':
      return {
        format,
        hasSecrets,
        files: SYSTEMD_DROP_INS.map((d) => ({ path: d.path, mode, content: systemdDropIn(s, d.unit) })),
        notes: [
          'then on the node: systemctl daemon-reload && systemctl restart containerd kubelet',
          ...(s.caBundle !== undefined
            ? [
                `the https proxy's CA must be in the node's trust store (e.g. ${NODE_PROXY_CA_PATH}, then update-ca-certificates): containerd and kubelet use the system roots`,
              ]
            : []),
        ],
      };
    case 'kubeadm':
      return {
        format,
        hasSecrets,
        files: [{ path: 'kubeadm-proxy.yaml', mode, content: kubeadmPatches(s, cluster, hasSecrets) }],
        notes: [
          'merge spec.kubeadmConfigSpec into your KubeadmControlPlane and spec.template.spec into your KubeadmConfigTemplate (append to existing files: and preKubeadmCommands:)',
          ...(hasSecrets ? ['the proxy password is inline in both objects: keep them as confidential as a Secret'] : []),
        ],
      };
    case 'kyverno': {
      const excluded = [...new Set(opts.excludeNamespaces ?? DEFAULT_POLICY_EXCLUDED_NAMESPACES)];
      return {
        format,
        hasSecrets,
        files: [{ path: 'kyverno-proxy-env.yaml', mode, content: kyvernoPolicy(s, excluded) }],
        notes: [
          `the policy skips ${excluded.length > 0 ? `namespaces ${excluded.join(', ')}` : 'no namespace'} and cannot reach static pods (kubelet starts them without the API server): use the systemd or kubeadm format for those nodes' components`,
          'pods created before the policy (cert-manager, chart operators) need the env from their charts: see --format helm-values',
          ...(hasSecrets ? ['the proxy password is in the policy and in every pod spec it mutates'] : []),
        ],
      };
    }
    case 'env':
      return {
        format,
        hasSecrets,
        files: [{ path: 'proxy.env', mode, content: s.env.map((e) => `${e.name}=${e.value}\n`).join('') }],
        notes: [],
      };
    case 'helm-values':
      return {
        format,
        hasSecrets,
        files: [{ path: 'proxy-values.yaml', mode, content: helmValues(s) }],
        notes: ["map these keys to each chart's own (cert-manager: http_proxy, https_proxy, no_proxy; others: extraEnv / env)"],
      };
    case 'json':
      return {
        format,
        hasSecrets,
        files: [{ path: 'proxy-config.json', mode, content: `${JSON.stringify(jsonView(s), null, 2)}\n` }],
        notes: [],
      };
  }
}

// --- systemd --------------------------------------------------------------------------------------------

/**
 * One `Environment="NAME=value"` line. Inside double quotes systemd unescapes C-style backslash escapes,
 * and every value expands `%` specifiers, so a percent-encoded password (`%40`) must be written `%%40`.
 */
export function systemdEnvironmentLine(e: EnvVar): string {
  const text = `${e.name}=${e.value}`.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/%/g, '%%');
  return `Environment="${text}"`;
}

function systemdDropIn(s: MergedProxySettings, unit: string): string {
  return [
    '# Written by cluster-proxy proxy-config render: the egress proxy for ' + unit + '.',
    '# After a change: systemctl daemon-reload && systemctl restart ' + unit,
    '[Service]',
    ...s.env.map(systemdEnvironmentLine),
    '',
  ].join('\n');
}

// --- kubeadm (Cluster API v1beta1) ----------------------------------------------------------------------

/** POSIX shell single-quoting. */
function shellQuote(value: string): string {
  return /^[A-Za-z0-9_@%+=:,./-]+$/.test(value) ? value : `'${value.replace(/'/g, `'\\''`)}'`;
}

interface KubeadmFile {
  path: string;
  owner: string;
  permissions: string;
  content: string;
}

function kubeadmConfigPart(s: MergedProxySettings, hasSecrets: boolean): { files: KubeadmFile[]; preKubeadmCommands: string[] } {
  const permissions = hasSecrets ? '0600' : '0644';
  const files: KubeadmFile[] = SYSTEMD_DROP_INS.map((d) => ({
    path: d.path,
    owner: 'root:root',
    permissions,
    content: systemdDropIn(s, d.unit),
  }));
  const commands: string[] = [];
  if (s.caBundle !== undefined) {
    files.push({ path: NODE_PROXY_CA_PATH, owner: 'root:root', permissions: '0644', content: s.caBundle });
    commands.push('update-ca-certificates');
  }
  // cloud-init runs preKubeadmCommands as one script, so these exports reach `kubeadm init/join` itself
  // (its preflight checks and image pulls read them).
  commands.push(...s.env.map((e) => `export ${e.name}=${shellQuote(e.value)}`));
  commands.push('systemctl daemon-reload', 'systemctl restart containerd');
  return { files, preKubeadmCommands: commands };
}

function kubeadmPatches(s: MergedProxySettings, cluster: string, hasSecrets: boolean): string {
  const part = kubeadmConfigPart(s, hasSecrets);
  const kcp = {
    apiVersion: 'controlplane.cluster.x-k8s.io/v1beta1',
    kind: 'KubeadmControlPlane',
    metadata: { name: `${cluster}-control-plane` },
    spec: { kubeadmConfigSpec: part },
  };
  const kct = {
    apiVersion: 'bootstrap.cluster.x-k8s.io/v1beta1',
    kind: 'KubeadmConfigTemplate',
    metadata: { name: `${cluster}-md-0` },
    spec: { template: { spec: part } },
  };
  const header = [
    '# Written by cluster-proxy proxy-config render: merge patches (kubectl patch --type merge, or kustomize',
    '# patches) for your KubeadmControlPlane and KubeadmConfigTemplate; rename the objects to yours.',
    '# If they already have files: or preKubeadmCommands:, append these entries (a merge patch replaces lists).',
  ].join('\n');
  return `${header}\n${yamlDoc(kcp)}---\n${yamlDoc(kct)}`;
}

// --- Kyverno ----------------------------------------------------------------------------------------------

const CONTAINER_LISTS = [
  { rule: 'containers', field: 'containers' },
  { rule: 'init-containers', field: 'initContainers' },
] as const;

function kyvernoPolicy(s: MergedProxySettings, excluded: readonly string[]): string {
  const rules = CONTAINER_LISTS.map(({ rule, field }) => ({
    name: `proxy-env-${rule}`,
    match: { any: [{ resources: { kinds: ['Pod'], operations: ['CREATE'] } }] },
    ...(excluded.length > 0 ? { exclude: { any: [{ resources: { namespaces: [...excluded] } }] } } : {}),
    ...(field === 'initContainers'
      ? { preconditions: { all: [{ key: '{{ length(request.object.spec.initContainers || `[]`) }}', operator: 'GreaterThan', value: 0 }] } }
      : {}),
    mutate: {
      // One entry per variable, so a container that sets it (by value or valueFrom) keeps its own.
      foreach: s.env.map((e) => ({
        list: `request.object.spec.${field}`,
        preconditions: { all: [{ key: e.name, operator: 'AnyNotIn', value: '{{ element.env[].name || `[]` }}' }] },
        patchStrategicMerge: { spec: { [field]: [{ name: '{{ element.name }}', env: [{ name: e.name, value: e.value }] }] } },
      })),
    },
  }));
  const policy = {
    apiVersion: 'kyverno.io/v1',
    kind: 'ClusterPolicy',
    metadata: {
      name: 'cluster-proxy-egress-env',
      annotations: {
        'policies.kyverno.io/title': 'Egress proxy environment',
        'policies.kyverno.io/subject': 'Pod',
        'policies.kyverno.io/description':
          `Adds ${[...new Set(s.env.map((e) => e.name.toUpperCase()))].join(', ')} (upper and lower case) to every container and init container ` +
          'of every new Pod, except where the container already sets the variable. ' +
          `Excluded namespaces: ${excluded.length > 0 ? excluded.join(', ') : 'none'}. ` +
          'Static pods and pods in excluded namespaces need the systemd or kubeadm settings instead.',
      },
    },
    spec: { background: false, rules },
  };
  const header = [
    '# Written by cluster-proxy proxy-config render.',
    `# Not mutated: pods in ${excluded.length > 0 ? excluded.join(', ') : '(no namespace excluded)'}, static pods, and pods created before this policy.`,
  ].join('\n');
  return `${header}\n${yamlDoc(policy)}`;
}

// --- helm values, json ------------------------------------------------------------------------------------

function helmValues(s: MergedProxySettings): string {
  const proxy: Record<string, unknown> = {};
  if (s.httpProxy !== undefined) proxy['httpProxy'] = s.httpProxy;
  if (s.httpsProxy !== undefined) proxy['httpsProxy'] = s.httpsProxy;
  proxy['noProxy'] = s.noProxy.join(',');
  if (s.caBundle !== undefined) proxy['caBundle'] = s.caBundle;
  proxy['env'] = s.env;
  return `# Written by cluster-proxy proxy-config render: the egress proxy for charts installed before the Kyverno policy.\n${yamlDoc({ proxy })}`;
}

function jsonView(s: MergedProxySettings): Record<string, unknown> {
  return {
    ...(s.httpProxy !== undefined ? { httpProxy: s.httpProxy } : {}),
    ...(s.httpsProxy !== undefined ? { httpsProxy: s.httpsProxy } : {}),
    noProxy: s.noProxy.join(','),
    noProxyEntries: s.noProxy,
    ...(s.caBundle !== undefined ? { caBundle: s.caBundle } : {}),
    env: s.env,
  };
}

function yamlDoc(value: unknown): string {
  return toYaml(value as YamlValue);
}
