// `pnpm bench`: throughput, latency and dial rate of the tunnel next to a direct connection and an
// `ssh -R` reverse tunnel, everything on 127.0.0.1. See README.md in this directory.
import { writeFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';
import { CleanupStack } from './cleanup.js';
import { errorMessage } from './io.js';
import { cpuBusy, loadAverage, machineFacts } from './machine.js';
import { startReaper, stopReaper } from './reaper.js';
import { PATH_LABELS, PATH_NAMES, setupPaths, type Network, type PathName, type PathSet } from './paths.js';
import { formatReport, type BenchReport, type GoalCheck, type ResultRow } from './report.js';
import { FULL_CONFIG, QUICK_CONFIG, SCENARIOS, type BenchConfig, type PathRun, type Scenario } from './scenarios.js';

const USAGE = `Usage: pnpm bench [-- flags]   (or: node test/dist/bench/main.js [flags])

Runs every scenario against three paths on 127.0.0.1 - direct TCP, an OpenSSH "ssh -R" reverse
tunnel, and the cluster-proxy tunnel (SDK -> hub -> agent) - and prints a table.

Flags:
  --json FILE          also write the figures as JSON to FILE
  --quick              short measurements, one round (a smoke test, well under a minute)
  --only NAME[,NAME]   run only these scenarios: ${SCENARIOS.map((s) => s.name).join(', ')}
  --help               show this help
`;

/** The whole run is aborted (and everything stopped) after this long. */
const WATCHDOG_MS = { full: 10 * 60_000, quick: 4 * 60_000 };
/** Pause between measurements, so the previous one's connections finish closing. */
const SETTLE_MS = 250;

const log = (message: string): void => void process.stderr.write(`[bench] ${message}\n`);

interface Options {
  json: string | undefined;
  quick: boolean;
  scenarios: Scenario[];
}

function parseOptions(argv: string[]): Options | 'help' {
  const { values } = parseArgs({
    args: argv,
    options: { json: { type: 'string' }, quick: { type: 'boolean' }, only: { type: 'string' }, help: { type: 'boolean' } },
    strict: true,
    allowPositionals: false,
  });
  if (values.help) return 'help';
  let scenarios = [...SCENARIOS];
  if (values.only !== undefined) {
    const names = values.only.split(',').map((n) => n.trim()).filter(Boolean);
    const unknown = names.filter((n) => !SCENARIOS.some((s) => s.name === n));
    if (unknown.length > 0 || names.length === 0) {
      throw new Error(`--only: unknown scenario ${unknown.join(', ') || '(none given)'}; choose from ${SCENARIOS.map((s) => s.name).join(', ')}`);
    }
    scenarios = SCENARIOS.filter((s) => names.includes(s.name));
  }
  return { json: values.json, quick: values.quick ?? false, scenarios };
}

/** Runs one scenario on every available path, `rounds` times, alternating the path order. */
async function runScenario(scenario: Scenario, set: PathSet, cfg: BenchConfig, stopped: () => boolean): Promise<ResultRow[]> {
  const runs = new Map<PathName, PathRun>();
  const failures = new Map<PathName, string[]>();
  for (const path of PATH_NAMES) {
    const slot = set[path];
    if (slot.ok) runs.set(path, scenario.forPath(slot.dialer, cfg));
  }
  log(`${scenario.name}: ${scenario.description}`);
  for (let round = 0; round < cfg.rounds; round++) {
    // Alternate the order so no path always runs first (or right after the heaviest one).
    const order = round % 2 === 0 ? PATH_NAMES : [...PATH_NAMES].reverse();
    for (const path of order) {
      const run = runs.get(path);
      if (!run || stopped()) continue;
      const tag = `${scenario.name} round ${round + 1}/${cfg.rounds} ${PATH_LABELS[path]}`;
      try {
        log(`${tag}: ${await run.measure(round)}`);
      } catch (err) {
        if (stopped()) break; // torn down under us (SIGINT): not a result
        const message = errorMessage(err);
        log(`${tag}: FAILED: ${message}`);
        failures.set(path, [...(failures.get(path) ?? []), `round ${round + 1}: ${message}`]);
      }
      await new Promise((resolve) => setTimeout(resolve, SETTLE_MS));
    }
  }
  const perPath = new Map(PATH_NAMES.map((p) => [p, runs.get(p)?.values() ?? scenario.metrics.map(() => null)] as const));
  return scenario.metrics.map((m, i) => {
    const value = (p: PathName): number | null => perPath.get(p)?.[i] ?? null;
    const rounds = (p: PathName): number[] => runs.get(p)?.roundValues()[i] ?? [];
    const notes: string[] = [];
    for (const p of PATH_NAMES) {
      for (const n of runs.get(p)?.notes() ?? []) notes.push(`${PATH_LABELS[p]}: ${n}`);
      for (const f of failures.get(p) ?? []) notes.push(`${PATH_LABELS[p]} ${f}`);
    }
    return {
      scenario: scenario.name,
      metric: m.metric,
      unit: m.unit,
      better: m.better,
      direct: value('direct'),
      ssh: value('ssh'),
      tunnel: value('tunnel'),
      rounds: { direct: rounds('direct'), ssh: rounds('ssh'), tunnel: rounds('tunnel') },
      notes: i === 0 ? notes : [],
    };
  });
}

/** The goal for the tunnel over 20 ms RTT: at least 50 MB/s each way. */
function checkGoals(rows: readonly ResultRow[]): GoalCheck[] {
  return rows
    .filter((r) => r.scenario.startsWith('rtt20-throughput-') && r.metric === 'throughput')
    .map((r) => ({ scenario: r.scenario, metric: r.metric, goal: '>= 50 MB/s', value: r.tunnel, met: r.tunnel !== null && r.tunnel >= 50 }));
}

async function main(): Promise<number> {
  let options: Options | 'help';
  try {
    options = parseOptions(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`${errorMessage(err)}\n\n${USAGE}`);
    return 2;
  }
  if (options === 'help') {
    process.stdout.write(USAGE);
    return 0;
  }
  const mode = options.quick ? 'quick' : 'full';
  const cfg = options.quick ? QUICK_CONFIG : FULL_CONFIG;
  const machine = machineFacts(
    `${mode}: ${cfg.rounds} round(s), throughput ~${cfg.throughputSeconds} s, rtt ${cfg.rttSeconds} s, dial ${cfg.dialSeconds} s x${cfg.dialConcurrency}`,
  );
  const cleanup = new CleanupStack(log);
  let stopping = false;
  const abort = (why: string, code: number): void => {
    if (stopping) {
      log(`${why} again: exiting without waiting for cleanup`);
      process.exit(code);
    }
    stopping = true;
    log(`${why}: stopping everything ...`);
    void cleanup.unwind().finally(() => {
      stopReaper();
      process.exit(code);
    });
  };
  process.on('SIGINT', () => abort('SIGINT', 130));
  process.on('SIGTERM', () => abort('SIGTERM', 143));
  const watchdog = setTimeout(() => abort(`watchdog: the run took longer than ${WATCHDOG_MS[mode] / 60_000} min`, 1), WATCHDOG_MS[mode]);
  watchdog.unref();

  const began = performance.now();
  startReaper();
  try {
    // Other work on the machine (a test run, a build) skews every figure: say so up front.
    const busy = await cpuBusy(options.quick ? 500 : 1000);
    machine['busy before start'] = busy === undefined ? 'n/a' : `${(busy * 100).toFixed(0)}% of all cores (load average ${loadAverage()})`;
    if (busy !== undefined && busy > 0.15) log(`WARNING: the machine is already ${(busy * 100).toFixed(0)}% busy before the benchmark starts; figures will be noisy`);
    const networks = new Set<Network>(options.scenarios.map((s) => s.network));
    const { sets, facts } = await setupPaths(networks, cleanup, log);
    Object.assign(machine, facts);
    const unavailable: Record<string, string> = {};
    for (const [network, set] of sets) {
      for (const p of PATH_NAMES) {
        const slot = set[p];
        if (!slot.ok) unavailable[`${PATH_LABELS[p]} (${network})`] = slot.reason;
      }
    }
    log(`setup took ${((performance.now() - began) / 1000).toFixed(1)} s`);
    const results: ResultRow[] = [];
    for (const scenario of options.scenarios) {
      const set = sets.get(scenario.network);
      if (stopping || !set) continue;
      results.push(...(await runScenario(scenario, set, cfg, () => stopping)));
    }
    if (stopping) return 1;
    machine['duration'] = `${((performance.now() - began) / 1000).toFixed(0)} s`;
    machine['load after'] = loadAverage();
    const report: BenchReport = {
      machine,
      config: { mode, ...cfg, scenarios: options.scenarios.map((s) => s.name).join(',') },
      results,
      unavailable,
      goals: checkGoals(results),
    };
    process.stdout.write(`${formatReport(report)}\n`);
    if (options.json !== undefined) {
      // Three decimals are plenty for any of these figures.
      const round = (_key: string, value: unknown): unknown => (typeof value === 'number' && !Number.isInteger(value) ? Math.round(value * 1000) / 1000 : value);
      await writeFile(options.json, `${JSON.stringify(report, round, 2)}\n`);
      log(`wrote ${options.json}`);
    }
    return 0;
  } finally {
    clearTimeout(watchdog);
    log('stopping processes and servers ...');
    await cleanup.unwind();
    stopReaper();
  }
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    log(`error: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
    process.exit(1);
  },
);
