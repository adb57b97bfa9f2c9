// `cluster-proxy proxy-config` end to end (docs/egress-proxy.md), with real processes:
//  1. a hub on the embedded store: `proxy-config set` stores the install-wide settings, `join` records the
//     cluster's facts, and `render --cluster` writes exactly the env the agent's install manifests carry;
//  2. the rendered `env` file given to a real curl inside a network namespace with the cluster's addresses
//     (pod, service, apiserver, metadata, "internet", hub) and a real squid: for every destination curl goes
//     direct or through squid exactly as the audit (`noproxy explain`, Go's rules) says.
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { explainNoProxy } from '@cluster-proxy/agent';
import { killAllSpawned, runCommand, spawnProcess, type ManagedProcess } from '../src/fixtures/index.js';
import { createNetnsLab, netnsUnavailableReason, type NetnsLab } from '../src/fixtures/netns.js';
import { startSquid, type SquidProxy } from '../src/fixtures/squid.js';
import { CLI } from '../src/harness.js';

const CA_FILE = new URL('../../cli/src/testdata/proxy-config/proxy-ca.crt', import.meta.url).pathname;

describe('proxy-config set, join, render --cluster: one source of truth with the agent manifests', () => {
  let dir = '';
  let hub: ManagedProcess;
  const cli = (args: string[]) => runCommand(process.execPath, [CLI, ...args], { cwd: dir, timeoutMs: 20_000 });

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'cp-proxy-config-'));
    hub = spawnProcess({
      name: 'hub',
      command: process.execPath,
      cwd: dir,
      args: [
        CLI,
        'hub',
        '--data-dir',
        'hub',
        '--bind-address',
        '127.0.0.1',
        '--agent-port',
        '0',
        '--frontend-port',
        '0',
        '--health-port',
        '0',
        '--admin-port',
        '0',
        '--connect-port',
        'off',
        '--agent-entrypoint',
        'hub.example.com:8091',
        '--log-format',
        'json',
      ],
    });
    await hub.waitForJsonLine((o) => o['msg'] === 'proxy server listening', 20_000);
  });

  afterAll(async () => {
    await hub?.stop(8000);
    await killAllSpawned();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("render --cluster writes the env of the agent Deployment that join rendered, and audits against the hub's entrypoint", async () => {
    const set = await cli([
      'proxy-config',
      'set',
      '--data-dir',
      'hub',
      '--https-proxy',
      'http://cp:s3cret@proxy.corp.example:3128',
      '--http-proxy',
      'http://proxy.corp.example:3128',
      '--no-proxy',
      'corp.example',
      '--ca-bundle',
      CA_FILE,
    ]);
    expect(set.code, set.stderr).toBe(0);
    expect(set.stdout).toContain('httpsProxy http://cp:***@proxy.corp.example:3128');
    expect(set.stdout).not.toContain('s3cret');

    const join = await cli([
      'join',
      'c1',
      '--data-dir',
      'hub',
      '--out',
      'c1',
      '--pod-cidr',
      '10.244.0.0/16',
      '--service-cidr',
      '10.96.0.0/12',
      '--apiserver-ip',
      '10.96.0.1',
      '--cluster-domain',
      'example.local',
    ]);
    expect(join.code, join.stderr).toBe(0);
    const docs = parseAllDocuments(await readFile(path.join(dir, 'c1', 'manifests.yaml'), 'utf8')).map(
      (d) => d.toJS() as { kind: string; spec: { template: { spec: { containers: { env?: { name: string; value?: string }[] }[] } } } },
    );
    const deployment = docs.find((d) => d.kind === 'Deployment')!;
    const agentEnv = deployment.spec.template.spec.containers[0]!.env!.filter((e) => /_proxy$/i.test(e.name));
    expect(agentEnv.map((e) => e.name)).toEqual(['HTTP_PROXY', 'http_proxy', 'HTTPS_PROXY', 'https_proxy', 'NO_PROXY', 'no_proxy']);

    const render = await cli(['proxy-config', 'render', '--cluster', 'c1', '--data-dir', 'hub', '--format', 'json', '--show-secrets']);
    expect(render.code, render.stderr).toBe(0);
    const json = JSON.parse(render.stdout) as { env: { name: string; value: string }[]; noProxy: string };
    expect(json.env).toEqual(agentEnv);
    expect(json.noProxy).toContain('.example.local');

    // The hub the audit protects is the hub's own entrypoint, not a flag.
    const bypass = await cli([
      'proxy-config',
      'render',
      '--cluster',
      'c1',
      '--data-dir',
      'hub',
      '--format',
      'env',
      '--no-proxy',
      'example.com',
    ]);
    expect(bypass.code).toBe(1);
    expect(bypass.stdout).toBe('');
    expect(bypass.stderr).toContain('hub hub.example.com:8091 matches NO_PROXY entry "example.com"');
  });

  it('a later join without facts drops the recorded ones; the render then refuses for the missing CIDRs', async () => {
    expect((await cli(['join', 'c1', '--data-dir', 'hub', '--out', 'c1-again'])).code).toBe(0);
    const r = await cli(['proxy-config', 'render', '--cluster', 'c1', '--data-dir', 'hub', '--format', 'env']);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('the pod CIDR is unknown');
  });

  it('bad input gets one line: an unknown cluster, a proxy URL the agent cannot use', async () => {
    const unknown = await cli(['proxy-config', 'render', '--cluster', 'nope', '--data-dir', 'hub', '--format', 'env']);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr.trim()).toBe('cluster-proxy: --cluster nope: cluster nope is not registered');
    const bad = await cli(['proxy-config', 'set', '--data-dir', 'hub', '--https-proxy', 'socks5://proxy:1080']);
    expect(bad.code).toBe(2);
    expect(bad.stderr.trim().split('\n')).toHaveLength(1);
    expect(bad.stderr).toContain('socks5:// is not supported');
    // Nothing was lost: the earlier settings are still there.
    const still = await cli([
      'proxy-config',
      'render',
      '--cluster',
      'c1',
      '--data-dir',
      'hub',
      '--format',
      'env',
      '--pod-cidr',
      '10.244.0.0/16',
      '--service-cidr',
      '10.96.0.0/12',
    ]);
    expect(still.code, still.stderr).toBe(0);
    expect(still.stdout).toContain('HTTPS_PROXY=http://cp:***@proxy.corp.example:3128\n');
  });
});

describe('the rendered env, given to curl, decides direct or proxy as the audit says (real squid, network namespace)', () => {
  const NS = 'cluster';
  const PORT = 8080;
  /** Every address lives on the namespace's loopback: nothing leaves it. */
  const ADDRESSES = {
    pod: '10.244.1.5',
    service: '10.96.0.10',
    apiserver: '10.96.0.1',
    metadata: '169.254.169.254',
    internet: '198.51.100.20',
    corp: '198.51.100.30',
    hub: '192.0.2.10',
  };
  const NAMES: Record<string, string> = {
    'web.team.svc': ADDRESSES.service,
    'web.team.svc.cluster.local': ADDRESSES.service,
    'git.corp.example': ADDRESSES.corp,
    'registry.example.com': ADDRESSES.internet,
    'hub.example.com': ADDRESSES.hub,
  };
  /** What Go's rules say for each, written out so the test cannot pass by agreeing with a broken audit. */
  const EXPECTED: Record<string, 'direct' | 'proxy'> = {
    [ADDRESSES.pod]: 'direct',
    [ADDRESSES.service]: 'direct',
    [ADDRESSES.apiserver]: 'direct',
    [ADDRESSES.metadata]: 'direct',
    'web.team.svc': 'direct',
    'web.team.svc.cluster.local': 'direct',
    'git.corp.example': 'direct',
    'registry.example.com': 'proxy',
    'hub.example.com': 'proxy',
    [ADDRESSES.internet]: 'proxy',
  };
  let lab: NetnsLab | null = null;
  let squid: SquidProxy | undefined;
  let dir = '';

  beforeAll(async () => {
    lab = await createNetnsLab([NS]);
    if (!lab) return;
    dir = await mkdtemp(path.join(os.tmpdir(), 'cp-proxy-env-'));
    for (const ip of Object.values(ADDRESSES)) await lab.exec(NS, 'ip', ['addr', 'add', `${ip}/32`, 'dev', 'lo']);
    const server = lab.spawn(NS, {
      name: 'targets',
      command: process.execPath,
      args: ['-e', `require('node:http').createServer((q, s) => s.end('ok')).listen(${PORT}, '0.0.0.0', () => console.log('listening'))`],
    });
    await server.waitForLine((l) => l === 'listening', 10_000);
    squid = await startSquid({ name: 'ns-squid', hosts: NAMES, spawn: (o) => lab!.spawn(NS, o) });
  }, 300_000);

  afterAll(async () => {
    await squid?.close();
    await killAllSpawned();
    await lab?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('every destination', async (ctx) => {
    if (!lab || !squid) {
      ctx.skip(netnsUnavailableReason() ?? 'network namespaces unavailable');
      return;
    }
    const proxy = `http://127.0.0.1:${squid.port}`;
    const envFile = path.join(dir, 'proxy.env');
    const r = await runCommand(process.execPath, [
      CLI,
      'proxy-config',
      'render',
      '--format',
      'env',
      '--out',
      dir,
      '--http-proxy',
      proxy,
      '--https-proxy',
      proxy,
      '--no-proxy',
      'corp.example',
      '--pod-cidr',
      '10.244.0.0/16',
      '--service-cidr',
      '10.96.0.0/12',
      '--apiserver-ip',
      ADDRESSES.apiserver,
      '--hub',
      'hub.example.com:8091',
    ]);
    expect(r.code, r.stderr).toBe(0);
    const env: Record<string, string> = {};
    for (const line of (await readFile(envFile, 'utf8')).split('\n').filter(Boolean)) {
      const eq = line.indexOf('=');
      env[line.slice(0, eq)] = line.slice(eq + 1);
    }
    const noProxy = env['NO_PROXY']!;
    const resolve = Object.entries(NAMES).flatMap(([name, ip]) => ['--resolve', `${name}:${PORT}:${ip}`]);
    const results: Record<string, string> = {};
    for (const host of Object.keys(EXPECTED)) {
      const audit = explainNoProxy(noProxy, `${host}:${PORT}`).decision;
      expect(audit, `the audit's decision for ${host}`).toBe(EXPECTED[host]);
      // --proxytunnel: curl CONNECTs through the proxy for http:// too, and %{http_connect} says whether it did.
      const curl = await lab.exec(NS, 'env', [
        '-i',
        ...Object.entries(env).map(([k, v]) => `${k}=${v}`),
        'curl',
        '-s',
        '--max-time',
        '10',
        '--proxytunnel',
        ...resolve,
        '-o',
        '/dev/null',
        '-w',
        '%{http_connect} %{http_code}',
        `http://${host}:${PORT}/`,
      ]);
      const [connect, code] = curl.stdout.trim().split(' ');
      expect(code, `curl ${host}`).toBe('200');
      results[host] = connect === '200' ? 'proxy' : 'direct';
    }
    expect(results).toEqual(EXPECTED);
    // squid saw exactly the proxied ones.
    const proxied = Object.keys(EXPECTED)
      .filter((h) => EXPECTED[h] === 'proxy')
      .map((h) => `${h}:${PORT}`)
      .sort();
    for (const target of proxied) await squid.waitForAccessLog((l) => l.url === target, 10_000);
    const logged = [...new Set((await squid.accessLog()).filter((l) => l.method === 'CONNECT').map((l) => l.url))].sort();
    expect(logged).toEqual(proxied);
  }, 120_000);
});
