// A histogram without labels for a per-packet observation, in prom-client's registry: observe() adds to
// preallocated numbers (no label hashing, no allocation), and the registry reads them when scraped.
// prom-client's own Histogram hashes its labels on every observe().
import type { Registry } from './prom.js';

interface Sample {
  metricName: string;
  labels: Record<string, string | number>;
  value: number;
}

export class TallyHistogram {
  /** Observations per bucket (not cumulative: the scrape adds them up). */
  private readonly counts: Float64Array;
  private sum = 0;
  private count = 0;

  constructor(
    readonly name: string,
    readonly help: string,
    private readonly buckets: readonly number[],
  ) {
    this.counts = new Float64Array(buckets.length);
  }

  observe(value: number): void {
    const b = this.buckets;
    let i = 0;
    while (i < b.length && value > b[i]!) i++;
    if (i < b.length) this.counts[i]!++;
    this.sum += value;
    this.count++;
  }

  /** prom-client's Registry calls this when scraped. */
  async get(): Promise<{ name: string; help: string; type: 'histogram'; aggregator: 'sum'; values: Sample[] }> {
    const values: Sample[] = [];
    let cumulative = 0;
    this.buckets.forEach((le, i) => {
      cumulative += this.counts[i]!;
      values.push({ metricName: `${this.name}_bucket`, labels: { le }, value: cumulative });
    });
    values.push({ metricName: `${this.name}_bucket`, labels: { le: '+Inf' }, value: this.count });
    values.push({ metricName: `${this.name}_sum`, labels: {}, value: this.sum });
    values.push({ metricName: `${this.name}_count`, labels: {}, value: this.count });
    return { name: this.name, help: this.help, type: 'histogram', aggregator: 'sum', values };
  }
}

/** Registers a TallyHistogram with prom-client's registry (which takes any metric with a name and get()). */
export function registerTally(registry: Registry, h: TallyHistogram): TallyHistogram {
  registry.registerMetric(h as unknown as Parameters<Registry['registerMetric']>[0]);
  return h;
}
