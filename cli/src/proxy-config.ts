// `cluster-proxy proxy-config render --format F`: the egress-proxy settings a whole managed cluster needs
// (containerd, kubelet, kubeadm, pods, charts), merged exactly as the agent's env is, audited with
// `noproxy check` before anything is written. Rendering lives in server/src/proxy-config-render.ts; this
// file reads the inputs (flags, or a registered cluster's recorded facts from the hub), runs the audit,
// and writes stdout or files.
import { readFile, chmod, mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { auditNoProxy, formatAudit, NoProxyAuditError, type AuditReport, type ClusterFacts } from '@cluster-proxy/agent';
import type {
  ClusterProxyConfigResponse,
  ClusterProxyFacts,
  MergedProxySettings,
  ProxyConfig,
  ProxyConfigRender,
} from '@cluster-proxy/server';
import { UsageError, helpText, list, parseFlags, str, type FlagSpecs, type ParsedFlags } from './flags.js';
import { AdminRequestError, adminAddress, adminFlag, adminRequest, hubDataDirFlags } from './hub-files.js';

const FORMATS = 'systemd|kubeadm|kyverno|env|helm-values|json';

export const proxyConfigRenderFlags: FlagSpecs = {
  format: { type: 'string', help: `what to write: ${FORMATS}` },
  'http-proxy': { type: 'string', help: 'proxy for http:// requests (HTTP_PROXY)' },
  'https-proxy': { type: 'string', help: 'proxy for https:// requests and the hub (HTTPS_PROXY)' },
  'no-proxy': {
    type: 'string',
    help: 'install-wide NO_PROXY entries; the cluster part is added (not read from $NO_PROXY: this machine is not the cluster)',
  },
  'ca-bundle': { type: 'string', help: 'FILE with the CA that signs an https:// proxy (PEM)' },
  'pod-cidr': { type: 'string', multiple: true, help: "the cluster's pod CIDR(s); comma-separated or repeated" },
  'service-cidr': { type: 'string', multiple: true, help: "the cluster's service CIDR(s); comma-separated or repeated" },
  'cluster-domain': { type: 'string', help: "the cluster's DNS domain (default cluster.local)" },
  'apiserver-ip': { type: 'string', help: 'the kubernetes Service ClusterIP' },
  hub: { type: 'string', help: 'the hub the agent dials, HOST:PORT (NO_PROXY must not match it)' },
  cluster: {
    type: 'string',
    help: 'take the proxy settings and facts of this registered cluster from the hub (flags given override them)',
  },
  out: { type: 'string', help: 'write the files into DIR (mode 0600 when they hold a proxy password) instead of printing' },
  'exclude-namespace': { type: 'string', multiple: true, help: 'kyverno: namespaces the policy skips (default kube-system, kyverno)' },
  force: { type: 'boolean', help: 'render even when the audit finds problems' },
  'show-secrets': { type: 'boolean', help: 'print proxy passwords on stdout instead of ***' },
  ...adminFlag,
  'data-dir': hubDataDirFlags['data-dir']!,
};

export const proxyConfigUsage = `Usage: cluster-proxy proxy-config render|set [flags]

Commands:
  render     write the egress-proxy settings a managed cluster needs beyond the agent: systemd drop-ins
             for containerd and kubelet, kubeadm files for Cluster API, a Kyverno policy for pods, env
             lines, Helm values (--format ${FORMATS})
  set        store the install-wide settings on the hub (the AddOnDeploymentConfig's proxyConfig):
             the agents' install manifests and "render --cluster" use them

Run "cluster-proxy proxy-config COMMAND --help" for a command's flags.
`;

export const proxyConfigSetFlags: FlagSpecs = {
  'http-proxy': proxyConfigRenderFlags['http-proxy']!,
  'https-proxy': proxyConfigRenderFlags['https-proxy']!,
  'no-proxy': { type: 'string', help: "install-wide NO_PROXY entries (each cluster's own ranges are added per cluster)" },
  'ca-bundle': proxyConfigRenderFlags['ca-bundle']!,
  ...adminFlag,
  'data-dir': hubDataDirFlags['data-dir']!,
};

export const proxyConfigSetUsage = helpText(
  'cluster-proxy proxy-config set [--https-proxy URL] [--http-proxy URL] [--no-proxy LIST] [--ca-bundle FILE]',
  "Replaces the hub's install-wide egress proxy settings (flags left out are cleared). Manifests written by join from then on carry them.",
  proxyConfigSetFlags,
);

export const proxyConfigRenderUsage = helpText(
  `cluster-proxy proxy-config render --format ${FORMATS} (--https-proxy URL | --http-proxy URL | --cluster C) [flags]`,
  "Merges the install-wide settings with the cluster part (pod and service CIDRs, apiserver IP, cluster domain, metadata endpoints) as the agent's env is merged, audits the result as `noproxy check` does (exit 1 and nothing written on a problem, unless --force), and writes it in the chosen format.",
  proxyConfigRenderFlags,
);

const splitList = (values: string[]): string[] =>
  values
    .flatMap((v) => v.split(','))
    .map((v) => v.trim())
    .filter((v) => v !== '');

export interface RenderIo {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
  env?: NodeJS.ProcessEnv;
}

/** The inputs after flags and (with --cluster) the hub's record are combined. */
interface RenderInputs {
  proxy: ProxyConfig;
  facts: ClusterProxyFacts;
  hub?: string;
  clusterName?: string;
}

async function readCaBundle(file: string): Promise<string> {
  try {
    return await readFile(file, 'utf8');
  } catch (err) {
    throw new UsageError(`cannot read --ca-bundle ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
}

async function setCommand(args: string[], io: RenderIo): Promise<number> {
  const { flags, positionals } = parseFlags(args, proxyConfigSetFlags, io.env ?? process.env);
  if (flags['help']) {
    io.stdout(proxyConfigSetUsage);
    return 0;
  }
  if (positionals.length > 0) throw new UsageError(`proxy-config set takes no arguments, got "${positionals[0]}"`);
  const body: ProxyConfig = {};
  const http = str(flags, 'http-proxy');
  const https = str(flags, 'https-proxy');
  const noProxy = str(flags, 'no-proxy');
  const ca = str(flags, 'ca-bundle');
  if (http !== undefined) body.httpProxy = http;
  if (https !== undefined) body.httpsProxy = https;
  if (noProxy !== undefined) body.noProxy = noProxy;
  if (ca !== undefined) body.caBundle = await readCaBundle(ca);
  try {
    await adminRequest(adminAddress(flags), 'POST', '/v1/proxy-config', body);
  } catch (err) {
    if (err instanceof AdminRequestError && err.status < 500) throw new UsageError(`cannot set the proxy config: ${err.message}`);
    throw err;
  }
  const { maskProxyPassword } = await import('@cluster-proxy/server');
  const shown = (v: string | undefined): string => (v === undefined ? '(unset)' : maskProxyPassword(v));
  io.stdout(
    `addondeploymentconfig.addon.open-cluster-management.io/cluster-proxy configured: httpProxy ${shown(http)}, httpsProxy ${shown(https)}, noProxy ${noProxy ?? '(unset)'}${ca !== undefined ? ', caBundle from ' + ca : ''}\n`,
  );
  return 0;
}

async function inputsOf(f: ParsedFlags): Promise<RenderInputs> {
  let recorded: ClusterProxyConfigResponse | undefined;
  const cluster = str(f, 'cluster');
  if (cluster !== undefined) {
    try {
      recorded = (await adminRequest(
        adminAddress(f),
        'GET',
        `/v1/proxy-config/${encodeURIComponent(cluster)}`,
      )) as ClusterProxyConfigResponse;
    } catch (err) {
      if (err instanceof AdminRequestError && err.status < 500) throw new UsageError(`--cluster ${cluster}: ${err.message}`);
      throw err;
    }
  }
  const proxy: ProxyConfig = { ...(recorded?.proxyConfig ?? {}) };
  const override = (key: 'httpProxy' | 'httpsProxy' | 'noProxy', flag: string): void => {
    const v = str(f, flag);
    if (v !== undefined) proxy[key] = v;
  };
  override('httpProxy', 'http-proxy');
  override('httpsProxy', 'https-proxy');
  override('noProxy', 'no-proxy');
  const caFile = str(f, 'ca-bundle');
  if (caFile !== undefined) proxy.caBundle = await readCaBundle(caFile);
  const facts: ClusterProxyFacts = { ...(recorded?.facts ?? {}) };
  const pods = splitList(list(f, 'pod-cidr'));
  const services = splitList(list(f, 'service-cidr'));
  if (pods.length > 0) facts.podCidrs = pods;
  if (services.length > 0) facts.serviceCidrs = services;
  const domain = str(f, 'cluster-domain');
  const apiserver = str(f, 'apiserver-ip');
  if (domain !== undefined) facts.clusterDomain = domain;
  if (apiserver !== undefined) facts.apiserverIp = apiserver;
  const hub = str(f, 'hub') ?? recorded?.agentEntrypoint;
  return { proxy, facts, ...(hub !== undefined ? { hub } : {}), ...(cluster !== undefined ? { clusterName: cluster } : {}) };
}

/**
 * The audit of the merged value, plus what only a render can know: without the cluster's pod and service
 * CIDRs the rendered NO_PROXY cannot hold them, and pods would reach each other through the proxy.
 */
function auditMerged(merged: MergedProxySettings, inputs: RenderInputs): { report: AuditReport; missing: string[] } {
  const facts: ClusterFacts = {
    ...(inputs.facts.podCidrs ? { podCidrs: [...inputs.facts.podCidrs] } : {}),
    ...(inputs.facts.serviceCidrs ? { serviceCidrs: [...inputs.facts.serviceCidrs] } : {}),
    ...(inputs.facts.clusterDomain ? { clusterDomain: inputs.facts.clusterDomain } : {}),
    ...(inputs.facts.apiserverIp ? { apiserverIp: inputs.facts.apiserverIp } : {}),
    ...(inputs.hub ? { hub: inputs.hub } : {}),
  };
  let report: AuditReport;
  try {
    report = auditNoProxy(merged.noProxy.join(','), facts);
  } catch (err) {
    if (err instanceof NoProxyAuditError) throw new UsageError(err.message);
    throw err;
  }
  const missing: string[] = [];
  if (!inputs.facts.podCidrs?.length)
    missing.push('the pod CIDR is unknown (--pod-cidr): pod-to-pod traffic (Prometheus scrapes, webhooks) would go through the proxy');
  if (!inputs.facts.serviceCidrs?.length)
    missing.push('the service CIDR is unknown (--service-cidr): calls to ClusterIP Services would go through the proxy');
  return { report, missing };
}

/** Runs `proxy-config ARGS`; returns the exit code (0, or 1 when the audit refused). Throws UsageError on bad input. */
export async function proxyConfigCommand(args: string[], io: RenderIo): Promise<number> {
  const [sub, ...rest] = args;
  if (sub === undefined || sub === '--help' || sub === '-h' || sub === 'help') {
    io.stdout(proxyConfigUsage);
    if (sub === undefined) throw new UsageError('proxy-config needs a command: render');
    return 0;
  }
  if (sub === 'set') return setCommand(rest, io);
  if (sub !== 'render') throw new UsageError(`unknown proxy-config command "${sub}"; run "cluster-proxy proxy-config --help"`);
  const { flags, positionals } = parseFlags(rest, proxyConfigRenderFlags, io.env ?? process.env);
  if (flags['help']) {
    io.stdout(proxyConfigRenderUsage);
    return 0;
  }
  if (positionals.length > 0) throw new UsageError(`proxy-config render takes no arguments, got "${positionals[0]}"`);
  // The renderer (and its YAML library) loads only for this command.
  const server = await import('@cluster-proxy/server');
  const format = str(flags, 'format');
  if (format === undefined) throw new UsageError(`--format is required: ${FORMATS}`);
  if (!server.isProxyConfigFormat(format)) throw new UsageError(`--format "${format}" is not one of ${FORMATS}`);
  const inputs = await inputsOf(flags);
  let merged: MergedProxySettings;
  try {
    merged = server.mergeProxySettings(inputs.proxy, inputs.facts);
  } catch (err) {
    if (err instanceof server.ProxySettingsError || err instanceof server.ProxyConfigRenderError) throw new UsageError(err.message);
    throw err;
  }

  const { report, missing } = auditMerged(merged, inputs);
  const refused = report.problems > 0 || missing.length > 0;
  const lines: string[] = [];
  if (refused) {
    // The whole audit: the problems, their fixes, and the warnings beside them.
    lines.push(formatAudit(report).trimEnd(), ...missing.map((m) => `PROBLEM  ${m}`));
    lines.push(force(flags) ? 'rendering anyway (--force)' : 'nothing written: fix the problems above, or pass --force');
  } else if (report.warnings > 0) {
    // Warnings are about other tools' readings (CIDR, leading dots): worth a line, not a report.
    lines.push(
      `audit: no problems; ${report.warnings} warning${report.warnings === 1 ? '' : 's'} about how tools other than Go read NO_PROXY (details: cluster-proxy noproxy check)`,
    );
  }
  if (inputs.hub === undefined) lines.push('note: --hub not given, so NO_PROXY was not checked against the hub the agent dials');
  if (lines.length > 0) io.stderr(`${lines.join('\n')}\n`);
  if (refused && !force(flags)) return 1;

  const opts = {
    ...(inputs.clusterName ? { clusterName: inputs.clusterName } : {}),
    ...(list(flags, 'exclude-namespace').length > 0 ? { excludeNamespaces: splitList(list(flags, 'exclude-namespace')) } : {}),
  };
  const out = str(flags, 'out');
  if (out !== undefined) {
    const render = server.renderProxyConfig(format, merged, opts);
    const written = await writeFiles(out, render);
    io.stdout(`${written.map((w) => `wrote ${w}`).join('\n')}\n${notes(render)}`);
    return 0;
  }
  const render = server.renderProxyConfig(format, merged, { ...opts, maskSecrets: !flags['show-secrets'] });
  io.stdout(stdoutText(render));
  const tail = notes(render);
  if (render.hasSecrets && !flags['show-secrets'])
    io.stderr('proxy passwords are shown as ***: --out DIR writes them into files (mode 0600), --show-secrets prints them\n');
  if (tail !== '') io.stderr(tail);
  return 0;
}

function force(flags: ParsedFlags): boolean {
  return flags['force'] === true;
}

function notes(render: ProxyConfigRender): string {
  return render.notes.map((n) => `note: ${n}\n`).join('');
}

/** One file as it is; several (systemd) each under a `# path (mode)` comment line. */
function stdoutText(render: ProxyConfigRender): string {
  if (render.files.length === 1) return render.files[0]!.content;
  return render.files.map((f) => `# ${f.path} (mode ${f.mode.toString(8).padStart(4, '0')})\n${f.content}`).join('\n');
}

/** Node paths (/etc/systemd/...) go under DIR with their full path; plain names go into DIR. */
async function writeFiles(dir: string, render: ProxyConfigRender): Promise<string[]> {
  const written: string[] = [];
  for (const f of render.files) {
    const target = path.join(dir, f.path.replace(/^\/+/, ''));
    await mkdir(path.dirname(target), { recursive: true, mode: 0o755 });
    await writeFile(target, f.content, { mode: f.mode });
    await chmod(target, f.mode); // an existing file keeps its old mode through writeFile
    written.push(`${target} (mode ${f.mode.toString(8).padStart(4, '0')})`);
  }
  return written;
}

/** Thrown when the audit refused the render: the CLI prints its message and exits 1. */
export class ProxyConfigRefused extends Error {
  override name = 'ProxyConfigRefused';
}

export async function runProxyConfig(args: string[]): Promise<void> {
  const code = await proxyConfigCommand(args, { stdout: (t) => process.stdout.write(t), stderr: (t) => process.stderr.write(t) });
  if (code !== 0) throw new ProxyConfigRefused('proxy-config render refused (see above)');
}
