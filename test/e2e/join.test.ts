// Registering a cluster, as a user types it: `cluster-proxy hub` (embedded store, its own PKI),
// `cluster-proxy join c1`, the agent started from the printed line → `get managedclusteraddons -A`
// says Available True; the agent killed → False within the hub's tunnel-loss window; back → True.
// Plus registration's error paths seen from the command line.
import { mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Tunnel } from '@cluster-proxy/client';
import { echoRoundTripForTest } from '../src/join-helpers.js';
import {
  killAllSpawned,
  runCommand,
  spawnProcess,
  startEchoServer,
  waitFor,
  type ManagedProcess,
  type TcpTarget,
} from '../src/fixtures/index.js';
import { CLI } from '../src/harness.js';

const WINDOW = '3s';

describe('hub + join + agent from the printed bundle', () => {
  let dir = '';
  let hub: ManagedProcess;
  let echo: TcpTarget;
  let adminPort = 0;
  let agentPort = 0;
  const agents: ManagedProcess[] = [];
  let agentArgs: string[] = [];
  const adminTables = async (): Promise<{ agents: { cluster: string }[] }> =>
    (await (await fetch(`http://127.0.0.1:${adminPort}/debug/connections`)).json()) as { agents: { cluster: string }[] };
  const cli = (args: string[]) => runCommand(process.execPath, [CLI, ...args], { cwd: dir, timeoutMs: 20_000 });

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'cp-join-'));
    echo = await startEchoServer();
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
        '--tunnel-loss-window',
        WINDOW,
        '--log-format',
        'json',
      ],
    });
    await hub.waitForJsonLine((o) => o['msg'] === 'proxy server listening', 20_000);
    const ports = JSON.parse(await readFile(path.join(dir, 'hub', 'ports.json'), 'utf8')) as { admin: number; agent: number };
    adminPort = ports.admin;
    agentPort = ports.agent;
  });

  afterAll(async () => {
    await Promise.all(agents.map((a) => a.stop(5000)));
    await hub?.stop(8000);
    await killAllSpawned();
    await echo?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  async function addonRow(cluster: string): Promise<string[] | undefined> {
    const r = await cli(['get', 'managedclusteraddons', '-A', '--data-dir', 'hub']);
    if (r.code !== 0) throw new Error(r.stderr);
    return r.stdout
      .split('\n')
      .map((l) => l.trim().split(/\s+/))
      .find((cols) => cols[0] === cluster);
  }

  it('join writes the bundle (token 0600, not printed) and prints the agent line; the agent bootstraps and the addon turns Available', async () => {
    const r = await cli(['join', 'c1', '--data-dir', 'hub', '--out', 'c1-bundle']);
    expect(r.code, r.stderr).toBe(0);
    const token = (await readFile(path.join(dir, 'c1-bundle', 'bootstrap-token'), 'utf8')).trim();
    expect(token.length).toBeGreaterThan(20);
    expect(r.stdout).not.toContain(token);
    expect((await stat(path.join(dir, 'c1-bundle', 'bootstrap-token'))).mode & 0o777).toBe(0o600);
    const manifests = await readFile(path.join(dir, 'c1-bundle', 'manifests.yaml'), 'utf8');
    expect(manifests).toContain('kind: Deployment');
    expect(manifests).toContain(`127.0.0.1:${agentPort}`);

    const line = r.stdout.split('\n').find((l) => l.trim().startsWith('cluster-proxy agent '));
    expect(line, r.stdout).toBeDefined();
    const args = line!
      .trim()
      .split(/\s+/)
      .slice(1)
      .map((a) => (a === 'HOST:PORT' ? `127.0.0.1:${echo.port}` : a));
    agentArgs = args;
    const agent = spawnProcess({
      name: 'agent-c1',
      command: process.execPath,
      cwd: dir,
      args: [CLI, ...args, '--health-port', '0', '--lease-duration', '1s', '--log-format', 'json'],
    });
    agents.push(agent);

    const row = await waitFor(
      async () => {
        const c = await addonRow('c1');
        return c?.[2] === 'True' ? c : undefined;
      },
      { timeoutMs: 20_000, intervalMs: 300, message: 'c1 Available True' },
    );
    expect(row.slice(0, 3)).toEqual(['c1', 'cluster-proxy', 'True']);
    // The private key was made on the agent's side and stays there.
    expect((await stat(path.join(dir, 'c1-bundle', 'credentials'))).isDirectory()).toBe(true);

    // And the tunnel carries data to the agent's apiserver address.
    const tunnel = new Tunnel({
      address: `127.0.0.1:${(JSON.parse(await readFile(path.join(dir, 'hub', 'ports.json'), 'utf8')) as { frontend: number }).frontend}`,
      serverName: 'localhost',
      caCert: await readFile(path.join(dir, 'hub', 'pki', 'ca.crt')),
      cert: await readFile(path.join(dir, 'hub', 'pki', 'client.crt')),
      key: await readFile(path.join(dir, 'hub', 'pki', 'client.key')),
    });
    try {
      const s = await tunnel.dial('c1:443');
      expect((await echoRoundTripForTest(s, Buffer.from('hello'))).toString()).toBe('hello');
      s.destroy();
    } finally {
      tunnel.close();
    }
  });

  it('the bootstrap token is single use: a second agent with it is refused with a clear error', async () => {
    const again = spawnProcess({
      name: 'agent-reuse',
      command: process.execPath,
      cwd: dir,
      args: [
        CLI,
        'agent',
        '--cluster',
        'c1',
        '--hub',
        `127.0.0.1:${agentPort}`,
        '--ca-cert',
        'c1-bundle/ca.crt',
        '--bootstrap-token-file',
        'c1-bundle/bootstrap-token',
        '--credentials-dir',
        'other-creds',
        '--apiserver',
        `127.0.0.1:${echo.port}`,
        '--health-port',
        '0',
        '--log-format',
        'json',
      ],
    });
    agents.push(again);
    await again.waitForLine((l) => /already used/.test(l), 15_000);
    await again.stop(3000);
  });

  it('killing the agent turns Available False within the window; a restart brings it back', async () => {
    const agent = agents[0]!;
    agent.kill('SIGKILL');
    await agent.exited;
    const t0 = Date.now();
    await waitFor(async () => (await addonRow('c1'))?.[2] === 'False', {
      timeoutMs: 15_000,
      intervalMs: 250,
      message: 'c1 Available False',
    });
    // Not a speed assertion: the window is the product's promise (3 s here, plus the status loop's period).
    expect(Date.now() - t0).toBeLessThan(12_000);
    // Restarted with the same credentials directory: no token needed (it was used up), the key stays.
    const args = [...agentArgs];
    const back = spawnProcess({
      name: 'agent-c1-again',
      command: process.execPath,
      cwd: dir,
      args: [CLI, ...args, '--health-port', '0', '--lease-duration', '1s', '--log-format', 'json'],
    });
    agents.push(back);
    await waitFor(async () => (await addonRow('c1'))?.[2] === 'True', {
      timeoutMs: 15_000,
      intervalMs: 250,
      message: 'c1 Available True again',
    });
  });

  it('delete cluster revokes it: its tunnel is cut, the agent cannot reconnect, the addon row goes away', async () => {
    const agent = agents[agents.length - 1]!;
    const mark = agent.lineCount();
    const r = await cli(['delete', 'cluster', 'c1', '--data-dir', 'hub']);
    expect(r.code, r.stderr).toBe(0);
    await waitFor(async () => (await addonRow('c1')) === undefined, { timeoutMs: 10_000, intervalMs: 250, message: 'c1 addon removed' });
    await waitFor(async () => (await adminTables()).agents.every((a) => a.cluster !== 'c1'), {
      timeoutMs: 10_000,
      message: 'c1 tunnel closed',
    });
    await agent.waitForLine((l) => /not registered with the hub/.test(l), 15_000, { after: mark });
    expect((await adminTables()).agents.filter((a) => a.cluster === 'c1')).toEqual([]);
    const again = await cli(['delete', 'cluster', 'c1', '--data-dir', 'hub']);
    expect(again.code).toBe(2);
    expect(again.stderr).toMatch(/not registered/);
  });

  it('join --namespace records the install namespace on the addon (spec.installNamespace)', async () => {
    const r = await cli(['join', 'c2', '--namespace', 'proxy-agents', '--data-dir', 'hub', '--out', 'c2-bundle']);
    expect(r.code, r.stderr).toBe(0);
    expect(await readFile(path.join(dir, 'c2-bundle', 'manifests.yaml'), 'utf8')).toContain('namespace: proxy-agents');
    const addon = await waitFor(
      async () => {
        const g = await cli(['get', 'managedclusteraddons', 'c2', '-o', 'json', '--data-dir', 'hub']);
        const items = (JSON.parse(g.stdout || '{"items":[]}') as { items: { spec: { installNamespace: string } }[] }).items;
        return items[0];
      },
      { timeoutMs: 10_000, intervalMs: 250, message: 'c2 addon' },
    );
    expect(addon.spec.installNamespace).toBe('proxy-agents');
  });

  it('join refuses bad names with one line and exit 2', async () => {
    const r = await cli(['join', 'Not_A_Name', '--data-dir', 'hub']);
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/DNS-1123/);
  });
});
