// `pnpm bench`: throughput, latency, dial rate, head-of-line blocking and memory of the tunnel
// (SDK over our mux transport, SDK over ANP's gRPC, HTTP CONNECT) next to a direct connection and an
// `ssh -R` reverse tunnel, everything on 127.0.0.1. See README.md in this directory.
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { errorMessage } from './io.js';
import { cpuBusy, describeTcpMemory, loadAverage, machineFacts, tcpMemory } from './machine.js';
import { runToExit, startBenchRun } from './run.js';
import { PATH_LABELS, PATH_NAMES, setupPaths, type Network, type PathName, type PathSet } from './paths.js';
import { checkGoals, computeRatios, formatReport, type BenchReport, type ResultRow } from './report.js';
import {
  FULL_CONFIG,
  QUICK_CONFIG,
  positiveCounts,
  SCENARIOS as MAIN_SCENARIOS,
  type BenchConfig,
  type PathRun,
  type Scenario,
} from './scenarios.js';
import { BIG_WRITE } from './big-write.js';
import { GATEWAY } from './gateway.js';
import { STUCK_DESTINATION } from './stuck.js';
import { FLEET } from './fleet.js';

const SCENARIOS: readonly Scenario[] = [...MAIN_SCENARIOS, STUCK_DESTINATION, BIG_WRITE, GATEWAY, FLEET];

const USAGE = `Usage: pnpm bench [-- flags]   (or: node test/dist/bench/main.js [flags])

Runs every scenario against five paths on 127.0.0.1 - direct TCP, an OpenSSH "ssh -R" reverse
tunnel, and cluster-proxy: "tunnel" (SDK -> hub -> agent over our mux transport), "tunnel-grpc"
(the same over ANP's gRPC) and "connect" (HTTP CONNECT over TLS to the hub, mux agent) - and
prints a table and the goals of docs/goals.md.

Flags:
  --json FILE          also write the figures as JSON to FILE
  --quick              short measurements, one round, small scale counts (a smoke test, ~3 min)
  --only NAME[,NAME]   run only these scenarios: ${SCENARIOS.map((s) => s.name).join(', ')}
  --cpu-prof DIR       every hub and agent writes a V8 CPU profile into DIR when it exits
  --paths NAME[,NAME]  measure only these paths: ${PATH_NAMES.join(', ')}
  --fleet-sizes N[,N]  the fleet scenario's numbers of clusters (default 1000,2500,5000; 100 with --quick)
  --stuck-counts N[,N] stuck-destination's numbers of stuck connections (default 64,256,1024; 64 with --quick)
  --help               show this help
`;

/** The whole run is aborted (and everything stopped) after this long. */
const WATCHDOG_MS = { full: 25 * 60_000, quick: 6 * 60_000 };
/** The fleet scenario's sizes take this much longer on top. */
const FLEET_WATCHDOG_MS = { full: 25 * 60_000, quick: 4 * 60_000 };

const log = (message: string): void => void process.stderr.write(`[bench] ${message}\n`);

interface Options {
  json: string | undefined;
  quick: boolean;
  scenarios: Scenario[];
  cpuProf: string | undefined;
  fleetSizes: string | undefined;
  stuckCounts: string | undefined;
  paths: readonly PathName[];
}

function parseOptions(argv: string[]): Options | 'help' {
  const { values } = parseArgs({
    args: argv,
    options: {
      json: { type: 'string' },
      quick: { type: 'boolean' },
      only: { type: 'string' },
      'cpu-prof': { type: 'string' },
      'fleet-sizes': { type: 'string' },
      'stuck-counts': { type: 'string' },
      paths: { type: 'string' },
      help: { type: 'boolean' },
    },
    strict: true,
    allowPositionals: false,
  });
  if (values.help) return 'help';
  const scenarioNames =
    values.only === undefined
      ? undefined
      : pickNames(
          '--only',
          'scenario',
          values.only,
          SCENARIOS.map((s) => s.name),
        );
  const scenarios = scenarioNames ? SCENARIOS.filter((s) => scenarioNames.includes(s.name)) : [...SCENARIOS];
  const pathNames = values.paths === undefined ? undefined : pickNames('--paths', 'path', values.paths, PATH_NAMES);
  const paths = pathNames ? PATH_NAMES.filter((p) => pathNames.includes(p)) : PATH_NAMES;
  for (const [flag, value] of [
    ['--fleet-sizes', values['fleet-sizes']],
    ['--stuck-counts', values['stuck-counts']],
  ] as const) {
    if (value !== undefined && positiveCounts(value).join(',') !== value.replace(/\s/g, ''))
      throw new Error(`${flag}: expected positive integers separated by commas, got "${value}"`);
  }
  return {
    json: values.json,
    quick: values.quick ?? false,
    scenarios,
    cpuProf: values['cpu-prof'] === undefined ? undefined : path.resolve(values['cpu-prof']),
    fleetSizes: values['fleet-sizes'],
    stuckCounts: values['stuck-counts'],
    paths,
  };
}

/** The names a flag lists (comma-separated), each one of `known`; throws naming the unknown ones. */
function pickNames(flag: string, what: string, value: string, known: readonly string[]): string[] {
  const names = value
    .split(',')
    .map((n) => n.trim())
    .filter(Boolean);
  const unknown = names.filter((n) => !known.includes(n));
  if (unknown.length > 0 || names.length === 0)
    throw new Error(`${flag}: unknown ${what} ${unknown.join(', ') || '(none given)'}; choose from ${known.join(', ')}`);
  return names;
}

/** Runs one scenario on every available path it applies to, its rounds alternating the path order. */
async function runScenario(
  scenario: Scenario,
  set: PathSet,
  cfg: BenchConfig,
  only: readonly PathName[],
  stopped: () => boolean,
): Promise<ResultRow[]> {
  const runs = new Map<PathName, PathRun>();
  const failures = new Map<PathName, string[]>();
  const applies = (p: PathName): boolean => !scenario.appliesTo || scenario.appliesTo.paths.includes(p);
  for (const p of PATH_NAMES) {
    const slot = set[p];
    if (slot.ok && applies(p) && only.includes(p)) runs.set(p, scenario.forPath(slot.dialer, cfg));
  }
  const rounds = scenario.rounds?.(cfg) ?? cfg.rounds;
  const began = performance.now();
  log(`${scenario.name}: ${scenario.description}`);
  for (let round = 0; round < rounds; round++) {
    // Alternate the order so no path always runs first (or right after the heaviest one).
    const order = round % 2 === 0 ? PATH_NAMES : [...PATH_NAMES].reverse();
    for (const p of order) {
      const run = runs.get(p);
      if (!run || stopped()) continue;
      const tag = `${scenario.name} round ${round + 1}/${rounds} ${PATH_LABELS[p]}`;
      try {
        log(`${tag}: ${await run.measure(round)}`);
      } catch (err) {
        if (stopped()) break; // torn down under us (SIGINT): not a result
        const message = errorMessage(err);
        log(`${tag}: FAILED: ${message}`);
        failures.set(p, [...(failures.get(p) ?? []), `round ${round + 1}: ${message}`]);
      }
      await new Promise((resolve) => setTimeout(resolve, cfg.settleMs));
    }
  }
  log(`${scenario.name}: ${((performance.now() - began) / 1000).toFixed(0)} s`);
  const notes: string[] = [];
  for (const p of PATH_NAMES) {
    for (const n of runs.get(p)?.notes() ?? []) notes.push(`${PATH_LABELS[p]}: ${n}`);
    for (const f of failures.get(p) ?? []) notes.push(`${PATH_LABELS[p]} ${f}`);
  }
  if (scenario.appliesTo)
    notes.push(
      `n/a for ${PATH_NAMES.filter((p) => !applies(p))
        .map((p) => PATH_LABELS[p])
        .join(', ')}: ${scenario.appliesTo.otherwise}`,
    );
  return (scenario.metricsFor?.(cfg) ?? scenario.metrics).map((m, i) => {
    const values = {} as Record<PathName, number | null>;
    const perRound = {} as Record<PathName, number[]>;
    for (const p of PATH_NAMES) {
      const v = runs.get(p)?.values()[i];
      values[p] = v === undefined || v === null || !Number.isFinite(v) ? null : v;
      perRound[p] = runs.get(p)?.roundValues()[i] ?? [];
    }
    return {
      scenario: scenario.name,
      metric: m.metric,
      unit: m.unit,
      better: m.better,
      values,
      rounds: perRound,
      ratios: computeRatios(values),
      notes: i === 0 ? notes : [],
    };
  });
}

async function main(): Promise<number> {
  let options: Options | 'help';
  try {
    // `pnpm bench -- --json F` hands the script a literal "--" first (pnpm passes it through).
    const argv = process.argv.slice(2);
    options = parseOptions(argv[0] === '--' ? argv.slice(1) : argv);
  } catch (err) {
    process.stderr.write(`${errorMessage(err)}\n\n${USAGE}`);
    return 2;
  }
  if (options === 'help') {
    process.stdout.write(USAGE);
    return 0;
  }
  const mode = options.quick ? 'quick' : 'full';
  const cfg: BenchConfig = {
    ...(options.quick ? QUICK_CONFIG : FULL_CONFIG),
    ...(options.fleetSizes !== undefined ? { fleetSizes: options.fleetSizes } : {}),
    ...(options.stuckCounts !== undefined ? { stuckCounts: options.stuckCounts } : {}),
  };
  const machine = machineFacts(
    `${mode}: ${cfg.rounds} round(s) (rtt20 ${cfg.rtt20Rounds}, hol ${cfg.holRounds}, scale 1), throughput ~${cfg.throughputSeconds} s, rtt ${cfg.rttSeconds} s, ` +
      `dial ${cfg.dialSeconds} s x${cfg.dialConcurrency}, hol ${2 * cfg.holStalled + 1} x ~${cfg.holSeconds} s, ` +
      `scale ${cfg.scaleConnections} connections (ssh -R ${cfg.scaleSshConnections}) / ${cfg.scaleAgents} agents, ` +
      `stuck ${cfg.stuckCounts} connections x ${cfg.stuckSeconds} s, big write ${cfg.bigWriteBytes / 2 ** 20} MiB`,
  );
  const run = startBenchRun(log, WATCHDOG_MS[mode] + (options.scenarios.includes(FLEET) ? FLEET_WATCHDOG_MS[mode] : 0));
  const { cleanup, stopping } = run;

  const began = performance.now();
  try {
    // Other work on the machine (a test run, a build) skews every figure: say so up front.
    const busy = await cpuBusy(options.quick ? 500 : 1000);
    machine['busy before start'] = busy === undefined ? 'n/a' : `${(busy * 100).toFixed(0)}% of all cores (load average ${loadAverage()})`;
    if (busy !== undefined && busy > 0.15)
      log(`WARNING: the machine is already ${(busy * 100).toFixed(0)}% busy before the benchmark starts; figures will be noisy`);
    const tcp = await tcpMemory();
    machine['tcp memory'] = describeTcpMemory(tcp);
    if (tcp && tcp.pages >= tcp.pressurePages)
      log(
        'WARNING: the kernel is under TCP memory pressure (another process holds full socket buffers); throughput through the proxies will be far lower',
      );
    const networks = new Set<Network>(options.scenarios.map((s) => s.network));
    if (options.cpuProf !== undefined) {
      await mkdir(options.cpuProf, { recursive: true });
      machine['cpu profiles'] = `${options.cpuProf} (every hub and agent; figures are slower while profiling)`;
    }
    const { sets, facts } = await setupPaths(networks, cleanup, log, { cpuProfDir: options.cpuProf });
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
      if (stopping() || !set) continue;
      results.push(...(await runScenario(scenario, set, cfg, options.paths, stopping)));
    }
    if (stopping()) return 1;
    machine['duration'] = `${((performance.now() - began) / 1000).toFixed(0)} s`;
    machine['load after'] = loadAverage();
    const tcpAfter = await tcpMemory();
    const pressured = tcp && tcpAfter ? (tcpAfter.pressureMs - tcp.pressureMs) / 1000 : Number.NaN;
    machine['tcp memory after'] =
      `${describeTcpMemory(tcpAfter)}${Number.isFinite(pressured) ? `; ${pressured.toFixed(0)} s under pressure during the run` : ''}`;
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
      const round = (_key: string, value: unknown): unknown =>
        typeof value === 'number' && !Number.isInteger(value) ? Math.round(value * 1000) / 1000 : value;
      await writeFile(options.json, `${JSON.stringify(report, round, 2)}\n`);
      log(`wrote ${options.json}`);
    }
    return 0;
  } finally {
    await run.finish();
  }
}

runToExit(main, log);
