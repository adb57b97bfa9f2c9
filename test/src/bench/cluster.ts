// A hub + agent pair for the `tunnel` path. The harness's startHub/startAgent wait for info-level
// log lines, but the benchmark runs both with --log-level warn (logging must not skew results), and
// the agent may have to reach the hub through a latency relay; so this spawns them itself, using
// the harness's PKI and CLI path, and detects readiness from ports.json and the hub's admin table.
import { readFileSync } from 'node:fs';
import { mkdtemp, readFile } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Tunnel } from '@cluster-proxy/client';
import { CLI, getJson, type HubProcess, type HubTables, type TestPki } from '../harness.js';
import { reapOnDeath } from './reaper.js';
import { spawnProcess, type ManagedProcess } from '../fixtures/index.js';

export const BENCH_CLUSTER = 'bench';

export interface BenchCluster {
  hub: HubProcess;
  agent: ManagedProcess;
  /** One Tunnel to this hub's frontend, created once and reused for every dial. */
  tunnel: Tunnel;
  stop(): Promise<void>;
}

export interface ClusterOptions {
  /** Shown in process names and errors, e.g. "lan" or "rtt20". */
  label: string;
  /**
   * Where the agent dials the hub's agent listener; gets the hub's agent port, may start a relay
   * in front of it. Default: straight to 127.0.0.1:<agent port>.
   */
  agentHubAddress?: (hubAgentPort: number) => Promise<string>;
  /** Registered as the relay is started, so it is stopped even if a later step fails. */
  onStarted?: (name: string, stop: () => Promise<void>) => void;
}

const READY_TIMEOUT_MS = 15_000;

async function waitUntil<T>(what: string, proc: ManagedProcess, timeoutMs: number, check: () => Promise<T | undefined>): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  let lastError = '';
  for (;;) {
    if (!proc.isRunning()) throw new Error(`${proc.name} exited while waiting for ${what}; last output:\n${proc.lines().slice(-20).join('\n')}`);
    try {
      const value = await check();
      if (value !== undefined) return value;
    } catch (err) {
      lastError = err instanceof Error ? err.message : String(err);
    }
    if (performance.now() > deadline) {
      throw new Error(`${what}: not ready within ${timeoutMs} ms${lastError ? ` (last error: ${lastError})` : ''}; ${proc.name} output:\n${proc.lines().slice(-20).join('\n')}`);
    }
    await sleep(50);
  }
}

async function startHub(pki: TestPki, label: string, onStarted: ClusterOptions['onStarted']): Promise<HubProcess> {
  const dataDir = await mkdtemp(path.join(pki.dir, `hub-${label}-`));
  const proc = reapOnDeath(spawnProcess({
    name: `hub-${label}`,
    command: process.execPath,
    args: [CLI, 'hub', '--data-dir', dataDir, '--bind-address', '127.0.0.1', '--agent-port', '0', '--frontend-port', '0', '--health-port', '0', '--admin-port', '0',
      '--ca-cert', pki.caPath, '--server-cert', pki.server.certPath, '--server-key', pki.server.keyPath,
      '--grant', `${BENCH_CLUSTER}=cidr:127.0.0.0/8`, '--log-level', 'warn'],
  }));
  onStarted?.(`hub-${label}`, async () => void (await proc.stop(8000)));
  // ports.json is written (atomically) once every listener is bound.
  const ports = await waitUntil(`hub-${label} ports.json`, proc, READY_TIMEOUT_MS, async () =>
    JSON.parse(await readFile(path.join(dataDir, 'ports.json'), 'utf8')) as HubProcess['ports'],
  );
  const tunnels: Tunnel[] = [];
  return {
    proc,
    dataDir,
    ports,
    tunnel: () => {
      const t = new Tunnel({ address: `127.0.0.1:${ports.frontend}`, serverName: 'localhost', caCert: Buffer.from(pki.ca.certPem), cert: readFileSync(pki.client.certPath), key: readFileSync(pki.client.keyPath) });
      tunnels.push(t);
      return t;
    },
    tables: async () => (await getJson(ports.admin, '/debug/connections')) as HubTables,
    stop: async () => {
      for (const t of tunnels) t.close();
      await proc.stop(8000);
    },
  };
}

async function startAgent(pki: TestPki, label: string, hubAddress: string): Promise<ManagedProcess> {
  const cert = await pki.agent(BENCH_CLUSTER);
  const proc = reapOnDeath(spawnProcess({
    name: `agent-${label}`,
    command: process.execPath,
    args: [CLI, 'agent', '--cluster', BENCH_CLUSTER, '--hub', hubAddress, '--server-name', 'localhost',
      '--ca-cert', pki.caPath, '--cert', cert.certPath, '--key', cert.keyPath,
      '--allow', '127.0.0.1:*', '--identifiers', 'cidr=127.0.0.0/8',
      '--health-bind-address', '127.0.0.1', '--health-port', '0', '--drain-grace', '1s', '--log-level', 'warn'],
  }));
  return proc;
}

/** Starts a hub and one agent for cluster `bench` that may dial any 127.0.0.1 port. */
export async function startCluster(pki: TestPki, opts: ClusterOptions): Promise<BenchCluster> {
  const { label, onStarted } = opts;
  const hub = await startHub(pki, label, onStarted);
  const hubAddress = opts.agentHubAddress ? await opts.agentHubAddress(hub.ports.agent) : `127.0.0.1:${hub.ports.agent}`;
  const agent = await startAgent(pki, label, hubAddress);
  onStarted?.(`agent-${label}`, async () => void (await agent.stop(8000)));
  await waitUntil(`agent-${label} registered at hub-${label}`, agent, READY_TIMEOUT_MS, async () => {
    const tables = await hub.tables();
    return tables.agents.some((a) => a.cluster === BENCH_CLUSTER) ? true : undefined;
  });
  const tunnel = hub.tunnel();
  onStarted?.(`tunnel-${label}`, async () => tunnel.close());
  return {
    hub,
    agent,
    tunnel,
    stop: async () => {
      tunnel.close();
      await agent.stop(8000);
      await hub.stop();
    },
  };
}
