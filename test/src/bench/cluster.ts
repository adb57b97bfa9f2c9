// A hub + agent pair for the tunnel paths. The harness's startHub/startAgent wait for info-level
// log lines, but the benchmark runs both with --log-level warn (logging must not skew results), and
// the agent may have to reach the hub through a latency relay; so this spawns them itself, using
// the harness's PKI and CLI path, and detects readiness from ports.json and the hub's admin table.
//
// Every hub and agent runs with a raised open-files limit (helpers.spawnNode). With `gcHook` they
// also get gc-hook.js preloaded, so the scale scenario can ask them for a full GC before reading
// their RSS. With `cpuProfDir` they write a V8 CPU profile there when they exit (`--cpu-prof`).
import { mkdtemp, readFile } from 'node:fs/promises';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { CLI, cliLaunchFlags, getJson, type HubTables, type TestPki } from '../harness.js';
import type { ManagedProcess } from '../fixtures/index.js';
import type { ClientSpec } from './clients.js';
import { script, spawnNode, type TargetName } from './helpers.js';
import { reapOnDeath } from './reaper.js';

export const BENCH_CLUSTER = 'bench';

export type AgentTransport = 'mux' | 'grpc';

export interface HubPorts {
  agent: number;
  frontend: number;
  admin: number;
  health: number;
  connect: number | null;
  gateway?: number | null;
}

export interface BenchHub {
  proc: ManagedProcess;
  pid: number;
  ports: HubPorts;
  tables(): Promise<HubTables>;
  /** Full GC (gcHook only); resolves with the hub's V8 heapUsed (bytes) after it. */
  gc(): Promise<number>;
  stop(): Promise<void>;
}

export interface BenchCluster {
  hub: BenchHub;
  agent: ManagedProcess;
  agentPid: number;
  transport: AgentTransport;
  /** How an SDK client reaches `targets` through this pair, with the agent's transport. */
  tunnelSpec(targets: Partial<Record<TargetName, number>>): ClientSpec;
  /** How a CONNECT client reaches `targets` through this pair (hub's CONNECT port, client certificate). */
  connectSpec(targets: Partial<Record<TargetName, number>>): Extract<ClientSpec, { kind: 'connect' }>;
  /** Full GC in hub and agent (gcHook only); resolves with their V8 heapUsed (bytes) after it. */
  gc(): Promise<{ hub: number; agent: number }>;
  /**
   * One `cluster-proxy forward` process per target (what an admin runs): resolves with the local
   * port each serves, and its PID. Each process is registered with `onStarted` so it is stopped with the rest.
   */
  forwards(
    targets: Partial<Record<TargetName, number>>,
    onStarted: (name: string, stop: () => Promise<void>) => void,
  ): Promise<{ ports: Partial<Record<TargetName, number>>; pids: Partial<Record<TargetName, number>> }>;
  stop(): Promise<void>;
}

export interface ProcessOptions {
  /** Preload gc-hook.js (and --expose-gc): gc() works. */
  gcHook?: boolean;
  /** Write a CPU profile per process into this directory on exit. */
  cpuProfDir?: string;
  /** The `cluster-proxy` entry script of another build (ab.ts compares builds); default this checkout's. */
  cli?: string;
}

export interface ClusterOptions extends ProcessOptions {
  /** Shown in process names and errors, e.g. "lan" or "rtt20-grpc". */
  label: string;
  /** The agent's `--transport`, and the SDK's. */
  transport: AgentTransport;
  /**
   * Where the agent dials the hub's agent listener; gets the hub's agent port, may start a relay
   * in front of it. Default: straight to 127.0.0.1:<agent port>.
   */
  agentHubAddress?: (hubAgentPort: number) => Promise<string>;
  /** Registered as each process is started, so it is stopped even if a later step fails. */
  onStarted?: (name: string, stop: () => Promise<void>) => void;
  /** More `cluster-proxy hub` / `agent` flags (e.g. the gateway's). */
  hubArgs?: string[];
  agentArgs?: string[];
}

const READY_TIMEOUT_MS = 15_000;

export async function waitUntil<T>(what: string, proc: ManagedProcess, timeoutMs: number, check: () => Promise<T | undefined>): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  let lastError = '';
  for (;;) {
    if (!proc.isRunning())
      throw new Error(`${proc.name} exited while waiting for ${what}; last output:\n${proc.lines().slice(-20).join('\n')}`);
    try {
      const value = await check();
      if (value !== undefined) return value;
    } catch (err) {
      lastError = err instanceof Error ? err.message : String(err);
    }
    if (performance.now() > deadline) {
      throw new Error(
        `${what}: not ready within ${timeoutMs} ms${lastError ? ` (last error: ${lastError})` : ''}; ${proc.name} output:\n${proc.lines().slice(-20).join('\n')}`,
      );
    }
    await sleep(50);
  }
}

function nodeFlags(name: string, opts: ProcessOptions): string[] {
  const flags: string[] = cliLaunchFlags(opts.cli ?? CLI);
  if (opts.gcHook) flags.push('--expose-gc', '--import', pathToFileURL(script('gc-hook.js')).href);
  if (opts.cpuProfDir) flags.push('--cpu-prof', '--cpu-prof-dir', opts.cpuProfDir, '--cpu-prof-name', `${name}.cpuprofile`);
  return flags;
}

/** Sends SIGUSR2 to a process started with gcHook, waits for its confirmation line, returns its heapUsed. */
async function requestGc(proc: ManagedProcess): Promise<number> {
  const after = proc.lineCount();
  if (!proc.kill('SIGUSR2')) throw new Error(`${proc.name} is not running`);
  const line = await proc.waitForJsonLine((o) => typeof o['benchGc'] === 'number', 10_000, { after });
  if (line['exposed'] !== true) throw new Error(`${proc.name}: gc() is not exposed`);
  return Number(line['heapUsed']);
}

function pidOf(proc: ManagedProcess): number {
  if (proc.pid === undefined) throw new Error(`${proc.name} has no pid`);
  return proc.pid;
}

export interface HubOptions extends ProcessOptions {
  label: string;
  /** Extra `--grant` values. */
  grants?: string[];
  hubArgs?: string[];
  onStarted?: (name: string, stop: () => Promise<void>) => void;
}

/** A `cluster-proxy hub` on 127.0.0.1 with every port picked by the kernel (CONNECT frontend included). */
export async function startBenchHub(pki: TestPki, opts: HubOptions): Promise<BenchHub> {
  const { label } = opts;
  const dataDir = await mkdtemp(path.join(pki.dir, `hub-${label}-`));
  const proc = reapOnDeath(
    spawnNode(`hub-${label}`, [
      ...nodeFlags(`hub-${label}`, opts),
      opts.cli ?? CLI,
      'hub',
      '--data-dir',
      dataDir,
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
      '0',
      '--ca-cert',
      pki.caPath,
      '--server-cert',
      pki.server.certPath,
      '--server-key',
      pki.server.keyPath,
      ...(opts.grants ?? []).flatMap((g) => ['--grant', g]),
      '--log-level',
      'warn',
      ...(opts.hubArgs ?? []),
    ]),
  );
  opts.onStarted?.(`hub-${label}`, async () => void (await proc.stop(8000)));
  // ports.json is written (atomically) once every listener is bound.
  const ports = await waitUntil(
    `hub-${label} ports.json`,
    proc,
    READY_TIMEOUT_MS,
    async () => JSON.parse(await readFile(path.join(dataDir, 'ports.json'), 'utf8')) as HubPorts,
  );
  return {
    proc,
    pid: pidOf(proc),
    ports,
    tables: async () => (await getJson(ports.admin, '/debug/connections')) as HubTables,
    gc: () => requestGc(proc),
    stop: async () => void (await proc.stop(8000)),
  };
}

export async function startAgent(pki: TestPki, label: string, hubAddress: string, opts: ClusterOptions): Promise<ManagedProcess> {
  const cert = await pki.agent(BENCH_CLUSTER);
  return reapOnDeath(
    spawnNode(`agent-${label}`, [
      ...nodeFlags(`agent-${label}`, opts),
      opts.cli ?? CLI,
      'agent',
      '--cluster',
      BENCH_CLUSTER,
      '--hub',
      hubAddress,
      '--server-name',
      'localhost',
      '--transport',
      opts.transport,
      '--ca-cert',
      pki.caPath,
      '--cert',
      cert.certPath,
      '--key',
      cert.keyPath,
      '--allow',
      '127.0.0.1:*',
      '--identifiers',
      'cidr=127.0.0.0/8',
      '--health-bind-address',
      '127.0.0.1',
      '--health-port',
      '0',
      '--drain-grace',
      '1s',
      '--log-level',
      'warn',
      ...(opts.agentArgs ?? []),
    ]),
  );
}

/** Starts a hub and one agent for cluster `bench` that may dial any 127.0.0.1 port. */
export async function startCluster(pki: TestPki, opts: ClusterOptions): Promise<BenchCluster> {
  const { label, onStarted } = opts;
  const hub = await startBenchHub(pki, { ...opts, grants: [`${BENCH_CLUSTER}=cidr:127.0.0.0/8`] });
  const hubAddress = opts.agentHubAddress ? await opts.agentHubAddress(hub.ports.agent) : `127.0.0.1:${hub.ports.agent}`;
  const agent = await startAgent(pki, label, hubAddress, opts);
  onStarted?.(`agent-${label}`, async () => void (await agent.stop(8000)));
  await waitUntil(`agent-${label} registered at hub-${label}`, agent, READY_TIMEOUT_MS, async () => {
    const tables = await hub.tables();
    return tables.agents.some((a) => a.cluster === BENCH_CLUSTER) ? true : undefined;
  });
  const tls = { caPath: pki.caPath, certPath: pki.client.certPath, keyPath: pki.client.keyPath };
  return {
    hub,
    agent,
    agentPid: pidOf(agent),
    transport: opts.transport,
    tunnelSpec: (targets) => ({ kind: 'tunnel', address: `127.0.0.1:${hub.ports.frontend}`, transport: opts.transport, tls, targets }),
    connectSpec: (targets) => {
      if (hub.ports.connect === null) throw new Error(`hub-${label} has no CONNECT port`);
      return { kind: 'connect', port: hub.ports.connect, tls, targets };
    },
    gc: async () => {
      const [h, a] = await Promise.all([hub.gc(), requestGc(agent)]);
      return { hub: h, agent: a };
    },
    forwards: async (targets, started) => {
      const ports: Partial<Record<TargetName, number>> = {};
      const pids: Partial<Record<TargetName, number>> = {};
      for (const [name, port] of Object.entries(targets) as [TargetName, number][]) {
        const proc = reapOnDeath(
          spawnNode(`forward-${label}-${name}`, [
            ...nodeFlags(`forward-${label}-${name}`, opts),
            opts.cli ?? CLI,
            'forward',
            BENCH_CLUSTER,
            `127.0.0.1:${port}`,
            '--listen',
            '127.0.0.1:0',
            '--frontend',
            `127.0.0.1:${hub.ports.frontend}`,
            '--server-name',
            'localhost',
            '--ca-cert',
            tls.caPath,
            '--cert',
            tls.certPath,
            '--key',
            tls.keyPath,
            '--log-level',
            'info',
          ]),
        );
        started(`forward-${label}-${name}`, async () => void (await proc.stop(8000)));
        const line = await proc.waitForJsonLine((o) => o['msg'] === 'forwarding', READY_TIMEOUT_MS);
        ports[name] = Number(/:(\d+)$/.exec(String(line['listen']))?.[1]);
        pids[name] = pidOf(proc);
      }
      return { ports, pids };
    },
    stop: async () => {
      await agent.stop(8000);
      await hub.stop();
    },
  };
}
