// What Node's TLS alone costs a server per connection: N mutual-TLS clients (the bench's client
// certificate, as konnectivity-style clients present one) to a server with the hub's TLS settings and
// nothing else of it (tls-floor-server.js), each sending `--forward-bytes` that the server passes on to
// one upstream TLS connection (a sink here, as a hub passes a stuck stream's first window to the agent),
// then `--hold-bytes` (default: the hub's initial window for a gRPC client stream) that it reads and
// keeps, then pauses. Prints one JSON line: the server's anonymous memory (RssAnon, after full
// collections) before and while they are held, its highest sample (every 100 ms) meanwhile, and the
// growth per connection of both: the least any hub in Node pays per stuck konnectivity-style
// connection, beside `anp-stuck.js`'s figure for ANP's proxy-server and stuck-destination's for ours.
//
//   node test/dist/bench/tls-floor.js [--count 1024] [--hold-bytes 8192] [--forward-bytes 0]
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import tls from 'node:tls';
import { FRONTEND_STREAM_WINDOW, INITIAL_CONNECTION_WINDOW } from '@cluster-proxy/proto';
import { cliLaunchFlags, createPki } from '../harness.js';
import { killAllSpawned, type ManagedProcess } from '../fixtures/index.js';
import { script, spawnNode } from './helpers.js';
import { reapOnDeath } from './reaper.js';
import { refuse, toolArgs } from './tool-args.js';

const USAGE = `Usage: node test/dist/bench/tls-floor.js [--count N] [--hold-bytes B] [--forward-bytes B]

N mutual-TLS clients to a server with the hub's TLS settings and nothing else; prints one JSON line.
  --count N         connections (default 1024)
  --hold-bytes B    bytes each sends, which the server keeps (default ${FRONTEND_STREAM_WINDOW}: the hub's
                    initial window for a gRPC client stream)
  --forward-bytes B bytes each sends first, which the server passes on to one upstream TLS connection
                    (default 0; ${INITIAL_CONNECTION_WINDOW} is what a hub sends the agent of a stuck stream)
  --help            show this help
`;

const { values: flags } = toolArgs('tls-floor', USAGE, {
  options: {
    count: { type: 'string', default: '1024' },
    'hold-bytes': { type: 'string', default: String(FRONTEND_STREAM_WINDOW) },
    'forward-bytes': { type: 'string', default: '0' },
  },
});
const count = Number(flags.count);
const holdBytes = Number(flags['hold-bytes']);
const forwardBytes = Number(flags['forward-bytes']);
if (
  !(Number.isInteger(count) && count > 0) ||
  !(Number.isInteger(holdBytes) && holdBytes >= 0) ||
  !(Number.isInteger(forwardBytes) && forwardBytes >= 0)
)
  refuse('tls-floor', USAGE, '--count must be a whole number above 0, --hold-bytes and --forward-bytes whole numbers');

const CONCURRENCY = 64;
const log = (m: string): void => void process.stderr.write(`[tls-floor] ${m}\n`);

interface Reading {
  anonKiB: number;
  peakKiB: number;
  connections: number;
  held: number;
}

async function read(server: ManagedProcess): Promise<Reading> {
  const mark = server.lineCount();
  server.kill('SIGUSR2');
  const line = await server.waitForJsonLine((o) => 'anonKiB' in o, 10_000, { after: mark });
  return line as unknown as Reading;
}

async function main(): Promise<void> {
  const pki = await createPki();
  const clients: tls.TLSSocket[] = [];
  let server: ManagedProcess | undefined;
  // The upstream: reads everything the server passes on.
  let forwarded = 0;
  const sinkSockets = new Set<tls.TLSSocket>();
  const sink = tls.createServer({ cert: readFileSync(pki.server.certPath), key: readFileSync(pki.server.keyPath) }, (s) => {
    sinkSockets.add(s);
    s.once('close', () => sinkSockets.delete(s));
    s.on('data', (chunk: Buffer) => void (forwarded += chunk.length));
    s.on('error', () => undefined);
  });
  try {
    sink.listen(0, '127.0.0.1');
    await once(sink, 'listening');
    const upstreamPort = (sink.address() as { port: number }).port;
    const job = { caPath: pki.caPath, certPath: pki.server.certPath, keyPath: pki.server.keyPath, holdBytes, forwardBytes, upstreamPort };
    server = reapOnDeath(
      spawnNode('tls-floor-server', ['--expose-gc', ...cliLaunchFlags(), script('tls-floor-server.js'), JSON.stringify(job)]),
    );
    const { port } = (await server.waitForJsonLine((o) => 'port' in o, 20_000)) as { port: number };
    await sleep(2000);
    const before = await read(server);
    const opts: tls.ConnectionOptions = {
      host: '127.0.0.1',
      port,
      servername: 'localhost',
      ALPNProtocols: ['h2'],
      ca: readFileSync(pki.caPath),
      cert: readFileSync(pki.client.certPath),
      key: readFileSync(pki.client.keyPath),
    };
    const payload = Buffer.alloc(forwardBytes + holdBytes, 0x5a);
    for (let i = 0; i < count; i += CONCURRENCY) {
      const batch = Array.from({ length: Math.min(CONCURRENCY, count - i) }, async () => {
        const socket = tls.connect(opts);
        socket.on('error', () => undefined);
        clients.push(socket);
        await once(socket, 'secureConnect');
        if (payload.length > 0) socket.write(payload);
      });
      await Promise.all(batch);
    }
    log(`opened ${count}`);
    let held = await read(server);
    const settled = (): boolean => held.connections >= count && held.held >= count * holdBytes && forwarded >= count * forwardBytes;
    for (let tries = 0; tries < 60 && !settled(); tries++) {
      await sleep(500);
      held = await read(server);
    }
    if (!settled())
      throw new Error(
        `the server holds ${held.held} bytes of ${held.connections} connections and passed on ${forwarded}, not ${count * holdBytes} of ${count} and ${count * forwardBytes}`,
      );
    process.stdout.write(
      `${JSON.stringify({
        server: `bare mutual-TLS server, Node ${process.versions.node}`,
        count,
        holdBytes,
        forwardBytes,
        anonMiB: { before: before.anonKiB / 1024, held: held.anonKiB / 1024, peak: held.peakKiB / 1024 },
        growthKiBPerConnection: (held.anonKiB - before.anonKiB) / count,
        peakGrowthKiBPerConnection: (held.peakKiB - before.anonKiB) / count,
      })}\n`,
    );
  } finally {
    for (const c of clients) c.destroy();
    await server?.stop(5000);
    for (const s of sinkSockets) s.destroy();
    sink.close();
    await pki.cleanup();
    await killAllSpawned();
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`tls-floor: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);
