import { generateKeyPairSync } from 'node:crypto';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { systemdEnvironmentLine } from '@cluster-proxy/server';
import { UsageError } from './flags.js';
import { proxyConfigCommand } from './proxy-config.js';

const TESTDATA = path.join(path.dirname(fileURLToPath(import.meta.url)), 'testdata', 'proxy-config');
const CA_FILE = path.join(TESTDATA, 'proxy-ca.crt');

/** The one example input every golden file is rendered from (also the README's). */
const EXAMPLE = [
  '--http-proxy',
  'http://proxy.corp.example:3128',
  '--https-proxy',
  'https://proxy.corp.example:3129',
  '--ca-bundle',
  CA_FILE,
  '--no-proxy',
  'corp.example,.internal.corp.example',
  '--pod-cidr',
  '10.244.0.0/16',
  '--service-cidr',
  '10.96.0.0/12',
  '--apiserver-ip',
  '10.96.0.1',
  '--cluster-domain',
  'cluster.local',
  '--hub',
  'hub.example.com:8091',
];

async function run(args: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const code = await proxyConfigCommand(args, { stdout: (t) => (out += t), stderr: (t) => (err += t), env: {} });
  return { code, out, err };
}

async function usageError(args: string[]): Promise<string> {
  try {
    await run(args);
  } catch (e) {
    expect(e).toBeInstanceOf(UsageError);
    const msg = (e as Error).message;
    expect(msg).not.toContain('\n');
    return msg;
  }
  throw new Error(`expected a UsageError for ${args.join(' ')}`);
}

/** Parses `Environment=` lines as systemd does: unquote, unescape C-style, `%%` → `%`. */
function systemdEnvironment(dropIn: string): Map<string, string> {
  const env = new Map<string, string>();
  for (const line of dropIn.split('\n')) {
    const m = /^Environment="(.*)"$/.exec(line);
    if (!m) continue;
    const text = m[1]!.replace(/\\(.)/g, '$1').replace(/%%/g, '%');
    const eq = text.indexOf('=');
    env.set(text.slice(0, eq), text.slice(eq + 1));
  }
  return env;
}

const dirs: string[] = [];
afterEach(async () => {
  await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
});

describe('cluster-proxy proxy-config render: golden files from one example input', () => {
  for (const format of ['systemd', 'kubeadm', 'kyverno', 'env', 'helm-values', 'json']) {
    it(`--format ${format}`, async () => {
      const { code, out, err } = await run(['render', '--format', format, ...EXAMPLE]);
      expect(code).toBe(0);
      expect(err).not.toContain('PROBLEM');
      const golden = path.join(TESTDATA, `${format}.golden`);
      if (process.env['UPDATE_GOLDEN'] === '1') await writeFile(golden, out);
      expect(out).toBe(await readFile(golden, 'utf8'));
    });
  }

  it("merges as the agent's env: install-wide entries first in their order, then the cluster part, each entry once", async () => {
    const json = JSON.parse(
      (await run(['render', '--format', 'json', ...EXAMPLE, '--no-proxy', 'corp.example,LOCALHOST,.internal.corp.example,10.96.0.1'])).out,
    ) as { noProxy: string };
    expect(json.noProxy).toBe(
      'corp.example,localhost,.internal.corp.example,10.96.0.1,127.0.0.1,10.244.0.0/16,10.96.0.0/12,.svc,.cluster.local,169.254.169.254,metadata.google.internal',
    );
    const expected =
      'corp.example,.internal.corp.example,localhost,127.0.0.1,10.244.0.0/16,10.96.0.0/12,10.96.0.1,.svc,.cluster.local,169.254.169.254,metadata.google.internal';
    for (const format of ['systemd', 'kubeadm', 'kyverno', 'env', 'helm-values']) {
      expect((await run(['render', '--format', format, ...EXAMPLE])).out, format).toContain(expected);
    }
  });
});

describe('cluster-proxy proxy-config render: the audit runs first', () => {
  it('refuses (exit 1, nothing on stdout) when NO_PROXY would bypass the hub, and says what to fix', async () => {
    const { code, out, err } = await run(['render', '--format', 'env', ...EXAMPLE, '--no-proxy', 'example.com']);
    expect(code).toBe(1);
    expect(out).toBe('');
    expect(err).toContain('PROBLEM  hub hub.example.com:8091 matches NO_PROXY entry "example.com"');
    expect(err).toContain('nothing written: fix the problems above, or pass --force');
  });

  it('refuses when the pod or service CIDR is unknown; --force renders anyway', async () => {
    const args = ['render', '--format', 'env', '--https-proxy', 'http://proxy:3128', '--hub', 'hub:8091'];
    const refused = await run(args);
    expect(refused.code).toBe(1);
    expect(refused.err).toContain('PROBLEM  the pod CIDR is unknown (--pod-cidr)');
    expect(refused.err).toContain('PROBLEM  the service CIDR is unknown (--service-cidr)');
    const forced = await run([...args, '--force']);
    expect(forced.code).toBe(0);
    expect(forced.err).toContain('rendering anyway (--force)');
    expect(forced.out).toContain('HTTPS_PROXY=http://proxy:3128\n');
  });

  it('says when the hub was not checked', async () => {
    const { code, err } = await run([
      'render',
      '--format',
      'env',
      '--https-proxy',
      'http://proxy:3128',
      '--pod-cidr',
      '10.244.0.0/16',
      '--service-cidr',
      '10.96.0.0/12',
    ]);
    expect(code).toBe(0);
    expect(err).toContain('--hub not given');
  });

  it('writes nothing into --out when refused', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cp-render-'));
    dirs.push(dir);
    const { code } = await run(['render', '--format', 'systemd', ...EXAMPLE, '--no-proxy', 'hub.example.com', '--out', dir]);
    expect(code).toBe(1);
    expect(existsSync(path.join(dir, 'etc'))).toBe(false);
  });
});

describe('cluster-proxy proxy-config render: proxy passwords', () => {
  const SECRET = 'p@ss%word';
  const withPassword = [
    '--https-proxy',
    `http://alice:${encodeURIComponent(SECRET)}@proxy.corp.example:3128`,
    '--pod-cidr',
    '10.244.0.0/16',
    '--service-cidr',
    '10.96.0.0/12',
    '--hub',
    'hub.example.com:8091',
  ];
  const forms = [SECRET, encodeURIComponent(SECRET), encodeURIComponent(SECRET).replace(/%/g, '%%')];

  it('never prints them on stdout without --show-secrets, in any format', async () => {
    for (const format of ['systemd', 'kubeadm', 'kyverno', 'env', 'helm-values', 'json']) {
      const { out, err } = await run(['render', '--format', format, ...withPassword]);
      for (const f of forms) expect(out.includes(f) || err.includes(f), `${format} printed the password`).toBe(false);
      expect(out).toContain('alice:***@proxy.corp.example:3128');
      expect(err).toContain('proxy passwords are shown as ***');
    }
    const shown = await run(['render', '--format', 'env', ...withPassword, '--show-secrets']);
    expect(shown.out).toContain(`HTTPS_PROXY=http://alice:${encodeURIComponent(SECRET)}@proxy.corp.example:3128\n`);
  });

  it('--out writes them into the drop-ins with mode 0600, escaped for systemd', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cp-render-'));
    dirs.push(dir);
    const { code, out } = await run(['render', '--format', 'systemd', ...withPassword, '--out', dir]);
    expect(code).toBe(0);
    for (const f of forms) expect(out.includes(f)).toBe(false);
    for (const unit of ['containerd', 'kubelet']) {
      const file = path.join(dir, 'etc/systemd/system', `${unit}.service.d`, 'http-proxy.conf');
      expect(out).toContain(`wrote ${file} (mode 0600)`);
      expect((await stat(file)).mode & 0o777).toBe(0o600);
      const env = systemdEnvironment(await readFile(file, 'utf8'));
      expect(env.get('HTTPS_PROXY')).toBe(`http://alice:${encodeURIComponent(SECRET)}@proxy.corp.example:3128`);
      expect(env.get('https_proxy')).toBe(env.get('HTTPS_PROXY'));
    }
  });

  it('files without a password get 0644, also when an older file had 0600', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cp-render-'));
    dirs.push(dir);
    await run(['render', '--format', 'env', ...withPassword, '--out', dir]);
    expect((await stat(path.join(dir, 'proxy.env'))).mode & 0o777).toBe(0o600);
    await run(['render', '--format', 'env', ...EXAMPLE, '--out', dir]);
    expect((await stat(path.join(dir, 'proxy.env'))).mode & 0o777).toBe(0o644);
  });
});

describe('cluster-proxy proxy-config render: systemd escaping', () => {
  it('doubles % (specifiers) and escapes quotes and backslashes, so systemd reads the value back unchanged', () => {
    const value = 'http://u:a%25b"c\\d@proxy:3128';
    const line = systemdEnvironmentLine({ name: 'HTTPS_PROXY', value });
    expect(line).toBe('Environment="HTTPS_PROXY=http://u:a%%25b\\"c\\\\d@proxy:3128"');
    expect(systemdEnvironment(line).get('HTTPS_PROXY')).toBe(value);
  });
});

describe('cluster-proxy proxy-config render: bad input gets one line', () => {
  it('names what is wrong', async () => {
    expect(await usageError(['render'])).toContain('--format is required');
    expect(await usageError(['render', '--format', 'ini', ...EXAMPLE])).toContain(
      '--format "ini" is not one of systemd|kubeadm|kyverno|env|helm-values|json',
    );
    expect(await usageError(['render', '--format', 'env', '--pod-cidr', '10.244.0.0/16'])).toContain('no proxy to render');
    expect(await usageError(['render', '--format', 'env', ...EXAMPLE, '--pod-cidr', '10.244.0.0/33'])).toContain('is not a CIDR');
    expect(await usageError(['render', '--format', 'env', ...EXAMPLE, '--https-proxy', 'socks5://proxy:1080'])).toContain(
      'socks5:// is not supported',
    );
    expect(await usageError(['render', '--format', 'env', ...EXAMPLE, '--ca-bundle', '/nonexistent/ca.crt'])).toContain(
      'cannot read --ca-bundle /nonexistent/ca.crt: ENOENT',
    );
    expect(await usageError(['render', '--format', 'env', ...EXAMPLE, 'extra'])).toContain('takes no arguments');
    expect(await usageError(['frobnicate'])).toContain('unknown proxy-config command "frobnicate"');
    expect(await usageError(['render', '--format', 'env', ...EXAMPLE, '--bogus'])).toContain('unknown flag --bogus');
  });

  it('a CA bundle that holds a private key is refused', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cp-render-'));
    dirs.push(dir);
    const bad = path.join(dir, 'bad.pem');
    // A key pasted where the CA bundle belongs: made now, never stored.
    await writeFile(bad, generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ type: 'pkcs8', format: 'pem' }));
    expect(await usageError(['render', '--format', 'env', ...EXAMPLE, '--ca-bundle', bad])).toContain(
      'is a PRIVATE KEY, not a CERTIFICATE',
    );
  });

  it('--help prints the flags and exits 0', async () => {
    const { code, out } = await run(['render', '--help']);
    expect(code).toBe(0);
    expect(out).toContain('--exclude-namespace');
    expect(out).toContain('--show-secrets');
  });
});
