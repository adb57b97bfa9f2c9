// Child process holding latency relays (fixtures startLatencyRelay), so the delay lines don't run
// on the measuring process's event loop. Usage:
//   node relay-process.js --delay-ms 10 NAME=PORT [NAME=PORT ...]
// Prints one JSON line {"relays":{"NAME":listenPort,...}} on stdout once listening.
import { parseArgs } from 'node:util';
import { startLatencyRelay } from '../fixtures/index.js';
import { exitWithParent } from './child-util.js';

async function main(): Promise<void> {
  exitWithParent();
  const { values, positionals } = parseArgs({ options: { 'delay-ms': { type: 'string' } }, allowPositionals: true, strict: true });
  const delay = Number(values['delay-ms']);
  if (!Number.isFinite(delay) || delay < 0) throw new Error('--delay-ms must be a number >= 0');
  const relays: Record<string, number> = {};
  for (const spec of positionals) {
    const m = /^([\w-]+)=(\d+)$/.exec(spec);
    if (!m || m[1] === undefined || m[2] === undefined) throw new Error(`relay spec "${spec}" must be NAME=PORT`);
    const relay = await startLatencyRelay({ targetHost: '127.0.0.1', targetPort: Number(m[2]), oneWayDelayMs: delay });
    relays[m[1]] = relay.port;
  }
  process.stdout.write(`${JSON.stringify({ relays })}\n`);
}

main().catch((err: unknown) => {
  process.stderr.write(`relay-process: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
