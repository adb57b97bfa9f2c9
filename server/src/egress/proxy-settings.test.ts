import { describe, expect, it } from 'vitest';
// The agent's audit of the NO_PROXY we render (a dev dependency: the server package does not run the agent).
import { auditNoProxy } from '@cluster-proxy/agent';
import { createCA } from '../pki/index.js';
import {
  caCertificates,
  clusterNoProxyEntries,
  maskProxyPassword,
  mergeNoProxy,
  normalizeProxyUrl,
  proxyEnv,
  renderProxySettings,
  trustBundle,
  ProxySettingsError,
  type ClusterProxyFacts,
  type ProxyConfig,
} from './proxy-settings.js';

const FACTS: ClusterProxyFacts = {
  podCidrs: ['10.244.0.0/16'],
  serviceCidrs: ['10.96.0.0/12'],
  clusterDomain: 'cluster.local',
  apiserverIp: '10.96.0.1',
};
const CLUSTER_PART = [
  'localhost',
  '127.0.0.1',
  '10.244.0.0/16',
  '10.96.0.0/12',
  '10.96.0.1',
  '.svc',
  '.cluster.local',
  '169.254.169.254',
  'metadata.google.internal',
];

function expectError(fn: () => unknown, message: string | RegExp): ProxySettingsError {
  let caught: unknown;
  try {
    fn();
  } catch (err) {
    caught = err;
  }
  expect(caught).toBeInstanceOf(ProxySettingsError);
  const e = caught as ProxySettingsError;
  if (typeof message === 'string') expect(e.message).toBe(message);
  else expect(e.message).toMatch(message);
  expect(e.message).not.toContain('\n');
  return e;
}

describe('mergeNoProxy', () => {
  it('install-wide entries first, in their order; then the cluster part in its fixed order', () => {
    expect(mergeNoProxy({ noProxy: 'registry.corp.example,.corp.example,10.0.0.0/8' }, FACTS)).toEqual([
      'registry.corp.example',
      '.corp.example',
      '10.0.0.0/8',
      ...CLUSTER_PART,
    ]);
  });

  it('the cluster part does not depend on the order or spelling of the facts object', () => {
    const a = clusterNoProxyEntries({
      apiserverIp: '10.96.0.1',
      clusterDomain: 'cluster.local',
      serviceCidrs: ['10.96.0.0/12'],
      podCidrs: ['10.244.0.0/16'],
    });
    expect(a).toEqual(CLUSTER_PART);
    expect(clusterNoProxyEntries({ ...FACTS, clusterDomain: '.Cluster.Local.' })).toEqual(CLUSTER_PART);
  });

  it('de-duplicates case-folded, keeping the first occurrence in place', () => {
    expect(mergeNoProxy({ noProxy: ' .SVC , Localhost,169.254.169.254,foo.example,FOO.example,,10.96.0.0/12 ' }, FACTS)).toEqual([
      '.svc',
      'localhost',
      '169.254.169.254',
      'foo.example',
      '10.96.0.0/12',
      '127.0.0.1',
      '10.244.0.0/16',
      '10.96.0.1',
      '.cluster.local',
      'metadata.google.internal',
    ]);
  });

  it('writes cluster CIDRs and IPs canonically, so spellings of one range are one entry', () => {
    expect(
      clusterNoProxyEntries({
        podCidrs: ['10.244.1.7/16', 'FD00:10:244:0:0:0:0:0/56'],
        serviceCidrs: ['10.96.0.0/12,fd00:10:96::/112', '10.96.0.1/12'],
        apiserverIp: '[FD00:10:96::1]',
      }),
    ).toEqual([
      'localhost',
      '127.0.0.1',
      '10.244.0.0/16',
      'fd00:10:244::/56',
      '10.96.0.0/12',
      'fd00:10:96::/112',
      '10.96.0.0/12',
      'fd00:10:96::1',
      '.svc',
      '.cluster.local',
      '169.254.169.254',
      'metadata.google.internal',
    ]);
    // ...and mergeNoProxy drops the repeated one.
    expect(
      mergeNoProxy({}, { serviceCidrs: ['10.96.0.0/12', '10.96.0.1/12', '10.96.7.7/12'] }).filter((e) => e === '10.96.0.0/12'),
    ).toHaveLength(1);
  });

  it('empty parts: no install-wide entries, no facts, empty strings', () => {
    const base = ['localhost', '127.0.0.1', '.svc', '.cluster.local', '169.254.169.254', 'metadata.google.internal'];
    expect(mergeNoProxy({})).toEqual(base);
    expect(mergeNoProxy({ noProxy: '' }, {})).toEqual(base);
    expect(mergeNoProxy({ noProxy: ' , ,' }, { podCidrs: [], serviceCidrs: [''], clusterDomain: '  ', apiserverIp: '' })).toEqual(base);
    expect(clusterNoProxyEntries({ clusterDomain: 'corp.k8s' })).toContain('.corp.k8s');
  });

  it('keeps install-wide entries as Go reads them (trimmed, lower-cased), without judging them', () => {
    expect(mergeNoProxy({ noProxy: '*.Example.COM, [::1]:443 ,1.2.3.4:8443' }, {}).slice(0, 3)).toEqual([
      '*.example.com',
      '[::1]:443',
      '1.2.3.4:8443',
    ]);
  });
});

describe('validation: one-line errors that name the field and the value', () => {
  it('bad CIDRs', () => {
    expectError(
      () => mergeNoProxy({}, { podCidrs: ['10.244.0.0'] }),
      'podCidrs: "10.244.0.0" is not a CIDR such as 10.244.0.0/16 or fd00:10:244::/56',
    );
    expectError(() => mergeNoProxy({}, { podCidrs: ['10.244.0.0/33'] }), /^podCidrs: "10\.244\.0\.0\/33" is not a CIDR/);
    expectError(
      () => mergeNoProxy({}, { serviceCidrs: ['10.96.0.0/12,banana/8'] }),
      'serviceCidrs: "banana/8" is not a CIDR such as 10.96.0.0/12 or fd00:10:96::/112',
    );
    expectError(() => mergeNoProxy({}, { serviceCidrs: ['fd00::/129'] }), /^serviceCidrs: "fd00::\/129"/);
    expectError(() => mergeNoProxy({}, { podCidrs: ['010.244.0.0/16'] }), /^podCidrs: "010\.244\.0\.0\/16"/);
    expectError(() => mergeNoProxy({}, { podCidrs: ['10.0.0.0/8\nx'] }), /^podCidrs: "10\.0\.0\.0\/8\\nx" is not a CIDR/);
  });

  it('bad apiserver IP and cluster domain', () => {
    expectError(
      () => mergeNoProxy({}, { apiserverIp: 'kubernetes.default' }),
      'apiserverIp "kubernetes.default" is not an IP address such as 10.96.0.1',
    );
    expectError(() => mergeNoProxy({}, { apiserverIp: '10.96.0.0/12' }), /^apiserverIp "10\.96\.0\.0\/12" is not an IP address/);
    expectError(
      () => mergeNoProxy({}, { clusterDomain: 'cluster_local' }),
      'clusterDomain "cluster_local" is not a DNS domain such as cluster.local',
    );
    expectError(() => mergeNoProxy({}, { clusterDomain: 'a..b' }), /^clusterDomain "a\.\.b"/);
  });

  it('masks every copy of the password (a URL pasted twice; found by fuzzing)', () => {
    expect(maskProxyPassword('http://u:S3cr3tPw@http://u:S3cr3tPw@')).toBe('http://u:***@http://u:***@');
    expect(maskProxyPassword('http://u:pw@proxy:3128')).toBe('http://u:***@proxy:3128');
    expect(maskProxyPassword('http://proxy:3128')).toBe('http://proxy:3128');
    expect(maskProxyPassword('http:///u:S3cr3tPw@[::1]:443/p')).toBe('http:///u:***@[::1]:443/p');
    expectError(() => proxyEnv({ httpsProxy: 'socks5://u:S3cr3tPw@x/u:S3cr3tPw@' }), /^httpsProxy "socks5:\/\/u@x\/u:\*\*\*@"/);
  });

  it('proxy URLs: no host, unsupported scheme, not a URL; the password never appears', () => {
    expectError(
      () => proxyEnv({ httpsProxy: 'http://' }),
      'httpsProxy "http://" is not a proxy URL such as http://proxy.corp.example:3128',
    );
    expectError(
      () => proxyEnv({ httpsProxy: 'http://alice:s3cret@:3128' }),
      /^httpsProxy "http:\/\/alice@:3128" (has no host|is not a proxy URL)/,
    );
    expectError(
      () => proxyEnv({ httpProxy: 'socks5://alice:s3cret@proxy:1080' }),
      'httpProxy "socks5://alice@proxy:1080": scheme socks5:// is not supported (use http:// or https://)',
    );
    expectError(
      () => proxyEnv({ httpsProxy: 'http://alice:p@ss word@proxy:3128' }),
      'httpsProxy "http://alice@proxy:3128" contains whitespace or control characters',
    );
    expectError(
      () => proxyEnv({ httpsProxy: 'http://proxy:99999' }),
      'httpsProxy "http://proxy:99999" is not a proxy URL such as http://proxy.corp.example:3128',
    );
    for (const bad of ['http://alice:s3cret@:3128', 'socks5://alice:s3cret@proxy:1080', 'http://alice:s3cr@t@proxy:99999']) {
      try {
        proxyEnv({ httpsProxy: bad });
      } catch (err) {
        expect((err as Error).message).not.toMatch(/s3cr/);
        continue;
      }
      throw new Error(`expected ${bad} to be refused`);
    }
  });

  it('a long refused value shows cut, so the error stays a short line (found by fuzzing)', () => {
    const long = expectError(
      () => proxyEnv({ httpsProxy: `http://proxy:3128/${'a b,'.repeat(600)}` }),
      /^httpsProxy "http:\/\/proxy:3128\/a b,/,
    );
    expect(long.message).toContain('… (2418 characters)" contains whitespace or control characters');
    expect(long.message.length).toBeLessThan(300);
    const scheme = expectError(() => proxyEnv({ httpProxy: `x${'y'.repeat(3000)}://proxy:3128` }), /^httpProxy "xyyy/);
    expect(scheme.message).toMatch(/: scheme xyyy+… \(3001 characters\):\/\/ is not supported/);
    expect(scheme.message.length).toBeLessThan(600);
  });

  it('a scheme-less proxy is http:// (as Go reads it) and is rendered with the scheme', () => {
    expect(normalizeProxyUrl('httpsProxy', ' proxy.corp.example:3128 ')).toBe('http://proxy.corp.example:3128');
    expect(normalizeProxyUrl('httpsProxy', 'HTTPS://proxy.corp.example')).toBe('HTTPS://proxy.corp.example');
    expect(normalizeProxyUrl('httpsProxy', '  ')).toBeUndefined();
    expect(normalizeProxyUrl('httpsProxy', undefined)).toBeUndefined();
  });
});

describe('env vars', () => {
  it('upper- and lower-case HTTP_PROXY, HTTPS_PROXY and NO_PROXY as Kubernetes EnvVars, in a fixed order', () => {
    const env = proxyEnv(
      { httpProxy: 'http://proxy.corp.example:3128', httpsProxy: 'http://alice:pw@proxy.corp.example:3128', noProxy: '.corp.example' },
      FACTS,
    );
    const noProxy = ['.corp.example', ...CLUSTER_PART].join(',');
    expect(env).toEqual([
      { name: 'HTTP_PROXY', value: 'http://proxy.corp.example:3128' },
      { name: 'http_proxy', value: 'http://proxy.corp.example:3128' },
      { name: 'HTTPS_PROXY', value: 'http://alice:pw@proxy.corp.example:3128' },
      { name: 'https_proxy', value: 'http://alice:pw@proxy.corp.example:3128' },
      { name: 'NO_PROXY', value: noProxy },
      { name: 'no_proxy', value: noProxy },
    ]);
  });

  it('only the variables that have a value', () => {
    expect(proxyEnv({ httpsProxy: 'https://proxy:3129' }, {}).map((e) => e.name)).toEqual([
      'HTTPS_PROXY',
      'https_proxy',
      'NO_PROXY',
      'no_proxy',
    ]);
    expect(proxyEnv({ httpProxy: 'proxy:3128', httpsProxy: '' }, {}).map((e) => `${e.name}=${e.value.split(',')[0]}`)).toEqual([
      'HTTP_PROXY=http://proxy:3128',
      'http_proxy=http://proxy:3128',
      'NO_PROXY=localhost',
      'no_proxy=localhost',
    ]);
    // No proxy at all: nothing to bypass, nothing rendered (the merged list is still computed and validated).
    const none = renderProxySettings({ noProxy: '.corp.example' }, FACTS);
    expect(none.env).toEqual([]);
    expect(none.noProxy[0]).toBe('.corp.example');
    expectError(() => renderProxySettings({}, { podCidrs: ['nope'] }), /^podCidrs: "nope"/);
  });

  it('renders the same value twice for the same input (stable), and it is what mergeNoProxy returns', () => {
    const proxy: ProxyConfig = { httpsProxy: 'http://proxy:3128', noProxy: 'b.example,a.example' };
    const a = renderProxySettings(proxy, FACTS);
    const b = renderProxySettings({ ...proxy }, { ...FACTS });
    expect(a).toEqual(b);
    expect(a.env.find((e) => e.name === 'NO_PROXY')?.value).toBe(mergeNoProxy(proxy, FACTS).join(','));
  });
});

describe('trustBundle and caBundle', () => {
  const hubCa = createCA({ commonName: 'hub-ca' }).certPem;
  const proxyCa = createCA({ commonName: 'proxy-ca' }).certPem;
  const otherCa = createCA({ commonName: 'other-ca' }).certPem;
  const count = (pem: string): number => pem.match(/-----BEGIN CERTIFICATE-----/g)?.length ?? 0;

  it('appends the proxy CA when the https proxy is an https:// URL', () => {
    const bundle = trustBundle(hubCa, { httpsProxy: 'https://proxy.corp.example:3129', caBundle: proxyCa });
    expect(bundle.startsWith(hubCa)).toBe(true);
    expect(count(bundle)).toBe(2);
    expect(bundle.replace(/\s/g, '')).toContain(proxyCa.replace(/\s/g, ''));
  });

  it('leaves the bundle unchanged for an http:// or scheme-less https proxy, an https:// *http* proxy only, or no caBundle', () => {
    expect(trustBundle(hubCa, { httpsProxy: 'http://proxy:3128', caBundle: proxyCa })).toBe(hubCa);
    expect(trustBundle(hubCa, { httpsProxy: 'proxy:3128', caBundle: proxyCa })).toBe(hubCa);
    expect(trustBundle(hubCa, { httpProxy: 'https://proxy:3129', caBundle: proxyCa })).toBe(hubCa);
    expect(trustBundle(hubCa, { httpsProxy: 'https://proxy:3129' })).toBe(hubCa);
    expect(trustBundle(hubCa, {})).toBe(hubCa);
  });

  it('accepts base64 of PEM (a Go []byte field in YAML) and bytes; does not repeat certificates already there', () => {
    const b64 = Buffer.from(proxyCa + otherCa).toString('base64');
    const bundle = trustBundle(hubCa, { httpsProxy: 'https://proxy:3129', caBundle: b64 });
    expect(count(bundle)).toBe(3);
    expect(trustBundle(bundle, { httpsProxy: 'https://proxy:3129', caBundle: Buffer.from(proxyCa + proxyCa) })).toBe(bundle);
    // The hub CA itself listed in caBundle: nothing added.
    expect(trustBundle(hubCa, { httpsProxy: 'https://proxy:3129', caBundle: hubCa })).toBe(hubCa);
    // A bundle without a trailing newline still gets a well-formed append.
    const joined = trustBundle(hubCa.trimEnd(), { httpsProxy: 'https://proxy:3129', caBundle: proxyCa });
    expect(joined).toContain('-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----');
    expect(caCertificates(joined)).toHaveLength(2);
  });

  it('refuses a caBundle with no certificate, a private key, or a broken certificate', () => {
    const https = { httpsProxy: 'https://proxy:3129' };
    expectError(() => trustBundle(hubCa, { ...https, caBundle: 'not a certificate' }), /^caBundle holds no PEM certificate/);
    expectError(
      () => trustBundle(hubCa, { ...https, caBundle: `-----BEGIN ${'PRIVATE'} KEY-----\nMIIB\n-----END ${'PRIVATE'} KEY-----\n` }),
      'caBundle block 1 is a PRIVATE KEY, not a CERTIFICATE: the bundle must hold CA certificates only',
    );
    expectError(
      () => trustBundle(hubCa, { ...https, caBundle: `${proxyCa}-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n` }),
      /^caBundle certificate 2 cannot be parsed: /,
    );
    // Broken even while unused (an http:// proxy): said at once, not when someone switches to https://.
    expectError(() => renderProxySettings({ httpsProxy: 'http://proxy:3128', caBundle: 'nope' }), /^caBundle holds no PEM certificate/);
  });
});

describe("agrees with the agent's NO_PROXY audit (`cluster-proxy noproxy check`)", () => {
  const cases: Array<[string, ProxyConfig, ClusterProxyFacts]> = [
    ['kind defaults', { httpsProxy: 'http://proxy:3128' }, FACTS],
    ['install-wide entries too', { httpsProxy: 'http://proxy:3128', noProxy: 'registry.corp.example,.corp.example' }, FACTS],
    [
      'dual-stack',
      { httpsProxy: 'http://proxy:3128' },
      {
        podCidrs: ['10.244.0.0/16,fd00:10:244::/56'],
        serviceCidrs: ['10.96.0.0/12', 'fd00:10:96::/112'],
        apiserverIp: '10.96.0.1',
        clusterDomain: 'cluster.local',
      },
    ],
    [
      'IPv6 only, custom domain',
      { httpsProxy: 'http://proxy:3128' },
      { podCidrs: ['fd00:10:244::/56'], serviceCidrs: ['fd00:10:96::/112'], apiserverIp: 'fd00:10:96::1', clusterDomain: 'corp.k8s' },
    ],
    [
      'host bits set in the facts',
      { httpsProxy: 'http://proxy:3128' },
      { podCidrs: ['10.244.3.4/16'], serviceCidrs: ['172.30.5.5/16'], apiserverIp: '172.30.0.1' },
    ],
    [
      'apiserver outside the service CIDR',
      { httpsProxy: 'http://proxy:3128' },
      { podCidrs: ['10.128.0.0/14'], serviceCidrs: ['172.30.0.0/16'], apiserverIp: '192.168.10.5', clusterDomain: 'cluster.local' },
    ],
  ];
  for (const [name, proxy, facts] of cases) {
    it(`${name}: no problem for the rendered NO_PROXY`, () => {
      const value = renderProxySettings(proxy, facts).env.find((e) => e.name === 'NO_PROXY')!.value;
      // The audit reads a dual-stack element as two CIDRs only when given separately.
      const split = (v: readonly string[] | undefined): string[] | undefined => v?.flatMap((x) => x.split(','));
      // The renderer defaults the domain to cluster.local; the audit is given the effective facts.
      const report = auditNoProxy(value, {
        ...facts,
        clusterDomain: facts.clusterDomain ?? 'cluster.local',
        podCidrs: split(facts.podCidrs),
        serviceCidrs: split(facts.serviceCidrs),
        hub: 'hub.example.net:8091',
      });
      expect(report.findings.filter((f) => f.severity === 'problem')).toEqual([]);
      expect(report.unresolved).toEqual([]);
      // What is left are remarks about non-Go tools: CIDR entries in general, and the install-wide
      // ".corp.example" (subdomains only in Go, the domain too in curl and Python). Nothing to add or remove.
      const expected = proxy.noProxy?.includes('.corp.example') ? ['cidr-entries', 'leading-dot-entries'] : ['cidr-entries'];
      expect(report.findings.map((f) => f.code)).toEqual(expected);
      expect(report.suggested).toBe(report.entries.join(','));
    });
  }
});
