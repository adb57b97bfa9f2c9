// Child process: the clients of the stuck-destination scenario. It holds many connections to a
// destination that never reads, so it runs apart from the bench (with a raised open-files limit,
// helpers.spawnNode) and its own memory is never measured.
//
//   node stuck-client.js '<json {spec, count, concurrency, seconds, chunkBytes, perConnectionLimit}>'
//
// 1. opens `count` connections to `stall`, `concurrency` at a time; prints {"opened":N,"failed":F,...}
// 2. writes to every one of them as fast as the path lets it (chunkBytes per write(); after a
//    write() that returns false, the next one waits for 'drain'), never reading, for `seconds` (or
//    until SIGUSR1: the bench's memory guard). A connection stops at `perConnectionLimit` bytes
//    handed over (a path that never pushes back). Prints {"filled":BYTES,"stoppedBy":...} and
//    keeps them open. (No early end once all of them wait for 'drain': a busy path can pause every
//    connection for seconds and then accept more.)
// 3. on SIGUSR2: prints {"holding":N,"lost":L,...} (connections the path closed meanwhile, and
//    why), closes everything, prints {"closed":N} and exits.
// Exits on SIGTERM, or by itself when the bench goes away.
import { once } from 'node:events';
import type { Duplex } from 'node:stream';
import { setImmediate as yieldToLoop } from 'node:timers/promises';
import { limitUnsentBytes, useNativeCalls, type NativeCalls } from '@cluster-proxy/proto';
import { payloadBlock } from '../fixtures/index.js';
import { exitWithParent } from './child-util.js';
import { openClient, type ClientSpec } from './clients.js';
import { errorMessage } from './io.js';

export interface StuckJob {
  spec: ClientSpec;
  count: number;
  concurrency: number;
  seconds: number;
  chunkBytes: number;
  perConnectionLimit: number;
}

const DIAL_TIMEOUT_MS = 30_000;
/** Writes in a row that returned true before yielding to the event loop (so a path that never pushes back cannot starve the others). */
const WRITES_PER_TURN = 16;
const say = (obj: object): void => void process.stdout.write(`${JSON.stringify(obj)}\n`);
const nextSignal = (signal: NodeJS.Signals): Promise<void> => new Promise((resolve) => process.once(signal, () => resolve()));

interface Held {
  socket: Duplex;
  handed: number;
}

/** Resolves on 'drain', on close, or when `stop` resolves; removes its listeners either way. */
function drainOrStop(socket: Duplex, stop: Promise<void>): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = (): void => {
      socket.off('drain', done);
      socket.off('close', done);
      resolve();
    };
    socket.once('drain', done);
    socket.once('close', done);
    void stop.then(done);
  });
}

async function main(): Promise<void> {
  exitWithParent();
  process.on('SIGTERM', () => process.exit(0));
  const job = JSON.parse(process.argv[2] ?? '') as StuckJob;
  // The system calls hub and agent use (the CLI's, as the CLI installs them; the test package does not depend on it).
  const native = (await import(new URL('../../../cli/dist/memory/native-calls.js', import.meta.url).href)) as {
    loadNativeCalls(): NativeCalls | null;
  };
  useNativeCalls(native.loadNativeCalls());
  const client = openClient(job.spec);
  const chunk = payloadBlock().subarray(0, job.chunkBytes);
  // Plain TCP clients hold no handle while waiting: keep the process alive between the phases.
  const keepAlive = setInterval(() => {}, 1 << 30);

  // 1. open
  const held: Held[] = [];
  let lost = 0;
  let failed = 0;
  let unsentLimited = 0;
  let firstError = '';
  let closing = false;
  let started = 0;
  const begin = performance.now();
  const worker = async (): Promise<void> => {
    while (started < job.count) {
      started++;
      try {
        const socket = await client.dial('stall', DIAL_TIMEOUT_MS);
        // A client's unsent bytes sit in its own kernel, on its own machine; here they would be
        // charged to the one kernel the hub and the agent share (~1 GiB for 1,024 CONNECT clients,
        // past tcp_mem's pressure threshold). Capped as hub and agent cap theirs (SDK sockets have
        // no descriptor: their bytes wait in the SDK, under the tunnel's credit).
        if (limitUnsentBytes(socket)) unsentLimited++;
        held.push({ socket, handed: 0 });
        socket.on('error', (err: Error) => void (firstError ||= `a held connection failed: ${errorMessage(err)}`));
        socket.once('close', () => {
          if (!closing) lost++;
        });
      } catch (err) {
        failed++;
        firstError ||= `dial: ${errorMessage(err)}`;
        if (failed > Math.max(20, job.count / 10)) started = job.count;
      }
    }
  };
  await Promise.all(Array.from({ length: job.concurrency }, worker));
  say({ opened: held.length, failed, unsentLimited, firstError, seconds: (performance.now() - begin) / 1000, client: client.describe() });

  // 2. fill
  let stopWriting!: () => void;
  const stop = new Promise<void>((resolve) => (stopWriting = resolve));
  let stopped = false;
  /** Why writing ended: time, guard (the bench's memory guard), or closed (every connection closed or capped). */
  let stoppedBy = 'closed';
  const stopFor = (reason: string): void => {
    if (stopped) return;
    stopped = true;
    stoppedBy = reason;
    stopWriting();
  };
  const timer = setTimeout(() => stopFor('time'), job.seconds * 1000);
  void nextSignal('SIGUSR1').then(() => stopFor('guard'));
  const fillBegin = performance.now();
  let lastGrowth = fillBegin;
  let capped = 0;
  const fill = async (h: Held): Promise<void> => {
    let inTurn = 0;
    while (!stopped && !h.socket.destroyed) {
      if (h.handed >= job.perConnectionLimit) {
        capped++;
        return;
      }
      h.handed += chunk.length;
      lastGrowth = performance.now();
      if (!h.socket.write(chunk)) {
        inTurn = 0;
        await drainOrStop(h.socket, stop);
      } else if (++inTurn >= WRITES_PER_TURN) {
        inTurn = 0;
        await yieldToLoop();
      }
    }
  };
  await Promise.all(held.map(fill));
  clearTimeout(timer);
  const handed = held.map((h) => h.handed);
  const blocked = held.filter((h) => !h.socket.destroyed && h.socket.writableNeedDrain).length;
  say({
    filled: handed.reduce((a, b) => a + b, 0),
    min: handed.length > 0 ? Math.min(...handed) : 0,
    max: handed.length > 0 ? Math.max(...handed) : 0,
    open: held.filter((h) => !h.socket.destroyed).length,
    blocked,
    capped,
    // When the last write() was issued: after this, nothing moved any more.
    lastWriteAfter: (lastGrowth - fillBegin) / 1000,
    seconds: (performance.now() - fillBegin) / 1000,
    stoppedBy,
    lost,
    firstError,
  });

  // 3. close
  await nextSignal('SIGUSR2');
  say({ holding: held.filter((h) => !h.socket.destroyed).length, lost, firstError });
  closing = true;
  for (const { socket } of held) socket.destroy();
  await Promise.all(held.map(({ socket }) => (socket.closed ? undefined : once(socket, 'close').catch(() => {}))));
  client.close();
  clearInterval(keepAlive);
  say({ closed: held.length });
  process.exit(0);
}

main().catch((err: unknown) => {
  process.stderr.write(`stuck-client: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
