import { describe, expect, it } from 'vitest';
import {
  cidrContainsCidr,
  formatCidr,
  formatIp,
  parseCidr,
  parseIp,
  parseNoProxy,
  parseProxyUrl,
  proxyFromEnvironment,
  redactProxyUrl,
  splitHostPortGo,
} from './no-proxy.js';

// [NO_PROXY value, target host, target port, expected: 'direct' | 'proxy', deciding entry (for direct, when an entry decides)]
type Vector = [string, string, number, 'direct' | 'proxy', string?];

// peers.md §3.5: one value, many targets.
const P35 = 'foo.com,.bar.com,*.baz.com,10.0.0.0/8,1.2.3.4:8443,[::1]:443,fd00::/8, qux.io:8080 ';

const vectors: Vector[] = [
  // --- peers.md §3.5 ---
  [P35, 'foo.com', 443, 'direct', 'foo.com'],
  [P35, 'a.foo.com', 443, 'direct', 'foo.com'],
  [P35, 'badfoo.com', 443, 'proxy'],
  [P35, 'bar.com', 443, 'proxy'],
  [P35, 'x.bar.com', 443, 'direct', '.bar.com'],
  [P35, 'baz.com', 443, 'proxy'],
  [P35, 'a.baz.com', 443, 'direct', '*.baz.com'],
  [P35, '10.9.9.9', 443, 'direct', '10.0.0.0/8'],
  [P35, '11.0.0.1', 443, 'proxy'],
  [P35, '1.2.3.4', 8443, 'direct', '1.2.3.4:8443'],
  [P35, '1.2.3.4', 443, 'proxy'],
  [P35, 'fd00::1', 443, 'direct', 'fd00::/8'],
  [P35, '[fd00::1]', 443, 'direct', 'fd00::/8'],
  [P35, 'qux.io', 8080, 'direct', 'qux.io:8080'],
  [P35, 'qux.io', 443, 'proxy'],
  [P35, 'localhost', 443, 'direct'],
  [P35, '127.0.0.2', 443, 'direct'],
  [P35, '[::1]', 443, 'direct'],
  [P35, '::1', 8443, 'direct'],
  [P35, 'FOO.COM', 443, 'direct', 'foo.com'],
  [P35, 'db.internal', 443, 'proxy'], // a name that resolves into 10/8 is still proxied: nothing is resolved
  ['*', 'anything.example', 443, 'direct', '*'],
  ['*', '8.8.8.8', 53, 'direct', '*'],
  ['a.com,*', 'b.com', 443, 'direct', '*'],
  ['*,a.com', '2001:db8::1', 443, 'direct', '*'],
  // --- loopback is never proxied, even with an empty NO_PROXY ---
  ['', 'localhost', 443, 'direct'],
  ['', 'LocalHost', 80, 'direct'],
  ['', '127.255.255.254', 443, 'direct'],
  ['', '::ffff:127.0.0.1', 443, 'direct'],
  ['', 'localhost.example', 443, 'proxy'],
  ['', '128.0.0.1', 443, 'proxy'],
  ['', '::2', 443, 'proxy'],
  // --- trimming, case, empty entries ---
  ['  Example.COM  ,, ,', 'www.example.com', 443, 'direct', 'example.com'],
  [',,,', 'example.com', 443, 'proxy'],
  ['EXAMPLE.com', 'Example.Com', 443, 'direct', 'example.com'],
  // --- domains ---
  ['example.com', 'example.com.evil.net', 443, 'proxy'],
  ['example.com', 'notexample.com', 443, 'proxy'],
  ['example.com', 'a.b.c.example.com', 443, 'direct', 'example.com'],
  ['.example.com', 'example.com', 443, 'proxy'],
  ['.example.com', 'a.b.example.com', 443, 'direct', '.example.com'],
  ['*.example.com', 'example.com', 443, 'proxy'],
  ['svc', 'kubernetes.default.svc', 443, 'direct', 'svc'],
  ['.svc', 'kubernetes.default.svc', 443, 'direct', '.svc'],
  ['.svc', 'kubernetes.default.svc.cluster.local', 443, 'proxy'],
  ['cluster.local', 'kubernetes.default.svc.cluster.local', 443, 'direct', 'cluster.local'],
  ['example.com:443', 'www.example.com', 443, 'direct', 'example.com:443'],
  ['example.com:443', 'www.example.com', 8443, 'proxy'],
  ['example.com:', 'example.com', 1234, 'direct', 'example.com:'],
  ['bücher.de', 'www.xn--bcher-kva.de', 443, 'direct', 'bücher.de'],
  ['xn--bcher-kva.de', 'BÜCHER.de', 443, 'direct', 'xn--bcher-kva.de'],
  // --- domain entries never match IPs, IP entries never match names ---
  ['2.3.4', '1.2.3.4', 443, 'proxy'], // Go reads "2.3.4" as a domain; domains don't match IP literals
  ['10.0.0.0/8', 'ten.internal', 443, 'proxy'],
  ['1.2.3.4', 'a.1.2.3.4', 443, 'proxy'],
  // --- IPs and CIDRs ---
  ['1.2.3.4', '1.2.3.4', 1, 'direct', '1.2.3.4'],
  ['1.2.3.4', '1.2.3.5', 443, 'proxy'],
  ['1.2.3.4', '::ffff:1.2.3.4', 443, 'direct', '1.2.3.4'],
  ['::ffff:1.2.3.4', '1.2.3.4', 443, 'direct', '::ffff:1.2.3.4'],
  ['10.1.2.3/8', '10.200.0.1', 443, 'direct', '10.1.2.3/8'], // host bits are cleared, as Go's ParseCIDR does
  ['10.0.0.0/8', '::ffff:10.0.0.1', 443, 'direct', '10.0.0.0/8'],
  ['::ffff:10.0.0.0/104', '10.3.3.3', 443, 'direct', '::ffff:10.0.0.0/104'],
  ['::/0', '10.3.3.3', 443, 'proxy'], // IPv6 CIDRs never contain IPv4 targets (Go)
  ['0.0.0.0/0', '2001:db8::1', 443, 'proxy'],
  ['0.0.0.0/0', '203.0.113.9', 443, 'direct', '0.0.0.0/0'],
  ['2001:db8::/32', '2001:db8:ffff::1', 443, 'direct', '2001:db8::/32'],
  ['2001:db8::/32', '2001:db9::1', 443, 'proxy'],
  ['2001:DB8::1', '2001:db8:0:0:0:0:0:1', 443, 'direct', '2001:db8::1'],
  ['[2001:db8::1]:443', '2001:db8::1', 443, 'direct', '[2001:db8::1]:443'],
  ['[2001:db8::1]:443', '2001:db8::1', 6443, 'proxy'],
  ['fd00::1:443', 'fd00::1:443', 80, 'direct', 'fd00::1:443'], // a bare IPv6 address, not fd00::1 port 443
  ['fd00::1:443', 'fd00::1', 443, 'proxy'],
  ['1.2.3.4:80', '1.2.3.4', 443, 'proxy'],
  // --- entries Go cannot use: never match ---
  ['[2001:db8::1]', '2001:db8::1', 443, 'proxy'], // brackets without port: read as a name
  ['10.0.0.0/8:443', '10.1.1.1', 443, 'proxy'], // CIDR with a port: read as a name
  [':443', 'example.com', 443, 'proxy'],
  ['*example.com', 'www.example.com', 443, 'proxy'],
  ['example.com other.com', 'other.com', 443, 'proxy'], // whitespace is not a separator
  ['http://example.com', 'example.com', 443, 'proxy'],
  ['10.0.0.0/33', '10.0.0.1', 443, 'proxy'],
  ['01.2.3.4', '1.2.3.4', 443, 'proxy'], // leading zeros: not an IP to Go
];

describe('parseNoProxy: Go semantics, table-driven', () => {
  it('has at least 40 vectors', () => {
    expect(vectors.length).toBeGreaterThanOrEqual(40);
  });

  it.each(vectors)('NO_PROXY=%j, %s:%i → %s', (value, host, port, want, entry) => {
    const m = parseNoProxy(value).matches(host, port);
    expect(m.bypass ? 'direct' : 'proxy', m.why).toBe(want);
    if (want === 'direct' && entry !== undefined) expect(m.entry).toBe(entry);
    if (want === 'proxy') expect(m.entry).toBeNull();
    expect(m.why.length).toBeGreaterThan(0);
  });
});

describe('parseNoProxy: entries and explanations', () => {
  it('keeps every non-empty entry, trimmed and lower-cased, with its kind', () => {
    const m = parseNoProxy(P35);
    expect(m.entries.map((e) => [e.text, e.kind])).toEqual([
      ['foo.com', 'domain'],
      ['.bar.com', 'domain'],
      ['*.baz.com', 'domain'],
      ['10.0.0.0/8', 'cidr'],
      ['1.2.3.4:8443', 'ip'],
      ['[::1]:443', 'ip'],
      ['fd00::/8', 'cidr'],
      ['qux.io:8080', 'domain'],
    ]);
    expect(m.matchAll).toBe(false);
    expect(parseNoProxy('a,*').matchAll).toBe(true);
    expect(parseNoProxy(undefined).entries).toEqual([]);
  });

  it('marks entries Go reads but that can never match, and says why', () => {
    const inert = (v: string): string | undefined => {
      const e = parseNoProxy(v).entries[0]!;
      return 'inert' in e ? e.inert : undefined;
    };
    expect(inert('[fd00::1]')).toMatch(/brackets/);
    expect(inert('10.0.0.0/8:443')).toMatch(/CIDR with a port/);
    expect(inert('*foo.com')).toMatch(/leading `\*\.`/);
    expect(inert('https://proxy.corp')).toMatch(/URL/);
    expect(inert('a.com b.com')).toMatch(/whitespace/);
    expect(inert('foo.com')).toBeUndefined();
    expect(parseNoProxy(':443').entries[0]!.kind).toBe('ignored');
  });

  it('explains loopback, port mismatches and the no-DNS rule', () => {
    expect(parseNoProxy('').matches('127.0.0.1', 8091).why).toMatch(/loopback/);
    expect(parseNoProxy('hub.corp:443').matches('hub.corp', 8091).why).toMatch(/"hub.corp:443" names this host but another port/);
    expect(parseNoProxy('1.2.3.4:443').matches('1.2.3.4', 8091).why).toMatch(/"1.2.3.4:443" is for another port/);
    expect(parseNoProxy('10.0.0.0/8').matches('hub.corp', 8091).why).toMatch(/never resolved/);
    expect(parseNoProxy('.corp').matches('hub.corp', 8091).why).toBe('hub.corp ends with NO_PROXY entry ".corp"');
  });
});

describe('IP and CIDR helpers', () => {
  it('parses like Go: no zones, no brackets, no leading zeros; IPv4-mapped is IPv4', () => {
    expect(parseIp('1.2.3.4')).toEqual({ family: 4, value: 0x01020304n });
    expect(parseIp('::ffff:1.2.3.4')).toEqual({ family: 4, value: 0x01020304n });
    expect(parseIp('::')).toEqual({ family: 6, value: 0n });
    expect(parseIp('1:2:3:4:5:6:7::')?.family).toBe(6);
    for (const bad of ['1.2.3', '1.2.3.256', '01.2.3.4', '[::1]', 'fe80::1%eth0', '1::2::3', '1:2:3:4:5:6:7:8::', ':::', 'g::1', '']) {
      expect(parseIp(bad), bad).toBeNull();
    }
  });

  it('formats addresses and prefixes canonically', () => {
    expect(formatIp(parseIp('2001:0db8:0:0:0:0:0:1')!)).toBe('2001:db8::1');
    expect(formatIp(parseIp('1:0:0:2:0:0:0:3')!)).toBe('1:0:0:2::3');
    expect(formatCidr(parseCidr('10.1.2.3/8')!)).toBe('10.0.0.0/8');
    expect(formatCidr(parseCidr('fd00:1::/8')!)).toBe('fd00::/8');
  });

  it("reads a mask length with leading zeros as Go's net.ParseCIDR does (found by the Go differential fuzzer)", () => {
    expect(formatCidr(parseCidr('10.0.0.0/08')!)).toBe('10.0.0.0/8');
    expect(formatCidr(parseCidr('fd00::/008')!)).toBe('fd00::/8');
    expect(parseCidr('10.0.0.0/033')).toBeNull();
    expect(parseCidr('10.0.0.0/+8')).toBeNull();
    expect(parseNoProxy('10.0.0.0/08').matches('10.1.2.3', 443).bypass).toBe(true);
  });

  it('compares prefixes', () => {
    expect(cidrContainsCidr(parseCidr('10.0.0.0/8')!, parseCidr('10.96.0.0/12')!)).toBe(true);
    expect(cidrContainsCidr(parseCidr('10.96.0.0/12')!, parseCidr('10.0.0.0/8')!)).toBe(false);
    expect(cidrContainsCidr(parseCidr('10.0.0.0/8')!, parseCidr('fd00::/8')!)).toBe(false);
  });

  it('splits host:port like Go', () => {
    expect(splitHostPortGo('a.com:443')).toEqual({ host: 'a.com', port: '443' });
    expect(splitHostPortGo('[::1]:443')).toEqual({ host: '::1', port: '443' });
    expect(splitHostPortGo('a.com:')).toEqual({ host: 'a.com', port: '' });
    expect(splitHostPortGo('::1')).toBeNull();
    expect(splitHostPortGo('[::1]')).toBeNull();
    expect(splitHostPortGo('a.com')).toBeNull();
  });
});

describe('proxyFromEnvironment: Go precedence', () => {
  const hub = { host: 'hub.example.com', port: 8091 };

  it('uses HTTPS_PROXY over https_proxy', () => {
    const d = proxyFromEnvironment({ HTTPS_PROXY: 'http://upper:3128', https_proxy: 'http://lower:3128' }, hub.host, hub.port);
    expect(d.decision).toBe('proxy');
    expect(d.variable).toBe('HTTPS_PROXY');
    expect(d.proxy?.host).toBe('upper:3128');
    expect(d.reason).toContain('through http://upper:3128 from HTTPS_PROXY');
  });

  it('falls back to https_proxy when HTTPS_PROXY is empty', () => {
    const d = proxyFromEnvironment({ HTTPS_PROXY: '', https_proxy: 'http://lower:3128' }, hub.host, hub.port);
    expect(d.variable).toBe('https_proxy');
    expect(d.proxy?.host).toBe('lower:3128');
  });

  it('never falls back from HTTPS_PROXY to HTTP_PROXY for https targets', () => {
    const d = proxyFromEnvironment({ HTTP_PROXY: 'http://p:3128', http_proxy: 'http://p:3128' }, hub.host, hub.port);
    expect(d.decision).toBe('direct');
    expect(d.proxy).toBeNull();
    expect(d.variable).toBeNull();
    expect(d.reason).toContain('HTTPS_PROXY and https_proxy are not set');
  });

  it('uses HTTP_PROXY for http targets, and refuses it under CGI (REQUEST_METHOD)', () => {
    expect(proxyFromEnvironment({ HTTP_PROXY: 'p:3128', HTTPS_PROXY: 'q:3128' }, hub.host, 80, 'http').proxy?.host).toBe('p:3128');
    const cgi = proxyFromEnvironment({ HTTP_PROXY: 'p:3128', REQUEST_METHOD: 'GET' }, hub.host, 80, 'http');
    expect(cgi.decision).toBe('direct');
    expect(cgi.reason).toMatch(/REQUEST_METHOD/);
  });

  it('uses NO_PROXY over no_proxy, and no_proxy when NO_PROXY is empty', () => {
    const env = { HTTPS_PROXY: 'http://p:3128', NO_PROXY: 'other.com', no_proxy: 'example.com' };
    const upper = proxyFromEnvironment(env, hub.host, hub.port);
    expect(upper.decision).toBe('proxy');
    expect(upper.noProxyVariable).toBe('NO_PROXY');
    const lower = proxyFromEnvironment({ ...env, NO_PROXY: '' }, hub.host, hub.port);
    expect(lower.decision).toBe('direct');
    expect(lower.noProxyVariable).toBe('no_proxy');
    expect(lower.entry).toBe('example.com');
    expect(lower.reason).toContain('(no_proxy)');
  });

  it('reads a proxy without a scheme as http://', () => {
    expect(proxyFromEnvironment({ HTTPS_PROXY: 'proxy.corp:3128' }, hub.host, hub.port).proxy?.href).toBe('http://proxy.corp:3128/');
    expect(proxyFromEnvironment({ HTTPS_PROXY: '10.0.0.1:3128' }, hub.host, hub.port).proxy?.href).toBe('http://10.0.0.1:3128/');
    expect(proxyFromEnvironment({ HTTPS_PROXY: 'https://proxy.corp:3129' }, hub.host, hub.port).proxy?.protocol).toBe('https:');
    expect(parseProxyUrl('proxy.corp')?.href).toBe('http://proxy.corp/');
  });

  it('never proxies loopback, even with no NO_PROXY', () => {
    const d = proxyFromEnvironment({ HTTPS_PROXY: 'http://p:3128' }, '127.0.0.1', 8091);
    expect(d.decision).toBe('direct');
    expect(d.reason).toMatch(/loopback/);
  });

  it('flags unsupported proxy schemes but reports the decision Go would make', () => {
    const d = proxyFromEnvironment({ HTTPS_PROXY: 'socks5://p:1080' }, hub.host, hub.port);
    expect(d.decision).toBe('proxy');
    expect(d.reason).toMatch(/socks5 is not supported/);
  });

  it('never puts the password in the reason', () => {
    const env = { HTTPS_PROXY: 'http://alice:s3cr%40t@proxy.corp:3128' };
    const d = proxyFromEnvironment(env, hub.host, hub.port);
    expect(d.reason).toContain('http://alice@proxy.corp:3128');
    expect(d.reason).not.toMatch(/s3cr/);
    const direct = proxyFromEnvironment({ ...env, NO_PROXY: 'example.com' }, hub.host, hub.port);
    expect(direct.reason).not.toMatch(/s3cr/);
  });

  it('shows a long host, entry or proxy cut, so the reason stays a short line (found by fuzzing)', () => {
    const host = `${'a.'.repeat(1000)}example.com`;
    const entry = `${'a.'.repeat(500)}example.com`;
    const bypassed = proxyFromEnvironment({ HTTPS_PROXY: 'http://proxy:3128', NO_PROXY: entry }, host, 443);
    expect(bypassed.decision).toBe('direct');
    expect(bypassed.reason).toContain(
      `${'a.'.repeat(128)}… (2011 characters) is a subdomain of NO_PROXY entry "${'a.'.repeat(128)}… (1011 characters)"`,
    );
    expect(bypassed.reason.length).toBeLessThan(1200);
    const proxied = proxyFromEnvironment({ HTTPS_PROXY: `http://${'p.'.repeat(1000)}:3128` }, host, 443);
    expect(proxied.decision).toBe('proxy');
    expect(proxied.reason).toMatch(
      /^connecting to (a\.){128}… \(2011 characters\):443 through http:\/\/(p\.){124}p… \(\d+ characters\) from HTTPS_PROXY/,
    );
    expect(proxied.reason.length).toBeLessThan(1200);
  });
});

describe('redactProxyUrl', () => {
  it('drops the password, path and query; keeps the user name', () => {
    expect(redactProxyUrl(new URL('http://alice:secret@proxy:3128/'))).toBe('http://alice@proxy:3128');
    expect(redactProxyUrl('https://alice:secret@proxy:3129/x?y=1')).toBe('https://alice@proxy:3129');
    expect(redactProxyUrl('http://proxy:3128')).toBe('http://proxy:3128');
    expect(redactProxyUrl('proxy:3128')).toBe('http://proxy:3128');
    expect(redactProxyUrl('http://:secret@proxy:3128')).toBe('http://proxy:3128');
    expect(redactProxyUrl('http://[fd00::1]:3128')).toBe('http://[fd00::1]:3128');
  });

  it('removes user:password@ from strings that do not parse', () => {
    expect(redactProxyUrl('http://alice:secret@bad host:3128')).toBe('http://alice@bad host:3128');
  });
});
