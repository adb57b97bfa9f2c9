// Addon health with real processes: OCM's lease-only timing (Available stays True for 5 lease
// durations after the agent dies), Degraded when the agent cannot reach its apiserver, and the admin
// views (`get managedclusteraddons -A` plain, -o wide, -o json, -o yaml; `get managedclusters`).
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { runCommand, startEchoServer, waitFor, type TcpTarget } from '../src/fixtures/index.js';
import { CLI, startAgent, type AgentProcess, type HubProcess, type TestPki } from '../src/harness.js';
import { startEchoHub, type EchoHub } from '../src/e2e-setup.js';

describe('addon health from leases and agent reports', () => {
  let setup: EchoHub;
  let pki: TestPki;
  let hub: HubProcess;
  let echo: TcpTarget;
  const agents: AgentProcess[] = [];
  const cli = (args: string[]) =>
    runCommand(process.execPath, [CLI, ...args, '--admin', `127.0.0.1:${hub.ports.admin}`], { timeoutMs: 20_000 });
  const addon = async (
    cluster: string,
  ): Promise<{ status?: { conditions?: { type: string; status: string; reason: string; message: string }[] } } | undefined> => {
    const r = await cli(['get', 'managedclusteraddons', '-A', '-o', 'json']);
    if (r.code !== 0) throw new Error(r.stderr);
    return (JSON.parse(r.stdout) as { items: { metadata: { namespace: string } }[] }).items.find((i) => i.metadata.namespace === cluster);
  };
  const condition = async (cluster: string, type: string) => (await addon(cluster))?.status?.conditions?.find((c) => c.type === type);

  beforeAll(async () => {
    // Lease-only mode: OCM's timing, no help from the hub's view of the tunnels.
    setup = await startEchoHub((p) => ['--ca-key', path.join(p.dir, 'ca.key'), '--health-mode', 'lease']);
    ({ pki, echo, hub } = setup);
    for (const c of ['c1', 'c2']) {
      const r = await cli(['join', c, '--out', path.join(pki.dir, `${c}-bundle`)]);
      expect(r.code, r.stderr).toBe(0);
    }
  });
  afterAll(async () => {
    await Promise.all(agents.map((a) => a.stop()));
    await setup?.stop();
  });

  it('before any agent: Available Unknown (lease not found), Progressing Installing', async () => {
    await waitFor(async () => (await condition('c1', 'Available'))?.status === 'Unknown', {
      timeoutMs: 10_000,
      intervalMs: 200,
      message: 'c1 Available Unknown',
    });
    expect(await condition('c1', 'Available')).toMatchObject({ reason: 'ManagedClusterAddOnLeaseNotFound' });
    expect(await condition('c1', 'Progressing')).toMatchObject({ status: 'True', reason: 'Installing' });
  });

  it('agent up → Available True, Degraded False; the tables show it (plain, wide, yaml)', async () => {
    agents.push(await startAgent(pki, hub, { cluster: 'c1', apiserver: `127.0.0.1:${echo.port}`, args: ['--lease-duration', '1s'] }));
    await waitFor(async () => (await condition('c1', 'Available'))?.status === 'True', {
      timeoutMs: 15_000,
      intervalMs: 200,
      message: 'c1 Available True',
    });
    await waitFor(async () => (await condition('c1', 'Degraded'))?.status === 'False', {
      timeoutMs: 10_000,
      intervalMs: 200,
      message: 'c1 Degraded False',
    });
    expect(await condition('c1', 'Progressing')).toMatchObject({ status: 'False', reason: 'Completed' });

    const plain = await cli(['get', 'managedclusteraddons', '-A']);
    const lines = plain.stdout
      .trim()
      .split('\n')
      .map((l) => l.trim().split(/\s+/));
    expect(lines[0]).toEqual(['NAMESPACE', 'NAME', 'AVAILABLE', 'DEGRADED', 'PROGRESSING']);
    expect(lines.find((l) => l[0] === 'c1')).toEqual(['c1', 'cluster-proxy', 'True', 'False', 'False']);
    expect(lines.find((l) => l[0] === 'c2')).toEqual(['c2', 'cluster-proxy', 'Unknown', 'Unknown', 'True']);

    const wide = (await cli(['get', 'managedclusteraddons', '-A', '-o', 'wide'])).stdout.trim().split('\n');
    expect(wide[0]).toMatch(/^NAMESPACE\s+NAME\s+AVAILABLE\s+DEGRADED\s+PROGRESSING\s+LEASE AGE\s+SERVERS\s+AGENT VERSION$/);
    expect(wide.find((l) => l.startsWith('c1'))).toMatch(/\s\d+s\s+1\/1\s+0\.1\.0$/);
    expect(wide.find((l) => l.startsWith('c2'))).toMatch(/<none>\s+<none>\s+<none>$/);

    const yaml = parseYaml((await cli(['get', 'managedclusteraddons', '-A', '-o', 'yaml'])).stdout) as {
      kind: string;
      items: { kind: string; metadata: { name: string } }[];
    };
    expect(yaml.kind).toBe('List');
    expect(yaml.items.map((i) => `${i.kind}/${i.metadata.name}`)).toEqual([
      'ManagedClusterAddOn/cluster-proxy',
      'ManagedClusterAddOn/cluster-proxy',
    ]);

    const clusters = (await cli(['get', 'managedclusters'])).stdout
      .trim()
      .split('\n')
      .map((l) => l.trim().split(/\s+/));
    expect(clusters.slice(1).map((l) => l.slice(0, 2))).toEqual([
      ['c1', 'true'],
      ['c2', 'true'],
    ]);
  });

  it("lease-only mode keeps OCM's timing: Available stays True right after the agent dies, turns False after 5 lease durations", async () => {
    const agent = agents.shift()!;
    agent.proc.kill('SIGKILL');
    await agent.proc.exited;
    expect((await condition('c1', 'Available'))?.status).toBe('True');
    const stopped = await waitFor(
      async () => {
        const c = await condition('c1', 'Available');
        return c?.status === 'False' ? c : undefined;
      },
      { timeoutMs: 20_000, intervalMs: 250, message: 'c1 Available False' },
    );
    expect(stopped.reason).toBe('ManagedClusterAddOnLeaseUpdateStopped');
  });

  it('Degraded True, naming the problem, when the agent cannot reach its apiserver', async () => {
    const closed = await startEchoServer();
    const deadPort = closed.port;
    await closed.close();
    agents.push(await startAgent(pki, hub, { cluster: 'c2', apiserver: `127.0.0.1:${deadPort}`, args: ['--lease-duration', '1s'] }));
    const d = await waitFor(
      async () => {
        const c = await condition('c2', 'Degraded');
        return c?.status === 'True' ? c : undefined;
      },
      { timeoutMs: 15_000, intervalMs: 200, message: 'c2 Degraded True' },
    );
    expect(d.reason).toBe('ApiserverUnreachable');
    expect(d.message).toContain(`127.0.0.1:${deadPort}`);
    expect((await condition('c2', 'Available'))?.status).toBe('True');
  });

  it('ManagedProxyConfiguration reports its certificate conditions with Expiry messages', async () => {
    const list = (await (await fetch(`http://127.0.0.1:${hub.ports.admin}/v1/managedproxyconfigurations`)).json()) as {
      items: { metadata: { name: string }; status?: { conditions?: { type: string; status: string; message: string }[] } }[];
    };
    expect(list.items.map((i) => i.metadata.name)).toEqual(['cluster-proxy']);
    const conds = list.items[0]!.status?.conditions ?? [];
    expect(conds.map((c) => `${c.type}=${c.status}`)).toEqual([
      'ProxyServerDeployed=True',
      'ProxyServerSecretSigned=True',
      'AgentServerSecretSigned=True',
    ]);
    for (const c of conds.slice(1)) expect(c.message).toMatch(/^Expiry: \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
  });
});
