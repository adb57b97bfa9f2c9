// What is measured. Each scenario runs on every path (see paths.ts); a PathRun holds one
// scenario's state on one path across rounds, so rounds can be interleaved across paths.
import type { Duplex } from 'node:stream';
import { digestStream, payloadSha256, writePayload } from '../fixtures/index.js';
import { countToEnd, errorMessage, Pinger, readToEnd, SocketScope } from './io.js';
import type { Dialer, Network } from './paths.js';
import { GiB, mbPerSecond, MiB, Samples } from './stats.js';

export interface BenchConfig {
  /** Measurement rounds per scenario and path; paths alternate within a round. */
  rounds: number;
  /** Target duration of one timed bulk transfer. */
  throughputSeconds: number;
  /** Size of the sha256-verified transfer done once per path and direction (also calibrates). */
  verifyBytes: number;
  /** Upper bound on a timed transfer's size. */
  maxTransferBytes: number;
  rttSeconds: number;
  rttMaxIterations: number;
  rttWarmupIterations: number;
  dialSeconds: number;
  dialConcurrency: number;
  /** Upper bound on dials per measurement. */
  dialMaxCount: number;
}

export const FULL_CONFIG: BenchConfig = {
  rounds: 2,
  throughputSeconds: 4,
  verifyBytes: 64 * MiB,
  maxTransferBytes: 32 * GiB,
  rttSeconds: 3,
  rttMaxIterations: 20_000,
  rttWarmupIterations: 500,
  dialSeconds: 4,
  dialConcurrency: 16,
  dialMaxCount: 50_000,
};

export const QUICK_CONFIG: BenchConfig = {
  rounds: 1,
  throughputSeconds: 0.75,
  verifyBytes: 16 * MiB,
  maxTransferBytes: 8 * GiB,
  rttSeconds: 0.5,
  rttMaxIterations: 2_000,
  rttWarmupIterations: 100,
  dialSeconds: 0.75,
  dialConcurrency: 16,
  dialMaxCount: 5_000,
};

export interface MetricSpec {
  metric: string;
  unit: string;
  better: 'higher' | 'lower';
}

export interface PathRun {
  /** One measurement; resolves with a one-line summary for the progress log. */
  measure(round: number): Promise<string>;
  /** Per metric (aligned with Scenario.metrics), aggregated over successful rounds; null if none. */
  values(): (number | null)[];
  /** Per metric, the value of each successful round. */
  roundValues(): number[][];
  /** Anything a reader of the figures should know (errors during dials, ...). */
  notes(): string[];
}

export interface Scenario {
  name: string;
  network: Network;
  description: string;
  metrics: readonly MetricSpec[];
  forPath(dialer: Dialer, cfg: BenchConfig): PathRun;
}

const DIAL_TIMEOUT_MS = 10_000;

function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

function describeBytes(bytes: number): string {
  return bytes >= GiB ? `${(bytes / GiB).toFixed(2)} GiB` : `${(bytes / MiB).toFixed(0)} MiB`;
}

// ---------------------------------------------------------------- throughput

type Direction = 'up' | 'down';

function parseSinkReply(text: string): { bytes: number; sha256?: string } {
  const value: unknown = JSON.parse(text.trim());
  if (typeof value !== 'object' || value === null || typeof (value as { bytes?: unknown }).bytes !== 'number') {
    throw new Error(`unexpected sink reply ${JSON.stringify(text.slice(0, 200))}`);
  }
  const sha256 = (value as { sha256?: unknown }).sha256;
  return { bytes: (value as { bytes: number }).bytes, sha256: typeof sha256 === 'string' ? sha256 : undefined };
}

/**
 * Moves exactly `bytes` of the deterministic payload client→sink (up) or source→client (down) over
 * one fresh connection; returns the seconds from the first byte sent (up) / the request (down) until
 * the target confirmed the count (up: its reply after our EOF) / our EOF (down). With `hashed`, the
 * sha256 of what arrived is checked as well.
 */
async function transfer(dialer: Dialer, dir: Direction, bytes: number, hashed: boolean, timeoutMs: number): Promise<number> {
  const what = `${dir} ${describeBytes(bytes)}${hashed ? ' (sha256)' : ''}`;
  return SocketScope.run(what, timeoutMs, async (scope) => {
    if (dir === 'up') {
      const socket = scope.track(await dialer.dial(hashed ? 'sinkHash' : 'sink', DIAL_TIMEOUT_MS));
      const reply = readToEnd(socket);
      reply.catch(() => {}); // reported below, unless the write fails first
      const started = performance.now();
      await writePayload(socket, bytes);
      const result = parseSinkReply((await reply).toString('utf8'));
      const seconds = (performance.now() - started) / 1000;
      if (result.bytes !== bytes) throw new Error(`${what}: the sink received ${result.bytes} bytes`);
      if (hashed && result.sha256 !== payloadSha256(bytes)) throw new Error(`${what}: sha256 mismatch at the sink`);
      return seconds;
    }
    const socket = scope.track(await dialer.dial('source', DIAL_TIMEOUT_MS));
    const received: Promise<{ bytes: number; sha256?: string }> = hashed ? digestStream(socket) : countToEnd(socket).then((n) => ({ bytes: n }));
    received.catch(() => {});
    const started = performance.now();
    socket.write(`${bytes}\n`);
    const result = await received;
    const seconds = (performance.now() - started) / 1000;
    if (result.bytes !== bytes) throw new Error(`${what}: received ${result.bytes} bytes`);
    if (hashed && result.sha256 !== payloadSha256(bytes)) throw new Error(`${what}: sha256 mismatch at the client`);
    return seconds;
  });
}

class ThroughputRun implements PathRun {
  /** Bytes per second seen last; sizes the next timed transfer so it lasts about throughputSeconds. */
  private rate: number | undefined;
  private bytes = 0;
  private seconds = 0;
  private readonly perRound: number[] = [];

  constructor(private readonly dialer: Dialer, private readonly dir: Direction, private readonly cfg: BenchConfig) {}

  async measure(): Promise<string> {
    const { cfg } = this;
    let verified = '';
    if (this.rate === undefined) {
      const seconds = await transfer(this.dialer, this.dir, cfg.verifyBytes, true, 60_000);
      this.rate = cfg.verifyBytes / seconds;
      verified = `sha256 ok (${describeBytes(cfg.verifyBytes)}); `;
    }
    for (let attempt = 1; ; attempt++) {
      const wanted = Math.round((this.rate * cfg.throughputSeconds) / MiB) * MiB;
      const bytes = Math.min(cfg.maxTransferBytes, Math.max(cfg.verifyBytes, wanted));
      const timeoutMs = (3 * cfg.throughputSeconds + 15) * 1000;
      const seconds = await transfer(this.dialer, this.dir, bytes, false, timeoutMs);
      this.rate = bytes / seconds;
      // A calibration from a short (or hashed) transfer can be far off: retry once or twice so the
      // recorded transfer lasts about as long as intended.
      const longEnough = seconds >= 0.6 * cfg.throughputSeconds || bytes >= cfg.maxTransferBytes;
      if (longEnough || attempt === 3) {
        this.bytes += bytes;
        this.seconds += seconds;
        const mbps = mbPerSecond(bytes, seconds);
        this.perRound.push(mbps);
        return `${verified}${describeBytes(bytes)} in ${seconds.toFixed(2)} s = ${mbps.toFixed(1)} MB/s`;
      }
    }
  }

  values(): (number | null)[] {
    return [this.seconds > 0 ? mbPerSecond(this.bytes, this.seconds) : null];
  }

  roundValues(): number[][] {
    return [this.perRound];
  }

  notes(): string[] {
    return [];
  }
}

function throughput(name: string, network: Network, dir: Direction): Scenario {
  const towards = dir === 'up' ? 'client → target (sink)' : 'target (source) → client';
  return {
    name,
    network,
    description: `one connection, bulk ${towards}${network === 'rtt20' ? ', 20 ms RTT on the tunnelled link' : ''}`,
    metrics: [{ metric: 'throughput', unit: 'MB/s', better: 'higher' }],
    forPath: (dialer, cfg) => new ThroughputRun(dialer, dir, cfg),
  };
}

// ---------------------------------------------------------------- round-trip latency

class RttRun implements PathRun {
  private readonly all = new Samples();
  private readonly p50s: number[] = [];
  private readonly p99s: number[] = [];

  constructor(private readonly dialer: Dialer, private readonly cfg: BenchConfig) {}

  async measure(): Promise<string> {
    const { cfg } = this;
    const samples = await SocketScope.run('rtt-64', (cfg.rttSeconds + 30) * 1000, async (scope) => {
      const socket = scope.track(await this.dialer.dial('echo', DIAL_TIMEOUT_MS));
      const pinger = new Pinger(socket, 64);
      for (let i = 0; i < cfg.rttWarmupIterations; i++) await pinger.ping();
      const out = new Samples();
      const deadline = performance.now() + cfg.rttSeconds * 1000;
      while (out.count < cfg.rttMaxIterations && performance.now() < deadline) out.add((await pinger.ping()) * 1000);
      return out;
    });
    this.all.addAll(samples);
    const p50 = samples.percentile(50);
    const p99 = samples.percentile(99);
    this.p50s.push(p50);
    this.p99s.push(p99);
    return `${samples.count} round trips: p50 ${p50.toFixed(0)} µs, p99 ${p99.toFixed(0)} µs`;
  }

  values(): (number | null)[] {
    if (this.all.count === 0) return [null, null];
    return [this.all.percentile(50), this.all.percentile(99)];
  }

  roundValues(): number[][] {
    return [this.p50s, this.p99s];
  }

  notes(): string[] {
    return [];
  }
}

// ---------------------------------------------------------------- dial rate

class DialRateRun implements PathRun {
  private readonly latencies = new Samples();
  private completed = 0;
  private seconds = 0;
  private errors = 0;
  private firstError = '';
  private readonly perRound: number[][] = [[], [], []];

  constructor(private readonly dialer: Dialer, private readonly cfg: BenchConfig) {}

  async measure(): Promise<string> {
    const { cfg, dialer } = this;
    const round = await SocketScope.run('dial-rate', (cfg.dialSeconds + 30) * 1000, async (scope) => {
      const latencies = new Samples();
      let started = 0;
      let completed = 0;
      let errors = 0;
      let firstError = '';
      const begin = performance.now();
      const deadline = begin + cfg.dialSeconds * 1000;
      const worker = async (): Promise<void> => {
        while (performance.now() < deadline && started < cfg.dialMaxCount) {
          started++;
          const t0 = performance.now();
          let socket: Duplex | undefined;
          try {
            socket = scope.track(await dialer.dial('echo', DIAL_TIMEOUT_MS));
            await withTimeout(new Pinger(socket, 64).ping(), DIAL_TIMEOUT_MS, 'echo');
            latencies.add(performance.now() - t0);
            completed++;
          } catch (err) {
            errors++;
            firstError ||= errorMessage(err);
          } finally {
            socket?.destroy();
          }
        }
      };
      await Promise.all(Array.from({ length: cfg.dialConcurrency }, worker));
      const seconds = (performance.now() - begin) / 1000;
      if (completed === 0) throw new Error(`no dial completed (${errors} failed; first error: ${firstError})`);
      return { latencies, completed, errors, firstError, seconds };
    });
    this.latencies.addAll(round.latencies);
    this.completed += round.completed;
    this.seconds += round.seconds;
    this.errors += round.errors;
    this.firstError ||= round.firstError;
    const rate = round.completed / round.seconds;
    const p50 = round.latencies.percentile(50);
    const p99 = round.latencies.percentile(99);
    this.perRound[0]?.push(rate);
    this.perRound[1]?.push(p50);
    this.perRound[2]?.push(p99);
    const failed = round.errors > 0 ? `, ${round.errors} FAILED (${round.firstError})` : '';
    return `${round.completed} dials in ${round.seconds.toFixed(2)} s = ${rate.toFixed(0)}/s, p50 ${p50.toFixed(2)} ms, p99 ${p99.toFixed(2)} ms${failed}`;
  }

  values(): (number | null)[] {
    if (this.completed === 0) return [null, null, null];
    return [this.completed / this.seconds, this.latencies.percentile(50), this.latencies.percentile(99)];
  }

  roundValues(): number[][] {
    return this.perRound;
  }

  notes(): string[] {
    return this.errors > 0 ? [`${this.errors} dials failed (first: ${this.firstError})`] : [];
  }
}

// ---------------------------------------------------------------- the list

export const SCENARIOS: readonly Scenario[] = [
  throughput('throughput-up', 'lan', 'up'),
  throughput('throughput-down', 'lan', 'down'),
  {
    name: 'rtt-64',
    network: 'lan',
    description: '64-byte ping-pong against echo on one connection, after a warm-up',
    metrics: [
      { metric: 'p50', unit: 'us', better: 'lower' },
      { metric: 'p99', unit: 'us', better: 'lower' },
    ],
    forPath: (dialer, cfg) => new RttRun(dialer, cfg),
  },
  {
    name: 'dial-rate',
    network: 'lan',
    description: 'connect, one 64-byte echo, close; 16 at a time',
    metrics: [
      { metric: 'rate', unit: 'conn/s', better: 'higher' },
      { metric: 'dial p50', unit: 'ms', better: 'lower' },
      { metric: 'dial p99', unit: 'ms', better: 'lower' },
    ],
    forPath: (dialer, cfg) => new DialRateRun(dialer, cfg),
  },
  throughput('rtt20-throughput-up', 'rtt20', 'up'),
  throughput('rtt20-throughput-down', 'rtt20', 'down'),
];
