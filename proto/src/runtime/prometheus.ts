// The few Prometheus metric kinds the agent exports, written in the text exposition format (0.0.4).
// The agent runs in every managed cluster, so its memory counts: prom-client (with its cluster
// aggregator and default collectors) cost the idle agent ~3.7 MiB RSS of its ~65 (measured with the
// bench's idle-rss scenario and by importing it alone); this file is what the agent needs of it. The
// hub keeps prom-client for its own metrics but takes the process metrics from here: prom-client's
// default collectors (and the OpenTelemetry API they load) cost its start-up RSS ~3 MiB.
import { readdirSync } from 'node:fs';

export type Labels = Record<string, string>;

export const CONTENT_TYPE = 'text/plain; version=0.0.4; charset=utf-8';

const escapeHelp = (s: string): string => s.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
const escapeValue = (s: string): string => s.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n');

function labelText(labels: Labels): string {
  const keys = Object.keys(labels);
  if (keys.length === 0) return '';
  return `{${keys.map((k) => `${k}="${escapeValue(labels[k]!)}"`).join(',')}}`;
}

function num(v: number): string {
  if (v === Infinity) return '+Inf';
  if (v === -Infinity) return '-Inf';
  return Number.isNaN(v) ? 'NaN' : String(v);
}

export interface Metric {
  readonly name: string;
  /** HELP, TYPE and sample lines. */
  lines(): string[];
}

function header(name: string, help: string, type: string): string[] {
  return [`# HELP ${name} ${escapeHelp(help)}`, `# TYPE ${name} ${type}`];
}

/** A counter; with label names, one series per label set seen (none until the first inc). */
export class Counter<L extends string = never> implements Metric {
  private readonly series = new Map<string, { labels: Labels; value: number }>();

  constructor(readonly name: string, private readonly help: string, private readonly labelNames: readonly L[] = []) {
    if (labelNames.length === 0) this.series.set('', { labels: {}, value: 0 });
  }

  inc(labels?: Record<L, string> | number, value?: number): void {
    const l = typeof labels === 'object' ? labels : ({} as Record<L, string>);
    const by = typeof labels === 'number' ? labels : value ?? 1;
    this.add(this.keyOf(l), by);
  }

  /**
   * One label set's series, for a hot path (a count per packet): its key is built once, here, not on
   * every inc(). The series appears at its first inc(), as with inc(labels).
   */
  child(labels: Record<L, string>): { inc(by?: number): void } {
    const key = this.keyOf(labels);
    return { inc: (by = 1) => this.add(key, by) };
  }

  private keyOf(l: Record<L, string>): { key: string; ordered: Labels } {
    // In label-name order, so the same series has one key whatever order the caller wrote.
    const ordered: Labels = {};
    for (const k of this.labelNames) ordered[k] = String(l[k] ?? '');
    return { key: this.labelNames.length === 0 ? '' : JSON.stringify(ordered), ordered };
  }

  private add({ key, ordered }: { key: string; ordered: Labels }, by: number): void {
    if (by < 0 || !Number.isFinite(by)) throw new Error(`${this.name}: a counter only goes up (got ${by})`);
    const s = this.series.get(key);
    if (s) s.value += by;
    else this.series.set(key, { labels: ordered, value: by });
  }

  lines(): string[] {
    return [...header(this.name, this.help, 'counter'), ...[...this.series.values()].map((s) => `${this.name}${labelText(s.labels)} ${num(s.value)}`)];
  }
}

/** A value read when scraped (a gauge; or a counter kept elsewhere, such as CPU seconds). */
export class Gauge implements Metric {
  constructor(readonly name: string, private readonly help: string, private readonly read: () => number, private readonly type: 'gauge' | 'counter' = 'gauge') {}

  lines(): string[] {
    return [...header(this.name, this.help, this.type), `${this.name} ${num(this.read())}`];
  }
}

/** A histogram without labels (cumulative buckets, sum and count). */
export class Histogram implements Metric {
  private readonly counts: number[];
  private sum = 0;
  private count = 0;

  constructor(readonly name: string, private readonly help: string, private readonly buckets: readonly number[]) {
    this.counts = buckets.map(() => 0);
  }

  observe(value: number): void {
    for (let i = 0; i < this.buckets.length; i++) if (value <= this.buckets[i]!) this.counts[i]!++;
    this.sum += value;
    this.count++;
  }

  lines(): string[] {
    return [
      ...header(this.name, this.help, 'histogram'),
      ...this.buckets.map((b, i) => `${this.name}_bucket{le="${num(b)}"} ${this.counts[i]}`),
      `${this.name}_bucket{le="+Inf"} ${this.count}`,
      `${this.name}_sum ${num(this.sum)}`,
      `${this.name}_count ${this.count}`,
    ];
  }
}

export class Registry {
  private readonly metrics: Metric[] = [];

  register<M extends Metric>(m: M): M {
    if (this.metrics.some((x) => x.name === m.name)) throw new Error(`metric ${m.name} is registered twice`);
    this.metrics.push(m);
    return m;
  }

  text(): string {
    return `${this.metrics.flatMap((m) => m.lines()).join('\n')}\n`;
  }
}

/** The process metrics Prometheus' client libraries export under these names. */
export function processMetrics(): Metric[] {
  const startSeconds = Math.round((Date.now() - process.uptime() * 1000) / 1000);
  const cpu = (): NodeJS.CpuUsage => process.cpuUsage();
  const openFds = (): number => {
    try {
      return readdirSync('/proc/self/fd').length;
    } catch {
      return NaN; // not Linux
    }
  };
  return [
    new Gauge('process_cpu_user_seconds_total', 'Total user CPU time spent in seconds.', () => cpu().user / 1e6, 'counter'),
    new Gauge('process_cpu_system_seconds_total', 'Total system CPU time spent in seconds.', () => cpu().system / 1e6, 'counter'),
    new Gauge('process_cpu_seconds_total', 'Total user and system CPU time spent in seconds.', () => { const c = cpu(); return (c.user + c.system) / 1e6; }, 'counter'),
    new Gauge('process_start_time_seconds', 'Start time of the process since unix epoch in seconds.', () => startSeconds),
    new Gauge('process_resident_memory_bytes', 'Resident memory size in bytes.', () => process.memoryUsage.rss()),
    new Gauge('process_open_fds', 'Number of open file descriptors.', openFds),
    new Gauge('nodejs_heap_size_used_bytes', 'Process heap size used from Node.js in bytes.', () => process.memoryUsage().heapUsed),
    new Gauge('nodejs_heap_size_total_bytes', 'Process heap size from Node.js in bytes.', () => process.memoryUsage().heapTotal),
    new Gauge('nodejs_external_memory_bytes', 'Node.js external memory size in bytes.', () => process.memoryUsage().external),
  ];
}
