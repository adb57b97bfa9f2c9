// `agent --credentials-secret`: key, certificate and hub CA bundle also kept in a Secret of the agent's
// cluster (here the local API server that speaks the Kubernetes paths, reached through KUBECONFIG), so a
// new pod with an empty credentials directory — a rescheduled one, or a second replica started with the
// same single-use token — gets back in without a new token.
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { X509Certificate } from 'node:crypto';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  killAllSpawned,
  runCommand,
  spawnProcess,
  startEchoServer,
  startFakeKubeApiServer,
  waitFor,
  type FakeKubeApiServer,
  type ManagedProcess,
  type TcpTarget,
} from '../src/fixtures/index.js';
import { CLI } from '../src/harness.js';

const NS = 'open-cluster-management-agent-addon';
const SECRET = 'cluster-proxy-agent-credentials';

describe('agent credentials kept in a Secret of the managed cluster', () => {
  let dir = '';
  let hub: ManagedProcess;
  let echo: TcpTarget;
  let api: FakeKubeApiServer;
  let kubeconfig = '';
  let ports: { agent: number; admin: number };
  const agents: ManagedProcess[] = [];
  const cli = (args: string[]) => runCommand(process.execPath, [CLI, ...args], { cwd: dir, timeoutMs: 20_000 });
  const agentIds = async (): Promise<string[]> =>
    (
      (await (await fetch(`http://127.0.0.1:${ports.admin}/debug/connections`)).json()) as {
        agents: { cluster: string; agentID: string }[];
      }
    ).agents
      .filter((a) => a.cluster === 'c1')
      .map((a) => a.agentID)
      .sort();
  const startAgent = (id: string, credsDir: string): ManagedProcess => {
    const p = spawnProcess({
      name: id,
      command: process.execPath,
      cwd: dir,
      env: { ...process.env, KUBECONFIG: kubeconfig },
      args: [
        CLI,
        'agent',
        '--cluster',
        'c1',
        '--namespace',
        NS,
        '--agent-id',
        id,
        '--hub',
        `127.0.0.1:${ports.agent}`,
        '--ca-cert',
        'bundle/ca.crt',
        '--bootstrap-token-file',
        'bundle/bootstrap-token',
        '--credentials-dir',
        credsDir,
        '--credentials-secret',
        SECRET,
        '--apiserver',
        `127.0.0.1:${echo.port}`,
        '--health-port',
        '0',
        '--log-format',
        'json',
      ],
    });
    agents.push(p);
    return p;
  };

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'cp-credsecret-'));
    echo = await startEchoServer();
    // The install namespace exists in the managed cluster (the manifests create it first).
    api = await startFakeKubeApiServer({ namespaces: [NS] });
    kubeconfig = path.join(dir, 'kubeconfig');
    await api.writeKubeconfig(kubeconfig);
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
        '--log-format',
        'json',
      ],
    });
    await hub.waitForJsonLine((o) => o['msg'] === 'proxy server listening', 20_000);
    ports = JSON.parse(await readFile(path.join(dir, 'hub', 'ports.json'), 'utf8')) as typeof ports;
    const r = await cli(['join', 'c1', '--data-dir', 'hub', '--out', 'bundle']);
    expect(r.code, r.stderr).toBe(0);
  });

  afterAll(async () => {
    await Promise.all(agents.map((a) => a.stop(5000)));
    await hub?.stop(8000);
    await killAllSpawned();
    await api?.close();
    await echo?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('the first agent bootstraps and saves key and certificate to the Secret', async () => {
    const a = startAgent('agent-a', 'creds-a');
    await a.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 20_000);
    const secret = await waitFor(() => api.store.get('Secret', { name: SECRET, namespace: NS }), {
      timeoutMs: 10_000,
      message: 'credentials Secret written',
    });
    const cert = Buffer.from(secret.data?.['agent.crt'] ?? '', 'base64');
    const key = Buffer.from(secret.data?.['agent.key'] ?? '', 'base64');
    expect(cert.equals(await readFile(path.join(dir, 'creds-a', 'agent.crt')))).toBe(true);
    expect(key.equals(await readFile(path.join(dir, 'creds-a', 'agent.key')))).toBe(true);
    expect(new X509Certificate(cert).subject).toContain('cluster:c1');
    // The key is in the agent's own cluster only: never in a log line.
    expect(a.lines().join('\n')).not.toContain(key.toString('utf8').split('\n')[1]!);
  });

  it('a new pod with an empty directory and the used token restores from the Secret and connects', async () => {
    const b = startAgent('agent-b', 'creds-b');
    await b.waitForLine((l) => l.includes(`agent credentials restored from Secret ${NS}/${SECRET}`), 20_000);
    await b.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 20_000);
    expect(b.lines().some((l) => /bootstrap refused/.test(l))).toBe(false);
    await waitFor(async () => (await agentIds()).join(',') === 'agent-a,agent-b', { timeoutMs: 10_000, message: 'both agents connected' });
  });

  it('without the Secret the same start is refused (the token is single use)', async () => {
    await api.store.delete('Secret', { name: SECRET, namespace: NS });
    const c = startAgent('agent-c', 'creds-c');
    await c.waitForLine((l) => /already used/.test(l), 20_000);
    await c.stop(3000);
  });
});
