// fleet: N simulated clusters on one hub replica (test/src/fleet: real agents, one identity each, mux and
// gRPC mixed, real lease renewals and replica syncs) at the sizes of cfg.fleetSizes, a fresh hub for each
// N on the embedded store. Per N: how long the fleet took to connect; the idle hub's RSS, CPU and store
// requests per minute over a steady window (one dial a second meanwhile); dials with N agents connected;
// `cluster-proxy get managedclusteraddons -A`; one agent killed until the hub reports it unavailable; a hub
// restart until every agent is back, and how the reconnects spread. Dials are also measured with 10 agents.
import { setTimeout as sleep } from 'node:timers/promises';
import { runCommand } from '../fixtures/index.js';
import { CLI } from '../harness.js';
import { Fleet, clusterName } from '../fleet/fleet.js';
import { cpuTicks, CLOCK_TICKS } from './cpu.js';
import { rssKiB } from './helpers.js';
import { errorMessage } from './io.js';
import type { Dialer } from './paths.js';
import { positiveCounts, type BenchConfig, type MetricSpec, type PathRun, type Scenario } from './scenarios.js';
import { percentile, sorted } from './stats.js';

/** The goals of docs/goals.md are checked at this N. */
export const FLEET_GOAL_N = 5000;
/** Dials are compared with this small fleet. */
export const FLEET_BASE_N = 10;

/** FLEET_STORE=kubernetes: the hubs keep their store in the Kubernetes API fixture instead of the embedded store. */
const fleetStore = (): 'embedded' | 'kubernetes' => (process.env['FLEET_STORE'] === 'kubernetes' ? 'kubernetes' : 'embedded');

export const fleetSizes = (cfg: BenchConfig): number[] => positiveCounts(cfg.fleetSizes);

const FIGURES = [
  { key: 'connect all', unit: 's', better: 'lower' },
  { key: 'hub RSS', unit: 'MiB', better: 'lower' },
  { key: 'hub CPU idle', unit: '%', better: 'lower' },
  { key: 'store req/min', unit: 'count', better: 'lower' },
  { key: 'restart: all back', unit: 's', better: 'lower' },
  { key: 'restart: max in 1 s', unit: '%', better: 'lower' },
  { key: 'restart: all Available', unit: 's', better: 'lower' },
  { key: 'killed → unavailable', unit: 's', better: 'lower' },
  { key: 'dial rate', unit: 'conn/s', better: 'higher' },
  { key: 'dial p99', unit: 'ms', better: 'lower' },
  { key: 'dial p99 / N=10', unit: 'x', better: 'lower' },
  { key: 'get addons', unit: 'ms', better: 'lower' },
] as const;

export type FleetFigure = (typeof FIGURES)[number]['key'];

/** The metric name of one figure at N clusters, e.g. "N=5000 hub RSS". */
export const fleetMetric = (n: number, figure: FleetFigure): string => `N=${n} ${figure}`;

function fleetMetrics(cfg: BenchConfig): MetricSpec[] {
  const base: MetricSpec[] = [
    { metric: `N=${FLEET_BASE_N} dial rate`, unit: 'conn/s', better: 'higher' },
    { metric: `N=${FLEET_BASE_N} dial p99`, unit: 'ms', better: 'lower' },
  ];
  return [
    ...base,
    ...fleetSizes(cfg).flatMap((n) => FIGURES.map((f) => ({ metric: fleetMetric(n, f.key), unit: f.unit, better: f.better }))),
  ];
}

const log = (message: string): void => void process.stderr.write(`[bench] fleet: ${message}\n`);

const DIAL_CONCURRENCY = 16;
/** An upper bound on every wait: a fleet that does not converge fails the figure, it does not hang the bench. */
const CONVERGE_LIMIT_MS = 180_000;
const UNAVAILABLE_LIMIT_MS = 120_000;

const STORE_REQUESTS = 'cluster_proxy_server_store_requests_total';

/** N dials to random clusters, DIAL_CONCURRENCY at a time for `ms`: rate and p99 latency (connect → 64 bytes echoed). */
async function dials(fleet: Fleet, n: number, ms: number): Promise<{ rate: number; p99: number; failed: number }> {
  const latencies: number[] = [];
  let failed = 0;
  const began = performance.now();
  const worker = async (): Promise<void> => {
    while (performance.now() - began < ms && latencies.length < 200_000) {
      try {
        latencies.push(await fleet.dial(clusterName(Math.floor(Math.random() * n))));
      } catch {
        failed++;
        if (failed > 100) return;
      }
    }
  };
  await Promise.all(Array.from({ length: DIAL_CONCURRENCY }, worker));
  const seconds = (performance.now() - began) / 1000;
  return { rate: latencies.length / seconds, p99: percentile(sorted(Float64Array.from(latencies)), 0.99), failed };
}

interface SizeResult {
  figures: Partial<Record<FleetFigure, number>>;
  notes: string[];
}

async function measureSize(n: number, cfg: BenchConfig, baseP99: number | undefined): Promise<SizeResult> {
  const figures: SizeResult['figures'] = {};
  const notes: string[] = [];
  const prof = process.env['FLEET_HUB_CPU_PROF'];
  const store = fleetStore();
  const realOcm = process.env['FLEET_OCM'] === 'real';
  const ocm = process.env['FLEET_OCM'] === '1' || realOcm;
  const fleet = await Fleet.create({
    clusters: n,
    log,
    store,
    ocm,
    realOcm,
    hubNodeArgs: prof ? ['--cpu-prof', '--cpu-prof-dir', prof] : [],
  });
  if (realOcm)
    notes.push(
      `N=${n}: OCM mode on OCM itself (FLEET_OCM=real): --agent-install manifestwork on a real kube-apiserver with OCM's hub controllers (registration, addon-manager, placement, work)`,
    );
  else if (ocm) notes.push(`N=${n}: OCM mode (FLEET_OCM=1): --agent-install manifestwork, the store in the Kubernetes API fixture`);
  else if (store === 'kubernetes') notes.push(`N=${n}: hub store: the Kubernetes API fixture (FLEET_STORE=kubernetes)`);
  try {
    await fleet.loadClient();
    const { issuedSeconds } = await fleet.startAgents();
    // In OCM mode the hub installs every agent's work and writes every addon's status while the fleet connects (on
    // the same cores as the API server it writes to): a longer bound, the time itself is the figure.
    figures['connect all'] = await fleet.waitConnected(n, CONVERGE_LIMIT_MS + n * (ocm ? 40 : 20));
    log(`N=${n}: certificates issued in ${issuedSeconds.toFixed(1)} s; all ${n} connected in ${figures['connect all'].toFixed(1)} s`);

    // First every addon settled: Available (the status pass has written the fleet's conditions), in OCM mode also
    // installed, and on OCM itself its rollout Completed. The embedded store is read through the admin API, a list
    // of N addons for the hub to serve, so every 5 s.
    const began = performance.now();
    const settledNow = async (): Promise<number> =>
      ocm ? fleet.settledAddons() : (await fleet.addons()).filter((a) => a.available === 'True').length;
    let settled = 0;
    while ((settled = await settledNow()) < n && performance.now() - began < CONVERGE_LIMIT_MS) await sleep(ocm ? 1000 : 5000);
    notes.push(
      `N=${n}: ${settled} of ${n} addons settled (Available${ocm ? `, ManifestApplied${realOcm ? ', Progressing Completed' : ''}` : ''}) ${((performance.now() - began) / 1000).toFixed(0)} s after all connected`,
    );
    // Steady state: the first lease renewals and status writes are over; one dial a second, as an idle fleet sees.
    await sleep(cfg.fleetSettleSeconds * 1000);
    const steadyMs = cfg.fleetSteadySeconds * 1000;
    const pid = fleet.hub.pid;
    const ticks0 = await cpuTicks(pid);
    const store0 = await fleet.hubMetric(STORE_REQUESTS);
    const t0 = performance.now();
    let dialFailures = 0;
    while (performance.now() - t0 < steadyMs) {
      await Promise.all([fleet.dial(clusterName(Math.floor(Math.random() * n))).catch(() => void dialFailures++), sleep(1000)]);
    }
    const ticks1 = await cpuTicks(pid);
    const store1 = await fleet.hubMetric(STORE_REQUESTS);
    const minutes = (performance.now() - t0) / 60_000;
    figures['hub RSS'] = (await rssKiB(pid)) / 1024;
    if (ticks0 !== undefined && ticks1 !== undefined) figures['hub CPU idle'] = ((ticks1 - ticks0) / CLOCK_TICKS / (minutes * 60)) * 100;
    figures['store req/min'] = (store1 - store0) / minutes;
    const { childRssKiB } = await fleet.connectedAgents();
    notes.push(
      `N=${n}: steady ${(minutes * 60).toFixed(0)} s, ${dialFailures} of the once-a-second dials failed; agent processes ${(childRssKiB / 1024).toFixed(0)} MiB together`,
    );
    log(
      `N=${n}: steady: hub ${figures['hub RSS'].toFixed(0)} MiB, CPU ${figures['hub CPU idle']?.toFixed(1)} %, store ${figures['store req/min'].toFixed(0)} req/min`,
    );

    const d = await dials(fleet, n, cfg.dialSeconds * 1000);
    figures['dial rate'] = d.rate;
    figures['dial p99'] = d.p99;
    if (baseP99 !== undefined) figures['dial p99 / N=10'] = d.p99 / baseP99;
    if (d.failed > 0) notes.push(`N=${n}: ${d.failed} dials failed`);

    // The real command, as an admin runs it on the hub's machine (its Node start included).
    const gets: number[] = [];
    for (let i = 0; i < 3; i++) {
      const began = performance.now();
      const r = await runCommand(
        process.execPath,
        [CLI, 'get', 'managedclusteraddons', '-A', '--admin', `127.0.0.1:${fleet.ports.admin}`],
        { timeoutMs: 60_000 },
      );
      if (r.code !== 0) throw new Error(`get managedclusteraddons failed: ${r.stderr.slice(0, 300)}`);
      gets.push(performance.now() - began);
      if (i === 0 && r.stdout.trim().split('\n').length !== n + 1)
        notes.push(`N=${n}: get managedclusteraddons listed ${r.stdout.trim().split('\n').length - 1} addons`);
    }
    figures['get addons'] = gets.sort((a, b) => a - b)[1];

    // One agent dies (as a killed pod: its tunnel closes): until the hub's addon status says Available False.
    const victim = clusterName(Math.floor(n / 2));
    const killedAt = performance.now();
    await fleet.killAgent(victim);
    for (;;) {
      const a = (await fleet.addons()).find((x) => x.cluster === victim);
      if (a?.available === 'False') {
        figures['killed → unavailable'] = (performance.now() - killedAt) / 1000;
        break;
      }
      if (performance.now() - killedAt > UNAVAILABLE_LIMIT_MS) {
        notes.push(`N=${n}: the killed agent's cluster was still ${a?.available} after ${UNAVAILABLE_LIMIT_MS / 1000} s`);
        break;
      }
      await sleep(500);
    }

    // Hub restart (SIGTERM, then a new process on the same ports and data): until every live agent is back.
    const live = n - 1;
    await fleet.stopHub();
    const stoppedAt = Date.now();
    await fleet.startHub();
    const readyAt = Date.now();
    try {
      await fleet.waitConnected(live, CONVERGE_LIMIT_MS);
      const times = (await fleet.upTimes(stoppedAt)).filter((t): t is number => t !== null);
      const last = Math.max(...times);
      figures['restart: all back'] = (last - readyAt) / 1000;
      const buckets = new Map<number, number>();
      for (const t of times) buckets.set(Math.floor((t - readyAt) / 1000), (buckets.get(Math.floor((t - readyAt) / 1000)) ?? 0) + 1);
      figures['restart: max in 1 s'] = (Math.max(...buckets.values()) / live) * 100;
      notes.push(
        `N=${n}: hub down ${((readyAt - stoppedAt) / 1000).toFixed(1)} s; reconnects per second after it was ready: ${[...buckets.entries()]
          .sort((a, b) => a[0] - b[0])
          .map(([s, c]) => `${s}s:${c}`)
          .join(' ')}`,
      );
      // And until every live cluster's addon says Available True again (what an operator's dashboard shows).
      for (;;) {
        const up = (await fleet.addons()).filter((a) => a.cluster !== victim && a.available === 'True').length;
        if (up >= live) {
          figures['restart: all Available'] = (Date.now() - readyAt) / 1000;
          break;
        }
        if (Date.now() - readyAt > CONVERGE_LIMIT_MS) {
          notes.push(`N=${n}: ${live - up} addons not Available ${CONVERGE_LIMIT_MS / 1000} s after the restart`);
          break;
        }
        await sleep(1000);
      }
    } catch (err) {
      notes.push(`N=${n}: after the restart: ${errorMessage(err)}`);
    }
  } finally {
    await fleet.stop();
  }
  return { figures, notes };
}

class FleetRun implements PathRun {
  private readonly results = new Map<string, number>();
  private readonly notesList: string[] = [];

  constructor(private readonly cfg: BenchConfig) {}

  async measure(): Promise<string> {
    // Dials with a small fleet, the baseline the large ones are compared with.
    let baseP99: number | undefined;
    const small = await Fleet.create({ clusters: FLEET_BASE_N, log });
    try {
      await small.loadClient();
      await small.startAgents();
      await small.waitConnected(FLEET_BASE_N, 60_000);
      const d = await dials(small, FLEET_BASE_N, this.cfg.dialSeconds * 1000);
      baseP99 = d.p99;
      this.results.set(`N=${FLEET_BASE_N} dial rate`, d.rate);
      this.results.set(`N=${FLEET_BASE_N} dial p99`, d.p99);
    } finally {
      await small.stop();
    }
    const summary: string[] = [];
    for (const n of fleetSizes(this.cfg)) {
      try {
        const r = await measureSize(n, this.cfg, baseP99);
        for (const [k, v] of Object.entries(r.figures)) this.results.set(fleetMetric(n, k as FleetFigure), v);
        this.notesList.push(...r.notes);
        summary.push(`N=${n} ${FIGURES.map((f) => `${f.key} ${r.figures[f.key]?.toFixed(1) ?? 'n/a'}`).join(', ')}`);
      } catch (err) {
        this.notesList.push(`N=${n} FAILED: ${errorMessage(err)}`);
        summary.push(`N=${n} FAILED: ${errorMessage(err)}`);
      }
    }
    return summary.join('; ');
  }

  values(): (number | null)[] {
    return fleetMetrics(this.cfg).map((m) => this.results.get(m.metric) ?? null);
  }

  roundValues(): number[][] {
    return this.values().map((v) => (v === null ? [] : [v]));
  }

  notes(): string[] {
    return this.notesList;
  }
}

export const FLEET: Scenario = {
  name: 'fleet',
  network: 'lan',
  description:
    'N simulated clusters (real agents, own identities, mux + gRPC) on one hub: idle RSS, CPU and store requests, restart convergence, unavailability, dials, get addons',
  metrics: [],
  metricsFor: fleetMetrics,
  rounds: () => 1,
  appliesTo: { paths: ['tunnel'], otherwise: 'the fleet runs its own hub and agents (figures in the tunnel column)' },
  forPath: (_dialer: Dialer, cfg) => new FleetRun(cfg),
};
