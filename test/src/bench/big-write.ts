// big-write: one socket.write() of a single 1 GiB Buffer through the SDK while another connection
// of the same Tunnel does 64-byte echoes every 50 ms: the bytes arrive intact (sha256 at the sink),
// the other connection stays open, and how long its round trips get meanwhile.
import { setTimeout as sleep } from 'node:timers/promises';
import { payloadBlock, payloadSha256 } from '../fixtures/index.js';
import { errorMessage, Pinger, readToEnd, SocketScope } from './io.js';
import type { Dialer } from './paths.js';
import {
  describeBytes,
  DIAL_TIMEOUT_MS,
  meanOrNull,
  parseSinkReply,
  withTimeout,
  type BenchConfig,
  type PathRun,
  type Scenario,
} from './scenarios.js';
import { mbPerSecond, MiB, Samples } from './stats.js';

/** Between the echo pings on the other connection. */
const ECHO_INTERVAL_MS = 50;
/** An echo that takes longer than this counts as the other connection being stuck. */
const ECHO_STUCK_MS = 30_000;

/** A Buffer of `bytes` of the deterministic payload (its sha256 is payloadSha256(bytes)). */
function payloadBuffer(bytes: number): Buffer {
  const block = payloadBlock();
  const out = Buffer.allocUnsafe(bytes);
  for (let off = 0; off < bytes; off += block.length) block.copy(out, off, 0, Math.min(block.length, bytes - off));
  return out;
}

/** 64-byte echoes every ECHO_INTERVAL_MS until stop(); round trips in ms. */
function echoLoop(pinger: Pinger): { stop(): Promise<{ rtts: Samples; error: string }> } {
  const rtts = new Samples();
  let running = true;
  let error = '';
  const loop = (async () => {
    while (running) {
      const began = performance.now();
      try {
        rtts.add(await withTimeout(pinger.ping(), ECHO_STUCK_MS, 'echo'));
      } catch (err) {
        error = errorMessage(err);
        return;
      }
      const rest = ECHO_INTERVAL_MS - (performance.now() - began);
      if (rest > 0) await sleep(rest);
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      return { rtts, error };
    },
  };
}

class BigWriteRun implements PathRun {
  private readonly perRound: number[][] = [[], [], [], []];
  private readonly notesList: string[] = [];

  constructor(
    private readonly dialer: Dialer,
    private readonly cfg: BenchConfig,
  ) {}

  async measure(): Promise<string> {
    const bytes = this.cfg.bigWriteBytes;
    const expected = payloadSha256(bytes);
    const timeoutMs = 60_000 + (bytes / (10 * MiB)) * 1000;
    return SocketScope.run(`big-write ${describeBytes(bytes)}`, timeoutMs, async (scope) => {
      const echo = scope.track(await this.dialer.dial('echo', DIAL_TIMEOUT_MS));
      const pinger = new Pinger(echo, 64);
      const alone = echoLoop(pinger);
      await sleep(1000);
      const solo = await alone.stop();
      if (solo.error) throw new Error(`echo before the big write: ${solo.error}`);

      let big: Buffer | undefined = payloadBuffer(bytes);
      const sink = scope.track(await this.dialer.dial('sinkHash', DIAL_TIMEOUT_MS));
      const reply = readToEnd(sink);
      reply.catch(() => {});
      const beside = echoLoop(pinger);
      const started = performance.now();
      sink.write(big);
      sink.end();
      big = undefined;
      let result: { bytes: number; sha256?: string } | undefined;
      let writeError = '';
      try {
        result = parseSinkReply((await reply).toString('utf8'));
      } catch (err) {
        writeError = errorMessage(err);
      }
      const seconds = (performance.now() - started) / 1000;
      const during = await beside.stop();
      // Still open and answering afterwards?
      const lastPing = during.error
        ? during.error
        : await withTimeout(pinger.ping(), ECHO_STUCK_MS, 'echo').then(
            () => '',
            (err: unknown) => errorMessage(err),
          );

      const faults: string[] = [];
      if (writeError) faults.push(`the big write FAILED: ${writeError}`);
      else if (result?.bytes !== bytes) faults.push(`the sink received ${result?.bytes} of ${bytes} bytes`);
      else if (result.sha256 !== expected) faults.push('sha256 MISMATCH at the sink');
      if (lastPing) faults.push(`the echo connection was DISTURBED: ${lastPing}`);
      const mbps = mbPerSecond(bytes, seconds);
      const p50 = during.rtts.percentile(50);
      const p99 = during.rtts.percentile(99);
      if (!writeError) this.perRound[0]!.push(mbps);
      if (during.rtts.count > 0) {
        this.perRound[1]!.push(p50);
        this.perRound[2]!.push(p99);
      }
      this.perRound[3]!.push(faults.length);
      const max = during.rtts.count > 0 ? Math.max(...during.rtts.values()) : Number.NaN;
      const summary =
        `${describeBytes(bytes)} in one write(): ${writeError ? 'failed' : `${seconds.toFixed(2)} s = ${mbps.toFixed(1)} MB/s, sha256 ${result?.sha256 === expected ? 'ok' : 'WRONG'}`}; ` +
        `echo beside it: ${during.rtts.count} round trips, p50 ${p50.toFixed(1)} ms, p99 ${p99.toFixed(1)} ms, max ${max.toFixed(0)} ms ` +
        `(alone: p50 ${solo.rtts.percentile(50).toFixed(1)} ms, p99 ${solo.rtts.percentile(99).toFixed(1)} ms), ${lastPing ? 'NOT open/answering after' : 'still open after'}`;
      this.notesList.push(faults.length > 0 ? `${summary}; ${faults.join('; ')}` : summary);
      if (faults.length > 0) throw new Error(faults.join('; '));
      return summary;
    });
  }

  values(): (number | null)[] {
    return this.perRound.map(meanOrNull);
  }

  roundValues(): number[][] {
    return this.perRound;
  }

  notes(): string[] {
    return this.notesList;
  }
}

export const BIG_WRITE: Scenario = {
  name: 'big-write',
  network: 'lan',
  description:
    'one socket.write() of bigWriteBytes through the SDK to sinkHash, while another connection of the same Tunnel echoes 64 bytes every 50 ms',
  metrics: [
    { metric: 'throughput', unit: 'MB/s', better: 'higher' },
    { metric: 'echo p50', unit: 'ms', better: 'lower' },
    { metric: 'echo p99', unit: 'ms', better: 'lower' },
    { metric: 'faults', unit: 'count', better: 'lower' },
  ],
  rounds: () => 1,
  appliesTo: { paths: ['tunnel', 'tunnel-grpc'], otherwise: 'the SDK paths only (one write() into a Tunnel connection)' },
  forPath: (dialer, cfg) => new BigWriteRun(dialer, cfg),
};
