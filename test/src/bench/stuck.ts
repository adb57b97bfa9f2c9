// stuck-destination: N connections (64, 256, 1024) to a destination that never reads, every one
// written into as fast as the path lets it: what hub and agent hold meanwhile (peak RSS), whether a
// healthy bulk upload still gets through beside them, and whether everything is given back once
// the clients leave. Fresh hub + agent for each path and N.
import { setTimeout as sleep } from 'node:timers/promises';
import { DEFAULT_UNSENT_LIMIT } from '@cluster-proxy/proto';
import type { ManagedProcess } from '../fixtures/index.js';
import { openClient } from './clients.js';
import { describeTcpMemory, tcpMemory } from './machine.js';
import { errorMessage } from './io.js';
import type { Dialer, PathName } from './paths.js';
import {
  describeBytes,
  mib,
  positiveCounts,
  transfer,
  transferSize,
  type BenchConfig,
  type MetricSpec,
  type PathRun,
  type Scenario,
} from './scenarios.js';
import { mbPerSecond, MiB } from './stats.js';
import type { StuckJob } from './stuck-client.js';
import { spawnStuckClients } from './stuck-clients.js';
import {
  memAvailableKiB,
  RssSampler,
  STUCK_CLIENTS,
  STUCK_PATHS,
  startStuckRig,
  stuckClientPaths,
  type StuckClients,
  type StuckPath,
  type Tables,
} from './stuck-rig.js';

/** The goals of docs/goals.md are checked at this N (one of the full run's cfg.stuckCounts). */
export const STUCK_GOAL_COUNT = 1024;

const stuckCounts = (cfg: BenchConfig): number[] => positiveCounts(cfg.stuckCounts);

/** The figures of one stuck-destination measurement, in table order (each a metric per N). */
const STUCK_FIGURES = [
  { key: 'hub peak', unit: 'MiB', better: 'lower' },
  { key: 'agent peak', unit: 'MiB', better: 'lower' },
  { key: 'hub before', unit: 'MiB', better: 'lower' },
  { key: 'hub after', unit: 'MiB', better: 'lower' },
  { key: 'agent before', unit: 'MiB', better: 'lower' },
  { key: 'agent after', unit: 'MiB', better: 'lower' },
  // What a pod is charged (cgroup v2): anonymous memory (RssAnon) and the kernel's socket buffers
  // (ss -m's skmem: r + w + f), not the node binary's file-backed pages that VmRSS counts.
  { key: 'hub anon before', unit: 'MiB', better: 'lower' },
  { key: 'hub anon peak', unit: 'MiB', better: 'lower' },
  { key: 'hub anon after', unit: 'MiB', better: 'lower' },
  { key: 'agent anon before', unit: 'MiB', better: 'lower' },
  { key: 'agent anon peak', unit: 'MiB', better: 'lower' },
  { key: 'agent anon after', unit: 'MiB', better: 'lower' },
  { key: 'hub socket held', unit: 'MiB', better: 'lower' },
  { key: 'agent socket held', unit: 'MiB', better: 'lower' },
  { key: 'agent anon+socket', unit: 'MiB', better: 'lower' },
  { key: 'hub KiB/conn', unit: 'KiB', better: 'lower' },
  { key: 'hub+agent KiB/conn', unit: 'KiB', better: 'lower' },
  { key: 'bulk kept', unit: '%', better: 'higher' },
  { key: 'accepted', unit: 'MiB', better: 'lower' },
  { key: 'lost', unit: 'count', better: 'lower' },
  { key: 'left', unit: 'count', better: 'lower' },
] as const;

type StuckFigure = (typeof STUCK_FIGURES)[number]['key'];

/** The metric name of one figure at N stuck connections, e.g. "N=1024 hub peak", "N=1024 konnectivity hub peak". */
export const stuckMetric = (n: number, figure: StuckFigure, clients: StuckClients = 'sdk'): string =>
  `N=${n} ${clients === 'sdk' ? '' : `${clients} `}${figure}`;

export { STUCK_CLIENTS, stuckClientPaths };

/** The stuck clients measured on a path. */
const clientsFor = (path: StuckPath): StuckClients[] => STUCK_CLIENTS.filter((clients) => stuckClientPaths(clients).includes(path));

/** Rows for the path's own clients at every N, then for konnectivity-style clients (measured on tunnel-grpc only). */
function stuckMetrics(counts: readonly number[]): MetricSpec[] {
  return STUCK_CLIENTS.flatMap((clients) =>
    counts.flatMap((n) => STUCK_FIGURES.map((f) => ({ metric: stuckMetric(n, f.key, clients), unit: f.unit, better: f.better }))),
  );
}

/** Bytes one write() of the stuck clients hands over (what an application copying a stream writes). */
const STUCK_CHUNK_BYTES = 64 * 1024;
/** A writer that accepted nothing in this last stretch of the writing time found every buffer on the way full. */
const STUCK_FULL_MS = 2000;
/** A stuck connection that took this much has no back-pressure at all: its client stops there. */
const STUCK_CONNECTION_LIMIT = 256 * MiB;
/** The stuck clients stop writing once hub + agent hold this share of the machine's available memory (at most 16 GiB). */
const GUARD_SHARE = 0.6;
const GUARD_MAX_KIB = 16 * 1024 * 1024;

/** How the clients' writing ended (stuck-client.ts `stoppedBy`, `seconds`, `lastWriteAfter`). */
function fillEnd(filled: Record<string, unknown>): string {
  const seconds = Number(filled['seconds']);
  const quiet = seconds - Number(filled['lastWriteAfter']);
  const how =
    filled['stoppedBy'] === 'time'
      ? quiet * 1000 >= STUCK_FULL_MS
        ? `all full (nothing accepted in the last ${quiet.toFixed(1)} s)`
        : 'still accepting when the time was up: NOT all full'
      : filled['stoppedBy'] === 'guard'
        ? 'stopped by the memory guard'
        : 'every connection closed or capped';
  return `${how} at ${seconds.toFixed(1)} s`;
}

const log = (message: string): void => void process.stderr.write(`[bench] ${message}\n`);

interface StuckResult {
  figures: Partial<Record<StuckFigure, number>>;
  summary: string;
}

/**
 * One measurement on fresh processes: healthy bulk alone; settle, GC, RSS "before"; a child opens
 * `n` connections to `stall` and writes into them for stuckSeconds (RSS sampled every 100 ms); the
 * same bulk next to them; the child closes them and exits; stuckAfterMs later GC, RSS "after" and
 * the connection tables.
 */
async function stuckOnce(path: StuckPath, clients: StuckClients, n: number, cfg: BenchConfig): Promise<StuckResult> {
  const rig = await startStuckRig(path, clients);
  const bulk = openClient(rig.spec);
  const dialer: Dialer = { path, network: 'lan', dial: (target, timeoutMs) => bulk.dial(target, timeoutMs) };
  let child: ManagedProcess | undefined;
  const figures: StuckResult['figures'] = {};
  const notes: string[] = [];
  try {
    // The healthy bulk alone, before the "before" reading: its own buffers are not charged to the stuck connections.
    const calibration = transferSize(0, 0, cfg);
    const rate = calibration / (await transfer(dialer, 'up', calibration, false, 60_000));
    const bulkBytes = transferSize(rate, cfg.stuckBulkSeconds, cfg);
    const soloSeconds = await transfer(dialer, 'up', bulkBytes, false, (5 * cfg.stuckBulkSeconds + 20) * 1000);
    await sleep(cfg.scaleSettleMs);
    const before = await rig.gcAndRss();
    const anonBefore = await rig.anon();
    const socketBefore = await rig.socketMemory().catch(() => undefined);
    figures['hub before'] = (before.hub ?? 0) / 1024;
    figures['agent before'] = (before.agent ?? 0) / 1024;
    figures['hub anon before'] = (anonBefore.hub ?? 0) / 1024;
    figures['agent anon before'] = (anonBefore.agent ?? 0) / 1024;
    const counters = await rig.agentCounters();
    const mark = rig.mark();

    const guardKiB = Math.min(GUARD_MAX_KIB, GUARD_SHARE * (await memAvailableKiB()));
    const sampler = new RssSampler(rig, guardKiB, () => void child?.kill('SIGUSR1'));
    sampler.start();
    const job: StuckJob = {
      spec: rig.stuckSpec,
      count: n,
      concurrency: 64,
      seconds: cfg.stuckSeconds,
      chunkBytes: STUCK_CHUNK_BYTES,
      perConnectionLimit: STUCK_CONNECTION_LIMIT,
    };
    child = await spawnStuckClients(`stuck-client-${path}-${n}`, job);
    const opened = await child.waitForJsonLine((o) => 'opened' in o, 60_000 + n * 100);
    const filled = await child.waitForJsonLine((o) => 'filled' in o, (cfg.stuckSeconds + 60) * 1000);
    const held = await rig.tables().catch((err: unknown) => errorMessage(err));
    const budgets = await rig.budgets().catch(() => undefined);
    const queues = await rig.kernelQueues().catch(() => undefined);
    // Every stuck connection is full now: what the kernel holds for hub and agent is at its most.
    const socketHeld = await rig.socketMemory().catch(() => undefined);
    const anonHeld = await rig.anon();
    const anonPeakHeld = { ...sampler.anonPeak };
    // The same after a full collection: what the held connections keep alive, without their garbage.
    await rig.gcAndRss();
    const anonLive = await rig.anon();
    // The stuck connections' bytes sit mostly in kernel buffers (both ends are on this machine): past
    // tcp_mem's pressure threshold the kernel caps every socket, the bulk's included.
    const kernelTcp = await tcpMemory();

    const bulkTimeoutMs = Math.max(30, 15 * soloSeconds) * 1000;
    let stuckSeconds: number | undefined;
    try {
      stuckSeconds = await transfer(dialer, 'up', bulkBytes, false, bulkTimeoutMs);
    } catch (err) {
      notes.push(`the bulk next to them FAILED: ${errorMessage(err)}`);
    }
    bulk.close();
    const soloMBps = mbPerSecond(bulkBytes, soloSeconds);
    const stuckMBps = stuckSeconds === undefined ? 0 : mbPerSecond(bulkBytes, stuckSeconds);
    figures['bulk kept'] = (100 * stuckMBps) / soloMBps;

    const after = child.lineCount();
    child.kill('SIGUSR2');
    const holding = await child.waitForJsonLine((o) => 'holding' in o, 30_000, { after });
    await child.waitForJsonLine((o) => 'closed' in o, 60_000, { after });
    await child.stop(10_000);
    await sampler.stop();
    figures['hub peak'] = sampler.peak.hub / 1024;
    figures['agent peak'] = sampler.peak.agent / 1024;
    const anonPeak = {
      hub: Math.max(sampler.anonPeak.hub, anonHeld.hub ?? 0),
      agent: Math.max(sampler.anonPeak.agent, anonHeld.agent ?? 0),
    };
    figures['hub anon peak'] = anonPeak.hub / 1024;
    figures['agent anon peak'] = anonPeak.agent / 1024;
    if (socketHeld?.hub !== undefined && socketHeld.agent !== undefined) {
      figures['hub socket held'] = socketHeld.hub / 1024;
      figures['agent socket held'] = socketHeld.agent / 1024;
      // The peak of anonymous memory plus the sockets while full (both at their most, maybe not at one instant).
      figures['agent anon+socket'] = (anonPeak.agent + socketHeld.agent) / 1024;
      const sb = { hub: socketBefore?.hub ?? 0, agent: socketBefore?.agent ?? 0 };
      const hubGrowth = anonPeak.hub + socketHeld.hub - (anonBefore.hub ?? 0) - sb.hub;
      const agentGrowth = anonPeak.agent + socketHeld.agent - (anonBefore.agent ?? 0) - sb.agent;
      figures['hub KiB/conn'] = hubGrowth / n;
      figures['hub+agent KiB/conn'] = (hubGrowth + agentGrowth) / n;
    }

    await sleep(cfg.stuckAfterMs);
    const deaths = await rig.deaths();
    const end = await rig.gcAndRss();
    if (end.hub !== undefined) figures['hub after'] = end.hub / 1024;
    if (end.agent !== undefined) figures['agent after'] = end.agent / 1024;
    const anonEnd = await rig.anon();
    if (anonEnd.hub !== undefined) figures['hub anon after'] = anonEnd.hub / 1024;
    if (anonEnd.agent !== undefined) figures['agent anon after'] = anonEnd.agent / 1024;
    const left = await rig.tables().catch(() => undefined);
    // Connections still listed: the most any one table (hub routes, hub frontends, agent) holds.
    const listed = (t: Tables): number => Math.max(t.hubRoutes, t.hubFrontends, t.agent);
    if (left) figures.left = listed(left);
    const countersAfter = deaths.length === 0 ? await rig.agentCounters().catch(() => undefined) : undefined;

    const openedCount = Number(opened['opened']);
    const lostByPath = Number(holding['lost']);
    const tunnelsLost = countersAfter ? countersAfter.tunnelsLost - counters.tunnelsLost : 0;
    const tunnelsReopened = countersAfter ? countersAfter.tunnelsOpened - counters.tunnelsOpened : 0;
    figures.lost = deaths.length + Math.max(tunnelsLost, tunnelsReopened) + (n - openedCount) + lostByPath;
    figures.accepted = Number(filled['filled']) / MiB;

    if (deaths.length > 0) notes.push(`DIED: ${deaths.join(', ')}`);
    if (tunnelsLost > 0 || tunnelsReopened > 0)
      notes.push(`the agent LOST its tunnel ${tunnelsLost} time(s) (${tunnelsReopened} reconnect(s))`);
    if (openedCount < n)
      notes.push(
        `only ${openedCount} of ${n} connections opened (${String(opened['failed'])} dials failed: ${String(opened['firstError'])})`,
      );
    if (lostByPath > 0) notes.push(`${lostByPath} stuck connection(s) CLOSED by the path (${String(holding['firstError']) || 'no error'})`);
    if (filled['stoppedBy'] === 'guard') notes.push(`the clients stopped writing early: hub + agent passed ${mib(guardKiB)}`);
    if (Number(filled['capped']) > 0)
      notes.push(
        `${String(filled['capped'])} connection(s) still accepted after ${describeBytes(STUCK_CONNECTION_LIMIT)} (no back-pressure)`,
      );
    const tablesText = (t: Tables): string => `the hub lists ${t.hubRoutes} (frontends ${t.hubFrontends}), the agent ${t.agent}`;
    if (!left) notes.push('the connection tables could not be read after');
    else if (listed(left) > 0) notes.push(`${cfg.stuckAfterMs / 1000} s after: ${tablesText(left)}`);
    const warnings = rig.warnings(mark);
    if (warnings.length > 0) notes.push(`logged: ${warnings.join('; ')}`);

    const per = (b: number): string => describeBytes(b);
    const budgetText = budgets
      ? `; their budgets: hub holds ${per(budgets.hub.held)} (windows ${per(budgets.hub.committed)}), agent ${per(budgets.agent.held)} (${per(budgets.agent.committed)})`
      : '';
    const queueText = queues
      ? `; in their sockets' kernel queues: hub ${per(queues.hub.send)} unsent or unacknowledged, ${per(queues.hub.receive)} unread; agent ${per(queues.agent.send)}, ${per(queues.agent.receive)}`
      : '';
    const heldText = `${typeof held === 'string' ? `tables unreadable while held (${held})` : `while held ${tablesText(held)}`}${budgetText}${queueText}`;
    const limited = Number(opened['unsentLimited']);
    const capText =
      limited > 0
        ? `; ${limited} client sockets capped at ${DEFAULT_UNSENT_LIMIT / 1024} KiB unsent (a real client's kernel is on its own machine)`
        : rig.stuckSpec.kind === 'connect'
          ? '; client sockets NOT capped (no system calls here): their send queues count on this machine'
          : '';
    const clientText = `${String(opened['client'])}${capText}`;
    const summary =
      `N=${n}: ${openedCount} opened in ${Number(opened['seconds']).toFixed(1)} s (${clientText}); ` +
      `${per(Number(filled['filled']))} handed over in all (${per(Number(filled['min']))}–${per(Number(filled['max']))} per connection; last write() at ${Number(filled['lastWriteAfter']).toFixed(1)} s; ` +
      `${fillEnd(filled)} with ${String(filled['open'])} open, ${String(filled['blocked'])} blocked); ${heldText}; ` +
      `hub ${mib(before.hub ?? 0)} → peak ${mib(sampler.peak.hub)} → ${end.hub === undefined ? 'gone' : mib(end.hub)}, ` +
      `agent ${mib(before.agent ?? 0)} → peak ${mib(sampler.peak.agent)} → ${end.agent === undefined ? 'gone' : mib(end.agent)} (${sampler.samples} samples); ` +
      `anonymous: hub ${mib(anonBefore.hub ?? 0)} → peak ${mib(anonPeak.hub)} (${mib(anonPeakHeld.hub)} before the bulk, ${mib(anonHeld.hub ?? 0)} while held, ${mib(anonLive.hub ?? 0)} live) → ${anonEnd.hub === undefined ? 'gone' : mib(anonEnd.hub)}, agent ${mib(anonBefore.agent ?? 0)} → peak ${mib(anonPeak.agent)} (${mib(anonPeakHeld.agent)} before the bulk, ${mib(anonHeld.agent ?? 0)} while held, ${mib(anonLive.agent ?? 0)} live) → ${anonEnd.agent === undefined ? 'gone' : mib(anonEnd.agent)}; ` +
      `socket memory (skmem) before / while held: hub ${socketBefore?.hub === undefined ? '?' : mib(socketBefore.hub)} / ${socketHeld?.hub === undefined ? '?' : mib(socketHeld.hub)}, agent ${socketBefore?.agent === undefined ? '?' : mib(socketBefore.agent)} / ${socketHeld?.agent === undefined ? '?' : mib(socketHeld.agent)}; ` +
      `bulk ${describeBytes(bulkBytes)} alone ${soloMBps.toFixed(0)} MB/s, next to them ${stuckSeconds === undefined ? 'did not finish' : `${stuckMBps.toFixed(0)} MB/s`} (kernel TCP memory while held: ${describeTcpMemory(kernelTcp)})` +
      (notes.length > 0 ? `; ${notes.join('; ')}` : '');
    return { figures, summary };
  } finally {
    bulk.close();
    await child?.stop(5000);
    await rig.stop();
  }
}

class StuckRun implements PathRun {
  private readonly figures = new Map<string, number>();
  private readonly notesList: string[] = [];

  constructor(
    private readonly path: StuckPath,
    private readonly cfg: BenchConfig,
  ) {}

  async measure(): Promise<string> {
    const failed: string[] = [];
    for (const clients of clientsFor(this.path)) {
      const who = clients === 'sdk' ? '' : ` ${clients}-style clients`;
      for (const n of stuckCounts(this.cfg)) {
        try {
          const { figures, summary } = await stuckOnce(this.path, clients, n, this.cfg);
          for (const [figure, value] of Object.entries(figures)) this.figures.set(stuckMetric(n, figure as StuckFigure, clients), value);
          this.notesList.push(`${who ? `${who.trim()}, ` : ''}${summary}`);
          log(`stuck-destination ${this.path}${who} ${summary}`);
        } catch (err) {
          failed.push(`${who ? `${who.trim()} ` : ''}N=${n}: ${errorMessage(err)}`);
          log(`stuck-destination ${this.path}${who} N=${n}: FAILED: ${errorMessage(err)}`);
        }
      }
    }
    if (failed.length > 0) throw new Error(failed.join('; '));
    return `N=${stuckCounts(this.cfg).join(', ')} done`;
  }

  values(): (number | null)[] {
    return stuckMetrics(stuckCounts(this.cfg)).map((m) => this.figures.get(m.metric) ?? null);
  }

  roundValues(): number[][] {
    return this.values().map((v) => (v === null ? [] : [v]));
  }

  notes(): string[] {
    return this.notesList;
  }
}

const isStuckPath = (p: PathName): p is StuckPath => (STUCK_PATHS as readonly PathName[]).includes(p);

export const STUCK_DESTINATION: Scenario = {
  name: 'stuck-destination',
  network: 'lan',
  description:
    'N connections to a destination that never reads, written into as fast as the path allows (fresh hub + agent per N): peak RSS, a healthy bulk beside them, RSS and tables after',
  metrics: stuckMetrics([STUCK_GOAL_COUNT]),
  metricsFor: (cfg) => stuckMetrics(stuckCounts(cfg)),
  rounds: () => 1,
  appliesTo: {
    paths: STUCK_PATHS,
    otherwise: 'no hub or agent in between (direct, ssh -R); forward is the tunnel path behind one more process',
  },
  forPath: (dialer, cfg) => {
    if (!isStuckPath(dialer.path)) throw new Error(`stuck-destination does not apply to ${dialer.path}`);
    return new StuckRun(dialer.path, cfg);
  },
};
