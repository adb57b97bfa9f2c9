// Child process of tls-floor.js: a mutual-TLS server with nothing of the hub but its TLS settings
// (the hub's listener options, 16 KiB stream buffers, the certificate-leak guard). Each connection's
// first `forwardBytes` go on to one upstream TLS connection (`upstreamPort`, the tool's sink), as a hub
// forwards a stuck stream's first window to the agent; then it is read until `holdBytes` more arrived,
// and paused, as a stalled stream holds its window.
//
//   node --expose-gc tls-floor-server.js '<json {caPath, certPath, keyPath, holdBytes, forwardBytes, upstreamPort}>'
//
// Prints {"port":N}; on SIGUSR2 runs full collections and prints {"anonKiB":..,"peakKiB":..,"connections":..,
// "held":..}, peakKiB being the highest RssAnon sampled every 100 ms since the start. Exits on SIGTERM, or
// by itself when the bench goes away.
import { readFileSync } from 'node:fs';
import { setDefaultHighWaterMark } from 'node:stream';
import tls from 'node:tls';
import { avoidPeerCertificateLeak } from '@cluster-proxy/server';
import { exitWithParent } from './child-util.js';
import { procStatusKiB } from './helpers.js';

interface FloorJob {
  caPath: string;
  certPath: string;
  keyPath: string;
  holdBytes: number;
  forwardBytes: number;
  upstreamPort?: number;
}

const job = JSON.parse(process.argv[2] ?? '{}') as FloorJob;
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error('tls-floor-server needs --expose-gc');
exitWithParent();
setDefaultHighWaterMark(false, 16 * 1024); // the hub's (cli/src/memory/stream-buffers.ts)
avoidPeerCertificateLeak();

let held = 0;
let peakKiB = 0;
const sample = setInterval(() => {
  void procStatusKiB(process.pid, 'RssAnon').then((kib) => void (peakKiB = Math.max(peakKiB, kib ?? 0)));
}, 100);
sample.unref();
const ca = readFileSync(job.caPath);
const upstream =
  job.forwardBytes > 0 && job.upstreamPort !== undefined
    ? tls.connect({ host: '127.0.0.1', port: job.upstreamPort, servername: 'localhost', ca })
    : null;
upstream?.on('error', (err) => {
  process.stderr.write(`tls-floor-server: upstream: ${err.message}\n`);
  process.exit(1);
});
const sockets = new Set<tls.TLSSocket>();
const server = tls.createServer(
  {
    ca,
    cert: readFileSync(job.certPath),
    key: readFileSync(job.keyPath),
    requestCert: true,
    rejectUnauthorized: true,
    ALPNProtocols: ['h2'],
  },
  (socket) => {
    sockets.add(socket);
    let forwarded = 0;
    let got = 0;
    const kept: Buffer[] = [];
    socket.on('data', (data: Buffer) => {
      let chunk = data;
      if (upstream && forwarded < job.forwardBytes) {
        const n = Math.min(chunk.length, job.forwardBytes - forwarded);
        upstream.write(chunk.subarray(0, n));
        forwarded += n;
        chunk = chunk.subarray(n);
        if (chunk.length === 0) return;
      }
      kept.push(chunk);
      got += chunk.length;
      held += chunk.length;
      if (got >= job.holdBytes) socket.pause();
    });
    socket.on('error', () => undefined);
    socket.on('close', () => {
      sockets.delete(socket);
      held -= got;
      kept.length = 0;
    });
  },
);
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`${JSON.stringify({ port: (server.address() as { port: number }).port })}\n`);
});
process.on('SIGUSR2', () => {
  gc();
  gc();
  void procStatusKiB(process.pid, 'RssAnon').then((anonKiB) => {
    process.stdout.write(`${JSON.stringify({ anonKiB, peakKiB, connections: sockets.size, held })}\n`);
  });
});
process.on('SIGTERM', () => {
  for (const s of sockets) s.destroy();
  upstream?.destroy();
  server.close(() => process.exit(0));
});
