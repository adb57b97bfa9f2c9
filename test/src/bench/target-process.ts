// Child process holding the benchmark's TCP targets, so the measuring process (the "client") is
// not also the target. Prints one JSON line {"targets":{...ports}} on stdout once listening.
//
//   echo      echoes every byte (fixtures startEchoServer)
//   sink      reads to EOF, then replies `{"bytes":N}\n` and closes
//   sinkHash  like sink but also hashes: `{"bytes":N,"sha256":"..."}\n`
//   source    reads a request line `N\n`, writes N bytes of the deterministic payload, then FIN
//   stall     accepts and never reads (fixtures startStallServer): a sender's window fills and stays full
//
// Started with a raised open-files limit (helpers.spawnNode): the scale scenario holds 10,000
// connections to echo.
//
// Exits on SIGTERM (default action), or by itself when its parent goes away.
import { createHash, type Hash } from 'node:crypto';
import type net from 'node:net';
import { startEchoServer, startStallServer, startTcpServer, writePayload } from '../fixtures/index.js';
import { exitWithParent } from './child-util.js';

/** Upper bound for one source request (keeps a garbled request from streaming forever). */
const MAX_SOURCE_BYTES = 64 * 1024 * 1024 * 1024;

function sinkHandler(hashing: boolean): (socket: net.Socket) => void {
  return (socket) => {
    const hash: Hash | null = hashing ? createHash('sha256') : null;
    let bytes = 0;
    socket.on('data', (chunk: Buffer) => {
      bytes += chunk.length;
      hash?.update(chunk);
    });
    socket.on('end', () => {
      const reply = hash === null ? { bytes } : { bytes, sha256: hash.digest('hex') };
      socket.end(`${JSON.stringify(reply)}\n`);
    });
  };
}

function sourceHandler(socket: net.Socket): void {
  let header = '';
  const onData = (chunk: Buffer): void => {
    header += chunk.toString('latin1');
    const newline = header.indexOf('\n');
    if (newline < 0) {
      if (header.length > 64) socket.destroy();
      return;
    }
    socket.off('data', onData);
    socket.resume(); // discard anything else the client sends
    const text = header.slice(0, newline).trim();
    const n = Number(text);
    if (!/^\d+$/.test(text) || !Number.isSafeInteger(n) || n > MAX_SOURCE_BYTES) {
      socket.destroy();
      return;
    }
    writePayload(socket, n).catch(() => socket.destroy());
  };
  socket.on('data', onData);
}

async function main(): Promise<void> {
  exitWithParent();
  const echo = await startEchoServer();
  const sink = await startTcpServer('127.0.0.1', sinkHandler(false));
  const sinkHash = await startTcpServer('127.0.0.1', sinkHandler(true));
  const source = await startTcpServer('127.0.0.1', sourceHandler);
  const stall = await startStallServer();
  process.stdout.write(
    `${JSON.stringify({ targets: { echo: echo.port, sink: sink.port, sinkHash: sinkHash.port, source: source.port, stall: stall.port } })}\n`,
  );
}

main().catch((err: unknown) => {
  process.stderr.write(`target-process: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
