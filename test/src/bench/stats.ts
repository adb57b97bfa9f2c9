// Small statistics helpers for the benchmark: percentiles over latency samples, rates.

/** A growable list of samples (latencies); percentiles are taken over all of them. */
export class Samples {
  private data = new Float64Array(1024);
  private n = 0;

  get count(): number {
    return this.n;
  }

  add(value: number): void {
    if (this.n === this.data.length) {
      const bigger = new Float64Array(this.data.length * 2);
      bigger.set(this.data);
      this.data = bigger;
    }
    this.data[this.n++] = value;
  }

  addAll(other: Samples): void {
    for (const v of other.values()) this.add(v);
  }

  values(): Float64Array {
    return this.data.subarray(0, this.n);
  }

  /** Nearest-rank percentile (p in 0..100); NaN when empty. */
  percentile(p: number): number {
    return percentile(sorted(this.values()), p);
  }
}

export function sorted(values: Float64Array): Float64Array {
  return Float64Array.from(values).sort();
}

/** Nearest-rank percentile of an ascending array (p in 0..100); NaN when empty. */
export function percentile(ascending: Float64Array, p: number): number {
  if (ascending.length === 0) return Number.NaN;
  const rank = Math.ceil((p / 100) * ascending.length);
  const index = Math.min(ascending.length - 1, Math.max(0, rank - 1));
  return ascending[index] ?? Number.NaN;
}

export const MB = 1e6;
export const MiB = 1024 * 1024;
export const GiB = 1024 * MiB;

/** Megabytes (1e6 bytes) per second. */
export function mbPerSecond(bytes: number, seconds: number): number {
  return seconds > 0 ? bytes / MB / seconds : Number.NaN;
}
