// What is measured. Each scenario runs on every path it applies to (see paths.ts); a PathRun holds
// one scenario's state on one path across rounds, so rounds can be interleaved across paths.
import type { Duplex } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { digestStream, payloadBlock, payloadSha256, writePayload, type ManagedProcess } from '../fixtures/index.js';
import { AFTER_TRIM_MS, procStatusKiB, rssKiB, script, spawnNode } from './helpers.js';
import { countToEnd, errorMessage, Pinger, readToEnd, SocketScope } from './io.js';
import { CPU_FIGURE_LABELS, CPU_FIGURES, CPU_UNIT, CpuTally, withCpu, type CpuSample } from './cpu.js';
import { openClient } from './clients.js';
import type { Dialer, Network, PathName, ScaleRig } from './paths.js';
import { reapOnDeath } from './reaper.js';
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
  /** Rounds of the rtt20 scenarios (each costs seconds of relayed transfers per path). */
  rtt20Rounds: number;
  /** Head-of-line: duration of each bulk transfer; they alternate solo, next to a stall, solo, ... */
  holSeconds: number;
  /** Head-of-line: transfers next to a stall per round (each between two solo ones). */
  holStalled: number;
  holRounds: number;
  /** Head-of-line: give up filling the stalled connection after this much (unbounded buffering). */
  holStallLimitBytes: number;
  /** Head-of-line: a connection counts as stalled once nothing moved on it for this long. */
  holQuietMs: number;
  /** Pause between measurements, so the previous one's connections finish closing. */
  settleMs: number;
  /** scale-conns: idle connections through one agent, opened this many at a time. */
  scaleConnections: number;
  /** scale-conns over ssh -R: fewer (sshd's channel handling slows down with thousands: 10,000 take ~90 s). */
  scaleSshConnections: number;
  scaleConcurrency: number;
  /** scale-conns: connections opened and closed before the "before" figure (JIT, lazy set-up). */
  scaleWarmup: number;
  /** scale-agents: agents registered with one hub, this many at a time. */
  scaleAgents: number;
  scaleAgentsConcurrency: number;
  /** Pause before each RSS reading (timers, lazily freed buffers), before the forced GC. */
  scaleSettleMs: number;
  /** idle-rss: bytes echoed through one connection (so as many each way) between the first two readings. */
  idleRssBytes: number;
  /** stuck-destination: the numbers of stuck connections measured, e.g. "64,256,1024". */
  stuckCounts: string;
  /** stuck-destination: how long the clients keep writing into the stuck connections. */
  stuckSeconds: number;
  /** stuck-destination: the healthy bulk upload lasts about this long alone. */
  stuckBulkSeconds: number;
  /** stuck-destination: pause after the stuck clients left, before the "after" reading. */
  stuckAfterMs: number;
  /** big-write: the size of the single write(). */
  bigWriteBytes: number;
  /** fleet: the numbers of simulated clusters, comma-separated (one fresh hub each). */
  fleetSizes: string;
  /** fleet: wait after every agent connected (first leases, first status writes), then watch the idle fleet this long. */
  fleetSettleSeconds: number;
  fleetSteadySeconds: number;
}

/** "1000, 2500,5000" → [1000, 2500, 5000]: the counts a config or a flag lists (what is not a positive integer is left out). */
export const positiveCounts = (text: string): number[] =>
  text
    .split(',')
    .map((s) => Number(s.trim()))
    .filter((n) => Number.isInteger(n) && n > 0);

export const FULL_CONFIG: BenchConfig = {
  rounds: 2,
  throughputSeconds: 2.5,
  verifyBytes: 64 * MiB,
  maxTransferBytes: 32 * GiB,
  rttSeconds: 3,
  rttMaxIterations: 20_000,
  rttWarmupIterations: 500,
  dialSeconds: 3,
  dialConcurrency: 16,
  dialMaxCount: 50_000,
  rtt20Rounds: 1,
  holSeconds: 1.2,
  holStalled: 2,
  holRounds: 1,
  holStallLimitBytes: 1 * GiB,
  holQuietMs: 500,
  settleMs: 250,
  scaleConnections: 10_000,
  scaleSshConnections: 2000,
  scaleConcurrency: 64,
  scaleWarmup: 200,
  scaleAgents: 1000,
  scaleAgentsConcurrency: 32,
  scaleSettleMs: 1000,
  idleRssBytes: GiB,
  stuckCounts: '64,256,1024',
  stuckSeconds: 20,
  stuckBulkSeconds: 2,
  stuckAfterMs: 10_000,
  bigWriteBytes: GiB,
  fleetSizes: '1000,2500,5000',
  fleetSettleSeconds: 20,
  // At least one lease period (60 s), so every agent renews within the window.
  fleetSteadySeconds: 60,
};

export const QUICK_CONFIG: BenchConfig = {
  rounds: 1,
  throughputSeconds: 0.4,
  verifyBytes: 16 * MiB,
  maxTransferBytes: 8 * GiB,
  rttSeconds: 0.5,
  rttMaxIterations: 2_000,
  rttWarmupIterations: 100,
  dialSeconds: 0.5,
  dialConcurrency: 16,
  dialMaxCount: 5_000,
  rtt20Rounds: 1,
  holSeconds: 0.25,
  holStalled: 1,
  holRounds: 1,
  holStallLimitBytes: 1 * GiB,
  holQuietMs: 300,
  settleMs: 100,
  scaleConnections: 500,
  scaleSshConnections: 200,
  scaleConcurrency: 64,
  scaleWarmup: 20,
  scaleAgents: 50,
  scaleAgentsConcurrency: 25,
  scaleSettleMs: 200,
  idleRssBytes: 64 * MiB,
  stuckCounts: '64',
  stuckSeconds: 5,
  stuckBulkSeconds: 0.5,
  stuckAfterMs: 10_000,
  bigWriteBytes: 128 * MiB,
  fleetSizes: '100',
  fleetSettleSeconds: 5,
  fleetSteadySeconds: 20,
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
  /** The metrics for this configuration, where they depend on it (replaces `metrics`). */
  metricsFor?: (cfg: BenchConfig) => readonly MetricSpec[];
  /** Rounds for this scenario (default cfg.rounds). */
  rounds?: (cfg: BenchConfig) => number;
  /** Paths it is measured on (default all); the others show n/a with this reason. */
  appliesTo?: { paths: readonly PathName[]; otherwise: string };
  forPath(dialer: Dialer, cfg: BenchConfig): PathRun;
}

export const DIAL_TIMEOUT_MS = 10_000;

export function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

export function describeBytes(bytes: number): string {
  return bytes >= GiB ? `${(bytes / GiB).toFixed(2)} GiB` : `${(bytes / MiB).toFixed(bytes < 10 * MiB ? 1 : 0)} MiB`;
}

// ---------------------------------------------------------------- throughput

export type Direction = 'up' | 'down';

export function parseSinkReply(text: string): { bytes: number; sha256?: string } {
  const value: unknown = JSON.parse(text.trim());
  if (typeof value !== 'object' || value === null || typeof (value as { bytes?: unknown }).bytes !== 'number') {
    throw new Error(`unexpected sink reply ${JSON.stringify(text.slice(0, 200))}`);
  }
  const sha256 = (value as { sha256?: unknown }).sha256;
  return { bytes: (value as { bytes: number }).bytes, sha256: typeof sha256 === 'string' ? sha256 : undefined };
}

/**
 * Moves exactly `bytes` of the deterministic payload client→sink (up) or source→client (down),
 * split evenly over `connections` fresh connections that run at once; returns the seconds from the
 * first byte sent (up) / the requests (down) until every target confirmed its count (up: its reply
 * after our EOF) / every connection saw EOF (down). Dials happen before the clock starts. With
 * `hashed`, the sha256 of what arrived on each connection is checked as well.
 */
export async function transfer(
  dialer: Dialer,
  dir: Direction,
  bytes: number,
  hashed: boolean,
  timeoutMs: number,
  connections = 1,
): Promise<number> {
  const each = bytes / connections;
  if (!Number.isInteger(each)) throw new Error(`internal: ${bytes} bytes do not split over ${connections} connections`);
  const what = `${dir} ${describeBytes(bytes)}${connections > 1 ? ` over ${connections} connections` : ''}${hashed ? ' (sha256)' : ''}`;
  return SocketScope.run(what, timeoutMs, async (scope) => {
    const target = dir === 'up' ? (hashed ? 'sinkHash' : 'sink') : 'source';
    const sockets = await Promise.all(
      Array.from({ length: connections }, async () => scope.track(await dialer.dial(target, DIAL_TIMEOUT_MS))),
    );
    if (dir === 'up') {
      const replies = sockets.map((socket) => {
        const reply = readToEnd(socket);
        reply.catch(() => {}); // reported below, unless the write fails first
        return reply;
      });
      const started = performance.now();
      await Promise.all(
        sockets.map(async (socket, i) => {
          await writePayload(socket, each);
          const result = parseSinkReply((await replies[i]!).toString('utf8'));
          if (result.bytes !== each) throw new Error(`${what}: a sink received ${result.bytes} of ${each} bytes`);
          if (hashed && result.sha256 !== payloadSha256(each)) throw new Error(`${what}: sha256 mismatch at the sink`);
        }),
      );
      return (performance.now() - started) / 1000;
    }
    const received = sockets.map((socket) => {
      const r: Promise<{ bytes: number; sha256?: string }> = hashed ? digestStream(socket) : countToEnd(socket).then((n) => ({ bytes: n }));
      r.catch(() => {});
      return r;
    });
    const started = performance.now();
    for (const socket of sockets) socket.write(`${each}\n`);
    await Promise.all(
      received.map(async (r) => {
        const result = await r;
        if (result.bytes !== each) throw new Error(`${what}: received ${result.bytes} of ${each} bytes`);
        if (hashed && result.sha256 !== payloadSha256(each)) throw new Error(`${what}: sha256 mismatch at the client`);
      }),
    );
    return (performance.now() - started) / 1000;
  });
}

/** A byte count lasting about `seconds` at `rate` B/s, a multiple of `connections` MiB, within bounds. */
export function transferSize(rate: number, seconds: number, cfg: BenchConfig, connections = 1): number {
  const unit = connections * MiB;
  const wanted = Math.round((rate * seconds) / unit) * unit;
  return Math.min(Math.floor(cfg.maxTransferBytes / unit) * unit, Math.max(Math.ceil(cfg.verifyBytes / unit) * unit, wanted));
}

export class ThroughputRun implements PathRun {
  /** Bytes per second seen last; sizes the next timed transfer so it lasts about throughputSeconds. */
  private rate: number | undefined;
  private bytes = 0;
  private seconds = 0;
  private readonly perRound: number[] = [];
  /** CPU per GiB of the recorded transfers, where the path says which processes it crosses. */
  readonly cpu: CpuTally | undefined;

  /** With `cpu`, the values also hold CPU seconds per GiB (CPU_FIGURES, after the MB/s). */
  constructor(
    private readonly dialer: Dialer,
    private readonly dir: Direction,
    private readonly cfg: BenchConfig,
    private readonly connections = 1,
    cpu = false,
  ) {
    this.cpu = cpu ? new CpuTally() : undefined;
  }

  async measure(): Promise<string> {
    const { cfg, connections } = this;
    let verified = '';
    if (this.rate === undefined) {
      const bytes = transferSize(0, 0, cfg, connections);
      const seconds = await transfer(this.dialer, this.dir, bytes, true, 60_000, connections);
      this.rate = bytes / seconds;
      verified = `sha256 ok (${describeBytes(bytes)}); `;
    }
    for (let attempt = 1; ; attempt++) {
      const bytes = transferSize(this.rate, cfg.throughputSeconds, cfg, connections);
      const timeoutMs = (3 * cfg.throughputSeconds + 15) * 1000;
      const timed = (): Promise<number> => transfer(this.dialer, this.dir, bytes, false, timeoutMs, connections);
      // Read around every attempt; only the recorded one's figures are kept.
      const procs = this.cpu ? this.dialer.processes?.(this.dir === 'up' ? 'sink' : 'source') : undefined;
      let cpu: CpuSample | undefined;
      let seconds: number;
      if (procs) ({ result: seconds, cpu } = await withCpu(procs, timed));
      else seconds = await timed();
      this.rate = bytes / seconds;
      // A calibration from a short (or hashed) transfer can be far off: retry once or twice so the
      // recorded transfer lasts about as long as intended.
      const longEnough = seconds >= 0.6 * cfg.throughputSeconds || bytes >= cfg.maxTransferBytes;
      if (longEnough || attempt === 3) {
        this.bytes += bytes;
        this.seconds += seconds;
        const mbps = mbPerSecond(bytes, seconds);
        this.perRound.push(mbps);
        if (cpu) this.cpu?.add(bytes, cpu);
        const cpuText = cpu
          ? `; CPU s: ${Object.entries(cpu.seconds)
              .map(([role, s]) => `${role} ${s.toFixed(2)}`)
              .join(', ')}`
          : '';
        return `${verified}${describeBytes(bytes)} in ${seconds.toFixed(2)} s = ${mbps.toFixed(1)} MB/s${cpuText}`;
      }
    }
  }

  values(): (number | null)[] {
    const { cpu } = this;
    return [this.seconds > 0 ? mbPerSecond(this.bytes, this.seconds) : null, ...(cpu ? CPU_FIGURES.map((f) => cpu.perGiB(f)) : [])];
  }

  roundValues(): number[][] {
    const { cpu } = this;
    return [this.perRound, ...(cpu ? CPU_FIGURES.map((f) => cpu.perRound(f)) : [])];
  }

  notes(): string[] {
    return this.cpu && this.cpu.perGiB('client') !== null ? [this.cpu.note()] : [];
  }
}

/** The CPU rows of a throughput scenario, after its MB/s. */
export const CPU_METRICS: readonly MetricSpec[] = CPU_FIGURES.map((f) => ({
  metric: CPU_FIGURE_LABELS[f],
  unit: CPU_UNIT,
  better: 'lower',
}));

/** With `cpu`, also CPU seconds per GiB of every process on the path (lan paths know their processes). */
function throughput(name: string, network: Network, dir: Direction, connections = 1, cpu = false): Scenario {
  const towards = dir === 'up' ? 'client → target (sink)' : 'target (source) → client';
  return {
    name,
    network,
    description: `${connections === 1 ? 'one connection' : `${connections} connections at once`}, bulk ${towards}${network === 'rtt20' ? ', 20 ms RTT on the tunnelled link' : ''}${cpu ? ', CPU per GiB of each process' : ''}`,
    metrics: [{ metric: 'throughput', unit: 'MB/s', better: 'higher' }, ...(cpu ? CPU_METRICS : [])],
    rounds: network === 'rtt20' ? (cfg) => cfg.rtt20Rounds : undefined,
    forPath: (dialer, cfg) => new ThroughputRun(dialer, dir, cfg, connections, cpu),
  };
}

// ---------------------------------------------------------------- head-of-line

interface Stall {
  /** Bytes the stalled connection took before it stopped moving (up: accepted by write(); down: buffered unread at the client). */
  bytes: number;
  alive(): boolean;
}

/**
 * Opens a connection and fills it until it stops moving: up, the client writes to `stall` (never
 * reads) until write() returns false and no 'drain' follows for 500 ms; down, the client asks
 * `source` for more than it could ever read and never reads. The socket belongs to `scope`.
 */
async function openStall(dialer: Dialer, dir: Direction, cfg: BenchConfig, scope: SocketScope): Promise<Stall> {
  const QUIET_MS = cfg.holQuietMs;
  if (dir === 'up') {
    const socket = scope.track(await dialer.dial('stall', DIAL_TIMEOUT_MS));
    const block = payloadBlock();
    let accepted = 0;
    for (;;) {
      if (socket.destroyed) throw new Error(`stalled upload: connection closed after ${describeBytes(accepted)}`);
      accepted += block.length;
      if (socket.write(block)) continue;
      const drained = await new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => {
          socket.off('drain', onDrain);
          resolve(false);
        }, QUIET_MS);
        const onDrain = (): void => {
          clearTimeout(timer);
          resolve(true);
        };
        socket.once('drain', onDrain);
      });
      if (!drained) break;
      if (accepted > cfg.holStallLimitBytes)
        throw new Error(`stalled upload: still accepting after ${describeBytes(accepted)} (unbounded buffering?)`);
    }
    return { bytes: accepted, alive: () => !socket.destroyed };
  }
  const socket = scope.track(await dialer.dial('source', DIAL_TIMEOUT_MS));
  socket.on('error', () => {});
  socket.write(`${cfg.maxTransferBytes}\n`);
  let last = -1;
  let stableSince = performance.now();
  for (;;) {
    await sleep(50);
    if (socket.destroyed) throw new Error('stalled download: connection closed');
    const buffered = socket.readableLength;
    if (buffered > cfg.holStallLimitBytes)
      throw new Error(`stalled download: the client buffered ${describeBytes(buffered)} unread (unbounded buffering?)`);
    if (buffered !== last) {
      last = buffered;
      stableSince = performance.now();
    } else if (buffered > 0 && performance.now() - stableSince >= QUIET_MS) {
      return { bytes: buffered, alive: () => !socket.destroyed };
    }
  }
}

class HolRun implements PathRun {
  private rate: number | undefined;
  private soloBytes = 0;
  private soloSeconds = 0;
  private stalledBytes = 0;
  private stalledSeconds = 0;
  private readonly kept: number[] = [];
  private readonly stallSizes: number[] = [];

  constructor(
    private readonly dialer: Dialer,
    private readonly dir: Direction,
    private readonly cfg: BenchConfig,
  ) {}

  /** One bulk transfer of `bytes` while another connection on the same path is stalled with a full window. */
  private async nextToStall(bytes: number, timeoutMs: number): Promise<number> {
    const { cfg, dialer, dir } = this;
    return SocketScope.run(`hol-${dir} stall`, timeoutMs + 30_000, async (scope) => {
      const stall = await openStall(dialer, dir, cfg, scope);
      this.stallSizes.push(stall.bytes);
      const seconds = await transfer(dialer, dir, bytes, false, timeoutMs);
      if (!stall.alive()) throw new Error('the stalled connection was closed during the bulk transfer');
      return seconds;
    });
  }

  async measure(): Promise<string> {
    const { cfg, dialer, dir } = this;
    if (this.rate === undefined) {
      const bytes = transferSize(0, 0, cfg);
      this.rate = bytes / (await transfer(dialer, dir, bytes, false, 60_000));
    }
    const bytes = transferSize(this.rate, cfg.holSeconds, cfg);
    const timeoutMs = (5 * cfg.holSeconds + 20) * 1000;
    // Solo and next-to-a-stall transfers alternate (S X S X S), so a drift in machine load hits both
    // alike. A stalled transfer starts after the stall was quiet for holQuietMs; a solo one gets the
    // same pause, so neither kind starts on the heels of the previous transfer more than the other.
    const solo1 = async (): Promise<number> => {
      await sleep(cfg.holQuietMs);
      return transfer(dialer, dir, bytes, false, timeoutMs);
    };
    let solo = await solo1();
    let soloCount = 1;
    let stalled = 0;
    for (let i = 0; i < cfg.holStalled; i++) {
      stalled += await this.nextToStall(bytes, timeoutMs);
      solo += await solo1();
      soloCount++;
    }
    this.rate = (soloCount * bytes) / solo;
    this.soloBytes += soloCount * bytes;
    this.soloSeconds += solo;
    this.stalledBytes += cfg.holStalled * bytes;
    this.stalledSeconds += stalled;
    const soloRate = mbPerSecond(soloCount * bytes, solo);
    const withStall = mbPerSecond(cfg.holStalled * bytes, stalled);
    this.kept.push((100 * withStall) / soloRate);
    const held = dir === 'up' ? 'writer blocked after' : 'unread at the client';
    const sizes = this.stallSizes.slice(-cfg.holStalled).map(describeBytes).join(', ');
    return `stall: ${sizes} ${held}; bulk ${describeBytes(bytes)} x ${soloCount} solo: ${soloRate.toFixed(1)} MB/s, x ${cfg.holStalled} next to the stall: ${withStall.toFixed(1)} MB/s = ${((100 * withStall) / soloRate).toFixed(1)} %`;
  }

  values(): (number | null)[] {
    if (this.stalledSeconds === 0) return [null];
    return [(100 * mbPerSecond(this.stalledBytes, this.stalledSeconds)) / mbPerSecond(this.soloBytes, this.soloSeconds)];
  }

  roundValues(): number[][] {
    return [this.kept];
  }

  notes(): string[] {
    if (this.stallSizes.length === 0) return [];
    const held =
      this.dir === 'up'
        ? 'accepted by the stalled connection before its writer blocked'
        : 'buffered unread at the client on the stalled connection';
    const sizes = [...new Set(this.stallSizes.map(describeBytes))].join(', ');
    return [
      `${sizes} ${held}; bulk solo ${mbPerSecond(this.soloBytes, this.soloSeconds).toFixed(0)} MB/s, next to the stall ${mbPerSecond(this.stalledBytes, this.stalledSeconds).toFixed(0)} MB/s`,
    ];
  }
}

function headOfLine(name: string, dir: Direction): Scenario {
  return {
    name,
    network: 'lan',
    description:
      dir === 'up'
        ? 'bulk upload on one connection while another upload on the same path is stalled (destination never reads)'
        : 'bulk download on one connection while another download on the same path is stalled (client never reads)',
    metrics: [{ metric: 'bulk kept', unit: '%', better: 'higher' }],
    rounds: (cfg) => cfg.holRounds,
    forPath: (dialer, cfg) => new HolRun(dialer, dir, cfg),
  };
}

// ---------------------------------------------------------------- scale

/** A helper child process speaking JSON lines; stopped with its scope. */
export function spawnHelper(name: string, file: string, job: object): ManagedProcess {
  return reapOnDeath(spawnNode(name, [script(file), JSON.stringify(job)]));
}

async function sumRss(pids: readonly number[]): Promise<number> {
  let total = 0;
  for (const pid of pids) total += await rssKiB(pid);
  return total;
}

/** RssAnon of the processes, KiB (0 for one that is gone). */
async function sumAnon(pids: readonly number[]): Promise<number> {
  let total = 0;
  for (const pid of pids) total += (await procStatusKiB(pid, 'RssAnon')) ?? 0;
  return total;
}

interface Reading {
  /** VmRSS, KiB. */
  hub: number;
  agent: number;
  /** RssAnon, KiB: the anonymous part of VmRSS, what a memory limit charges (not the binary's file pages). */
  anon: { hub: number; agent: number };
  /** V8 heapUsed after the GC, bytes (our processes only). */
  heap?: { hub: number; agent: number };
}

/** Settle, full GC, then VmRSS (KiB) of each side. */
async function settledRss(rig: ScaleRig, settleMs: number): Promise<Reading> {
  await sleep(settleMs);
  const heap = await rig.gc();
  await sleep(AFTER_TRIM_MS);
  const pids = await rig.pids();
  return {
    hub: await sumRss(pids.hub),
    agent: await sumRss(pids.agent),
    anon: { hub: await sumAnon(pids.hub), agent: await sumAnon(pids.agent) },
    heap,
  };
}

async function waitHubConnections(rig: ScaleRig, want: (n: number) => boolean, timeoutMs: number, what: string): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  let n: number | undefined;
  for (;;) {
    n = await rig.hubConnections();
    if (n === undefined || want(n)) return;
    if (performance.now() > deadline) throw new Error(`${what}: the hub still holds ${n} connections after ${timeoutMs / 1000} s`);
    await sleep(100);
  }
}

/** What `idleConnectionsCycle` saw: RSS before, while holding, and after closing, and how the opening went. */
interface IdleCycle {
  before: Reading;
  held: Reading;
  closed: Reading;
  seconds: number;
  client: string;
}

/**
 * Through a scale rig: a child process opens and closes `scaleWarmup` connections, then (RSS "before")
 * opens `n` idle connections, each proven by an echo (RSS "held"), checks none was closed while idle,
 * and closes them all (RSS "closed").
 */
async function idleConnectionsCycle(path: PathName, rig: ScaleRig, cfg: BenchConfig, n: number): Promise<IdleCycle> {
  const child = spawnHelper(`scale-client-${path}`, 'scale-client.js', {
    spec: rig.spec,
    count: n,
    concurrency: cfg.scaleConcurrency,
    warmup: cfg.scaleWarmup,
  });
  try {
    const warm = await child.waitForJsonLine((o) => 'warm' in o, 60_000);
    await waitHubConnections(rig, (c) => c === 0, 15_000, 'after the warm-up');
    const before = await settledRss(rig, cfg.scaleSettleMs);
    let after = child.lineCount();
    child.kill('SIGUSR2');
    const ready = await child.waitForJsonLine((o) => 'ready' in o, Math.max(120_000, n * 10), { after });
    const opened = Number(ready['ready']);
    if (opened !== n)
      throw new Error(
        `opened ${opened} of ${n} connections (${String(ready['failed'])} failed; first error: ${String(ready['firstError'])})`,
      );
    await waitHubConnections(rig, (c) => c >= n, 15_000, 'all connections up');
    const held = await settledRss(rig, cfg.scaleSettleMs);
    after = child.lineCount();
    child.kill('SIGUSR2');
    const holding = await child.waitForJsonLine((o) => 'holding' in o, 10_000, { after });
    if (Number(holding['lost']) !== 0)
      throw new Error(`${String(holding['lost'])} of the ${n} idle connections were closed by the path while idle`);
    await child.waitForJsonLine((o) => 'closed' in o, 60_000, { after });
    await waitHubConnections(rig, (c) => c === 0, 30_000, 'after closing');
    const closed = await settledRss(rig, cfg.scaleSettleMs);
    return { before, held, closed, seconds: Number(ready['seconds']), client: String(ready['client'] ?? warm['client']) };
  } finally {
    await child.stop(5000);
  }
}

export const mib = (kib: number): string => `${(kib / 1024).toFixed(1)} MiB`;

/** The mean of one figure's rounds; null when no round succeeded. */
export function meanOrNull(xs: readonly number[]): number | null {
  return xs.length === 0 ? null : xs.reduce((a, b) => a + b, 0) / xs.length;
}

class ScaleConnsRun implements PathRun {
  private readonly hub: number[] = [];
  private readonly agent: number[] = [];
  private readonly notesList: string[] = [];

  constructor(
    private readonly dialer: Dialer,
    private readonly cfg: BenchConfig,
  ) {}

  async measure(): Promise<string> {
    const { cfg, dialer } = this;
    if (!dialer.scaleConns) throw new Error('no scale set-up for this path');
    const n = dialer.path === 'ssh' ? cfg.scaleSshConnections : cfg.scaleConnections;
    const rig = await dialer.scaleConns();
    try {
      const { before, held, closed, seconds, client } = await idleConnectionsCycle(dialer.path, rig, cfg, n);
      const hub = (held.hub - before.hub) / n;
      const agent = (held.agent - before.agent) / n;
      this.hub.push(hub);
      this.agent.push(agent);
      const heap = (side: 'hub' | 'agent'): string => {
        if (!before.heap || !held.heap || !closed.heap) return '';
        const kib = (b: number): string => `${(b / 1024 / n).toFixed(1)}`;
        return `; V8 heap ${kib(held.heap[side] - before.heap[side])} KiB/conn, ${kib(closed.heap[side] - before.heap[side])} KiB/conn left after closing`;
      };
      const summary =
        `${n} idle connections opened in ${seconds.toFixed(1)} s (${client}); ` +
        `${rig.sides.hub} RSS ${mib(before.hub)} → ${mib(held.hub)} (${mib(closed.hub)} after closing)${heap('hub')}; ` +
        `${rig.sides.agent} RSS ${mib(before.agent)} → ${mib(held.agent)} (${mib(closed.agent)} after closing)${heap('agent')}`;
      this.notesList.push(summary);
      return `${summary}: ${hub.toFixed(1)} / ${agent.toFixed(1)} KiB per connection`;
    } finally {
      await rig.stop();
    }
  }

  values(): (number | null)[] {
    return [meanOrNull(this.hub), meanOrNull(this.agent)];
  }

  roundValues(): number[][] {
    return [this.hub, this.agent];
  }

  notes(): string[] {
    return this.notesList;
  }
}

/** Writes `bytes` into an echo connection while reading them back; resolves when all came back. */
async function echoThrough(socket: Duplex, bytes: number): Promise<void> {
  const chunk = Buffer.alloc(64 * 1024, 0x5a);
  let received = 0;
  const done = new Promise<void>((resolve, reject) => {
    socket.on('data', (d: Buffer) => {
      received += d.length;
      if (received >= bytes) resolve();
    });
    socket.once('error', reject);
    socket.once('close', () => (received >= bytes ? resolve() : reject(new Error(`closed after ${received} of ${bytes} echoed bytes`))));
  });
  for (let sent = 0; sent < bytes; sent += chunk.length) {
    const piece = bytes - sent < chunk.length ? chunk.subarray(0, bytes - sent) : chunk;
    if (!socket.write(piece))
      await new Promise<void>((resolve, reject) => {
        const onDrain = (): void => {
          socket.off('close', onClose);
          resolve();
        };
        const onClose = (): void => {
          socket.off('drain', onDrain);
          reject(new Error(`closed after ${sent} of ${bytes} bytes sent`));
        };
        socket.once('drain', onDrain);
        socket.once('close', onClose);
      });
  }
  await done;
}

/**
 * RSS of fresh hub and agent processes (sshd session and ssh client for ssh -R): after start, after
 * echoing `idleRssBytes` each way through one connection, and after opening and closing the scale
 * scenario's idle connections. Memory a path keeps after work shows here; scale-conns shows the cost
 * while holding connections.
 */
class IdleRssRun implements PathRun {
  private readonly figures: number[][] = [[], [], [], [], [], [], [], [], [], []];
  private readonly notesList: string[] = [];

  constructor(
    private readonly dialer: Dialer,
    private readonly cfg: BenchConfig,
  ) {}

  async measure(): Promise<string> {
    const { cfg, dialer } = this;
    if (!dialer.scaleConns) throw new Error('no scale set-up for this path');
    const n = dialer.path === 'ssh' ? cfg.scaleSshConnections : cfg.scaleConnections;
    const rig = await dialer.scaleConns();
    try {
      const start = await settledRss(rig, cfg.scaleSettleMs);
      const client = openClient(rig.spec);
      try {
        const socket = await client.dial('echo', DIAL_TIMEOUT_MS);
        await withTimeout(echoThrough(socket, cfg.idleRssBytes), 300_000, 'echo transfer');
        socket.destroy();
      } finally {
        client.close();
      }
      await waitHubConnections(rig, (c) => c === 0, 15_000, 'after the transfer');
      const moved = await settledRss(rig, cfg.scaleSettleMs);
      const { closed } = await idleConnectionsCycle(dialer.path, rig, cfg, n);
      const readings = [
        start.hub,
        moved.hub,
        closed.hub,
        start.agent,
        moved.agent,
        closed.agent,
        start.anon.hub,
        closed.anon.hub,
        start.anon.agent,
        closed.anon.agent,
      ].map((kib) => kib / 1024);
      readings.forEach((v, i) => this.figures[i]!.push(v));
      const moveText = `${cfg.idleRssBytes / GiB >= 1 ? `${cfg.idleRssBytes / GiB} GiB` : `${cfg.idleRssBytes / MiB} MiB`} each way`;
      const summary =
        `${rig.sides.hub} ${mib(start.hub)} at start, ${mib(moved.hub)} after ${moveText}, ${mib(closed.hub)} after ${n} idle connections closed; ` +
        `${rig.sides.agent} ${mib(start.agent)}, ${mib(moved.agent)}, ${mib(closed.agent)}; anonymous (RssAnon): ${rig.sides.hub} ${mib(start.anon.hub)} at start, ` +
        `${mib(moved.anon.hub)}, ${mib(closed.anon.hub)}; ${rig.sides.agent} ${mib(start.anon.agent)}, ${mib(moved.anon.agent)}, ${mib(closed.anon.agent)}`;
      this.notesList.push(summary);
      return summary;
    } finally {
      await rig.stop();
    }
  }

  values(): (number | null)[] {
    return this.figures.map(meanOrNull);
  }

  roundValues(): number[][] {
    return this.figures;
  }

  notes(): string[] {
    return this.notesList;
  }
}

class ScaleAgentsRun implements PathRun {
  private readonly perAgent: number[] = [];
  private readonly notesList: string[] = [];

  constructor(
    private readonly dialer: Dialer,
    private readonly cfg: BenchConfig,
  ) {}

  async measure(): Promise<string> {
    const { cfg, dialer } = this;
    if (!dialer.scaleAgents) throw new Error('no scale set-up for this path');
    const n = cfg.scaleAgents;
    const rig = await dialer.scaleAgents();
    let child: ManagedProcess | undefined;
    try {
      await sleep(cfg.scaleSettleMs);
      const heapBefore = await rig.gc();
      await sleep(200);
      const before = await rssKiB(rig.hubPid);
      child = spawnHelper(`agents-load-${rig.transport}`, 'agents-load.js', {
        transport: rig.transport,
        hubAddress: rig.hubAddress,
        tls: rig.tls,
        cluster: rig.cluster,
        count: n,
        concurrency: cfg.scaleAgentsConcurrency,
      });
      const ready = await child.waitForJsonLine((o) => 'ready' in o, Math.max(120_000, n * 100));
      const registered = Number(ready['ready']);
      if (registered !== n)
        throw new Error(
          `registered ${registered} of ${n} agents (${String(ready['failed'])} failed; first error: ${String(ready['firstError'])})`,
        );
      const deadline = performance.now() + 15_000;
      let atHub = 0;
      while ((atHub = await rig.agentsRegistered()) < n) {
        if (performance.now() > deadline) throw new Error(`the hub lists ${atHub} of ${n} agents`);
        await sleep(100);
      }
      await sleep(cfg.scaleSettleMs);
      const heapHeld = await rig.gc();
      await sleep(200);
      const held = await rssKiB(rig.hubPid);
      const after = child.lineCount();
      child.kill('SIGUSR2');
      const holding = await child.waitForJsonLine((o) => 'holding' in o, 10_000, { after });
      if (Number(holding['lost']) !== 0) throw new Error(`${String(holding['lost'])} of the ${n} agents were disconnected while idle`);
      const perAgent = (held - before) / n;
      this.perAgent.push(perAgent);
      const summary =
        `${n} ${rig.transport} agents registered in ${Number(ready['seconds']).toFixed(1)} s; hub RSS ${(before / 1024).toFixed(1)} MiB → ${(held / 1024).toFixed(1)} MiB; ` +
        `V8 heap ${((heapHeld - heapBefore) / 1024 / n).toFixed(1)} KiB/agent`;
      this.notesList.push(summary);
      return `${summary}: ${perAgent.toFixed(1)} KiB per agent`;
    } finally {
      await child?.stop(5000);
      await rig.stop();
    }
  }

  values(): (number | null)[] {
    return [meanOrNull(this.perAgent)];
  }

  roundValues(): number[][] {
    return [this.perAgent];
  }

  notes(): string[] {
    return this.notesList;
  }
}

// ---------------------------------------------------------------- round-trip latency

class RttRun implements PathRun {
  private readonly all = new Samples();
  private readonly p50s: number[] = [];
  private readonly p99s: number[] = [];

  constructor(
    private readonly dialer: Dialer,
    private readonly cfg: BenchConfig,
  ) {}

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

  constructor(
    private readonly dialer: Dialer,
    private readonly cfg: BenchConfig,
  ) {}

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

function dialRate(name: string, network: Network): Scenario {
  return {
    name,
    network,
    description: `connect, one 64-byte echo, close; 16 at a time${network === 'rtt20' ? ', 20 ms RTT on the tunnelled link' : ''}`,
    metrics: [
      { metric: 'rate', unit: 'conn/s', better: 'higher' },
      { metric: 'dial p50', unit: 'ms', better: 'lower' },
      { metric: 'dial p99', unit: 'ms', better: 'lower' },
    ],
    rounds: network === 'rtt20' ? (cfg) => cfg.rtt20Rounds : undefined,
    forPath: (dialer, cfg) => new DialRateRun(dialer, cfg),
  };
}

export const SCENARIOS: readonly Scenario[] = [
  throughput('throughput-up', 'lan', 'up', 1, true),
  throughput('throughput-down', 'lan', 'down', 1, true),
  throughput('throughput-8-up', 'lan', 'up', 8),
  throughput('throughput-8-down', 'lan', 'down', 8),
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
  dialRate('dial-rate', 'lan'),
  throughput('rtt20-throughput-up', 'rtt20', 'up'),
  throughput('rtt20-throughput-down', 'rtt20', 'down'),
  dialRate('rtt20-dial-rate', 'rtt20'),
  headOfLine('hol-up', 'up'),
  headOfLine('hol-down', 'down'),
  {
    name: 'scale-conns',
    network: 'lan',
    description: 'idle connections through one agent (fresh processes): VmRSS growth per connection after a full GC',
    metrics: [
      { metric: 'hub KiB/conn', unit: 'KiB', better: 'lower' },
      { metric: 'agent KiB/conn', unit: 'KiB', better: 'lower' },
    ],
    rounds: () => 1,
    appliesTo: { paths: ['ssh', 'tunnel', 'tunnel-grpc', 'connect'], otherwise: 'no process in between' },
    forPath: (dialer, cfg) => new ScaleConnsRun(dialer, cfg),
  },
  {
    name: 'idle-rss',
    network: 'lan',
    description: 'RSS of fresh processes: at start, after echoing idleRssBytes each way, after the scale idle connections closed',
    metrics: [
      { metric: 'hub start', unit: 'MiB', better: 'lower' },
      { metric: 'hub after transfer', unit: 'MiB', better: 'lower' },
      { metric: 'hub after conns', unit: 'MiB', better: 'lower' },
      { metric: 'agent start', unit: 'MiB', better: 'lower' },
      { metric: 'agent after transfer', unit: 'MiB', better: 'lower' },
      { metric: 'agent after conns', unit: 'MiB', better: 'lower' },
      { metric: 'hub anon start', unit: 'MiB', better: 'lower' },
      { metric: 'hub anon after conns', unit: 'MiB', better: 'lower' },
      { metric: 'agent anon start', unit: 'MiB', better: 'lower' },
      { metric: 'agent anon after conns', unit: 'MiB', better: 'lower' },
    ],
    rounds: () => 1,
    appliesTo: {
      paths: ['ssh', 'tunnel', 'tunnel-grpc'],
      otherwise: "no process in between (direct); connect shares tunnel's hub and agent",
    },
    forPath: (dialer, cfg) => new IdleRssRun(dialer, cfg),
  },
  {
    name: 'scale-agents',
    network: 'lan',
    description: 'idle agents connected to one hub (fresh hub, simulated agents): hub VmRSS growth per agent after a full GC',
    metrics: [{ metric: 'hub KiB/agent', unit: 'KiB', better: 'lower' }],
    rounds: () => 1,
    appliesTo: {
      paths: ['tunnel', 'tunnel-grpc'],
      otherwise: 'tunnel = mux agents, tunnel-grpc = gRPC agents; connect uses the same agents as tunnel',
    },
    forPath: (dialer, cfg) => new ScaleAgentsRun(dialer, cfg),
  },
];
