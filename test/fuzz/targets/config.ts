// Text an operator or a hub hands in: NO_PROXY and proxy URLs (the agent's environment, the hub's proxy
// settings), `--config` files, CA bundles.
import { generateKeyPairSync } from 'node:crypto';
import fc from 'fast-check';
import { parseNoProxy, parseProxyUrl, proxyFromEnvironment, redactProxyUrl } from '@cluster-proxy/agent';
import { caCertificates, maskProxyPassword, normalizeProxyUrl, ProxySettingsError } from '@cluster-proxy/server';
import { parseConfigYaml } from '@cluster-proxy/cli/parsers';
import { check, checkBounded, checkOneLine, heldBytes, type FuzzTarget } from '../engine.js';

const SECRET = 'S3cr3tPw';

function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

const noProxyParts = fc
  .array(
    fc.oneof(
      fc.constantFrom(
        '*',
        '.example.com',
        '*.example.com',
        'example.com:443',
        '10.0.0.0/8',
        '::1',
        '[::1]:443',
        'fd00::/8',
        '1.2.3.4:80',
        ' Foo.COM ',
        'bücher.de',
        '.',
        '*foo',
        '[fe80::1]',
        'http://x',
        'a b',
        '::ffff:10.0.0.0/104',
        '0.0.0.0/0',
        'localhost',
      ),
      fc.string({ maxLength: 12 }),
    ),
    { maxLength: 6 },
  )
  .map((es) => es.join(','));

export const proxyEnvTarget: FuzzTarget = {
  name: 'proxy-env',
  about:
    "the agent's HTTPS_PROXY / NO_PROXY reading (parseNoProxy, proxyFromEnvironment, redactProxyUrl) and the hub's proxy settings (normalizeProxyUrl, maskProxyPassword): never throws but a one-line ProxySettingsError; the decision's reason is one line and never shows the password",
  generate: fc
    .tuple(
      noProxyParts,
      fc.constantFrom(
        'proxy:3128',
        `http://u:${SECRET}@proxy:3128`,
        `https://u:${SECRET}@[::1]:443/p?q`,
        `u:${SECRET}@p`,
        'socks5://p:1080',
        '://x',
        'http://',
        `http://u:${SECRET}@`,
      ),
      fc.constantFrom('api.example.com', '10.1.2.3', '::1', '[fd00::1]', 'LOCALHOST', 'xn--bcher-kva.de', 'bücher.de', 'a\nb'),
    )
    .map(([np, proxy, host]) => Buffer.from(`${np}\u0000${proxy}\u0000${host}\u0000443`)),
  run(input) {
    const [noProxy = '', proxy = '', host = '', port = ''] = input.toString('utf8').split('\u0000');
    const m = parseNoProxy(noProxy);
    checkBounded(heldBytes(m.entries), input.length, 'no-proxy: entries');
    const hit = m.matches(host, port);
    check(typeof hit.bypass === 'boolean', 'no-proxy: no decision');
    const d = proxyFromEnvironment({ HTTPS_PROXY: proxy, NO_PROXY: noProxy }, host, Number(port) || 443);
    if (!host.includes('\n') && !host.includes('\r') && !proxy.includes('\n') && !proxy.includes('\r'))
      checkOneLine(d.reason, 'proxy decision');
    // The password (what follows the user name's colon) never shows; the user name may.
    const parsed = parseProxyUrl(proxy);
    const password = parsed?.password ?? '';
    // A password that is also the host, the port or a user name shows as that (`http://3128:3128@p:3128`).
    const elsewhere = [host, port, noProxy, parsed?.username ?? '', parsed?.hostname ?? '', parsed?.port ?? ''].some(
      (t) => t.includes(password) || safeDecode(t).includes(password),
    );
    if (password.length >= 4 && !elsewhere) {
      check(!d.reason.includes(password), `proxy decision shows the password: ${d.reason}`);
      check(!redactProxyUrl(proxy).includes(password), `redactProxyUrl shows the password: ${redactProxyUrl(proxy)}`);
    }
    if (parsed !== null) check(parsed.host !== '', 'parseProxyUrl: a proxy URL without a host');
    let normalized: string | undefined;
    try {
      normalized = normalizeProxyUrl('httpsProxy', proxy);
    } catch (err) {
      check(err instanceof ProxySettingsError, `normalizeProxyUrl threw ${(err as Error).name}`);
      checkOneLine(err.message, 'proxy settings refusal');
      const userInfo = /^(?:[a-z][a-z0-9+.-]*:\/\/)?[^:@/?#]*:([^/?#]*)@/i.exec(proxy.trim());
      const written = userInfo?.[1] ?? '';
      const rest = proxy.trim().slice(userInfo?.[0].length ?? 0); // a password that is also the host or port shows as that
      const quoted = /^\S+ ("(?:[^"\\]|\\.)*")/.exec(err.message)?.[1] ?? err.message; // the value as the message shows it
      // ...also once quoted: "proxy:\x13128" is written "proxy:\u0013128", which holds a password "3128".
      if (written.length >= 4 && !rest.includes(written) && !JSON.stringify(rest).includes(written))
        check(!quoted.includes(written), `proxy settings refusal shows the password: ${err.message}`);
    }
    if (normalized !== undefined) {
      check(/^https?:\/\//i.test(normalized), 'normalizeProxyUrl: no scheme');
      const masked = maskProxyPassword(normalized);
      const u = new URL(normalized);
      const pw = u.password;
      if (pw.length >= 4 && !u.host.includes(pw) && !u.username.includes(pw))
        check(!masked.includes(pw), `maskProxyPassword shows the password: ${masked}`);
    }
  },
};

const configLines = fc
  .array(
    fc.oneof(
      fc.constantFrom(
        'hub: hub.example.com:8091',
        'cluster: c1',
        'identifier:\n  - a\n  - b',
        'x: &a 1',
        'y: *a',
        'z: !!str 1',
        'k: |\n  multi',
        '---',
        '# comment',
        'k: {a: 1}',
        'k: [1, 2]',
        'debug: true',
        'v: 1.20',
        'n: 0x1f',
        'dup: 1',
        'dup: 2',
        'empty:',
        '? complex',
        '"q": "v"',
        '\t',
        'k: "\\u0000"',
      ),
      fc.string({ maxLength: 16 }),
    ),
    { maxLength: 8 },
  )
  .map((ls) => Buffer.from(ls.join('\n')));

export const configFileTarget: FuzzTarget = {
  name: 'config-file',
  about: '`--config FILE` (parseConfigYaml): flat "flag: value" scalars and lists of scalars, or an Error "line N: problem" on one line',
  generate: configLines,
  run(input) {
    const text = input.toString('utf8');
    let out: ReturnType<typeof parseConfigYaml>;
    try {
      out = parseConfigYaml(text);
    } catch (err) {
      check(err instanceof Error, 'config: threw a non-Error');
      checkOneLine(err.message, 'config refusal');
      check(/^line \d+: /.test(err.message), `config: refusal without a line number: ${err.message}`);
      return;
    }
    if (out === null) return;
    checkBounded(heldBytes(out), input.length, 'config');
    for (const [k, v] of Object.entries(out)) {
      const scalar = (x: unknown): boolean => x === null || typeof x === 'string' || typeof x === 'boolean';
      check(scalar(v) || (Array.isArray(v) && v.every(scalar)), `config: ${k} is not a scalar or a list of scalars`);
    }
  },
};

// A real certificate for the corpus generator's blocks (a self-signed CA, made once by the corpus script).
const PEM_LABELS = ['CERTIFICATE', 'PRIVATE KEY', 'RSA PRIVATE KEY', 'X', 'CERTIFICATE REQUEST'];

/**
 * Bundles with private-key blocks beside certificate-shaped ones, made at run time with a key generated now (the
 * corpus keeps no key material): a bundle must never take a key for a certificate.
 */
function keyBlocks(): Buffer[] {
  const { privateKey } = generateKeyPairSync('ed25519');
  const key = privateKey.export({ type: 'pkcs8', format: 'pem' }).toString();
  const junkCert = '-----BEGIN CERTIFICATE-----\nfcLnl4dY\n-----END CERTIFICATE-----\n';
  return [key, key.replace(/\n/g, '\r\n'), `${junkCert}${key}`, key.replace(/ PRIVATE KEY/g, ' RSA PRIVATE KEY') + junkCert].map((s) =>
    Buffer.from(s),
  );
}

export const caBundleTarget: FuzzTarget = {
  name: 'ca-bundle',
  about:
    "a CA bundle (caCertificates: PEM blocks or base64 of them, as OCM's caBundle is written): certificates that parse and re-read to themselves, or a one-line ProxySettingsError",
  generate: fc
    .array(fc.tuple(fc.constantFrom(...PEM_LABELS), fc.base64String({ maxLength: 200 }), fc.constantFrom('\n', '\r\n', ' ')), {
      maxLength: 3,
    })
    .map((bs) => Buffer.from(bs.map(([l, b, eol]) => `-----BEGIN ${l}-----${eol}${b}${eol}-----END ${l}-----${eol}`).join(''))),
  seeds: keyBlocks,
  run(input) {
    for (const bundle of [input, input.toString('latin1')]) {
      let certs: string[];
      try {
        certs = caCertificates(bundle);
      } catch (err) {
        check(err instanceof ProxySettingsError, `ca-bundle: threw ${(err as Error).name}: ${(err as Error).message}`);
        checkOneLine(err.message, 'ca-bundle refusal');
        continue;
      }
      check(certs.length > 0, 'ca-bundle: no certificate and no error');
      const again = caCertificates(certs.join(''));
      check(again.join('') === certs.join(''), 'ca-bundle: normalized certificates do not re-read to themselves');
      checkBounded(heldBytes(certs), input.length, 'ca-bundle');
    }
  },
};
