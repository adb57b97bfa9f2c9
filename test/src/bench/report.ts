// Turning results into the printed table and the --json document.
import type { PathName } from './paths.js';

export interface ResultRow {
  scenario: string;
  metric: string;
  unit: string;
  better: 'higher' | 'lower';
  direct: number | null;
  ssh: number | null;
  tunnel: number | null;
  /** The value of each successful round, per path. */
  rounds: Record<PathName, number[]>;
  notes: string[];
}

export type MachineFacts = Record<string, string | number>;

export interface BenchReport {
  machine: MachineFacts;
  config: Record<string, number | string | boolean>;
  results: ResultRow[];
  /** Paths that could not be measured (per network), and why. */
  unavailable: Record<string, string>;
  /** Goals from the issue, checked against the tunnel's figures. */
  goals: GoalCheck[];
}

export interface GoalCheck {
  scenario: string;
  metric: string;
  goal: string;
  value: number | null;
  met: boolean;
}

const DISPLAY_UNIT: Record<string, string> = { us: 'µs' };

function displayUnit(unit: string): string {
  return DISPLAY_UNIT[unit] ?? unit;
}

export function formatValue(value: number | null, unit: string): string {
  if (value === null || !Number.isFinite(value)) return 'n/a';
  const abs = Math.abs(value);
  if (unit === 'ms') return abs >= 100 ? value.toFixed(0) : abs >= 10 ? value.toFixed(1) : value.toFixed(2);
  if (abs >= 100) return value.toFixed(0);
  if (abs >= 10) return value.toFixed(1);
  return value.toFixed(2);
}

export function ratio(tunnel: number | null, baseline: number | null): number | null {
  if (tunnel === null || baseline === null || !Number.isFinite(tunnel) || !Number.isFinite(baseline) || baseline === 0) return null;
  return tunnel / baseline;
}

function formatRatio(value: number | null): string {
  return value === null ? 'n/a' : `${value.toFixed(2)}x`;
}

/** Plain-text table; first two columns left-aligned, the rest right-aligned. */
export function formatTable(rows: readonly ResultRow[]): string {
  const header = ['scenario', 'metric', 'direct', 'ssh -R', 'tunnel', 'tunnel/direct', 'tunnel/ssh'];
  const body = rows.map((r) => [
    r.scenario,
    `${r.metric} ${displayUnit(r.unit)}`,
    formatValue(r.direct, r.unit),
    formatValue(r.ssh, r.unit),
    formatValue(r.tunnel, r.unit),
    formatRatio(ratio(r.tunnel, r.direct)),
    formatRatio(ratio(r.tunnel, r.ssh)),
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...body.map((row) => (row[i] ?? '').length)));
  const line = (cells: readonly string[]): string =>
    cells.map((c, i) => (i < 2 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0))).join(' | ').trimEnd();
  const rule = widths.map((w) => '-'.repeat(w)).join('-|-');
  return [line(header), rule, ...body.map(line)].join('\n');
}

export function formatReport(report: BenchReport): string {
  const out: string[] = [];
  out.push('cluster-proxy bench');
  for (const [key, value] of Object.entries(report.machine)) out.push(`  ${`${key}:`.padEnd(10)} ${value}`);
  out.push('');
  out.push(formatTable(report.results));
  out.push('');
  out.push('Ratios are tunnel / baseline. MB/s and conn/s: higher is better; µs and ms: lower is better.');
  if (report.results.some((r) => r.scenario.startsWith('rtt20-'))) out.push('rtt20-*: 20 ms RTT relay between client and target (direct), ssh and sshd (ssh -R), agent and hub (tunnel).');
  for (const goal of report.goals) {
    out.push(`Goal ${goal.scenario} tunnel ${goal.goal}: ${formatValue(goal.value, 'MB/s')} MB/s ${goal.met ? 'met' : 'NOT met'}`);
  }
  for (const [path, reason] of Object.entries(report.unavailable)) out.push(`n/a ${path}: ${reason}`);
  for (const row of report.results) for (const note of row.notes) out.push(`note ${row.scenario} ${row.metric}: ${note}`);
  return out.join('\n');
}
