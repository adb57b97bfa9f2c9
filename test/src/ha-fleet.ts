// Three (or N) hub replicas on the Kubernetes store behind a real haproxy, and agents of one cluster dialing
// the balanced address: the set-up the HA end-to-end tests share. The store's API server is our stand-in
// (kube-api-server.ts) or, with `apiserver: 'real'`, a real control plane (real-kube.ts) with our chart's CRDs,
// where the replicas run as the chart's service account with only the chart's RBAC (real-install.ts).
// `hubs` and `agents` are the live lists the tests change (a replica stopped is null until restarted).
import { mkdtemp, readdir } from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'vitest';
import {
  freeLoopbackPort,
  killAllSpawned,
  runCommand,
  startEchoServer,
  startFakeKubeApiServer,
  startHaproxy,
  waitFor,
  startRealKube,
  CHART_CRDS_DIR,
  type FakeKubeApiServer,
  type Haproxy,
  type RealKube,
  type TcpTarget,
} from './fixtures/index.js';
import { installHubIdentity } from './fixtures/real-install.js';
import { CLI, createPki, getJson, startAgent, startHub, type AgentProcess, type HubProcess, type TestPki } from './harness.js';

export interface HaFleetOptions {
  replicas: number;
  /** More `cluster-proxy hub` flags for every replica. */
  hubArgs: string[];
  /** The cluster registered with `join` (the agents are c1's, whether or not it is that one). */
  join: string;
  /** Agent IDs of cluster c1, and more `cluster-proxy agent` flags for them. */
  agentIDs: string[];
  agentArgs: string[];
  /** Another build's entry script for the first replicas, the join and the agents (the skew tests' previous release). */
  cli?: string;
  /** The store's API server: our stand-in (default) or a real control plane. */
  apiserver?: 'stand-in' | 'real';
}

export interface HaFleet<A extends FakeKubeApiServer | RealKube = FakeKubeApiServer> {
  pki: TestPki;
  api: A;
  lb: Haproxy;
  echo: TcpTarget;
  hubs: (HubProcess | null)[];
  agents: AgentProcess[];
  /** Starts replica `i` on its agent port (behind the balancer), as `hub-<i>`; `cli`: another build's (default this checkout's). */
  startReplica(i: number, cli?: string): Promise<HubProcess>;
  /** The replicas an agent holds tunnels to (serverIDs, sorted). */
  servers(a: AgentProcess): Promise<string[]>;
  /** Until every agent holds tunnels to exactly `ids`. */
  allAgentsAt(ids: string[]): Promise<void>;
  stop(): Promise<void>;
}

export function startHaFleet(o: HaFleetOptions & { apiserver?: 'stand-in' }): Promise<HaFleet<FakeKubeApiServer>>;
export function startHaFleet(o: HaFleetOptions & { apiserver: 'real' }): Promise<HaFleet<RealKube>>;
export async function startHaFleet(o: HaFleetOptions): Promise<HaFleet<FakeKubeApiServer | RealKube>> {
  const pki = await createPki();
  const echo = await startEchoServer();
  const kubeDir = await mkdtemp(path.join(pki.dir, 'kube-'));
  let kubeconfig = path.join(kubeDir, 'kubeconfig');
  let api: FakeKubeApiServer | RealKube;
  let closeApi: () => Promise<void>;
  if (o.apiserver === 'real') {
    const crds = (await readdir(CHART_CRDS_DIR)).filter((f) => f.endsWith('.yaml')).map((f) => path.join(CHART_CRDS_DIR, f));
    const kube = await startRealKube({ crdFiles: crds });
    api = kube;
    closeApi = () => kube.stop();
    try {
      kubeconfig = await installHubIdentity(kube, kubeDir);
    } catch (err) {
      await Promise.all([kube.stop(), echo.close(), pki.cleanup()]);
      throw err;
    }
  } else {
    // Strict about namespaces, like a real apiserver: the hub must create the ones it writes into.
    const fake = await startFakeKubeApiServer({ requireNamespaces: true });
    api = fake;
    closeApi = () => fake.close();
    await fake.writeKubeconfig(kubeconfig);
  }
  const agentPorts: number[] = [];
  const hubs: (HubProcess | null)[] = [];
  const agents: AgentProcess[] = [];
  let lb: Haproxy | null = null;
  /** Stops what has started; on a failed start too, so no replica outlives the test that wanted it. */
  const stopAll = async (): Promise<void> => {
    for (const a of agents) a.proc.kill('SIGCONT'); // a test may have frozen them
    await Promise.all(agents.map((a) => a.stop()));
    await Promise.all(hubs.map((h) => h?.stop()));
    await lb?.close();
    await killAllSpawned();
    await closeApi();
    await echo.close();
    await pki.cleanup();
  };
  const startReplica = (i: number, cli?: string): Promise<HubProcess> =>
    startHub(
      pki,
      [
        '--store',
        'kubernetes',
        '--kubeconfig',
        kubeconfig,
        '--agent-port',
        String(agentPorts[i]),
        '--server-id',
        `hub-${i}`,
        '--replica-lease-duration',
        '15s',
        '--shutdown-grace',
        '3s',
        '--ca-key',
        path.join(pki.dir, 'ca.key'),
        ...o.hubArgs,
      ],
      cli ? { cli } : {},
    );
  try {
    for (let i = 0; i < o.replicas; i++) agentPorts.push(await freeLoopbackPort());
    for (let i = 0; i < o.replicas; i++) hubs.push(await startReplica(i, o.cli));
    lb = await startHaproxy(agentPorts);
    const join = await runCommand(
      process.execPath,
      [o.cli ?? CLI, 'join', o.join, '--out', path.join(pki.dir, o.join), '--admin', `127.0.0.1:${hubs[0]!.ports.admin}`],
      { timeoutMs: 20_000 },
    );
    expect(join.code, join.stderr).toBe(0);
    for (const id of o.agentIDs) {
      agents.push(
        await startAgent(pki, { ports: { agent: lb.port } } as HubProcess, {
          cluster: 'c1',
          apiserver: `127.0.0.1:${echo.port}`,
          args: ['--agent-id', id, ...o.agentArgs],
          ...(o.cli ? { cli: o.cli } : {}),
        }),
      );
    }
  } catch (err) {
    await stopAll();
    throw err;
  }
  const balancer = lb;
  const servers = async (a: AgentProcess): Promise<string[]> =>
    ((await getJson(a.healthPort, '/debug/connections')) as { servers: { serverID: string }[] }).servers.map((s) => s.serverID).sort();
  return {
    pki,
    api,
    lb: balancer,
    echo,
    hubs,
    agents,
    startReplica,
    servers,
    allAgentsAt: (ids) =>
      waitFor(
        async () => {
          for (const a of agents) if ((await servers(a)).join(',') !== ids.join(',')) return false;
          return true;
        },
        { timeoutMs: 30_000, intervalMs: 200, message: `every agent holds tunnels to ${ids.join(', ')}` },
      ).then(() => undefined),
    stop: stopAll,
  };
}
