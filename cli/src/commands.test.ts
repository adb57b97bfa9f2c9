// `cluster-proxy token`, `get` and `kubeconfig` with the built CLI: output formats and every user
// mistake (one line on stderr, exit 2; a failure that is not the user's flags, exit 1). `get` and the
// cluster check of `kubeconfig` talk to a fake admin endpoint serving a canned /debug/connections.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { mkdir, readFile, stat, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCA } from '@cluster-proxy/server';

const CLI = fileURLToPath(new URL('../dist/main.js', import.meta.url));

interface RunResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

function cli(args: string[], opts: { env?: NodeJS.ProcessEnv; cwd?: string } = {}): Promise<RunResult> {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('CLUSTER_PROXY_') && k !== 'FORCE_COLOR'));
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], {
      env: { ...env, ...opts.env },
      cwd: opts.cwd,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

/** Exit 2 and exactly one line on stderr matching `want`. */
function expectUsage(r: RunResult, want: RegExp | string): void {
  expect(r.code, r.stderr).toBe(2);
  const lines = r.stderr.trimEnd().split('\n');
  expect(lines, r.stderr).toHaveLength(1);
  if (typeof want === 'string') expect(lines[0]).toBe(`cluster-proxy: ${want}`);
  else expect(lines[0]).toMatch(want);
}

const TOKEN = /^[A-Za-z0-9_-]{43}$/;
let tmp: string;
let admin: http.Server;
let adminAddr: string;
let connections: unknown;
let caFile: string;

const agent = (agentID: string, cluster: string, extra: object = {}): object => ({
  agentID,
  cluster,
  draining: false,
  hosts: [cluster, `${cluster}.open-cluster-management-agent-addon`],
  pending: 0,
  established: [],
  ...extra,
});

beforeAll(async () => {
  tmp = mkdtempSync(path.join(os.tmpdir(), 'cp-commands-'));
  connections = {
    serverID: 'srv-1',
    agents: [
      agent('a1', 'cluster1', {
        established: [
          { connectID: 1, address: 'cluster1:443', state: 'open' },
          { connectID: 2, address: 'cluster1:443', state: 'open' },
        ],
        pending: 1,
      }),
      agent('a2', 'cluster1', { draining: true }),
      agent('b1', 'cluster2'),
    ],
    frontends: [],
  };
  admin = http.createServer((req, res) => {
    if (req.url === '/debug/connections') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(connections));
    } else res.writeHead(404).end();
  });
  await new Promise<void>((r) => admin.listen(0, '127.0.0.1', r));
  adminAddr = `127.0.0.1:${(admin.address() as net.AddressInfo).port}`;
  caFile = path.join(tmp, 'ca.crt');
  await writeFile(caFile, createCA({ commonName: 'commands-test' }).certPem);
});

afterAll(async () => {
  admin?.closeAllConnections();
  await new Promise((r) => admin?.close(r));
  rmSync(tmp, { recursive: true, force: true });
});

describe('cluster-proxy token', () => {
  const dataDir = (): string => path.join(tmp, 'hub-tokens');

  it('issue prints the token alone on stdout, details on stderr; the file keeps only a hash (0600)', async () => {
    const r = await cli(['token', 'issue', '--name', 'ci-bot', '--cluster', 'cluster1', '--cluster', 'cluster2', '--data-dir', dataDir()]);
    expect(r.code, r.stderr).toBe(0);
    const token = r.stdout.trimEnd();
    expect(token).toMatch(TOKEN);
    expect(r.stdout).toBe(`${token}\n`);
    expect(r.stderr).toMatch(
      /^Issued token "ci-bot" \(id [0-9a-f]{16}\) for clusters cluster1, cluster2, expires \d{4}-\d\d-\d\dT.*Z; it is shown only this once\. Stored \(as a hash\) in .*tokens\.json\.\n$/,
    );
    expect(r.stderr).not.toContain(token);
    const file = path.join(dataDir(), 'tokens.json');
    expect(await readFile(file, 'utf8')).not.toContain(token);
    expect((await stat(file)).mode & 0o777).toBe(0o600);
  });

  it('issue -o json, --ttl 0 (never), no --cluster (every cluster)', async () => {
    const r = await cli(['token', 'issue', '--name', 'admin', '--ttl', '0', '-o', 'json', '--data-dir', dataDir()]);
    expect(r.code, r.stderr).toBe(0);
    const doc = JSON.parse(r.stdout) as { id: string; name: string; token: string; clusters: string; expiresAt: null };
    expect(doc).toMatchObject({ name: 'admin', clusters: '*', expiresAt: null });
    expect(doc.token).toMatch(TOKEN);
    expect(r.stderr).toContain('for every cluster, never expires');
  });

  it('list: a table without secrets, and -o json / -o yaml', async () => {
    const r = await cli(['token', 'list', '--data-dir', dataDir()]);
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^NAME\s+ID\s+CLUSTERS\s+AGE\s+EXPIRES$/);
    expect(lines[1]).toMatch(/^ci-bot\s+[0-9a-f]{16}\s+cluster1,cluster2\s+\d+s\s+23h$/);
    expect(lines[2]).toMatch(/^admin\s+[0-9a-f]{16}\s+\*\s+\d+s\s+<never>$/);
    const json = await cli(['token', 'list', '-o', 'json', '--data-dir', dataDir()]);
    const tokens = (JSON.parse(json.stdout) as { tokens: { name: string; expired: boolean }[] }).tokens;
    expect(tokens.map((t) => t.name)).toEqual(['ci-bot', 'admin']);
    expect(json.stdout).not.toMatch(/sha256|[A-Za-z0-9_-]{43}/);
    const yaml = await cli(['token', 'list', '-o', 'yaml', '--data-dir', dataDir()]);
    expect(yaml.stdout).toMatch(/^tokens:\n- id: [0-9a-f]{16}\n  name: ci-bot\n  clusters:\n  - cluster1\n  - cluster2\n/);
  });

  it('revoke by name and by id; an unknown one is exit 1 with one line', async () => {
    const json = JSON.parse((await cli(['token', 'list', '-o', 'json', '--data-dir', dataDir()])).stdout) as {
      tokens: { id: string; name: string }[];
    };
    const adminId = json.tokens.find((t) => t.name === 'admin')!.id;
    const byName = await cli(['token', 'revoke', 'ci-bot', '--data-dir', dataDir()]);
    expect(byName.code, byName.stderr).toBe(0);
    expect(byName.stdout).toMatch(/^token "ci-bot" \(id [0-9a-f]{16}\) revoked\n$/);
    const byId = await cli(['token', 'revoke', adminId, '--data-dir', dataDir()]);
    expect(byId.stdout).toBe(`token "admin" (id ${adminId}) revoked\n`);
    const again = await cli(['token', 'revoke', 'ci-bot', '--data-dir', dataDir()]);
    expect(again.code).toBe(1);
    expect(again.stderr).toMatch(/^cluster-proxy: no token with id or name "ci-bot" in .*tokens\.json\n$/);
    const empty = await cli(['token', 'list', '--data-dir', dataDir()]);
    expect(empty.stdout).toBe('');
    expect(empty.stderr).toMatch(/^No tokens in .*tokens\.json\.\n$/);
  });

  it('--tokens-file instead of --data-dir, and from the environment', async () => {
    const file = path.join(tmp, 'elsewhere', 'my-tokens.json');
    const r = await cli(['token', 'issue', '--name', 'x', '--tokens-file', file]);
    expect(r.code, r.stderr).toBe(0);
    const listed = await cli(['token', 'list', '-o', 'json'], { env: { CLUSTER_PROXY_TOKENS_FILE: file } });
    expect((JSON.parse(listed.stdout) as { tokens: { name: string }[] }).tokens.map((t) => t.name)).toEqual(['x']);
  });

  it('user mistakes: one line, exit 2', async () => {
    const d = ['--data-dir', dataDir()];
    const cases: [string[], RegExp | string][] = [
      [['token'], 'token needs a command: issue, list or revoke'],
      [['token', 'mint', ...d], 'unknown token command "mint"; use issue, list or revoke'],
      [['token', 'issue', ...d], 'token issue needs --name NAME (who or what will use the token)'],
      [['token', 'issue', 'bob', ...d], 'token issue takes no arguments (got "bob"); name the token with --name'],
      [['token', 'issue', '--name', 'a', '--ttl', 'soon', ...d], '--ttl must be a duration like 500ms, 10s, 2m, 24h or 7d, got "soon"'],
      [['token', 'issue', '--name', 'a b', ...d], /^cluster-proxy: invalid token name "a b": /],
      [['token', 'issue', '--name', 'a', '--cluster', 'Not_A_Cluster', ...d], /^cluster-proxy: invalid cluster name "Not_A_Cluster"/],
      [['token', 'issue', '--name', 'a', '-o', 'xml', ...d], '-o must be json or yaml, got "xml"'],
      [['token', 'issue', '--name', 'a', '--bogus', ...d], 'unknown flag --bogus'],
      [['token', 'revoke', ...d], 'token revoke needs exactly one ID or NAME, e.g. "cluster-proxy token revoke ci-bot"'],
    ];
    const results = await Promise.all(cases.map(([args]) => cli(args)));
    results.forEach((r, i) => expectUsage(r, cases[i]![1]));
    await cli(['token', 'issue', '--name', 'dup', ...d]);
    expectUsage(await cli(['token', 'issue', '--name', 'dup', ...d]), 'a token named "dup" already exists; revoke it first');
    const corrupt = path.join(tmp, 'corrupt.json');
    await writeFile(corrupt, '{"version": 1, "tokens": 5}');
    expectUsage(
      await cli(['token', 'list', '--tokens-file', corrupt]),
      /^cluster-proxy: token file .*corrupt\.json is corrupt: "tokens" is not an array$/,
    );
  });

  it('--help on each command', async () => {
    for (const sub of ['issue', 'list', 'revoke']) {
      const r = await cli(['token', sub, '--help']);
      expect(r.code).toBe(0);
      expect(r.stdout).toContain(`Usage: cluster-proxy token ${sub}`);
      expect(r.stdout).toContain('--data-dir');
    }
  });
});

describe('cluster-proxy get', () => {
  const a = (): string[] => ['--admin', adminAddr];

  it("clusters: a kubectl-style table from the hub's admin endpoint", async () => {
    const r = await cli(['get', 'clusters', ...a()]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe(
      [
        'NAME       AGENTS   AVAILABLE   CONNECTIONS   PENDING',
        'cluster1   2        True        2             1',
        'cluster2   1        True        0             0',
        '',
      ].join('\n'),
    );
  });

  it('agents, -o wide, a NAME, --no-headers', async () => {
    const r = await cli(['get', 'agents', '-o', 'wide', ...a()]);
    expect(r.stdout.split('\n')[0]).toMatch(/^CLUSTER\s+AGENT ID\s+STATUS\s+CONNECTIONS\s+PENDING\s+HOSTS\s+SERVER$/);
    expect(r.stdout).toMatch(/^cluster1\s+a2\s+Draining\s+0\s+0\s+cluster1,cluster1\.open-cluster-management-agent-addon\s+srv-1$/m);
    const one = await cli(['get', 'agents', 'cluster2', '--no-headers', ...a()]);
    expect(one.stdout).toMatch(/^cluster2\s+b1\s+Connected\s+0\s+0\n$/);
    const wide = await cli(['get', 'clusters', 'cluster1', '-owide', ...a()]);
    expect(wide.stdout).toMatch(/^cluster1\s+2\s+True\s+2\s+1\s+cluster1,cluster1\.open-cluster-management-agent-addon\s+a1,a2$/m);
  });

  it('-o json and -o yaml', async () => {
    const j = await cli(['get', 'clusters', '-o', 'json', ...a()]);
    expect(JSON.parse(j.stdout)).toEqual({
      kind: 'ClusterList',
      serverID: 'srv-1',
      items: [
        {
          name: 'cluster1',
          agents: 2,
          available: true,
          connections: 2,
          pending: 1,
          hosts: ['cluster1', 'cluster1.open-cluster-management-agent-addon'],
          agentIDs: ['a1', 'a2'],
        },
        {
          name: 'cluster2',
          agents: 1,
          available: true,
          connections: 0,
          pending: 0,
          hosts: ['cluster2', 'cluster2.open-cluster-management-agent-addon'],
          agentIDs: ['b1'],
        },
      ],
    });
    const y = await cli(['get', 'agents', 'b1', '--output', 'yaml', ...a()]);
    expect(y.stdout).toBe(
      [
        'kind: AgentList',
        'serverID: srv-1',
        'items:',
        '- agentID: b1',
        '  cluster: cluster2',
        '  status: Connected',
        '  connections: 0',
        '  pending: 0',
        '  hosts:',
        '  - cluster2',
        '  - cluster2.open-cluster-management-agent-addon',
        '  serverID: srv-1',
        '',
      ].join('\n'),
    );
  });

  it('finds the admin port in DATA_DIR/ports.json', async () => {
    const dir = path.join(tmp, 'hub-ports');
    await mkdir(dir, { recursive: true });
    await writeFile(path.join(dir, 'ports.json'), JSON.stringify({ admin: Number(adminAddr.split(':')[1]) }));
    const r = await cli(['get', 'clusters', '--data-dir', dir]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain('cluster2');
  });

  it('"No resources found." on stderr when no agent is connected', async () => {
    const saved = connections;
    connections = { serverID: 'srv-1', agents: [], frontends: [] };
    try {
      const r = await cli(['get', 'clusters', '-A', ...a()]);
      expect(r).toEqual({ code: 0, stdout: '', stderr: 'No resources found.\n' });
    } finally {
      connections = saved;
    }
  });

  it('managedclusteraddons and managedclusters from a hub that is not running: exit 1 with one line', async () => {
    for (const what of ['managedclusteraddons', 'managedclusters']) {
      const r = await cli(['get', what, '-A', '--admin', '127.0.0.1:1']);
      expect(r.code).toBe(1);
      expect(r.stderr).toBe(
        "cluster-proxy: cannot reach the hub's admin endpoint at 127.0.0.1:1 (ECONNREFUSED); is the hub running? (set --admin HOST:PORT or --data-dir)\n",
      );
    }
  });

  it('a hub that is not running, an unknown NAME: exit 1 with one line', async () => {
    const down = await cli(['get', 'clusters', '--admin', '127.0.0.1:1']);
    expect(down.code).toBe(1);
    expect(down.stderr).toBe(
      "cluster-proxy: cannot reach the hub's admin endpoint at 127.0.0.1:1 (ECONNREFUSED); is the hub running? (set --admin HOST:PORT or --data-dir)\n",
    );
    const missing = await cli(['get', 'clusters', 'cluster9', ...a()]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toBe('cluster-proxy: cluster "cluster9" not found: no agent of that cluster is connected to the hub\n');
  });

  it('user mistakes: one line, exit 2', async () => {
    const cases: [string[], string][] = [
      [['get'], 'get needs a resource: clusters, agents, managedclusters or managedclusteraddons'],
      [['get', 'pods'], 'unknown resource "pods"; use clusters, agents, managedclusters or managedclusteraddons'],
      [['get', 'clusters', '-o', 'xml', ...a()], '-o must be wide, json or yaml, got "xml"'],
      [['get', 'clusters', 'a', 'b', ...a()], 'get clusters takes at most one NAME, got "a b"'],
      [['get', 'clusters', '--admin', 'nope'], '--admin "nope" is not HOST:PORT'],
      [['get', 'clusters', '--watch'], 'unknown flag --watch'],
    ];
    const results = await Promise.all(cases.map(([args]) => cli(args)));
    results.forEach((r, i) => expectUsage(r, cases[i]![1]));
  });
});

describe('cluster-proxy kubeconfig', () => {
  const hubDir = (): string => path.join(tmp, 'hub-kc');
  const base = (): string[] => ['--data-dir', hubDir(), '--admin', adminAddr, '--hub-ca', caFile];

  beforeAll(async () => {
    await mkdir(hubDir(), { recursive: true });
    await writeFile(path.join(hubDir(), 'ports.json'), JSON.stringify({ connect: 18089, frontend: 18090 }));
  });

  it('writes to stdout by default: proxy-url with a freshly issued token for that cluster, hub + apiserver CA bundle', async () => {
    const r = await cli(['kubeconfig', 'cluster1', '--apiserver-ca', caFile, ...base()]);
    expect(r.code, r.stderr).toBe(0);
    const m = /proxy-url: https:\/\/(kubeconfig-cluster1-[0-9a-f]{6}):([A-Za-z0-9_-]{43})@127\.0\.0\.1:18089\n/.exec(r.stdout);
    expect(m, r.stdout).not.toBeNull();
    expect(r.stdout).toContain('server: https://cluster1\n');
    expect(r.stdout).toContain('current-context: cluster1');
    const ca = Buffer.from(/certificate-authority-data: (\S+)\n/.exec(r.stdout)![1]!, 'base64').toString('utf8');
    expect(ca.match(/BEGIN CERTIFICATE/g)).toHaveLength(2);
    expect(r.stderr).toContain(
      `kubeconfig for cluster cluster1 via the hub's CONNECT frontend 127.0.0.1:18089; issued token "${m![1]}" for cluster1`,
    );
    expect(r.stderr).toContain('note: the kubeconfig has no apiserver credentials');
    const tokens = JSON.parse((await cli(['token', 'list', '-o', 'json', '--data-dir', hubDir()])).stdout) as {
      tokens: { name: string; clusters: string[] }[];
    };
    expect(tokens.tokens.find((t) => t.name === m![1])?.clusters).toEqual(['cluster1']);
  });

  it('unknown cluster: exit 2 naming the connected ones; --no-check writes it anyway; an unreachable hub only notes it', async () => {
    expectUsage(
      await cli(['kubeconfig', 'cluster9', ...base()]),
      'unknown cluster "cluster9": no agent of it is connected to the hub (connected: cluster1, cluster2); pass --no-check to write the kubeconfig anyway',
    );
    const forced = await cli(['kubeconfig', 'cluster9', '--no-check', '--token', 'x'.repeat(43), ...base()]);
    expect(forced.code, forced.stderr).toBe(0);
    expect(forced.stdout).toContain(`https://cluster-proxy:${'x'.repeat(43)}@127.0.0.1:18089`);
    const down = await cli(['kubeconfig', 'cluster9', '--token', 't', '--data-dir', hubDir(), '--admin', '127.0.0.1:1']);
    expect(down.code, down.stderr).toBe(0);
    expect(down.stderr).toContain('note: could not check that an agent of "cluster9" is connected (hub admin 127.0.0.1:1 unreachable)');
    expect(down.stderr).toMatch(/^warning: no --apiserver-ca/m);
    expect(down.stdout).toContain('insecure-skip-tls-verify: true');
  });

  it('--via forward: server on the local port with tls-server-name, and the forward command to start', async () => {
    const r = await cli([
      'kubeconfig',
      'cluster2',
      '--via',
      'forward',
      '--listen',
      '127.0.0.1:16443',
      '--apiserver-ca',
      caFile,
      '--apiserver-token',
      'sa',
      '--out',
      path.join(tmp, 'fwd.kubeconfig'),
      ...base(),
    ]);
    expect(r.code, r.stderr).toBe(0);
    const text = await readFile(path.join(tmp, 'fwd.kubeconfig'), 'utf8');
    expect(text).toContain('server: https://127.0.0.1:16443\n');
    expect(text).toContain('tls-server-name: cluster2');
    expect(text).toContain('token: sa');
    expect(text).not.toContain('proxy-url');
    expect(r.stderr).toMatch(/forward cluster2 cluster2:443 --listen 127\.0\.0\.1:16443 --frontend 127\.0\.0\.1:18090 /);
  });

  it('an --out that cannot be written: exit 2, and the token issued for it is revoked again', async () => {
    const before = (JSON.parse((await cli(['token', 'list', '-o', 'json', '--data-dir', hubDir()])).stdout) as { tokens: unknown[] }).tokens
      .length;
    await writeFile(path.join(tmp, 'a-file'), '');
    expectUsage(
      await cli(['kubeconfig', 'cluster1', '--out', path.join(tmp, 'a-file', 'kc'), ...base()]),
      /^cluster-proxy: cannot write --out .*a-file\/kc: (ENOTDIR|EEXIST)$/,
    );
    const after = (JSON.parse((await cli(['token', 'list', '-o', 'json', '--data-dir', hubDir()])).stdout) as { tokens: unknown[] }).tokens
      .length;
    expect(after).toBe(before);
  });

  it('user mistakes: one line, exit 2', async () => {
    const cases: [string[], RegExp | string][] = [
      [['kubeconfig'], 'kubeconfig needs exactly one CLUSTER, e.g. "cluster-proxy kubeconfig cluster1 --out cluster1.kubeconfig"'],
      [
        ['kubeconfig', 'a', 'b'],
        'kubeconfig needs exactly one CLUSTER, e.g. "cluster-proxy kubeconfig cluster1 --out cluster1.kubeconfig"',
      ],
      [['kubeconfig', 'Cluster_1'], '"Cluster_1" is not a cluster name (lower-case letters, digits, "-" and ".")'],
      [['kubeconfig', 'cluster1', '--via', 'ssh'], '--via must be connect, forward or gateway, got "ssh"'],
      [['kubeconfig', 'cluster1', '--gateway', '127.0.0.1:9092'], '--gateway works only with --via gateway'],
      [
        ['kubeconfig', 'cluster1', '--exec-command', 'kubectl-oidc_login'],
        "--exec-command works only with --via gateway (the hub authenticates the plugin's credential)",
      ],
      [['kubeconfig', 'cluster1', '--via', 'gateway', '--exec-arg', 'get-token'], '--exec-arg goes with --exec-command'],
      [['kubeconfig', 'cluster1', '--ttl', 'forever', ...base()], '--ttl must be a duration like 500ms, 10s, 2m, 24h or 7d, got "forever"'],
      [
        ['kubeconfig', 'cluster1', '--apiserver-ca', path.join(tmp, 'nope.crt'), ...base()],
        /^cluster-proxy: cannot read --apiserver-ca .*nope\.crt: ENOENT$/,
      ],
      [['kubeconfig', 'cluster1', '--apiserver-ca', CLI, ...base()], /^cluster-proxy: --apiserver-ca .*main\.js holds no PEM certificate$/],
      [
        ['kubeconfig', 'cluster1', '--apiserver-ca', caFile, '--data-dir', path.join(tmp, 'no-hub'), '--admin', adminAddr],
        /^cluster-proxy: cannot read the hub CA .*no-hub\/pki\/ca\.crt: ENOENT \(pass --hub-ca FILE or the hub's --data-dir\)$/,
      ],
      [
        ['kubeconfig', 'cluster1', '--tls-server-name', 'kubernetes.default.svc', ...base()],
        "--tls-server-name works only with --via forward: kubectl would verify the hub's certificate against that name too",
      ],
      [
        ['kubeconfig', 'cluster1', '--via', 'forward', '--token', 't', ...base()],
        '--token works only with --via connect (a forward authenticates with a client certificate)',
      ],
      [['kubeconfig', 'cluster1', '--connect', 'hub', ...base()], '--connect "hub" is not HOST:PORT'],
    ];
    const results = await Promise.all(cases.map(([args]) => cli(args)));
    results.forEach((r, i) => expectUsage(r, cases[i]![1]));
  });
});

describe('cluster-proxy ca issue-client', () => {
  const hubDir = (): string => path.join(tmp, 'hub-ca');
  beforeAll(async () => {
    const { writePemPair } = await import('@cluster-proxy/server');
    await writePemPair(path.join(hubDir(), 'pki'), 'ca', createCA({ commonName: 'issue-client-test' }));
  });

  it('writes NAME.crt and NAME.key (0600) signed by the hub CA, with the name as CN and --group as O', async () => {
    const out = path.join(tmp, 'alice-out');
    const r = await cli(['ca', 'issue-client', 'alice', '--group', 'sre', '--validity', '30d', '--out', out, '--data-dir', hubDir()]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe(`${path.join(out, 'alice.crt')}\n${path.join(out, 'alice.key')}\n`);
    const { X509Certificate, createPrivateKey } = await import('node:crypto');
    const cert = new X509Certificate(await readFile(path.join(out, 'alice.crt')));
    expect(cert.subject).toBe('O=sre\nCN=alice');
    expect(cert.checkIssued(new X509Certificate(await readFile(path.join(hubDir(), 'pki', 'ca.crt'))))).toBe(true);
    expect(cert.checkPrivateKey(createPrivateKey(await readFile(path.join(out, 'alice.key'))))).toBe(true);
    expect(Math.round((Date.parse(cert.validTo) - Date.now()) / 86_400_000)).toBe(30);
    expect((await stat(path.join(out, 'alice.key'))).mode & 0o777).toBe(0o600);
    expect(r.stdout + r.stderr).not.toContain('PRIVATE KEY');
  });

  it('user mistakes: one line, exit 2; an existing key is not overwritten', async () => {
    const d = ['--data-dir', hubDir()];
    const cases: [string[], RegExp | string][] = [
      [['ca', 'issue-client', ...d], "ca issue-client takes one NAME (the user, written as the certificate's CN)"],
      [['ca', 'issue-client', 'a b', ...d], /^cluster-proxy: invalid client name "a b"/],
      [
        ['ca', 'issue-client', 'bob', '--validity', 'soon', ...d],
        '--validity must be a duration like 500ms, 10s, 2m, 24h or 7d, got "soon"',
      ],
      [
        ['ca', 'issue-client', 'bob', '--data-dir', path.join(tmp, 'no-hub')],
        /^cluster-proxy: ca issue-client needs the hub's data-dir PKI: /,
      ],
      [['ca', 'sign'], 'usage: cluster-proxy ca rotate add|promote|finish, ca issue-client NAME, or ca issue-agent CLUSTER'],
    ];
    const results = await Promise.all(cases.map(([args]) => cli(args, { cwd: tmp })));
    results.forEach((r, i) => expectUsage(r, cases[i]![1]));
    const out = path.join(tmp, 'carol-out');
    expect((await cli(['ca', 'issue-client', 'carol', '--out', out, ...d])).code).toBe(0);
    const key = await readFile(path.join(out, 'carol.key'));
    expectUsage(await cli(['ca', 'issue-client', 'carol', '--out', out, ...d]), /exists; choose another --out or NAME$/);
    expect((await readFile(path.join(out, 'carol.key'))).equals(key)).toBe(true);
  });
});
