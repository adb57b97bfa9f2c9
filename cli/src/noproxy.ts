// `cluster-proxy noproxy check` and `cluster-proxy noproxy explain`: audit a NO_PROXY value against a
// cluster's facts, or say what Go (and the agent) would do for one destination. The logic lives in the
// agent package (no-proxy-audit.ts), next to the matcher the agent itself uses.
import { auditNoProxy, explainNoProxy, formatAudit, formatExplanation, NoProxyAuditError, type ClusterFacts } from '@cluster-proxy/agent';
import { UsageError, helpText, list, parseFlags, str, type FlagSpecs } from './flags.js';

export const noProxyCheckFlags: FlagSpecs = {
  'no-proxy': { type: 'string', help: 'the NO_PROXY value to check (default: $NO_PROXY, else $no_proxy, as Go reads them)' },
  'pod-cidr': { type: 'string', multiple: true, help: "the cluster's pod CIDR(s); comma-separated or repeated" },
  'service-cidr': { type: 'string', multiple: true, help: "the cluster's service CIDR(s); comma-separated or repeated" },
  'cluster-domain': { type: 'string', default: 'cluster.local', help: "the cluster's DNS domain" },
  'apiserver-ip': { type: 'string', help: 'the kubernetes Service ClusterIP (or apiserver endpoint IP)' },
  hub: { type: 'string', help: 'the hub the agent dials, HOST:PORT (must NOT match NO_PROXY)' },
  json: { type: 'boolean', help: 'print the report as JSON' },
};

export const noProxyExplainFlags: FlagSpecs = {
  'no-proxy': { type: 'string', help: 'the NO_PROXY value (default: $NO_PROXY, else $no_proxy, as Go reads them)' },
  json: { type: 'boolean', help: 'print the decision as JSON' },
};

export const noProxyUsage = `Usage: cluster-proxy noproxy check|explain [flags]

Audits NO_PROXY values with Go's semantics (what the agent, kubelet and kubectl do).

Commands:
  check      list what a NO_PROXY value sends through the proxy by mistake (pod/service CIDRs,
             cluster domain, apiserver, metadata endpoints), what bypasses it by mistake (the hub),
             and entries other tools read differently; exit code 1 when a problem is found
  explain    print "direct" or "proxy" for HOST[:PORT] and the entry that decided it

Run "cluster-proxy noproxy COMMAND --help" for a command's flags.
`;

export const noProxyCheckUsage = helpText(
  'cluster-proxy noproxy check --no-proxy VALUE [--pod-cidr CIDR] [--service-cidr CIDR] [--cluster-domain DOMAIN] [--apiserver-ip IP] [--hub HOST:PORT]',
  "Audits a NO_PROXY value against a cluster's facts. Exit code 1 when a problem is found (warnings alone exit 0), 2 on bad flags.",
  noProxyCheckFlags,
);

export const noProxyExplainUsage = helpText(
  'cluster-proxy noproxy explain --no-proxy VALUE HOST[:PORT]',
  'Prints "direct" or "proxy" for HOST[:PORT] (port 443 if omitted) and the NO_PROXY entry that decided it.',
  noProxyExplainFlags,
);

/** Thrown by runNoProxy when `check` found a problem: the CLI prints its message and exits 1. */
export class NoProxyCheckFailed extends Error {
  override name = 'NoProxyCheckFailed';
}

function noProxyValue(flagValue: string | undefined, env: NodeJS.ProcessEnv): { value: string; source: string } {
  if (flagValue !== undefined) return { value: flagValue, source: '--no-proxy' };
  for (const name of ['NO_PROXY', 'no_proxy']) {
    const v = env[name];
    if (v !== undefined && v !== '') return { value: v, source: `$${name}` };
  }
  throw new UsageError('--no-proxy is required (or set NO_PROXY)');
}

const splitList = (values: string[]): string[] =>
  values
    .flatMap((v) => v.split(','))
    .map((v) => v.trim())
    .filter((v) => v !== '');

/**
 * Runs `noproxy ARGS`, writing the report through `write`. Returns the exit code (0, or 1 when
 * `check` found a problem); throws UsageError on bad flags or facts.
 */
export async function noProxyCommand(args: string[], write: (text: string) => void, env: NodeJS.ProcessEnv = process.env): Promise<number> {
  const [sub, ...rest] = args;
  if (sub === undefined || sub === '--help' || sub === '-h' || sub === 'help') {
    write(noProxyUsage);
    if (sub === undefined) throw new UsageError('noproxy needs a command: check or explain');
    return 0;
  }
  if (sub === 'check') {
    const { flags, positionals } = parseFlags(rest, noProxyCheckFlags, env);
    if (flags['help']) {
      write(noProxyCheckUsage);
      return 0;
    }
    if (positionals.length > 0) throw new UsageError(`noproxy check takes no arguments, got "${positionals[0]}"`);
    const { value, source } = noProxyValue(str(flags, 'no-proxy'), env);
    const facts: ClusterFacts = {
      podCidrs: splitList(list(flags, 'pod-cidr')),
      serviceCidrs: splitList(list(flags, 'service-cidr')),
      clusterDomain: str(flags, 'cluster-domain'),
      apiserverIp: str(flags, 'apiserver-ip'),
      hub: str(flags, 'hub'),
    };
    let report;
    try {
      report = auditNoProxy(value, facts);
    } catch (err) {
      if (err instanceof NoProxyAuditError) throw new UsageError(err.message);
      throw err;
    }
    if (flags['json']) write(`${JSON.stringify({ source, ...report }, null, 2)}\n`);
    else write(`${source !== '--no-proxy' ? `(NO_PROXY read from ${source})\n` : ''}${formatAudit(report)}`);
    return report.problems > 0 ? 1 : 0;
  }
  if (sub === 'explain') {
    const { flags, positionals } = parseFlags(rest, noProxyExplainFlags, env);
    if (flags['help']) {
      write(noProxyExplainUsage);
      return 0;
    }
    if (positionals.length !== 1) throw new UsageError('noproxy explain needs exactly one HOST[:PORT]');
    const { value, source } = noProxyValue(str(flags, 'no-proxy'), env);
    let e;
    try {
      e = explainNoProxy(value, positionals[0]!);
    } catch (err) {
      if (err instanceof NoProxyAuditError) throw new UsageError(err.message);
      throw err;
    }
    if (flags['json']) write(`${JSON.stringify({ source, ...e }, null, 2)}\n`);
    else write(formatExplanation(e));
    return 0;
  }
  throw new UsageError(`unknown noproxy command "${sub}"; run "cluster-proxy noproxy --help"`);
}

export async function runNoProxy(args: string[]): Promise<void> {
  const code = await noProxyCommand(args, (text) => process.stdout.write(text));
  if (code !== 0) throw new NoProxyCheckFailed('noproxy check found problems (see above)');
}
