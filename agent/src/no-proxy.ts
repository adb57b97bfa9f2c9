// Proxy selection from the environment with Go's semantics (golang.org/x/net/http/httpproxy, the code
// behind net/http.ProxyFromEnvironment), so an agent behaves like every other Go component in the
// cluster (kubelet, kubectl, ANP's Go agent) given the same HTTPS_PROXY / NO_PROXY values.
//
// NO_PROXY, per Go:
//   - comma-separated; each entry trimmed and lower-cased; empty entries ignored; nothing is an error
//     (an entry Go cannot read simply never matches);
//   - `*` as an entry anywhere: nothing is proxied (the entries after it are not even read);
//   - CIDR (`10.0.0.0/8`, `fd00::/8`): IP-literal targets inside it, any port;
//   - IP with optional port (`1.2.3.4`, `1.2.3.4:8443`, `::1`, `[::1]:443`): that IP (and port);
//   - `foo.com[:port]`: foo.com and every subdomain; `.foo.com` and `*.foo.com`: subdomains only;
//   - domain entries never match IP-literal targets, IP/CIDR entries never match names: no DNS;
//   - `localhost` and loopback IPs (127.0.0.0/8, ::1) are never proxied, whatever NO_PROXY says.
// One deliberate difference: Go compares the target with "localhost" case-sensitively (it lower-cases
// only for the NO_PROXY comparison), so Go would proxy "LOCALHOST"; we fold case first.
import { domainToASCII } from 'node:url';

// --- IP addresses ---------------------------------------------------------------------------------

export interface IpAddress {
  family: 4 | 6;
  /** The address as an unsigned integer (32 or 128 bits). */
  value: bigint;
}

/** Bits 32-47 of an IPv4-mapped IPv6 address (::ffff:a.b.c.d); the bits above are zero. */
const V4_MAPPED_HIGH = 0xffffn;

/**
 * Parses an IPv4 or IPv6 literal the way Go's net.ParseIP does (no brackets, no zone, no leading
 * zeros in IPv4 octets). IPv4-mapped IPv6 (`::ffff:1.2.3.4`) is returned as IPv4: Go compares
 * them as equal and matches them against IPv4 CIDRs.
 */
export function parseIp(text: string): IpAddress | null {
  const v4 = parseIpv4(text);
  if (v4 !== null) return { family: 4, value: v4 };
  const v6 = parseIpv6(text);
  if (v6 === null) return null;
  if (v6 >> 32n === V4_MAPPED_HIGH) return { family: 4, value: v6 & 0xffffffffn };
  return { family: 6, value: v6 };
}

function parseIpv4(text: string): bigint | null {
  const parts = text.split('.');
  if (parts.length !== 4) return null;
  let value = 0n;
  for (const p of parts) {
    if (!/^(0|[1-9]\d{0,2})$/.test(p) || Number(p) > 255) return null;
    value = (value << 8n) | BigInt(p);
  }
  return value;
}

function parseIpv6(text: string): bigint | null {
  if (!/^[0-9a-f:.]+$/i.test(text) || text.length < 2) return null;
  let head = text;
  let tailV4: bigint | null = null;
  const lastColon = text.lastIndexOf(':');
  if (text.includes('.', lastColon)) {
    tailV4 = parseIpv4(text.slice(lastColon + 1));
    if (tailV4 === null) return null;
    head = `${text.slice(0, lastColon + 1)}0:0`; // placeholder groups, replaced below
  }
  const halves = head.split('::');
  if (halves.length > 2) return null;
  const groups = (s: string): number[] | null => {
    if (s === '') return [];
    const out: number[] = [];
    for (const g of s.split(':')) {
      if (!/^[0-9a-f]{1,4}$/i.test(g)) return null;
      out.push(parseInt(g, 16));
    }
    return out;
  };
  const left = groups(halves[0]!);
  const right = halves.length === 2 ? groups(halves[1]!) : [];
  if (left === null || right === null) return null;
  let all: number[];
  if (halves.length === 2) {
    const missing = 8 - left.length - right.length;
    if (missing < 1) return null;
    all = [...left, ...new Array<number>(missing).fill(0), ...right];
  } else {
    all = left;
  }
  if (all.length !== 8) return null;
  let value = 0n;
  for (const g of all) value = (value << 16n) | BigInt(g);
  if (tailV4 !== null) value = (value & ~0xffffffffn) | tailV4;
  return value;
}

export function formatIp(ip: IpAddress): string {
  if (ip.family === 4) {
    const v = ip.value;
    return [24n, 16n, 8n, 0n].map((s) => String((v >> s) & 0xffn)).join('.');
  }
  const groups: string[] = [];
  for (let i = 7; i >= 0; i--) groups.push(((ip.value >> BigInt(i * 16)) & 0xffffn).toString(16));
  // RFC 5952: compress the longest run (>= 2) of zero groups.
  let best = -1;
  let bestLen = 0;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== '0') {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === '0') j++;
    if (j - i > bestLen && j - i >= 2) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  if (best < 0) return groups.join(':');
  return `${groups.slice(0, best).join(':')}::${groups.slice(best + bestLen).join(':')}`;
}

export function isLoopbackIp(ip: IpAddress): boolean {
  return ip.family === 4 ? ip.value >> 24n === 127n : ip.value === 1n;
}

export interface Cidr {
  family: 4 | 6;
  /** Network address (host bits cleared, as Go's ParseCIDR returns it). */
  network: bigint;
  bits: number;
}

/** Parses `ADDR/BITS` like Go's net.ParseCIDR; host bits are cleared. */
export function parseCidr(text: string): Cidr | null {
  const slash = text.indexOf('/');
  if (slash < 0) return null;
  const addrText = text.slice(0, slash);
  const bitsText = text.slice(slash + 1);
  // Go reads the address with its IPv4 parser first, then IPv6; the mask length is decimal digits, leading
  // zeros allowed (`10.0.0.0/08` is /8 to Go's net.ParseCIDR).
  if (!/^\d{1,8}$/.test(bitsText)) return null;
  const v4 = parseIpv4(addrText);
  const family: 4 | 6 = v4 !== null ? 4 : 6;
  const value = v4 ?? parseIpv6(addrText);
  if (value === null) return null;
  const width = family === 4 ? 32 : 128;
  const bits = Number(bitsText);
  if (bits > width) return null;
  const network = value & prefixMask(bits, width);
  if (family === 6 && bits >= 96 && network >> 32n === V4_MAPPED_HIGH) {
    // `::ffff:10.0.0.0/104` is 10.0.0.0/8 to Go (its network number converts To4()).
    return { family: 4, network: network & 0xffffffffn, bits: bits - 96 };
  }
  return { family, network, bits };
}

function prefixMask(bits: number, width: number): bigint {
  const all = (1n << BigInt(width)) - 1n;
  return bits === 0 ? 0n : all ^ ((1n << BigInt(width - bits)) - 1n);
}

export function cidrContainsIp(cidr: Cidr, ip: IpAddress): boolean {
  if (cidr.family !== ip.family) return false;
  const width = cidr.family === 4 ? 32 : 128;
  return (ip.value & prefixMask(cidr.bits, width)) === cidr.network;
}

/** True if every address of `inner` lies inside `outer`. */
export function cidrContainsCidr(outer: Cidr, inner: Cidr): boolean {
  if (outer.family !== inner.family || inner.bits < outer.bits) return false;
  return cidrContainsIp(outer, { family: inner.family, value: inner.network });
}

export function formatCidr(cidr: Cidr): string {
  return `${formatIp({ family: cidr.family, value: cidr.network })}/${cidr.bits}`;
}

// --- host:port splitting --------------------------------------------------------------------------

/**
 * Go's net.SplitHostPort: `host:port` or `[host]:port`; the port may be empty; a bare IPv6 address
 * ("too many colons") or a name without a colon is an error (null).
 */
export function splitHostPortGo(text: string): { host: string; port: string } | null {
  if (text.startsWith('[')) {
    const end = text.indexOf(']');
    if (end < 0) return null;
    if (end + 1 === text.length || text[end + 1] !== ':') return null; // "missing port" or junk after ']'
    const host = text.slice(1, end);
    const port = text.slice(end + 2);
    if (host.includes('[') || host.includes(']') || port.includes('[') || port.includes(']')) return null;
    return { host, port };
  }
  const i = text.lastIndexOf(':');
  if (i < 0) return null;
  const host = text.slice(0, i);
  const port = text.slice(i + 1);
  if (host.includes(':') || /[[\]]/.test(host) || /[[\]]/.test(port)) return null;
  return { host, port };
}

function toAscii(name: string): string {
  if (/^[\x00-\x7f]*$/.test(name)) return name;
  const lead = name.startsWith('.') ? '.' : '';
  const ascii = domainToASCII(name.slice(lead.length));
  return ascii === '' ? name : lead + ascii;
}

// --- NO_PROXY ----------------------------------------------------------------------------------------

interface EntryBase {
  /** The entry exactly as written (untrimmed). */
  raw: string;
  /** Trimmed and lower-cased, as it is matched and as `explain` names it. */
  text: string;
  /**
   * Set when the entry is something Go reads as a name that can never match in practice (brackets
   * without a port, `*` other than a leading `*.`, a URL, whitespace inside, a CIDR with a port, ...).
   */
  inert?: string;
}

export type NoProxyEntry =
  | (EntryBase & { kind: 'all' })
  | (EntryBase & { kind: 'cidr'; cidr: Cidr })
  | (EntryBase & { kind: 'ip'; ip: IpAddress; port: string | null })
  | (EntryBase & { kind: 'domain'; suffix: string; matchHost: boolean; port: string | null })
  | (EntryBase & { kind: 'ignored'; reason: string });

export interface NoProxyMatch {
  /** True when the connection should go direct (not through the proxy). */
  bypass: boolean;
  /** The NO_PROXY entry that decided (trimmed, lower-cased), or null (loopback rule, or no match). */
  entry: string | null;
  /** One line saying why, for logs and `noproxy explain`. */
  why: string;
}

export interface NoProxyMatcher {
  /** The value the matcher was built from. */
  readonly value: string;
  /** Every non-empty entry in order, including the ones Go ignores (kind 'ignored'). */
  readonly entries: readonly NoProxyEntry[];
  /** True when an entry `*` is present: nothing is proxied. */
  readonly matchAll: boolean;
  /** `host` is a name or IP literal (brackets allowed); `port` is the target port. */
  matches(host: string, port: number | string): NoProxyMatch;
}

export function parseNoProxyEntry(raw: string): NoProxyEntry | null {
  const text = raw.trim().toLowerCase();
  if (text === '') return null;
  if (text === '*') return { kind: 'all', raw, text };

  const cidr = parseCidr(text);
  if (cidr !== null) return { kind: 'cidr', raw, text, cidr };

  let host = text;
  let port: string | null = null;
  const split = splitHostPortGo(text);
  if (split !== null) {
    if (split.host === '') return { kind: 'ignored', raw, text, reason: 'no host before the port' };
    host = split.host;
    port = split.port === '' ? null : split.port;
  }
  // Go's net.ParseIP: no zone, no brackets.
  const ip = host.includes('%') ? null : parseIp(host);
  if (ip !== null) return { kind: 'ip', raw, text, ip, port };

  // Everything else is a domain suffix.
  let name = host;
  if (name.startsWith('*.')) name = name.slice(1);
  const matchHost = !name.startsWith('.');
  const suffix = toAscii(matchHost ? `.${name}` : name);
  const entry: NoProxyEntry = { kind: 'domain', raw, text, suffix, matchHost, port };
  const inert = inertReason(host, text);
  if (inert !== undefined) entry.inert = inert;
  return entry;
}

function inertReason(host: string, text: string): string | undefined {
  if (text.includes('://')) return 'a URL, not a host: NO_PROXY entries are names, IPs or CIDRs';
  if (/\s/.test(text)) return 'contains whitespace: entries are separated by commas only';
  if (host.startsWith('[') || host.endsWith(']'))
    return 'an IPv6 address in brackets without a port: Go reads it as a name; write it without brackets';
  if (host.includes('/'))
    return parseCidr(host) !== null ? 'a CIDR with a port: Go does not read ports on CIDR entries' : 'not a valid CIDR';
  if (host.replace(/^\*\./, '').includes('*')) return '`*` only works as a whole entry or as a leading `*.`';
  if (host === '.') return 'matches only names ending in a dot';
  return undefined;
}

/** Parses a NO_PROXY value (Go's rules; see the top of this file). Never throws. */
export function parseNoProxy(value: string | undefined | null): NoProxyMatcher {
  const v = value ?? '';
  const entries: NoProxyEntry[] = [];
  for (const raw of v.split(',')) {
    const e = parseNoProxyEntry(raw);
    if (e !== null) entries.push(e);
  }
  const all = entries.find((e) => e.kind === 'all');
  // Go checks IP entries (in order) before domain entries; keep that order for "which entry decided".
  const ipEntries = entries.filter((e) => e.kind === 'cidr' || e.kind === 'ip');
  const domainEntries = entries.filter((e): e is Extract<NoProxyEntry, { kind: 'domain' }> => e.kind === 'domain');

  return {
    value: v,
    entries,
    matchAll: all !== undefined,
    matches(hostIn: string, portIn: number | string): NoProxyMatch {
      const port = String(portIn);
      let host = hostIn.trim().toLowerCase();
      if (host.startsWith('[') && host.endsWith(']')) host = host.slice(1, -1);
      host = toAscii(host);
      const target = `${host.includes(':') ? `[${cut(host)}]` : cut(host)}:${port}`;
      if (host === 'localhost') return { bypass: true, entry: null, why: `${target} is localhost, which is never proxied` };
      const ip = parseIp(host.replace(/%.*$/, ''));
      if (ip !== null && isLoopbackIp(ip))
        return { bypass: true, entry: null, why: `${target} is a loopback address, which is never proxied` };
      if (all !== undefined) return { bypass: true, entry: '*', why: `NO_PROXY entry "*" bypasses the proxy for everything` };
      if (ip !== null) {
        for (const e of ipEntries) {
          if (e.kind === 'cidr' && cidrContainsIp(e.cidr, ip)) {
            return { bypass: true, entry: e.text, why: `${formatIp(ip)} is inside NO_PROXY entry "${e.text}"` };
          }
          if (e.kind === 'ip' && e.ip.family === ip.family && e.ip.value === ip.value) {
            if (e.port === null) return { bypass: true, entry: e.text, why: `${formatIp(ip)} is NO_PROXY entry "${e.text}"` };
            if (e.port === port) return { bypass: true, entry: e.text, why: `${target} is NO_PROXY entry "${e.text}"` };
          }
        }
        const portOnly = ipEntries.find((e) => e.kind === 'ip' && e.ip.family === ip.family && e.ip.value === ip.value);
        const hint = portOnly ? ` (entry "${portOnly.text}" is for another port)` : '';
        return { bypass: false, entry: null, why: `no NO_PROXY entry covers ${target}${hint}; IP targets only match IP and CIDR entries` };
      }
      let portMiss: string | undefined;
      for (const e of domainEntries) {
        if (host.endsWith(e.suffix) || (e.matchHost && host === e.suffix.slice(1))) {
          if (e.port === null || e.port === port) {
            const how = host.endsWith(e.suffix) ? (e.matchHost ? 'is a subdomain of' : 'ends with') : 'is';
            const portNote = e.port === null ? '' : ` on port ${e.port}`;
            return { bypass: true, entry: e.text, why: `${cut(host)} ${how} NO_PROXY entry "${cut(e.text)}"${portNote}` };
          }
          portMiss ??= e.text;
        }
      }
      const hint = portMiss !== undefined ? ` (entry "${cut(portMiss)}" names this host but another port)` : '';
      return {
        bypass: false,
        entry: null,
        why: `no NO_PROXY entry matches ${target}${hint}; names are never resolved, so IP/CIDR entries do not apply`,
      };
    },
  };
}

// --- HTTPS_PROXY / HTTP_PROXY / NO_PROXY from the environment --------------------------------------

export interface ProxyDecision {
  /** The proxy to use, or null to connect directly. */
  proxy: URL | null;
  /** The variable the proxy URL came from (e.g. "HTTPS_PROXY"), or null when none is set. */
  variable: string | null;
  /** The variable NO_PROXY came from ("NO_PROXY" or "no_proxy"), or null when neither is set. */
  noProxyVariable: string | null;
  /** The NO_PROXY entry that made the target go direct, if any. */
  entry: string | null;
  decision: 'proxy' | 'direct';
  /** One line, safe to log: the proxy's password never appears. */
  reason: string;
}

function getEnvAny(env: Readonly<Record<string, string | undefined>>, ...names: string[]): { name: string; value: string } | null {
  for (const name of names) {
    const value = env[name];
    if (value !== undefined && value !== '') return { name, value };
  }
  return null;
}

/**
 * Go's parseProxy: a value that is not a URL with a scheme and a host is retried as
 * `http://VALUE` (so `proxy:3128` and `10.0.0.1:3128` mean http://). Returns null if neither parses.
 */
export function parseProxyUrl(value: string): URL | null {
  const tryParse = (s: string): URL | null => {
    try {
      return new URL(s);
    } catch {
      return null;
    }
  };
  const u = tryParse(value);
  if (u !== null && u.protocol !== '' && u.host !== '') return u;
  // Something that already has a scheme but does not parse is not fixed by another "http://".
  if (value.includes('://')) return null;
  const retried = tryParse(`http://${value}`);
  if (retried !== null && retried.host !== '') return retried;
  return null;
}

/** A name or URL longer than this (a DNS name has at most 253 characters) shows cut in a reason: one short line. */
const SHOWN_MAX = 256;

function cut(text: string): string {
  return text.length > SHOWN_MAX ? `${text.slice(0, SHOWN_MAX)}… (${text.length} characters)` : text;
}

/**
 * Which proxy (if any) to use for `scheme://targetHost:targetPort`, reading the environment as Go
 * does: HTTPS_PROXY then https_proxy for https (no fallback to HTTP_PROXY), HTTP_PROXY then
 * http_proxy for http (refused when REQUEST_METHOD is set, as Go does against "httpoxy"),
 * NO_PROXY then no_proxy; an empty variable counts as unset.
 */
export function proxyFromEnvironment(
  env: Readonly<Record<string, string | undefined>>,
  targetHost: string,
  targetPort: number,
  scheme: 'https' | 'http' = 'https',
): ProxyDecision {
  const names = scheme === 'https' ? ['HTTPS_PROXY', 'https_proxy'] : ['HTTP_PROXY', 'http_proxy'];
  const found = getEnvAny(env, ...names);
  const noProxy = getEnvAny(env, 'NO_PROXY', 'no_proxy');
  const base = { noProxyVariable: noProxy?.name ?? null, entry: null };
  const hostText = cut(targetHost.includes(':') && !targetHost.startsWith('[') ? `[${targetHost}]` : targetHost);
  const target = `${hostText}:${targetPort}`;
  if (found === null) {
    return {
      ...base,
      proxy: null,
      variable: null,
      decision: 'direct',
      reason: `${names.join(' and ')} are not set: connecting to ${target} directly`,
    };
  }
  const proxy = parseProxyUrl(found.value);
  if (proxy === null) {
    return {
      ...base,
      proxy: null,
      variable: found.name,
      decision: 'direct',
      reason: `${found.name} is not a valid proxy URL (ignored, as Go does): connecting to ${target} directly`,
    };
  }
  if (scheme === 'http' && env['REQUEST_METHOD'] !== undefined && env['REQUEST_METHOD'] !== '') {
    return {
      ...base,
      proxy: null,
      variable: found.name,
      decision: 'direct',
      reason: `${found.name} is refused because REQUEST_METHOD is set (CGI, "httpoxy"): connecting to ${target} directly`,
    };
  }
  const shown = cut(redactProxyUrl(proxy));
  const m = parseNoProxy(noProxy?.value ?? '').matches(targetHost, targetPort);
  if (m.bypass) {
    const source = m.entry !== null ? ` (${noProxy?.name ?? 'NO_PROXY'})` : '';
    return {
      ...base,
      proxy: null,
      variable: found.name,
      entry: m.entry,
      decision: 'direct',
      reason: `${m.why}${source}: connecting to ${target} directly, not through ${shown} from ${found.name}`,
    };
  }
  const unsupported =
    proxy.protocol === 'http:' || proxy.protocol === 'https:'
      ? ''
      : ` (scheme ${proxy.protocol.slice(0, -1)} is not supported: only http:// and https:// proxies)`;
  const nop = noProxy === null ? 'NO_PROXY/no_proxy not set' : `not bypassed by ${noProxy.name}`;
  return {
    ...base,
    proxy,
    variable: found.name,
    decision: 'proxy',
    reason: `connecting to ${target} through ${shown} from ${found.name} (${nop})${unsupported}`,
  };
}

/**
 * The proxy URL for logs and error messages: scheme, user name (if any) and host:port, without the
 * password, path or query. Accepts a URL or a string; a string that does not parse has any
 * `:password@` removed.
 */
export function redactProxyUrl(url: URL | string): string {
  let u: URL | null = null;
  if (typeof url === 'string') u = parseProxyUrl(url);
  else u = url;
  if (u === null) {
    const s = String(url);
    return s.replace(/^([^:/?#]+:\/\/)?([^:@/]*):[^@/]*@/, (_m, scheme: string | undefined, user: string) => `${scheme ?? ''}${user}@`);
  }
  const user = u.username !== '' ? `${u.username}@` : '';
  return `${u.protocol}//${user}${u.host}`;
}
