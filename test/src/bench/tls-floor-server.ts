// Child process of tls-floor.js: a mutual-TLS server with nothing of the hub but its TLS settings
// (the hub's listener options, 16 KiB stream buffers, the certificate-leak guard). Each connection is
// read until `holdBytes` arrived, then paused, as a stalled stream holds its window.
//
//   node --expose-gc tls-floor-server.js '<json {caPath, certPath, keyPath, holdBytes}>'
//
// Prints {"port":N}; on SIGUSR2 runs full collections and prints {"anonKiB":..,"connections":..,"held":..}.
// Exits on SIGTERM, or by itself when the bench goes away.
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
}

const job = JSON.parse(process.argv[2] ?? '{}') as FloorJob;
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error('tls-floor-server needs --expose-gc');
exitWithParent();
setDefaultHighWaterMark(false, 16 * 1024); // the hub's (cli/src/memory/stream-buffers.ts)
avoidPeerCertificateLeak();

let held = 0;
const sockets = new Set<tls.TLSSocket>();
const server = tls.createServer(
  {
    ca: readFileSync(job.caPath),
    cert: readFileSync(job.certPath),
    key: readFileSync(job.keyPath),
    requestCert: true,
    rejectUnauthorized: true,
    ALPNProtocols: ['h2'],
  },
  (socket) => {
    sockets.add(socket);
    let got = 0;
    const kept: Buffer[] = [];
    socket.on('data', (chunk: Buffer) => {
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
    process.stdout.write(`${JSON.stringify({ anonKiB, connections: sockets.size, held })}\n`);
  });
});
process.on('SIGTERM', () => {
  for (const s of sockets) s.destroy();
  server.close(() => process.exit(0));
});
