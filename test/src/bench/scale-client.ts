// Child process: the client side of the scale-conns scenario. It holds thousands of sockets, so it
// runs apart from the bench (with a raised open-files limit, helpers.spawnNode) and its own memory
// is never measured.
//
//   node scale-client.js '<json {spec, count, concurrency, warmup}>'
//
// 1. warm-up: `warmup` connections to echo (dial, one 64-byte echo, close); prints {"warm":N}
// 2. on SIGUSR2: opens `count` connections to echo, each proven by one 64-byte echo, and keeps them
//    open and idle; prints {"opened":N} now and then and {"ready":N,"failed":F,...} at the end
// 3. on SIGUSR2: prints {"holding":N,"lost":L} (connections closed by the other side meanwhile),
//    closes everything, prints {"closed":N} and exits
// Exits on SIGTERM, or by itself when the bench goes away.
import type { Duplex } from 'node:stream';
import { exitWithParent } from './child-util.js';
import { openClient, type ClientSpec } from './clients.js';
import { errorMessage, Pinger } from './io.js';

interface Job {
  spec: ClientSpec;
  count: number;
  concurrency: number;
  warmup: number;
}

const DIAL_TIMEOUT_MS = 30_000;
const say = (obj: object): void => void process.stdout.write(`${JSON.stringify(obj)}\n`);
const nextSignal = (): Promise<void> => new Promise((resolve) => process.once('SIGUSR2', () => resolve()));

async function openOne(dial: () => Promise<Duplex>): Promise<Duplex> {
  const socket = await dial();
  try {
    const pinger = new Pinger(socket, 64);
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      pinger.ping(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error('no echo within 30 s')), DIAL_TIMEOUT_MS);
      }),
    ]).finally(() => clearTimeout(timer));
    pinger.detach();
    return socket;
  } catch (err) {
    socket.destroy();
    throw err;
  }
}

async function main(): Promise<void> {
  exitWithParent();
  const job = JSON.parse(process.argv[2] ?? '') as Job;
  // Over gRPC the hub takes at most 1,024 streams per HTTP/2 connection and the SDK's gRPC transport has
  // one connection per Tunnel: a Tunnel per thousand connections, as a konnectivity-client holding many
  // tunnels has a connection per tunnel.
  const perClient = job.spec.kind === 'tunnel' && job.spec.transport === 'grpc' ? 1000 : Number.POSITIVE_INFINITY;
  const clients = [openClient(job.spec)];
  const client = clients[0]!;
  let dials = 0;
  const dial = (): Promise<Duplex> => {
    const i = Math.floor(dials++ / perClient);
    while (clients.length <= i) clients.push(openClient(job.spec));
    return clients[i]!.dial('echo', DIAL_TIMEOUT_MS);
  };

  // 1. warm-up
  const warmStart = performance.now();
  for (let i = 0; i < job.warmup; i++) (await openOne(dial)).destroy();
  dials = 0; // the held connections fill the clients from the first one again
  say({ warm: job.warmup, seconds: (performance.now() - warmStart) / 1000, client: client.describe() });
  const go = nextSignal();
  process.on('SIGTERM', () => process.exit(0));
  // Plain TCP clients hold no handle while idle: keep the process alive between the phases.
  const keepAlive = setInterval(() => {}, 1 << 30);
  await go;

  // 2. open and hold
  const open = new Set<Duplex>();
  let lost = 0;
  let failed = 0;
  let firstError = '';
  let started = 0;
  let closing = false;
  const begin = performance.now();
  const worker = async (): Promise<void> => {
    while (started < job.count) {
      started++;
      try {
        const socket = await openOne(dial);
        open.add(socket);
        socket.on('error', () => {});
        socket.once('close', () => {
          if (open.delete(socket) && !closing) lost++;
        });
        if (open.size % 2000 === 0) say({ opened: open.size });
      } catch (err) {
        failed++;
        firstError ||= errorMessage(err);
        // A path that refuses most dials would take ages at 30 s each: give up early.
        if (failed > Math.max(20, job.count / 100)) started = job.count;
      }
    }
  };
  await Promise.all(Array.from({ length: job.concurrency }, worker));
  const seconds = (performance.now() - begin) / 1000;
  const next = nextSignal();
  say({ ready: open.size, failed, firstError, lost, seconds, client: client.describe() });
  await next;

  // 3. close
  say({ holding: open.size, lost });
  closing = true;
  const all = [...open];
  await Promise.all(
    all.map(
      (s) =>
        new Promise<void>((resolve) => {
          if (s.destroyed && s.closed) return resolve();
          s.once('close', () => resolve());
          s.destroy();
        }),
    ),
  );
  for (const c of clients) c.close();
  clearInterval(keepAlive);
  say({ closed: all.length });
  process.exit(0);
}

main().catch((err: unknown) => {
  process.stderr.write(`scale-client: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
