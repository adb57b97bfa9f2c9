// The few Prometheus metric kinds the agent exports, written in the text exposition format (0.0.4).
// The agent runs in every managed cluster, so its memory counts: prom-client (with its cluster
// aggregator and default collectors) cost the idle agent ~3.7 MiB RSS of its ~65 (measured with the
// bench's idle-rss scenario and by importing it alone); this file is what the agent needs of it. The
// hub keeps prom-client for its own metrics but takes the process metrics from here: prom-client's
// default collectors (and the OpenTelemetry API they load) cost its start-up RSS ~3 MiB.
import { readdirSync } from 'node:fs';
import { netDevTotals, procLimit, procStatusBytes, readProcStatus, socketQueuedBytes } from './proc-self.js';

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
  /** Reads what the lines show, when that cannot be read synchronously (Registry.collect() awaits it). */
  refresh?(): Promise<void>;
}

function header(name: string, help: string, type: string): string[] {
  return [`# HELP ${name} ${escapeHelp(help)}`, `# TYPE ${name} ${type}`];
}

/** A counter; with label names, one series per label set seen (none until the first inc). */
export class Counter<L extends string = never> implements Metric {
  private readonly series = new Map<string, { labels: Labels; value: number }>();

  constructor(
    readonly name: string,
    private readonly help: string,
    private readonly labelNames: readonly L[] = [],
  ) {
    if (labelNames.length === 0) this.series.set('', { labels: {}, value: 0 });
    this.plainKey = labelNames.length === 0 ? { key: '', ordered: {} } : null;
  }

  /** The series without labels, when the counter has none (inc() adds to it without building a key). */
  private readonly plainKey: { key: string; ordered: Labels } | null;

  inc(labels?: Record<L, string> | number, value?: number): void {
    const by = typeof labels === 'number' ? labels : (value ?? 1);
    if (this.plainKey && typeof labels !== 'object') return this.add(this.plainKey, by);
    this.add(this.keyOf(typeof labels === 'object' ? labels : ({} as Record<L, string>)), by);
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
    return [
      ...header(this.name, this.help, 'counter'),
      ...[...this.series.values()].map((s) => `${this.name}${labelText(s.labels)} ${num(s.value)}`),
    ];
  }
}

/** A value read when scraped (a gauge; or a counter kept elsewhere, such as CPU seconds). */
export class Gauge implements Metric {
  constructor(
    readonly name: string,
    private readonly help: string,
    private readonly read: () => number,
    private readonly type: 'gauge' | 'counter' = 'gauge',
  ) {}

  lines(): string[] {
    return [...header(this.name, this.help, this.type), `${this.name} ${num(this.read())}`];
  }
}

interface HistogramSeries {
  labels: Labels;
  counts: number[];
  sum: number;
  count: number;
}

/**
 * A histogram (cumulative buckets, sum and count). Without label names it has one series from the start;
 * with them, one per label set seen (none until the first observeWith).
 */
export class Histogram<L extends string = never> implements Metric {
  private readonly series = new Map<string, HistogramSeries>();
  private readonly plain: HistogramSeries | null = null;

  constructor(
    readonly name: string,
    private readonly help: string,
    private readonly buckets: readonly number[],
    private readonly labelNames: readonly L[] = [],
  ) {
    if (labelNames.length === 0) this.series.set('', (this.plain = this.newSeries({})));
  }

  private newSeries(labels: Labels): HistogramSeries {
    return { labels, counts: this.buckets.map(() => 0), sum: 0, count: 0 };
  }

  /** An observation of the histogram without labels. */
  observe(value: number): void {
    if (!this.plain) throw new Error(`${this.name} has labels: use observeWith`);
    this.add(this.plain, value);
  }

  observeWith(labels: Record<L, string>, value: number): void {
    const ordered: Labels = {};
    for (const k of this.labelNames) ordered[k] = String(labels[k] ?? '');
    const key = JSON.stringify(ordered);
    let s = this.series.get(key);
    if (!s) this.series.set(key, (s = this.newSeries(ordered)));
    this.add(s, value);
  }

  private add(s: HistogramSeries, value: number): void {
    for (let i = 0; i < this.buckets.length; i++) if (value <= this.buckets[i]!) s.counts[i]!++;
    s.sum += value;
    s.count++;
  }

  lines(): string[] {
    const out = header(this.name, this.help, 'histogram');
    for (const s of this.series.values()) {
      const with_ = (extra: string): string => {
        const inner = Object.keys(s.labels).map((k) => `${k}="${escapeValue(s.labels[k]!)}"`);
        if (extra) inner.push(extra);
        return inner.length ? `{${inner.join(',')}}` : '';
      };
      this.buckets.forEach((b, i) => out.push(`${this.name}_bucket${with_(`le="${num(b)}"`)} ${s.counts[i]}`));
      out.push(
        `${this.name}_bucket${with_('le="+Inf"')} ${s.count}`,
        `${this.name}_sum${with_('')} ${num(s.sum)}`,
        `${this.name}_count${with_('')} ${s.count}`,
      );
    }
    return out;
  }
}

/**
 * A gauge whose value is read asynchronously, at most once per `minIntervalMs`: for readings too costly for
 * every scrape or for the event loop. The first scrape (Registry.collect()) waits for the first reading; later
 * ones start a new reading when the last is older than the interval and answer with the last value, so a slow
 * reading (a process with thousands of sockets on a busy machine took seconds) never holds up a scrape.
 */
export class RefreshedGauge implements Metric {
  private value = NaN;
  private readAt = -Infinity;
  private reading: Promise<void> | null = null;
  private readOnce = false;

  constructor(
    readonly name: string,
    private readonly help: string,
    private readonly read: () => Promise<number>,
    private readonly minIntervalMs = 0,
  ) {}

  async refresh(): Promise<void> {
    const now = performance.now();
    if (!this.reading && now - this.readAt >= this.minIntervalMs) {
      this.readAt = now;
      this.reading = this.read()
        .catch(() => NaN)
        .then((v) => {
          this.value = v;
          this.readOnce = true;
          this.reading = null;
        });
    }
    if (!this.readOnce) await this.reading;
  }

  lines(): string[] {
    return [...header(this.name, this.help, 'gauge'), `${this.name} ${num(this.value)}`];
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

  /** The exposition text after the metrics that read asynchronously have read. */
  async collect(): Promise<string> {
    await Promise.all(this.metrics.map((m) => m.refresh?.()));
    return this.text();
  }
}

/** The socket memory gauge reads at most this often (it visits every descriptor of the process). */
const SOCKET_MEMORY_INTERVAL_MS = 5000;

/**
 * The process metrics Prometheus' client libraries export under these names (Go's, which ANP's server and
 * agent export, all of them; its go_* runtime metrics have no meaning here), Node.js heap figures, and the
 * memory a pod is charged for.
 */
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
    new Gauge(
      'process_cpu_seconds_total',
      'Total user and system CPU time spent in seconds.',
      () => {
        const c = cpu();
        return (c.user + c.system) / 1e6;
      },
      'counter',
    ),
    new Gauge('process_start_time_seconds', 'Start time of the process since unix epoch in seconds.', () => startSeconds),
    new Gauge('process_resident_memory_bytes', 'Resident memory size in bytes.', () => process.memoryUsage.rss()),
    new Gauge('process_virtual_memory_bytes', 'Virtual memory size in bytes.', () => procStatusBytes(readProcStatus(), 'VmSize')),
    new Gauge('process_virtual_memory_max_bytes', 'Maximum amount of virtual memory available in bytes.', () =>
      procLimit('Max address space'),
    ),
    new Gauge('process_open_fds', 'Number of open file descriptors.', openFds),
    new Gauge('process_max_fds', 'Maximum number of open file descriptors.', () => procLimit('Max open files')),
    new Gauge(
      'process_network_receive_bytes_total',
      'Number of bytes received by the process over the network.',
      () => netDevTotals().receive,
      'counter',
    ),
    new Gauge(
      'process_network_transmit_bytes_total',
      'Number of bytes sent by the process over the network.',
      () => netDevTotals().transmit,
      'counter',
    ),
    // What a cgroup v2 memory limit charges for this process, which RSS does not tell: RSS counts the node
    // binary's file-backed pages (~50 MiB, shared, reclaimable) and not the kernel's socket buffers.
    new Gauge(
      'cluster_proxy_process_anon_memory_bytes',
      'Anonymous resident memory of this process (RssAnon of /proc/self/status): the part of RSS a memory limit charges and cannot reclaim',
      () => procStatusBytes(readProcStatus(), 'RssAnon'),
    ),
    new RefreshedGauge(
      'cluster_proxy_process_socket_memory_bytes',
      "Bytes this process's TCP sockets hold in the kernel (unsent or unacknowledged, and unread: tx_queue + rx_queue of /proc/self/net/tcp), read at most every 5 s; the kernel charges these, plus buffer overhead, to the pod",
      socketQueuedBytes,
      SOCKET_MEMORY_INTERVAL_MS,
    ),
    new Gauge('nodejs_heap_size_used_bytes', 'Process heap size used from Node.js in bytes.', () => process.memoryUsage().heapUsed),
    new Gauge('nodejs_heap_size_total_bytes', 'Process heap size from Node.js in bytes.', () => process.memoryUsage().heapTotal),
    new Gauge('nodejs_external_memory_bytes', 'Node.js external memory size in bytes.', () => process.memoryUsage().external),
  ];
}
