// Fresh processes for one stuck-destination measurement: a throwaway PKI, a targets process, and a
// hub + agent started with the gc hook (mux agent for `tunnel` and `connect`, gRPC agent for
// `tunnel-grpc`), so each measurement starts from clean processes. Also how they are watched: VmRSS
// sampled every 100 ms, the hub's and the agent's connection tables, the agent's tunnel counters,
// and whether either process died.
import { rmSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { createPki, getJson, type AgentTables } from '../harness.js';
import { kernelQueues, listeningPorts, socketMemory, type ManagedProcess } from '../fixtures/index.js';
import type { ClientSpec } from './clients.js';
import { startCluster, waitUntil, type BenchCluster } from './cluster.js';
import { AFTER_TRIM_MS, procStatusKiB, startTargets } from './helpers.js';
import { removeOnDeath } from './reaper.js';

export type StuckPath = 'tunnel' | 'tunnel-grpc' | 'connect';
/**
 * Who the stuck clients are: `sdk`, the path's own client (our SDK, every connection a stream of one
 * Tunnel; or CONNECT clients); `konnectivity`, on tunnel-grpc, clients that open a TLS connection and
 * an HTTP/2 session per connection and speak ANP only, as kube-apiserver's konnectivity-client does.
 */
export type StuckClients = 'sdk' | 'konnectivity';

export const STUCK_PATHS: readonly StuckPath[] = ['tunnel', 'tunnel-grpc', 'connect'];
export const STUCK_CLIENTS: readonly StuckClients[] = ['sdk', 'konnectivity'];
/** The paths each kind of stuck client is measured on: konnectivity-style ones reach the hub over gRPC only. */
export const stuckClientPaths = (clients: StuckClients): readonly StuckPath[] =>
  clients === 'konnectivity' ? ['tunnel-grpc'] : STUCK_PATHS;

/** RSS of the hub and the agent in KiB; undefined for a process that is gone. */
export interface RssPair {
  hub: number | undefined;
  agent: number | undefined;
}

export interface AgentCounters {
  /** cluster_proxy_agent_tunnel_reconnects_total: tunnels lost while running. */
  tunnelsLost: number;
  /** cluster_proxy_agent_tunnel_connects_total{result="ok"}. */
  tunnelsOpened: number;
}

export interface Tables {
  hubRoutes: number;
  hubFrontends: number;
  agent: number;
}

export type OutputMark = Record<'hub' | 'agent', number>;

/** Pino lines at level warn (40) or above printed by `proc` after line number `after`, as "msg (err)". */
function warningsSince(proc: ManagedProcess, after: number): string[] {
  const lines = proc.lines();
  const fresh = lines.slice(Math.max(0, lines.length - (proc.lineCount() - after)));
  const out: string[] = [];
  for (const line of fresh) {
    try {
      const o = JSON.parse(line) as Record<string, unknown>;
      if (typeof o['level'] !== 'number' || o['level'] < 40) continue;
      const detail = o['err'] === undefined ? '' : ` (${typeof o['err'] === 'string' ? o['err'] : JSON.stringify(o['err'])})`;
      out.push(`${String(o['msg'])}${detail}`);
    } catch {
      // not a log line (the gc hook's, or a stack trace)
    }
  }
  return out;
}

export interface StuckRig {
  cluster: BenchCluster;
  /** How a client reaches every target through this hub and agent on the path (the healthy bulk's). */
  spec: ClientSpec;
  /** How the stuck clients reach them. */
  stuckSpec: ClientSpec;
  /** Connections the hub lists towards the agent (established and pending) and at its frontends, and the agent lists. */
  tables(): Promise<Tables>;
  /** Where the hub's and the agent's output stands now, for warnings(). */
  mark(): OutputMark;
  /** Distinct warnings and errors the hub and the agent logged since `mark` (at most `limit`). */
  warnings(mark: OutputMark, limit?: number): string[];
  agentCounters(): Promise<AgentCounters>;
  /** What hub and agent say they hold for their peers now, and the windows they granted (their budgets' gauges, all directions). */
  budgets(): Promise<Record<'hub' | 'agent', { held: number; committed: number }>>;
  /** Bytes the hub's and the agent's sockets hold in the kernel now (kernelQueues). */
  kernelQueues(): Promise<Record<'hub' | 'agent', { send: number; receive: number }>>;
  /** Kernel memory of the hub's and the agent's TCP sockets now (socketMemory: ss -m's skmem), KiB. */
  socketMemory(): Promise<RssPair>;
  /** Full GC in whichever of hub and agent still runs, then VmRSS of both. */
  gcAndRss(): Promise<RssPair>;
  rss(): Promise<RssPair>;
  /** RssAnon of both (the anonymous part of VmRSS), KiB. */
  anon(): Promise<RssPair>;
  /** "hub exited (signal SIGKILL)" and the like, for each of hub and agent that is not running. */
  deaths(): Promise<string[]>;
  stop(): Promise<void>;
}

/** The sum of a Prometheus metric's samples whose label text contains `labels` (all of them if empty). */
export function metricSum(exposition: string, name: string, labels = ''): number {
  let sum = 0;
  for (const line of exposition.split('\n')) {
    if (!line.startsWith(name) || !/^[{ ]/.test(line.slice(name.length))) continue;
    if (labels && !line.slice(name.length).includes(labels)) continue;
    sum += Number(line.slice(line.lastIndexOf(' ') + 1));
  }
  return sum;
}

async function getText(port: number, pathName: string): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${port}${pathName}`, { signal: AbortSignal.timeout(5000) });
  if (!res.ok) throw new Error(`GET ${pathName} on port ${port}: HTTP ${res.status}`);
  return res.text();
}

/**
 * The agent runs with `--health-port 0 --log-level warn`, so it never logs its port: find the one
 * of its listening ports that answers /debug/connections.
 */
async function agentHealthPort(cluster: BenchCluster): Promise<number> {
  return waitUntil('the agent health port', cluster.agent, 10_000, async () => {
    for (const port of await listeningPorts(cluster.agentPid)) {
      const body = await getJson(port, '/debug/connections').catch(() => undefined);
      if (typeof body === 'object' && body !== null && Array.isArray((body as AgentTables).servers)) return port;
    }
    return undefined;
  });
}

/**
 * The temp dirs of rigs not stopped yet. On SIGINT the bench exits once its own teardown stack has
 * run, before a measurement's finally blocks could stop its rig: remove them at exit (the
 * processes are SIGKILLed by the fixtures' exit hook).
 */
const liveDirs = new Set<string>();
process.on('exit', () => {
  for (const dir of liveDirs) rmSync(dir, { recursive: true, force: true });
});

export async function startStuckRig(path: StuckPath, clients: StuckClients): Promise<StuckRig> {
  if (!stuckClientPaths(clients).includes(path)) throw new Error(`${clients} clients are not measured on ${path}`);
  const steps: (() => Promise<unknown>)[] = [];
  const stopAll = async (): Promise<void> => {
    for (const stop of steps.reverse()) await stop().catch(() => {});
  };
  try {
    const pki = await createPki();
    removeOnDeath(pki.dir);
    liveDirs.add(pki.dir);
    steps.push(async () => {
      await pki.cleanup();
      liveDirs.delete(pki.dir);
    });
    const targets = await startTargets();
    steps.push(targets.stop);
    const transport = path === 'tunnel-grpc' ? 'grpc' : 'mux';
    const cluster = await startCluster(pki, {
      label: `stuck-${path}`,
      transport,
      gcHook: true,
      onStarted: (_name, stop) => void steps.push(stop),
    });
    const healthPort = await agentHealthPort(cluster);
    const procs = { hub: cluster.hub.proc, agent: cluster.agent };
    const rss = async (): Promise<RssPair> => ({
      hub: await procStatusKiB(cluster.hub.pid, 'VmRSS'),
      agent: await procStatusKiB(cluster.agentPid, 'VmRSS'),
    });
    const anon = async (): Promise<RssPair> => ({
      hub: await procStatusKiB(cluster.hub.pid, 'RssAnon'),
      agent: await procStatusKiB(cluster.agentPid, 'RssAnon'),
    });
    // CONNECT clients resume TLS sessions: a thousand full RSA handshakes cost seconds on 2 cores,
    // and what is measured is the memory of open connections, not the dial.
    const spec: ClientSpec =
      path === 'connect' ? { ...cluster.connectSpec(targets.ports), resume: true } : cluster.tunnelSpec(targets.ports);
    const stuckSpec: ClientSpec =
      spec.kind === 'tunnel' && clients === 'konnectivity'
        ? { kind: 'anp', address: spec.address, tls: spec.tls, targets: spec.targets }
        : spec;
    return {
      cluster,
      spec,
      stuckSpec,
      tables: async () => {
        const hub = await cluster.hub.tables();
        const agent = (await getJson(healthPort, '/debug/connections')) as AgentTables;
        return {
          hubRoutes: hub.agents.reduce((n, a) => n + a.established.length + a.pending, 0),
          hubFrontends: hub.frontends.length,
          agent: agent.servers.reduce((n, s) => n + s.connections.length, 0),
        };
      },
      mark: () => ({ hub: procs.hub.lineCount(), agent: procs.agent.lineCount() }),
      warnings: (mark, limit = 3) => {
        const all = (['hub', 'agent'] as const).flatMap((side) => warningsSince(procs[side], mark[side]).map((w) => `${side}: ${w}`));
        const distinct = [...new Set(all)];
        return distinct.length > limit ? [...distinct.slice(0, limit), `${distinct.length - limit} more`] : distinct;
      },
      budgets: async () => {
        const [hub, agent] = await Promise.all([getText(cluster.hub.ports.health, '/metrics'), getText(healthPort, '/metrics')]);
        const read = (text: string, prefix: string): { held: number; committed: number } => ({
          held: metricSum(text, `${prefix}_memory_held_bytes`),
          committed: metricSum(text, `${prefix}_memory_committed_bytes`),
        });
        return { hub: read(hub, 'cluster_proxy_server'), agent: read(agent, 'cluster_proxy_agent') };
      },
      kernelQueues: async () => {
        const [hub, agent] = await Promise.all([kernelQueues(cluster.hub.pid), kernelQueues(cluster.agentPid)]);
        return { hub, agent };
      },
      agentCounters: async () => {
        const text = await getText(healthPort, '/metrics');
        return {
          tunnelsLost: metricSum(text, 'cluster_proxy_agent_tunnel_reconnects_total'),
          tunnelsOpened: metricSum(text, 'cluster_proxy_agent_tunnel_connects_total', 'result="ok"'),
        };
      },
      gcAndRss: async () => {
        if (procs.hub.isRunning() && procs.agent.isRunning()) await cluster.gc();
        await sleep(AFTER_TRIM_MS);
        return rss();
      },
      rss,
      anon,
      socketMemory: async () => {
        const kib = async (proc: ManagedProcess, pid: number): Promise<number | undefined> =>
          proc.isRunning() ? (await socketMemory(pid)) / 1024 : undefined;
        return { hub: await kib(procs.hub, cluster.hub.pid), agent: await kib(procs.agent, cluster.agentPid) };
      },
      deaths: async () => {
        const out: string[] = [];
        for (const [side, proc] of Object.entries(procs)) {
          if (proc.isRunning()) continue;
          const { code, signal } = await Promise.race([proc.exited, sleep(2000).then(() => ({ code: null, signal: null }))]);
          out.push(`${side} exited (${signal !== null ? `signal ${signal}` : `code ${code}`})`);
        }
        return out;
      },
      stop: stopAll,
    };
  } catch (err) {
    await stopAll();
    throw err;
  }
}

/**
 * Samples VmRSS and RssAnon of the hub and the agent every 100 ms and keeps the peaks. `guardKiB` protects the
 * machine from a path that buffers without bound: once hub + agent exceed it, `onGuard` runs (once).
 */
export class RssSampler {
  readonly peak = { hub: 0, agent: 0 };
  /** The peaks of RssAnon. */
  readonly anonPeak = { hub: 0, agent: 0 };
  samples = 0;
  guarded = false;
  private timer: NodeJS.Timeout | undefined;
  private busy = false;

  constructor(
    private readonly rig: StuckRig,
    private readonly guardKiB: number,
    private readonly onGuard: () => void,
  ) {}

  start(): void {
    this.timer = setInterval(() => void this.sample(), 100);
  }

  private async sample(): Promise<void> {
    if (this.busy) return;
    this.busy = true;
    try {
      const { hub, agent } = await this.rig.rss();
      const anon = await this.rig.anon();
      this.anonPeak.hub = Math.max(this.anonPeak.hub, anon.hub ?? 0);
      this.anonPeak.agent = Math.max(this.anonPeak.agent, anon.agent ?? 0);
      this.samples++;
      this.peak.hub = Math.max(this.peak.hub, hub ?? 0);
      this.peak.agent = Math.max(this.peak.agent, agent ?? 0);
      if (!this.guarded && (hub ?? 0) + (agent ?? 0) > this.guardKiB) {
        this.guarded = true;
        this.onGuard();
      }
    } finally {
      this.busy = false;
    }
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    while (this.busy) await sleep(10);
    await this.sample();
  }
}

/** MemAvailable of the machine in KiB (0 if unknown). */
export async function memAvailableKiB(): Promise<number> {
  const m = /^MemAvailable:\s+(\d+) kB/m.exec(await readFile('/proc/meminfo', 'utf8').catch(() => ''));
  return m?.[1] === undefined ? 0 : Number(m[1]);
}
