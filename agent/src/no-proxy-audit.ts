// `cluster-proxy noproxy check` and `noproxy explain`: audits a NO_PROXY value against a cluster's
// facts. Pure functions plus text formatters; the CLI lives in cli/src/noproxy.ts.
//
// Three kinds of findings:
//   - in-cluster traffic that would wrongly go through the proxy (pod/service CIDRs, the cluster
//     domain, the apiserver, cloud metadata endpoints);
//   - the hub wrongly bypassing it (NO_PROXY matches the hub: the agent would dial it directly);
//   - entries other tools read differently from Go. What the other tools do (checked in their source
//     where noted, else from the GitLab survey "We need to talk: Can we standardize NO_PROXY?"):
//       curl (lib/noproxy.c): leading `.` stripped, so `.foo.com` also matches foo.com; `*` only as the
//         whole value; `*.foo.com` and `host:port` compared literally (never match); CIDR since 7.86.
//       Python (urllib, requests): leading `.` stripped; `*` only as the whole value; no CIDR.
//       wget: no CIDR, no `*`, leading `.` kept.
//       Node proxy-from-env / undici: `*` only as the whole value; no CIDR.
//     None of them bypasses loopback by itself; Go (and this agent) always does.
import {
  cidrContainsCidr,
  cidrContainsIp,
  formatCidr,
  formatIp,
  isLoopbackIp,
  parseCidr,
  parseIp,
  parseNoProxy,
  type Cidr,
  type NoProxyEntry,
  type NoProxyMatcher,
} from './no-proxy.js';

export type Severity = 'problem' | 'warning';

export interface Finding {
  severity: Severity;
  /** Stable identifier, e.g. "pod-cidr-proxied", for tests and machine-readable output. */
  code: string;
  /** One line: what is wrong and what it breaks. */
  message: string;
  /** One line: what to change. */
  fix: string;
  /** NO_PROXY entries to add (merged into AuditReport.suggested). */
  add?: string[];
  /** NO_PROXY entries to remove (merged into AuditReport.suggested). */
  remove?: string[];
}

export interface ClusterFacts {
  /** Pod CIDRs (two for dual-stack). */
  podCidrs?: string[];
  /** Service CIDRs. */
  serviceCidrs?: string[];
  /** Cluster DNS domain, e.g. "cluster.local". */
  clusterDomain?: string;
  /** The apiserver's ClusterIP (the `kubernetes` Service) or endpoint IP. */
  apiserverIp?: string;
  /** The hub the agent dials, HOST:PORT. */
  hub?: string;
}

export interface AuditReport {
  value: string;
  /** The entries as Go reads them (trimmed, lower-cased, empty ones dropped). */
  entries: string[];
  findings: Finding[];
  problems: number;
  warnings: number;
  /** The value with every suggested addition and removal applied (the entries joined by "," if none). */
  suggested: string;
  /** Problems `suggested` still has: they need a decision by hand (e.g. narrowing an entry that matches the hub). */
  unresolved: Finding[];
}

export class NoProxyAuditError extends Error {
  override name = 'NoProxyAuditError';
}

/** Cloud metadata endpoints: reaching them through a proxy hits the *proxy's* metadata, or fails. */
export const METADATA_ENDPOINTS: readonly string[] = ['169.254.169.254', 'metadata.google.internal'];

/** Parses HOST, HOST:PORT, [IPv6]:PORT or a bare IPv6 address. */
export function parseTarget(text: string, defaultPort = 443): { host: string; port: number } | null {
  const t = text.trim();
  if (t === '') return null;
  const portOf = (p: string): number | null => (/^\d{1,5}$/.test(p) && Number(p) <= 65535 ? Number(p) : null);
  const bracket = /^\[([^\]]+)\](?::(\d+))?$/.exec(t);
  if (bracket) {
    const port = bracket[2] === undefined ? defaultPort : portOf(bracket[2]);
    return port === null ? null : { host: bracket[1]!, port };
  }
  if (parseIp(t) !== null) return { host: t, port: defaultPort }; // includes bare IPv6
  const colon = t.lastIndexOf(':');
  if (colon < 0) return { host: t, port: defaultPort };
  const host = t.slice(0, colon);
  const port = portOf(t.slice(colon + 1));
  if (host === '' || host.includes(':') || port === null) return null;
  return { host, port };
}

function formatTarget(host: string, port: number): string {
  return `${host.includes(':') ? `[${host}]` : host}:${port}`;
}

type Coverage = { kind: 'full'; by: string[] } | { kind: 'partial'; by: string[] } | { kind: 'none' };

/** How much of `range` the union of `entries` covers (an entry may cover it whole or pieces of it). */
function coverage(range: Cidr, entries: ReadonlyArray<{ cidr: Cidr; text: string }>): Coverage {
  const whole = entries.find((e) => cidrContainsCidr(e.cidr, range));
  if (whole) return { kind: 'full', by: [whole.text] };
  const inside = entries.filter((e) => cidrContainsCidr(range, e.cidr));
  if (inside.length === 0) return { kind: 'none' };
  const width = range.family === 4 ? 32 : 128;
  const bit = 1n << BigInt(width - range.bits - 1);
  const halves: Cidr[] = [
    { family: range.family, network: range.network, bits: range.bits + 1 },
    { family: range.family, network: range.network | bit, bits: range.bits + 1 },
  ];
  const [a, b] = halves.map((h) => coverage(h, inside)) as [Coverage, Coverage];
  const by = [...new Set([...(a.kind === 'none' ? [] : a.by), ...(b.kind === 'none' ? [] : b.by)])];
  return a.kind === 'full' && b.kind === 'full' ? { kind: 'full', by } : { kind: 'partial', by };
}

function cidrEntries(m: NoProxyMatcher): Array<{ cidr: Cidr; text: string }> {
  const out: Array<{ cidr: Cidr; text: string }> = [];
  for (const e of m.entries) {
    if (e.kind === 'cidr') out.push({ cidr: e.cidr, text: e.text });
    // An IP entry without a port covers that one address on every port.
    if (e.kind === 'ip' && e.port === null)
      out.push({ cidr: { family: e.ip.family, network: e.ip.value, bits: e.ip.family === 4 ? 32 : 128 }, text: e.text });
  }
  return out;
}

function requireCidr(text: string, flag: string): Cidr {
  const c = parseCidr(text.trim());
  if (c === null) throw new NoProxyAuditError(`${flag} "${text}" is not a CIDR such as 10.244.0.0/16 or fd00:10:244::/56`);
  return c;
}

function rangeFindings(m: NoProxyMatcher, ranges: readonly string[], flag: string, what: string, impact: string, code: string): Finding[] {
  const findings: Finding[] = [];
  if (m.matchAll) return findings;
  const entries = cidrEntries(m);
  for (const text of ranges) {
    const range = requireCidr(text, flag);
    const shown = formatCidr(range);
    const cov = coverage(range, entries);
    if (cov.kind === 'full') continue;
    const partly =
      cov.kind === 'partial' ? ` is only partly covered (by ${cov.by.map((b) => `"${b}"`).join(', ')})` : ' is not in NO_PROXY';
    findings.push({
      severity: 'problem',
      code,
      message: `${what} ${shown}${partly}: ${impact}`,
      fix: `add ${shown}`,
      add: [shown],
    });
  }
  return findings;
}

/** Audits `value` (a NO_PROXY value) against what is known about the cluster. Throws NoProxyAuditError on bad facts. */
export function auditNoProxy(value: string, facts: ClusterFacts = {}): AuditReport {
  const report = auditOnce(value, facts);
  if (report.suggested === report.entries.join(','))
    return { ...report, unresolved: report.findings.filter((f) => f.severity === 'problem') };
  // Re-check the suggestion: what it still gets wrong must be fixed by hand (e.g. a broad entry matching the hub).
  const again = auditOnce(report.suggested, facts);
  return { ...report, unresolved: again.findings.filter((f) => f.severity === 'problem') };
}

function auditOnce(value: string, facts: ClusterFacts): Omit<AuditReport, 'unresolved'> {
  const m = parseNoProxy(value);
  const findings: Finding[] = [];

  // --- in-cluster traffic that would go through the proxy --------------------------------------
  findings.push(
    ...rangeFindings(
      m,
      facts.podCidrs ?? [],
      '--pod-cidr',
      'pod CIDR',
      'traffic to pods (Prometheus scrapes, webhooks, pod-to-pod HTTP) would hairpin through the proxy',
      'pod-cidr-proxied',
    ),
  );
  const serviceFindings = rangeFindings(
    m,
    facts.serviceCidrs ?? [],
    '--service-cidr',
    'service CIDR',
    'calls to ClusterIP Services (including the kubernetes Service) would go through the proxy',
    'service-cidr-proxied',
  );
  findings.push(...serviceFindings);

  if (facts.apiserverIp !== undefined && facts.apiserverIp.trim() !== '') {
    const ipText = facts.apiserverIp.trim().replace(/^\[(.*)\]$/, '$1');
    const ip = parseIp(ipText);
    if (ip === null) throw new NoProxyAuditError(`--apiserver-ip "${facts.apiserverIp}" is not an IP address`);
    // Inside a service CIDR that is already reported: say so there instead of a second finding.
    const missingRange = serviceFindings.find((f) =>
      (f.add ?? []).some((c) => {
        const cidr = parseCidr(c);
        return cidr !== null && cidrContainsIp(cidr, ip);
      }),
    );
    if (missingRange) missingRange.message += ` (the apiserver at ${formatIp(ip)} among them)`;
    const inMissingServiceRange = missingRange !== undefined;
    if (!inMissingServiceRange && !isLoopbackIp(ip)) {
      const r = m.matches(ipText, 443);
      if (!r.bypass) {
        const shown = formatIp(ip);
        findings.push({
          severity: 'problem',
          code: 'apiserver-proxied',
          message: `apiserver IP ${shown} is not in NO_PROXY: in-cluster clients (client-go reads KUBERNETES_SERVICE_HOST) would reach the apiserver through the proxy`,
          fix: `add ${shown}`,
          add: [shown],
        });
      }
    }
  }

  const domain = facts.clusterDomain
    ?.trim()
    .toLowerCase()
    .replace(/^\.+|\.+$/g, '');
  if (facts.clusterDomain !== undefined && (domain === undefined || domain === '' || !/^[a-z0-9.-]+$/.test(domain))) {
    throw new NoProxyAuditError(`--cluster-domain "${facts.clusterDomain}" is not a DNS domain such as cluster.local`);
  }
  if (!m.matchAll) {
    const svcName = 'kubernetes.default.svc';
    const svcEntry = m.entries.find((e) => e.kind === 'domain' && (e.text === '.svc' || e.text === 'svc' || e.text === '*.svc'));
    if (!m.matches(svcName, 443).bypass) {
      findings.push({
        severity: 'problem',
        code: 'svc-proxied',
        message: `Service names such as ${svcName} would go through the proxy (nothing in NO_PROXY matches names ending in .svc)`,
        fix: 'add .svc',
        add: ['.svc'],
      });
    }
    if (domain) {
      const fqdn = `kubernetes.default.svc.${domain}`;
      if (!m.matches(fqdn, 443).bypass) {
        const why = svcEntry ? ` ("${svcEntry.text}" only matches names ending in .svc, not ${fqdn})` : '';
        findings.push({
          severity: 'problem',
          code: 'cluster-domain-proxied',
          message: `fully qualified in-cluster names such as ${fqdn} would go through the proxy${why}`,
          fix: `add .${domain}`,
          add: [`.${domain}`],
        });
      }
    }
  }

  for (const endpoint of METADATA_ENDPOINTS) {
    if (m.matches(endpoint, 80).bypass) continue;
    findings.push({
      severity: 'warning',
      code: 'metadata-proxied',
      message: `cloud metadata endpoint ${endpoint} would go through the proxy: workloads would get the proxy host's metadata (credentials!) or nothing`,
      fix: `add ${endpoint} (harmless where there is no cloud metadata service)`,
      add: [endpoint],
    });
  }

  // --- the hub bypassing the proxy ------------------------------------------------------------------
  let hubTarget: { host: string; port: number } | null = null;
  if (facts.hub !== undefined && facts.hub.trim() !== '') {
    const hub = parseTarget(facts.hub, 443);
    if (hub === null) throw new NoProxyAuditError(`--hub "${facts.hub}" must be HOST:PORT`);
    const target = formatTarget(hub.host, hub.port);
    hubTarget = hub;
    const r = m.matches(hub.host, hub.port);
    if (r.bypass && r.entry === null) {
      findings.push({
        severity: 'warning',
        code: 'hub-loopback',
        message: `hub ${target} is a loopback address: it is never proxied, whatever NO_PROXY says`,
        fix: "use the hub's real address to check a production setup",
      });
    } else if (r.bypass) {
      // Every entry that matches the hub on its own, not just the first one Go happens to try.
      const matching = m.entries.filter((e) => e.kind !== 'ignored' && parseNoProxy(e.text).matches(hub.host, hub.port).entry !== null);
      const removable = matching.filter((e) => e.kind === 'all' || isExactHubEntry(e, hub.host));
      const narrow = matching.filter((e) => !removable.includes(e));
      const fixes = [
        ...(removable.length > 0 ? [`remove ${removable.map((e) => `"${e.text}"`).join(', ')}`] : []),
        ...(narrow.length > 0
          ? [
              `narrow ${narrow.map((e) => `"${e.text}"`).join(', ')} so ${narrow.length === 1 ? 'it does' : 'they do'} not match the hub (list the hosts that should go direct instead)`,
            ]
          : []),
      ];
      findings.push({
        severity: 'problem',
        code: 'hub-bypassed',
        message: `hub ${target} matches NO_PROXY ${matching.length === 1 ? 'entry' : 'entries'} ${matching.map((e) => `"${e.text}"`).join(', ')}: the agent would dial the hub directly instead of through the proxy`,
        fix: fixes.join('; '),
        remove: removable.map((e) => e.text),
      });
    }
  }

  // --- loopback: Go skips the proxy by itself, other tools need the entries ------------------------
  const missing = m.matchAll ? [] : ['localhost', '127.0.0.1'].filter((h) => !m.entries.some((e) => entryMatchesHost(e, h)));
  if (missing.length > 0) {
    findings.push({
      severity: 'warning',
      code: 'loopback-missing',
      message: `${missing.join(' and ')} ${missing.length === 1 ? 'is' : 'are'} not in NO_PROXY: Go (and this agent) never proxy loopback, but curl, wget, Python and Node libraries do`,
      fix: `add ${missing.join(',')}`,
      add: missing,
    });
  }

  // --- entries other tools read differently ---------------------------------------------------------
  findings.push(...entryFindings(m, domain));

  const problems = findings.filter((f) => f.severity === 'problem').length;
  return {
    value,
    entries: m.entries.map((e) => e.text),
    findings: [...findings.filter((f) => f.severity === 'problem'), ...findings.filter((f) => f.severity === 'warning')],
    problems,
    warnings: findings.length - problems,
    suggested: suggest(m, findings, hubTarget),
  };
}

/** Whether entry `e` alone (any port) matches `host`, ignoring Go's built-in loopback rule. */
function entryMatchesHost(e: NoProxyEntry, host: string): boolean {
  const ip = parseIp(host);
  if (e.kind === 'cidr') return ip !== null && cidrContainsIp(e.cidr, ip);
  if (e.kind === 'ip') return ip !== null && e.port === null && e.ip.family === ip.family && e.ip.value === ip.value;
  if (e.kind === 'domain')
    return ip === null && e.port === null && (host.endsWith(e.suffix) || (e.matchHost && host === e.suffix.slice(1)));
  return false;
}

function isExactHubEntry(e: NoProxyEntry, hubHost: string): boolean {
  const host = hubHost.toLowerCase().replace(/^\[(.*)\]$/, '$1');
  if (e.kind === 'ip') {
    const ip = parseIp(host);
    return ip !== null && ip.family === e.ip.family && ip.value === e.ip.value;
  }
  if (e.kind === 'domain') return e.matchHost && e.suffix.slice(1) === host;
  return false;
}

function entryFindings(m: NoProxyMatcher, clusterDomain: string | undefined): Finding[] {
  const findings: Finding[] = [];
  const list = (entries: readonly NoProxyEntry[]): string => entries.map((e) => `"${e.text}"`).join(', ');

  for (const e of m.entries) {
    if (e.kind === 'ignored') {
      findings.push({
        severity: 'warning',
        code: 'entry-ignored',
        message: `entry "${e.text}" is ignored (${e.reason})`,
        fix: `remove "${e.text}"`,
        remove: [e.text],
      });
    } else if (e.inert !== undefined) {
      const replacement = inertReplacement(e.text);
      findings.push({
        severity: 'warning',
        code: 'entry-never-matches',
        message: `entry "${e.text}" never matches anything: ${e.inert}`,
        fix: replacement.length > 0 ? `write ${replacement.map((r) => `"${r}"`).join(',')} instead` : `remove "${e.text}"`,
        add: replacement,
        remove: [e.text],
      });
    }
  }

  if (m.matchAll) {
    const others = m.entries.length > 1;
    findings.push({
      severity: 'warning',
      code: 'star',
      message: others
        ? '"*" is one entry among others: Go bypasses the proxy for everything, but curl, Python, proxy-from-env and undici honour "*" only as the whole value, and wget never'
        : '"*" bypasses the proxy for everything (Go, curl, Python, Node); wget and Ruby ignore it',
      fix: 'list what should go direct instead of "*"',
    });
  }

  const cidrs = m.entries.filter((e) => e.kind === 'cidr');
  if (cidrs.length > 0) {
    findings.push({
      severity: 'warning',
      code: 'cidr-entries',
      message: `CIDR ${cidrs.length === 1 ? 'entry' : 'entries'} ${list(cidrs)} ${cidrs.length === 1 ? 'is' : 'are'} ignored by Python (urllib, requests), wget, Node's proxy-from-env/undici and curl before 7.86: those clients would use the proxy for these ranges`,
      fix: `keep ${cidrs.length === 1 ? 'it' : 'them'} for Go and this agent; where such clients matter, also list the names they use (e.g. .svc, .cluster.local)`,
    });
  }

  // One finding per entry, so a suggestion can apply (or skip) each replacement on its own.
  for (const e of m.entries) {
    if (e.kind !== 'domain' || !e.text.startsWith('*.') || e.inert !== undefined) continue;
    findings.push({
      severity: 'warning',
      code: 'star-dot-entry',
      message: `entry "${e.text}" works in Go and undici, but curl, wget and Python compare it literally and never match`,
      fix: `write "${e.text.slice(1)}" instead (same meaning in Go)`,
      add: [e.text.slice(1)],
      remove: [e.text],
    });
  }

  const ported = m.entries.filter((e) => (e.kind === 'domain' || e.kind === 'ip') && e.port !== null && e.inert === undefined);
  if (ported.length > 0) {
    findings.push({
      severity: 'warning',
      code: 'port-entries',
      message: `${ported.length === 1 ? 'entry' : 'entries'} ${list(ported)} ${ported.length === 1 ? 'matches' : 'match'} only that port in Go; curl and wget compare the whole entry with the host name and never match ${ported.length === 1 ? 'it' : 'them'}`,
      fix: 'drop the port if every port of that host should go direct',
    });
  }

  const conventional = new Set(['.svc', '.local', ...(clusterDomain ? [`.${clusterDomain}`] : [])]);
  const leadingDot = m.entries.filter(
    (e) => e.kind === 'domain' && e.text.startsWith('.') && e.inert === undefined && !conventional.has(e.text.replace(/:.*$/, '')),
  );
  if (leadingDot.length > 0) {
    findings.push({
      severity: 'warning',
      code: 'leading-dot-entries',
      message: `${leadingDot.length === 1 ? 'entry' : 'entries'} ${list(leadingDot)} ${leadingDot.length === 1 ? 'matches' : 'match'} only subdomains in Go, but curl and Python strip the dot and also match ${leadingDot.map((e) => e.text.slice(1)).join(', ')} itself`,
      fix: `write ${leadingDot.map((e) => `"${e.text.slice(1)}"`).join(', ')} if the domain itself should go direct too`,
    });
  }
  return findings;
}

/** What an entry Go cannot use was probably meant to be, when that is clear; else nothing. */
function inertReplacement(t: string): string[] {
  if (t.includes('://')) {
    const host = t
      .replace(/^[a-z][a-z0-9+.-]*:\/\//, '')
      .replace(/[/?#].*$/, '')
      .replace(/^[^@]*@/, '');
    return host !== '' && !host.includes('://') ? [host] : [];
  }
  if (/\s/.test(t)) return t.split(/\s+/).filter((x) => x !== '');
  if (/^\[[^\]]+\]$/.test(t) && parseIp(t.slice(1, -1)) !== null) return [t.slice(1, -1)];
  const cidrPort = /^(.*\/\d+):\d*$/.exec(t);
  if (cidrPort && parseCidr(cidrPort[1]!) !== null) return [cidrPort[1]!];
  return [];
}

function suggest(m: NoProxyMatcher, findings: readonly Finding[], hub: { host: string; port: number } | null): string {
  // Never suggest an entry that would send the hub around the proxy; a finding whose replacement
  // would is skipped whole (its removals too), so nothing the user listed silently disappears.
  const bypassesHub = (entry: string): boolean => hub !== null && parseNoProxy(entry).matches(hub.host, hub.port).entry !== null;
  const applied = findings.filter((f) => !(f.add ?? []).some(bypassesHub));
  const remove = new Set(applied.flatMap((f) => f.remove ?? []));
  const out: string[] = [];
  for (const e of m.entries) if (!remove.has(e.text) && !out.includes(e.text)) out.push(e.text);
  for (const a of applied.flatMap((f) => f.add ?? [])) if (!out.includes(a)) out.push(a);
  return out.join(',');
}

// --- explain ------------------------------------------------------------------------------------------

export interface Explanation {
  /** HOST:PORT as evaluated (IPv6 in brackets). */
  target: string;
  decision: 'direct' | 'proxy';
  /** The NO_PROXY entry that decided, or null (loopback rule, or nothing matched). */
  entry: string | null;
  why: string;
  /** How other tools would decide differently, when they would. */
  notes: string[];
}

/** What Go (and the agent) do for `target` (HOST[:PORT], default port 443) given NO_PROXY `value`. */
export function explainNoProxy(value: string, target: string, defaultPort = 443): Explanation {
  const t = parseTarget(target, defaultPort);
  if (t === null) throw new NoProxyAuditError(`"${target}" is not HOST, HOST:PORT or [IPv6]:PORT`);
  const m = parseNoProxy(value);
  const r = m.matches(t.host, t.port);
  const notes: string[] = [];
  const decided = r.entry === null ? undefined : m.entries.find((e) => e.text === r.entry);
  if (r.bypass && r.entry === null) notes.push('curl, wget, Python and Node libraries would use the proxy unless NO_PROXY lists it');
  if (decided?.kind === 'all' && m.entries.length > 1)
    notes.push('curl, Python, proxy-from-env and undici honour "*" only as the whole value: they would use the proxy');
  if (decided?.kind === 'cidr')
    notes.push('Python, wget, proxy-from-env/undici and curl before 7.86 ignore CIDR entries: they would use the proxy');
  if (decided?.kind === 'domain' && decided.text.startsWith('*.'))
    notes.push(`curl, wget and Python never match "${decided.text}": they would use the proxy`);
  if (decided !== undefined && (decided.kind === 'domain' || decided.kind === 'ip') && decided.port !== null)
    notes.push(`curl and wget never match entries with a port: they would use the proxy`);
  if (!r.bypass) {
    const host = t.host.toLowerCase();
    const apex = m.entries.find((e) => e.kind === 'domain' && !e.matchHost && e.port === null && e.suffix === `.${host}`);
    if (apex) notes.push(`curl and Python strip the leading dot of "${apex.text}": they would go direct`);
  }
  return { target: formatTarget(t.host, t.port), decision: r.bypass ? 'direct' : 'proxy', entry: r.entry, why: r.why, notes };
}

// --- text output --------------------------------------------------------------------------------------

export function formatAudit(report: AuditReport): string {
  const lines: string[] = [];
  lines.push(`NO_PROXY entries (${report.entries.length}): ${report.entries.length > 0 ? report.entries.join(',') : '(none)'}`);
  if (report.findings.length === 0) {
    lines.push('', 'OK: no problems found.');
    return `${lines.join('\n')}\n`;
  }
  lines.push('');
  for (const f of report.findings) {
    lines.push(`${f.severity === 'problem' ? 'PROBLEM' : 'warning'}  ${f.message}`);
    lines.push(`         fix: ${f.fix}`);
  }
  const plural = (n: number, w: string): string => `${n} ${w}${n === 1 ? '' : 's'}`;
  lines.push('', `${plural(report.problems, 'problem')}, ${plural(report.warnings, 'warning')}.`);
  if (report.suggested !== report.entries.join(',')) lines.push(`suggested NO_PROXY=${report.suggested}`);
  if (report.unresolved.length > 0) {
    const what = report.suggested !== report.entries.join(',') ? 'the suggestion still needs' : 'needs';
    lines.push(`${what} a decision by hand: ${report.unresolved.map((f) => f.fix).join('; ')}`);
  }
  return `${lines.join('\n')}\n`;
}

export function formatExplanation(e: Explanation): string {
  const by = e.entry !== null ? ` (entry "${e.entry}")` : '';
  const lines = [`${e.decision}${by}`, `  ${e.why}`, ...e.notes.map((n) => `  note: ${n}`)];
  return `${lines.join('\n')}\n`;
}
