// Turning results into the printed table and the --json document, and checking the goals of docs/goals.md.
import type { MachineFacts } from './machine.js';
import { GOAL_PATHS, OUR_PATHS, PATH_LABELS, PATH_NAMES, type PathName } from './paths.js';
import { STUCK_CLIENTS, STUCK_GOAL_COUNT, stuckClientPaths, stuckMetric } from './stuck.js';
import { FLEET_BASE_N, FLEET_GOAL_N, fleetMetric } from './fleet.js';
import { CLOCK_TICKS, CPU_FIGURE_LABELS, CPU_UNIT } from './cpu.js';

export interface ResultRow {
  scenario: string;
  metric: string;
  unit: string;
  better: 'higher' | 'lower';
  /** Aggregated over the rounds, per path; null where not measured (n/a). */
  values: Record<PathName, number | null>;
  /** The value of each successful round, per path. */
  rounds: Record<PathName, number[]>;
  /** Pair by pair: "tunnel/direct", "tunnel/ssh", "tunnel-grpc/ssh", "connect/ssh". */
  ratios: Record<string, number | null>;
  notes: string[];
}

export interface BenchReport {
  machine: MachineFacts;
  config: Record<string, number | string | boolean>;
  results: ResultRow[];
  /** Paths that could not be measured (per network), and why. */
  unavailable: Record<string, string>;
  /** The goals of docs/goals.md, checked for each of our paths. */
  goals: GoalCheck[];
}

export interface GoalCheck {
  goal: string;
  scenario: string;
  metric: string;
  /** e.g. ">= 1.0x ssh -R" or "<= 16 KiB". */
  target: string;
  /** Per path: the compared figure (a ratio to ssh -R, or the value itself) and whether it meets the goal (null: not measured). */
  paths: Partial<Record<PathName, { value: number | null; met: boolean | null }>>;
}

/** The ratio columns: numerator path, denominator path. */
export const RATIOS: readonly (readonly [PathName, PathName])[] = [
  ['tunnel', 'direct'],
  ['tunnel', 'ssh'],
  ['tunnel-grpc', 'ssh'],
  ['connect', 'ssh'],
];

export const ratioKey = (a: PathName, b: PathName): string => `${a}/${b}`;
const RATIO_HEADERS: Readonly<Record<string, string>> = {
  'tunnel/direct': 'tunnel/direct',
  'tunnel/ssh': 'tunnel/ssh',
  'tunnel-grpc/ssh': 'grpc/ssh',
  'connect/ssh': 'connect/ssh',
};

const DISPLAY_UNIT: Record<string, string> = { us: 'µs' };

function displayUnit(unit: string): string {
  return DISPLAY_UNIT[unit] ?? unit;
}

export function formatValue(value: number | null, unit: string): string {
  if (value === null || !Number.isFinite(value)) return 'n/a';
  const abs = Math.abs(value);
  if (unit === 'ms') return abs >= 100 ? value.toFixed(0) : abs >= 10 ? value.toFixed(1) : value.toFixed(2);
  if (unit === '%') return value.toFixed(1);
  if (unit === 'count') return value.toFixed(0);
  if (unit === CPU_UNIT) return abs >= 10 ? value.toFixed(1) : abs >= 1 ? value.toFixed(2) : value.toFixed(3);
  if (abs >= 100) return value.toFixed(0);
  if (abs >= 10) return value.toFixed(1);
  return value.toFixed(2);
}

export function ratio(value: number | null, baseline: number | null): number | null {
  if (value === null || baseline === null || !Number.isFinite(value) || !Number.isFinite(baseline) || baseline === 0) return null;
  return value / baseline;
}

export function computeRatios(values: Record<PathName, number | null>): Record<string, number | null> {
  const out: Record<string, number | null> = {};
  for (const [a, b] of RATIOS) out[ratioKey(a, b)] = ratio(values[a], values[b]);
  return out;
}

function formatRatio(value: number | null): string {
  return value === null ? 'n/a' : `${value.toFixed(2)}x`;
}

function table(header: readonly string[], body: readonly (readonly string[])[], leftColumns: number): string {
  const widths = header.map((h, i) => Math.max(h.length, ...body.map((row) => (row[i] ?? '').length)));
  const line = (cells: readonly string[]): string =>
    cells
      .map((c, i) => (i < leftColumns ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0)))
      .join(' | ')
      .trimEnd();
  const rule = widths.map((w) => '-'.repeat(w)).join('-|-');
  return [line(header), rule, ...body.map(line)].join('\n');
}

/** Plain-text table; first two columns left-aligned, the rest right-aligned. */
export function formatTable(rows: readonly ResultRow[]): string {
  const header = [
    'scenario',
    'metric',
    ...PATH_NAMES.map((p) => PATH_LABELS[p]),
    ...RATIOS.map(([a, b]) => RATIO_HEADERS[ratioKey(a, b)] ?? ratioKey(a, b)),
  ];
  const body = rows.map((r) => [
    r.scenario,
    `${r.metric} ${displayUnit(r.unit)}`,
    ...PATH_NAMES.map((p) => formatValue(r.values[p], r.unit)),
    ...RATIOS.map(([a, b]) => formatRatio(r.ratios[ratioKey(a, b)] ?? null)),
  ]);
  return table(header, body, 2);
}

// ---------------------------------------------------------------- goals (docs/goals.md)

interface GoalSpec {
  goal: string;
  scenario: string;
  metric: string;
  /** Against ssh -R or the SDK mux path (the ratio path/that is compared), or the figure itself. */
  compare: 'ssh' | 'tunnel' | 'value';
  op: '>=' | '<=';
  bound: number;
  unit: string;
  paths?: readonly PathName[];
  /** With compare 'value': the figure is metric − this metric of the same scenario (e.g. RSS after − before). */
  minus?: string;
}

type StuckFigureName = Parameters<typeof stuckMetric>[1];

const FLEET_AT = (figure: Parameters<typeof fleetMetric>[1]): string => fleetMetric(FLEET_GOAL_N, figure);
const FLEET_GOAL_PATHS: readonly PathName[] = ['tunnel'];

const GOALS: readonly GoalSpec[] = [
  { goal: 'one-connection throughput, up', scenario: 'throughput-up', metric: 'throughput', compare: 'ssh', op: '>=', bound: 1, unit: 'x' },
  {
    goal: 'one-connection throughput, down',
    scenario: 'throughput-down',
    metric: 'throughput',
    compare: 'ssh',
    op: '>=',
    bound: 1,
    unit: 'x',
  },
  // CPU per byte: what our two proxy processes spend per GiB against sshd + ssh (steadier than MB/s on a shared VM).
  {
    goal: 'hub + agent CPU per GiB, up',
    scenario: 'throughput-up',
    metric: CPU_FIGURE_LABELS.proxy,
    compare: 'ssh',
    op: '<=',
    bound: 1.3,
    unit: 'x',
  },
  {
    goal: 'hub + agent CPU per GiB, down',
    scenario: 'throughput-down',
    metric: CPU_FIGURE_LABELS.proxy,
    compare: 'ssh',
    op: '<=',
    bound: 1.3,
    unit: 'x',
  },
  { goal: '8-connection throughput, up', scenario: 'throughput-8-up', metric: 'throughput', compare: 'ssh', op: '>=', bound: 1, unit: 'x' },
  {
    goal: '8-connection throughput, down',
    scenario: 'throughput-8-down',
    metric: 'throughput',
    compare: 'ssh',
    op: '>=',
    bound: 1,
    unit: 'x',
  },
  { goal: '64-byte round trip p50', scenario: 'rtt-64', metric: 'p50', compare: 'ssh', op: '<=', bound: 1, unit: 'x' },
  { goal: 'dials per second', scenario: 'dial-rate', metric: 'rate', compare: 'ssh', op: '>=', bound: 10, unit: 'x' },
  {
    goal: '20 ms RTT, one connection, up',
    scenario: 'rtt20-throughput-up',
    metric: 'throughput',
    compare: 'ssh',
    op: '>=',
    bound: 1,
    unit: 'x',
  },
  {
    goal: '20 ms RTT, one connection, down',
    scenario: 'rtt20-throughput-down',
    metric: 'throughput',
    compare: 'ssh',
    op: '>=',
    bound: 1,
    unit: 'x',
  },
  { goal: 'head-of-line, stalled upload', scenario: 'hol-up', metric: 'bulk kept', compare: 'value', op: '>=', bound: 90, unit: '%' },
  { goal: 'head-of-line, stalled download', scenario: 'hol-down', metric: 'bulk kept', compare: 'value', op: '>=', bound: 90, unit: '%' },
  { goal: 'idle connection, hub', scenario: 'scale-conns', metric: 'hub KiB/conn', compare: 'value', op: '<=', bound: 16, unit: 'KiB' },
  { goal: 'idle connection, agent', scenario: 'scale-conns', metric: 'agent KiB/conn', compare: 'value', op: '<=', bound: 16, unit: 'KiB' },
  {
    goal: 'idle agent, hub',
    scenario: 'scale-agents',
    metric: 'hub KiB/agent',
    compare: 'value',
    op: '<=',
    bound: 100,
    unit: 'KiB',
    paths: ['tunnel', 'tunnel-grpc'],
  },
  // Footprint: the agent runs in every managed cluster; the hub on the embedded store. The goals count what a
  // pod is charged (anonymous memory, and below the kernel's socket buffers), not RSS: RSS counts the node
  // binary's file-backed pages and no socket buffer. RSS is still printed beside them.
  {
    goal: 'agent anonymous memory at start',
    scenario: 'idle-rss',
    metric: 'agent anon start',
    compare: 'value',
    op: '<=',
    bound: 20,
    unit: 'MiB',
    paths: ['tunnel', 'tunnel-grpc'],
  },
  {
    goal: 'hub anonymous memory at start (embedded store)',
    scenario: 'idle-rss',
    metric: 'hub anon start',
    compare: 'value',
    op: '<=',
    bound: 24,
    unit: 'MiB',
    paths: ['tunnel', 'tunnel-grpc'],
  },
  // The ANP path (Go hub components, ANP agents) against our own transport; forward against the SDK path.
  ...(['throughput-up', 'throughput-down', 'throughput-8-up', 'throughput-8-down'] as const).flatMap((scenario): GoalSpec[] => [
    {
      goal: `${scenario}: gRPC vs mux`,
      scenario,
      metric: 'throughput',
      compare: 'tunnel',
      op: '>=',
      bound: 0.8,
      unit: 'x',
      paths: ['tunnel-grpc'],
    },
    {
      goal: `${scenario}: gRPC vs ssh -R`,
      scenario,
      metric: 'throughput',
      compare: 'ssh',
      op: '>=',
      bound: 0.7,
      unit: 'x',
      paths: ['tunnel-grpc'],
    },
    {
      goal: `${scenario}: forward vs SDK`,
      scenario,
      metric: 'throughput',
      compare: 'tunnel',
      op: '>=',
      bound: 0.9,
      unit: 'x',
      paths: ['forward'],
    },
  ]),
  {
    goal: 'dials per second: gRPC vs mux',
    scenario: 'dial-rate',
    metric: 'rate',
    compare: 'tunnel',
    op: '>=',
    bound: 0.8,
    unit: 'x',
    paths: ['tunnel-grpc'],
  },
  {
    goal: 'dials per second: forward vs SDK',
    scenario: 'dial-rate',
    metric: 'rate',
    compare: 'tunnel',
    op: '>=',
    bound: 0.9,
    unit: 'x',
    paths: ['forward'],
  },
  {
    goal: '64-byte round trip p50: gRPC vs mux',
    scenario: 'rtt-64',
    metric: 'p50',
    compare: 'tunnel',
    op: '<=',
    bound: 1.2,
    unit: 'x',
    paths: ['tunnel-grpc'],
  },
  {
    goal: 'idle gRPC connection, hub',
    scenario: 'scale-conns',
    metric: 'hub KiB/conn',
    compare: 'value',
    op: '<=',
    bound: 4,
    unit: 'KiB',
    paths: ['tunnel-grpc'],
  },
  // Destinations that never read (stuck-destination at N=1024) and one enormous write (big-write).
  ...STUCK_CLIENTS.flatMap((clients): GoalSpec[] => {
    const at = (figure: StuckFigureName): string => stuckMetric(STUCK_GOAL_COUNT, figure, clients);
    const who = `${STUCK_GOAL_COUNT} stuck ${clients === 'sdk' ? 'connections' : 'konnectivity-style clients'}`;
    const paths: Pick<GoalSpec, 'paths'> = { paths: stuckClientPaths(clients) };
    return [
      {
        goal: `${who}: nothing killed or lost`,
        scenario: 'stuck-destination',
        metric: at('lost'),
        compare: 'value',
        op: '<=',
        bound: 0,
        unit: 'count',
        ...paths,
      },
      {
        goal: `${who}: healthy bulk kept`,
        scenario: 'stuck-destination',
        metric: at('bulk kept'),
        compare: 'value',
        op: '>=',
        bound: 80,
        unit: '%',
        ...paths,
      },
      {
        goal: `${who}: tables empty after`,
        scenario: 'stuck-destination',
        metric: at('left'),
        compare: 'value',
        op: '<=',
        bound: 0,
        unit: 'count',
        ...paths,
      },
      // What the pods are charged: anonymous memory and the kernel's socket buffers.
      {
        goal: `${who}: agent anonymous + socket memory`,
        scenario: 'stuck-destination',
        metric: at('agent anon+socket'),
        compare: 'value',
        op: '<=',
        bound: 128,
        unit: 'MiB',
        ...paths,
      },
      {
        goal: `${who}: hub anonymous after - before`,
        scenario: 'stuck-destination',
        metric: at('hub anon after'),
        minus: at('hub anon before'),
        compare: 'value',
        op: '<=',
        bound: 20,
        unit: 'MiB',
        ...paths,
      },
      {
        goal: `${who}: agent anonymous after - before`,
        scenario: 'stuck-destination',
        metric: at('agent anon after'),
        minus: at('agent anon before'),
        compare: 'value',
        op: '<=',
        bound: 20,
        unit: 'MiB',
        ...paths,
      },
      ...(clients === 'sdk'
        ? [
            {
              goal: `${who}: the hub's anonymous + socket growth per connection`,
              scenario: 'stuck-destination',
              metric: at('hub KiB/conn'),
              compare: 'value',
              op: '<=',
              bound: 128,
              unit: 'KiB',
              paths: ['tunnel', 'tunnel-grpc'],
            } satisfies GoalSpec,
          ]
        : []),
    ];
  }),
  // Fleet size (the fleet scenario: one hub replica, embedded store, N simulated clusters).
  {
    goal: `${FLEET_GOAL_N} clusters: hub RSS`,
    scenario: 'fleet',
    metric: FLEET_AT('hub RSS'),
    compare: 'value',
    op: '<=',
    bound: 1024,
    unit: 'MiB',
    paths: FLEET_GOAL_PATHS,
  },
  {
    goal: `${FLEET_GOAL_N} clusters: idle hub CPU (% of one core)`,
    scenario: 'fleet',
    metric: FLEET_AT('hub CPU idle'),
    compare: 'value',
    op: '<=',
    bound: 10,
    unit: '%',
    paths: FLEET_GOAL_PATHS,
  },
  {
    goal: `${FLEET_GOAL_N} clusters: store requests per minute (N/10)`,
    scenario: 'fleet',
    metric: FLEET_AT('store req/min'),
    compare: 'value',
    op: '<=',
    bound: FLEET_GOAL_N / 10,
    unit: 'count',
    paths: FLEET_GOAL_PATHS,
  },
  {
    goal: `${FLEET_GOAL_N} clusters: all back after a hub restart (s)`,
    scenario: 'fleet',
    metric: FLEET_AT('restart: all back'),
    compare: 'value',
    op: '<=',
    bound: 60,
    unit: 's',
    paths: FLEET_GOAL_PATHS,
  },
  {
    goal: `${FLEET_GOAL_N} clusters: every addon Available after a hub restart (s)`,
    scenario: 'fleet',
    metric: FLEET_AT('restart: all Available'),
    compare: 'value',
    op: '<=',
    bound: 60,
    unit: 's',
    paths: FLEET_GOAL_PATHS,
  },
  {
    goal: `${FLEET_GOAL_N} clusters: reconnects in any one second`,
    scenario: 'fleet',
    metric: FLEET_AT('restart: max in 1 s'),
    compare: 'value',
    op: '<=',
    bound: 10,
    unit: '%',
    paths: FLEET_GOAL_PATHS,
  },
  {
    goal: `${FLEET_GOAL_N} clusters: killed agent unavailable (s)`,
    scenario: 'fleet',
    metric: FLEET_AT('killed → unavailable'),
    compare: 'value',
    op: '<=',
    bound: 30,
    unit: 's',
    paths: FLEET_GOAL_PATHS,
  },
  {
    goal: `${FLEET_GOAL_N} clusters: dial p99 vs 10 clusters`,
    scenario: 'fleet',
    metric: FLEET_AT('dial p99 / N=10'),
    compare: 'value',
    op: '<=',
    bound: 1.5,
    unit: 'x',
    paths: FLEET_GOAL_PATHS,
  },
  {
    goal: 'big write: sha256 intact, other connection undisturbed',
    scenario: 'big-write',
    metric: 'faults',
    compare: 'value',
    op: '<=',
    bound: 0,
    unit: 'count',
    paths: ['tunnel', 'tunnel-grpc'],
  },
];

function targetText(g: GoalSpec): string {
  if (g.compare === 'value') return `${g.op} ${g.bound} ${g.unit}`;
  return `${g.op} ${g.bound.toFixed(1)}x ${g.compare === 'ssh' ? 'ssh -R' : 'tunnel'}`;
}

/** The goals for each of our paths, from the rows that were measured (others are left out). */
export function checkGoals(rows: readonly ResultRow[]): GoalCheck[] {
  const out: GoalCheck[] = [];
  for (const g of GOALS) {
    const row = rows.find((r) => r.scenario === g.scenario && r.metric === g.metric);
    const base = g.minus === undefined ? undefined : rows.find((r) => r.scenario === g.scenario && r.metric === g.minus);
    if (!row || (g.minus !== undefined && !base)) continue;
    const paths: GoalCheck['paths'] = {};
    const figure = (p: PathName): number | null => {
      const v = row.values[p];
      const b = base?.values[p];
      return base === undefined ? v : v === null || b === null || b === undefined ? null : v - b;
    };
    for (const p of g.paths ?? OUR_PATHS) {
      const value = g.compare === 'value' ? figure(p) : ratio(row.values[p], row.values[g.compare]);
      paths[p] = { value, met: value === null ? null : g.op === '>=' ? value >= g.bound : value <= g.bound };
    }
    out.push({ goal: g.goal, scenario: g.scenario, metric: g.metric, target: targetText(g), paths });
  }
  return out;
}

function formatGoals(goals: readonly GoalCheck[]): string {
  const header = ['goal (docs/goals.md)', 'target', ...GOAL_PATHS.map((p) => PATH_LABELS[p])];
  const body = goals.map((g) => [
    g.goal,
    g.target,
    ...GOAL_PATHS.map((p) => {
      const c = g.paths[p];
      if (!c) return '-';
      if (c.value === null || c.met === null) return 'n/a';
      const unit = /(%|KiB|MiB|count|s|x)$/.exec(g.target)?.[1] ?? '';
      const shown = /x (ssh|tunnel)/.test(g.target)
        ? `${c.value.toFixed(2)}x`
        : unit === 'count'
          ? c.value.toFixed(0)
          : `${c.value.toFixed(1)} ${unit}`;
      return `${shown} ${c.met ? 'met' : 'NOT met'}`;
    }),
  ]);
  return table(header, body, 2);
}

export function formatReport(report: BenchReport): string {
  const out: string[] = [];
  out.push('cluster-proxy bench');
  for (const [key, value] of Object.entries(report.machine)) out.push(`  ${`${key}:`.padEnd(10)} ${value}`);
  out.push('');
  out.push(formatTable(report.results));
  out.push('');
  out.push(
    'Ratios are pair by pair (grpc = tunnel-grpc). MB/s, conn/s and %: higher is better; µs, ms, KiB, MiB, s/GiB and counts: lower is better.',
  );
  if (report.results.some((r) => r.scenario.startsWith('rtt20-')))
    out.push(
      'rtt20-*: 20 ms RTT relay between client and target (direct), ssh and sshd (ssh -R), agent and hub (tunnel, tunnel-grpc, connect).',
    );
  if (report.results.some((r) => r.unit === CPU_UNIT)) {
    out.push(
      `CPU ${CPU_UNIT}: CPU seconds (user + system, all threads) per GiB moved during the timed transfers, per process: client = the bench process itself (it is the client on every path; process.cpuUsage()), hub|sshd = the hub (ssh -R: sshd's session process), agent|ssh = the agent (ssh -R: the ssh client), forward = the \`cluster-proxy forward\` process, target = the targets process; others from /proc/PID/stat in ${1000 / CLOCK_TICKS} ms ticks (error bounds in the notes). hub+agent|sshd+ssh = the proxy processes together; its tunnel/ssh, grpc/ssh and connect/ssh columns are our proxies' CPU per GiB over OpenSSH's.`,
    );
  }
  if (report.results.some((r) => r.scenario.startsWith('hol-')))
    out.push('hol-*: bulk throughput next to a stalled connection on the same path, in % of the same transfer alone.');
  if (report.results.some((r) => r.scenario === 'stuck-destination'))
    out.push(
      "stuck-destination: N connections whose destination never reads, fresh hub + agent per N; peak = highest VmRSS sampled every 100 ms, before/after = after a full GC (after: 10 s after the clients left); bulk kept = a healthy upload beside them in % of alone; accepted = bytes their writers handed over in all; lost = processes died + tunnels lost + stuck connections not opened or closed by the path; left = connections the hub's or the agent's table still lists after (the most in any one).",
    );
  if (report.results.some((r) => r.scenario === 'big-write'))
    out.push(
      'big-write: one write() of a single Buffer through the SDK; echo p50/p99 = 64-byte round trips on another connection of the same Tunnel meanwhile; faults = sha256 or byte count wrong, or the echo connection closed or stuck.',
    );
  if (report.results.some((r) => r.scenario === 'fleet'))
    out.push(
      `fleet: N simulated clusters on one hub (embedded store), figures in the tunnel column; hub CPU idle = % of one core over the steady window; store req/min = the hub's store requests then; restart: all back = from the new hub's readiness to the last agent's return, max in 1 s = the largest share of the agents that came back within one second; dial p99 / N=10 = against a fleet of ${FLEET_BASE_N}.`,
    );
  if (report.results.some((r) => r.scenario === 'scale-conns'))
    out.push('scale-conns: hub = the hub (sshd session processes for ssh -R), agent = the agent (the ssh client for ssh -R).');
  if (report.goals.length > 0) {
    out.push('');
    out.push(formatGoals(report.goals));
  }
  out.push('');
  for (const [path, reason] of Object.entries(report.unavailable)) out.push(`n/a ${path}: ${reason}`);
  for (const row of report.results) for (const note of row.notes) out.push(`note ${row.scenario} ${row.metric}: ${note}`);
  return out.join('\n').trimEnd();
}
