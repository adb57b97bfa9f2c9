// The agent's egress-proxy settings as the hub renders them (contract §8): the install-wide
// proxy config (OCM's `AddOnDeploymentConfig.spec.proxyConfig`: httpProxy, httpsProxy, noProxy, caBundle)
// plus what is specific to one cluster (pod and service CIDRs, cluster DNS domain, apiserver ClusterIP,
// cloud metadata endpoints) merged into one NO_PROXY list, and rendered as upper- and lower-case env vars
// for every agent container. Pure functions: no I/O, no clock.
//
// NO_PROXY order is stable, so re-rendering an unchanged config never changes a Deployment:
//   1. the install-wide `noProxy` entries, in their order (trimmed, lower-cased, empty ones dropped);
//   2. then the cluster part, always in this order:
//        localhost, 127.0.0.1, pod CIDR(s), service CIDR(s), apiserver IP, .svc, .<cluster domain>,
//        169.254.169.254, metadata.google.internal
// and every entry appears once (compared case-folded; the first occurrence keeps its place). CIDRs and IPs
// from the cluster facts are written canonically (host bits cleared, IPv6 compressed and lower-case), so
// `10.96.0.1/12` and `10.96.0.0/12` are one entry. Install-wide entries are kept as written (only trimmed and
// lower-cased, as Go reads them): NO_PROXY accepts anything, and an entry Go cannot read never matches.
//
// `caBundle` follows OCM: it joins the agent's trust bundle only when the https proxy is an `https://` URL
// (TLS to the proxy); with an `http://` proxy it is ignored. It may be PEM text, or base64 of PEM (how a Go
// `[]byte` field such as OCM's `caBundle` looks in JSON/YAML).
import { X509Certificate } from 'node:crypto';
import { isIPv4, isIPv6 } from 'node:net';
import { ipToBytes } from '../pki/ip-address.js';

/** OCM's `AddOnDeploymentConfig.spec.proxyConfig`, install-wide. */
export interface ProxyConfig {
  /** Proxy for http:// requests (HTTP_PROXY/http_proxy). */
  httpProxy?: string;
  /** Proxy for https:// requests (HTTPS_PROXY/https_proxy); the agent reaches the hub through this one. */
  httpsProxy?: string;
  /** Comma-separated NO_PROXY entries that apply to every cluster. */
  noProxy?: string;
  /** CA bundle (PEM, or base64 of PEM) that signs an https:// proxy's certificate. */
  caBundle?: string | Uint8Array;
}

/**
 * The cluster-specific part. Field names match `ClusterFacts` of the agent's NO_PROXY audit
 * (agent/src/no-proxy-audit.ts), so the same object can be rendered here and audited there.
 */
export interface ClusterProxyFacts {
  /** Pod CIDR(s); two for dual-stack. An element may itself be comma-separated ("10.244.0.0/16,fd00:10:244::/56"). */
  podCidrs?: readonly string[];
  /** Service CIDR(s), as podCidrs. */
  serviceCidrs?: readonly string[];
  /** Cluster DNS domain (default "cluster.local"). */
  clusterDomain?: string;
  /** The apiserver's ClusterIP (the `kubernetes` Service in `default`). */
  apiserverIp?: string;
}

/** A Kubernetes `EnvVar` with a literal value. */
export interface EnvVar {
  name: string;
  value: string;
}

export interface RenderedProxySettings {
  /** The merged NO_PROXY entries, in order. */
  noProxy: string[];
  /** HTTP_PROXY, http_proxy, HTTPS_PROXY, https_proxy, NO_PROXY, no_proxy: only those with a value. */
  env: EnvVar[];
}

export class ProxySettingsError extends Error {
  override name = 'ProxySettingsError';
}

export const DEFAULT_CLUSTER_DOMAIN = 'cluster.local';

/** Cloud metadata endpoints: through a proxy they answer with the *proxy host's* metadata, or not at all. */
export const METADATA_NO_PROXY: readonly string[] = ['169.254.169.254', 'metadata.google.internal'];

/** Never proxied by Go, but curl, wget, Python and Node libraries need them listed. */
export const LOOPBACK_NO_PROXY: readonly string[] = ['localhost', '127.0.0.1'];

// --- proxy URLs -------------------------------------------------------------------------------------

type ProxyField = 'httpProxy' | 'httpsProxy';

/** `[scheme://]user` and the `:password@` after it; greedy to the last '@' before the path, as URL parsers split user-info. */
const URL_PASSWORD = /^((?:[a-z][a-z0-9+.-]*:\/\/)?[^:@/?#]*):[^/?#]*@/i;

/**
 * `value` with its user-info password replaced by `mask` (`:` and all), and every other copy of it by "***":
 * a URL pasted twice, or user-info the regex does not see but a URL parser does (`http:///u:pw@host`).
 */
function replacePassword(value: string, mask: string): string {
  let out = value;
  const copies = new Set<string>();
  const m = URL_PASSWORD.exec(value);
  if (m) {
    const password = m[0].slice(m[1]!.length + 1, -1);
    out = `${m[1]}${mask}@${value.slice(m[0].length)}`;
    if (password.length >= 4) copies.add(password);
  }
  try {
    const parsed = new URL(/^[a-z][a-z0-9+.-]*:/i.test(value) ? value : `http://${value}`);
    if (parsed.password !== '') {
      copies.add(parsed.password);
      try {
        copies.add(decodeURIComponent(parsed.password));
      } catch {
        // not percent-encoding after all: the text as it is was added above
      }
    }
  } catch {
    // not a URL: the regex's answer is all there is
  }
  for (const c of copies) if (c !== '') out = out.split(c).join('***');
  return out;
}

/** The URL without its password, for error messages (never log a proxy password). */
function redact(value: string): string {
  return replacePassword(value, '');
}

/** The URL with its password as "***" (the user name kept, so the reader knows one is needed); for stdout. */
export function maskProxyPassword(url: string): string {
  // By hand, not through URL: it would percent-encode "***".
  return replacePassword(url, ':***');
}

/** Values longer than this show cut in error messages, which stay short lines whatever a caller sends. */
const SHOWN_MAX = 200;

function cut(value: string): string {
  return value.length > SHOWN_MAX ? `${value.slice(0, SHOWN_MAX)}… (${value.length} characters)` : value;
}

function oneLine(value: string): string {
  const v = cut(redact(value));
  return /[\x00-\x1f\x7f"\\]/.test(v) ? JSON.stringify(v) : `"${v}"`;
}

/**
 * Validates a proxy URL and returns the value to render: trimmed, and with `http://` in front when it
 * has no scheme (Go reads `proxy:3128` as http://proxy:3128; Python and Node libraries do not, so the
 * rendered value always carries the scheme). Only http:// and https:// are accepted: that is what the agent
 * speaks. Returns undefined for an unset or empty value.
 */
export function normalizeProxyUrl(field: ProxyField, value: string | undefined): string | undefined {
  if (value === undefined) return undefined;
  const v = value.trim();
  if (v === '') return undefined;
  const shown = oneLine(v);
  if (/[\s\x00-\x1f\x7f]/.test(v)) throw new ProxySettingsError(`${field} ${shown} contains whitespace or control characters`);
  const schemeMatch = /^([a-z][a-z0-9+.-]*):\/\//i.exec(v);
  const withScheme = schemeMatch ? v : `http://${v}`;
  const scheme = (schemeMatch?.[1] ?? 'http').toLowerCase();
  if (scheme !== 'http' && scheme !== 'https') {
    throw new ProxySettingsError(`${field} ${shown}: scheme ${cut(scheme)}:// is not supported (use http:// or https://)`);
  }
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    throw new ProxySettingsError(`${field} ${shown} is not a proxy URL such as http://proxy.corp.example:3128`);
  }
  if (url.hostname === '') throw new ProxySettingsError(`${field} ${shown} has no host`);
  return withScheme;
}

function isHttpsUrl(url: string | undefined): boolean {
  return url !== undefined && /^https:\/\//i.test(url);
}

// --- CIDRs and IPs ------------------------------------------------------------------------------------

function formatBytes(bytes: Uint8Array): string {
  if (bytes.length === 4) return [...bytes].join('.');
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(((bytes[i]! << 8) | bytes[i + 1]!).toString(16));
  // The WHATWG URL parser serializes IPv6 canonically (RFC 5952: lower-case, longest zero run compressed).
  return new URL(`http://[${groups.join(':')}]/`).hostname.slice(1, -1);
}

/** Canonical IP (brackets allowed around IPv6); null if not an IP literal. Zones are refused. */
function canonicalIp(text: string): string | null {
  const t = text.trim().replace(/^\[(.*)\]$/, '$1');
  if (t.includes('%')) return null;
  if (!isIPv4(t) && !isIPv6(t)) return null;
  return formatBytes(ipToBytes(t));
}

/** Canonical CIDR (host bits cleared, as Go's net.ParseCIDR returns the network); null if not a CIDR. */
function canonicalCidr(text: string): string | null {
  const m = /^([^/]+)\/(0|[1-9]\d{0,2})$/.exec(text.trim());
  if (!m) return null;
  const addr = m[1]!;
  if (addr.includes('%') || (!isIPv4(addr) && !isIPv6(addr))) return null;
  const bytes = ipToBytes(addr);
  const bits = Number(m[2]);
  if (bits > bytes.length * 8) return null;
  for (let i = 0; i < bytes.length; i++) {
    const keep = Math.max(0, Math.min(8, bits - i * 8));
    bytes[i] = bytes[i]! & ((0xff << (8 - keep)) & 0xff);
  }
  return `${formatBytes(bytes)}/${bits}`;
}

function cidrList(values: readonly string[] | undefined, field: 'podCidrs' | 'serviceCidrs'): string[] {
  const out: string[] = [];
  for (const value of values ?? []) {
    for (const part of value.split(',')) {
      if (part.trim() === '') continue;
      const c = canonicalCidr(part);
      if (c === null) {
        const example = field === 'podCidrs' ? '10.244.0.0/16 or fd00:10:244::/56' : '10.96.0.0/12 or fd00:10:96::/112';
        throw new ProxySettingsError(`${field}: ${oneLine(part.trim())} is not a CIDR such as ${example}`);
      }
      out.push(c);
    }
  }
  return out;
}

function clusterDomainOf(value: string | undefined): string {
  if (value === undefined || value.trim() === '') return DEFAULT_CLUSTER_DOMAIN;
  const d = value
    .trim()
    .toLowerCase()
    .replace(/^\.+|\.+$/g, '');
  const label = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
  if (d === '' || d.length > 253 || !d.split('.').every((l) => label.test(l))) {
    throw new ProxySettingsError(`clusterDomain ${oneLine(value)} is not a DNS domain such as cluster.local`);
  }
  return d;
}

// --- NO_PROXY -----------------------------------------------------------------------------------------

/** The cluster part of NO_PROXY, in its fixed order (see the top of this file). Validates the facts. */
export function clusterNoProxyEntries(facts: ClusterProxyFacts = {}): string[] {
  const pods = cidrList(facts.podCidrs, 'podCidrs');
  const services = cidrList(facts.serviceCidrs, 'serviceCidrs');
  let apiserver: string[] = [];
  if (facts.apiserverIp !== undefined && facts.apiserverIp.trim() !== '') {
    const ip = canonicalIp(facts.apiserverIp);
    if (ip === null)
      throw new ProxySettingsError(`apiserverIp ${oneLine(facts.apiserverIp.trim())} is not an IP address such as 10.96.0.1`);
    apiserver = [ip];
  }
  const domain = clusterDomainOf(facts.clusterDomain);
  return [...LOOPBACK_NO_PROXY, ...pods, ...services, ...apiserver, '.svc', `.${domain}`, ...METADATA_NO_PROXY];
}

/** Splits a NO_PROXY value as Go does: comma-separated, trimmed, lower-cased, empty entries dropped. */
export function splitNoProxy(value: string | undefined): string[] {
  return (value ?? '')
    .split(',')
    .map((e) => e.trim().toLowerCase())
    .filter((e) => e !== '');
}

/** Install-wide entries first (in their order), then the cluster part; each entry once (case-folded). */
export function mergeNoProxy(proxy: ProxyConfig, facts: ClusterProxyFacts = {}): string[] {
  const out: string[] = [];
  const seen = new Set<string>();
  for (const entry of [...splitNoProxy(proxy.noProxy), ...clusterNoProxyEntries(facts)]) {
    const key = entry.toLowerCase();
    if (seen.has(key)) continue;
    seen.add(key);
    out.push(entry);
  }
  return out;
}

// --- rendering ------------------------------------------------------------------------------------------

/**
 * The env vars for every agent container. Upper- and lower-case variants of each (tools disagree on
 * which one they read; Go reads upper-case first), only those with a value. Without any proxy nothing is
 * rendered: NO_PROXY alone has nothing to bypass.
 */
export function renderProxySettings(proxy: ProxyConfig, facts: ClusterProxyFacts = {}): RenderedProxySettings {
  const httpProxy = normalizeProxyUrl('httpProxy', proxy.httpProxy);
  const httpsProxy = normalizeProxyUrl('httpsProxy', proxy.httpsProxy);
  if (proxy.caBundle !== undefined) caCertificates(proxy.caBundle); // a broken bundle is an error even while unused
  const noProxy = mergeNoProxy(proxy, facts);
  if (httpProxy === undefined && httpsProxy === undefined) return { noProxy, env: [] };
  const env: EnvVar[] = [];
  const both = (name: string, value: string | undefined): void => {
    if (value === undefined || value === '') return;
    env.push({ name: name.toUpperCase(), value }, { name: name.toLowerCase(), value });
  };
  both('HTTP_PROXY', httpProxy);
  both('HTTPS_PROXY', httpsProxy);
  both('NO_PROXY', noProxy.join(','));
  return { noProxy, env };
}

/** Just the env vars (see renderProxySettings). */
export function proxyEnv(proxy: ProxyConfig, facts: ClusterProxyFacts = {}): EnvVar[] {
  return renderProxySettings(proxy, facts).env;
}

// --- trust bundle -----------------------------------------------------------------------------------------

const PEM_BLOCK = /-----BEGIN ([A-Z0-9 ]+)-----\r?\n([\s\S]*?)-----END \1-----/g;

function pemText(bundle: string | Uint8Array): string {
  const text = typeof bundle === 'string' ? bundle : Buffer.from(bundle).toString('utf8');
  if (text.includes('-----BEGIN')) return text;
  // base64 of PEM: how a Go []byte field (OCM's caBundle) is written in JSON and YAML.
  const compact = text.replace(/\s+/g, '');
  if (compact !== '' && /^[A-Za-z0-9+/]+={0,2}$/.test(compact)) {
    const decoded = Buffer.from(compact, 'base64').toString('utf8');
    if (decoded.includes('-----BEGIN')) return decoded;
  }
  return text;
}

/**
 * The certificates of a CA bundle as normalized PEM blocks. Throws when there is none, when a block is
 * not a certificate (a private key pasted by mistake), or when a certificate does not parse.
 */
export function caCertificates(bundle: string | Uint8Array): string[] {
  const text = pemText(bundle);
  const certs: string[] = [];
  let n = 0;
  for (const m of text.matchAll(PEM_BLOCK)) {
    n++;
    const type = m[1]!;
    if (type !== 'CERTIFICATE')
      throw new ProxySettingsError(`caBundle block ${n} is a ${type}, not a CERTIFICATE: the bundle must hold CA certificates only`);
    const body = m[2]!.replace(/\s+/g, '');
    const pem = `-----BEGIN CERTIFICATE-----\n${body.replace(/(.{64})/g, '$1\n').replace(/\n$/, '')}\n-----END CERTIFICATE-----\n`;
    try {
      new X509Certificate(pem);
    } catch (err) {
      throw new ProxySettingsError(`caBundle certificate ${n} cannot be parsed: ${(err as Error).message.split('\n')[0]}`);
    }
    certs.push(pem);
  }
  if (certs.length === 0)
    throw new ProxySettingsError('caBundle holds no PEM certificate (expected "-----BEGIN CERTIFICATE-----" blocks, or base64 of them)');
  return certs;
}

/**
 * The agent's trust bundle: `agentCa` (the hub CA bundle, PEM) with the proxy's `caBundle` appended when
 * (and only when) `httpsProxy` is an https:// URL and a caBundle is set, as OCM does. Certificates already
 * in `agentCa` are not repeated. Otherwise `agentCa` is returned unchanged.
 */
export function trustBundle(agentCa: string, proxy: ProxyConfig): string {
  const httpsProxy = normalizeProxyUrl('httpsProxy', proxy.httpsProxy);
  const extra = proxy.caBundle !== undefined ? caCertificates(proxy.caBundle) : [];
  if (!isHttpsUrl(httpsProxy) || extra.length === 0) return agentCa;
  const have = new Set([...agentCa.matchAll(PEM_BLOCK)].filter((m) => m[1] === 'CERTIFICATE').map((m) => m[2]!.replace(/\s+/g, '')));
  const added: string[] = [];
  for (const pem of extra) {
    const key = pem.replace(/-----[A-Z ]+-----/g, '').replace(/\s+/g, '');
    if (have.has(key)) continue;
    have.add(key);
    added.push(pem);
  }
  if (added.length === 0) return agentCa;
  const base = agentCa === '' || agentCa.endsWith('\n') ? agentCa : `${agentCa}\n`;
  return base + added.join('');
}
