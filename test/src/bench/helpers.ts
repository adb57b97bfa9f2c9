// Starting the benchmark's helper processes (targets, latency relays) and their readiness.
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { reapOnDeath } from './reaper.js';
import { spawnProcess, type ManagedProcess } from '../fixtures/index.js';

export type TargetName = 'echo' | 'sink' | 'sinkHash' | 'source';
export const TARGET_NAMES: readonly TargetName[] = ['echo', 'sink', 'sinkHash', 'source'];
export type TargetPorts = Record<TargetName, number>;

export interface HelperProcess<P> {
  proc: ManagedProcess;
  ports: P;
  stop(): Promise<void>;
}

function script(name: string): string {
  return fileURLToPath(new URL(`./${name}`, import.meta.url));
}

function portsFrom(obj: Record<string, unknown>, key: string): Record<string, number> {
  const value = obj[key];
  if (typeof value !== 'object' || value === null) throw new Error(`expected "${key}" in ${JSON.stringify(obj)}`);
  const out: Record<string, number> = {};
  for (const [name, port] of Object.entries(value)) {
    if (typeof port !== 'number') throw new Error(`port ${name} is not a number in ${JSON.stringify(obj)}`);
    out[name] = port;
  }
  return out;
}

export async function startTargets(): Promise<HelperProcess<TargetPorts>> {
  const proc = reapOnDeath(spawnProcess({ name: 'targets', command: process.execPath, args: [script('target-process.js')] }));
  try {
    const line = await proc.waitForJsonLine((o) => 'targets' in o, 15_000);
    const raw = portsFrom(line, 'targets');
    const ports = {} as TargetPorts;
    for (const name of TARGET_NAMES) {
      const port = raw[name];
      if (port === undefined) throw new Error(`target-process did not report a port for ${name}`);
      ports[name] = port;
    }
    return { proc, ports, stop: async () => void (await proc.stop(3000)) };
  } catch (err) {
    await proc.stop(3000);
    throw err;
  }
}

/** One relay per NAME=PORT, each adding `oneWayDelayMs` in each direction. */
export async function startRelays(name: string, oneWayDelayMs: number, targets: Record<string, number>): Promise<HelperProcess<Record<string, number>>> {
  const specs = Object.entries(targets).map(([k, port]) => `${k}=${port}`);
  const proc = reapOnDeath(spawnProcess({ name, command: process.execPath, args: [script('relay-process.js'), '--delay-ms', String(oneWayDelayMs), ...specs] }));
  try {
    const line = await proc.waitForJsonLine((o) => 'relays' in o, 15_000);
    return { proc, ports: portsFrom(line, 'relays'), stop: async () => void (await proc.stop(3000)) };
  } catch (err) {
    await proc.stop(3000);
    throw err;
  }
}

/** A port that was free a moment ago (bind port 0 on 127.0.0.1, then close). */
export async function freePort(): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host: '127.0.0.1', port: 0 }, () => resolve());
  });
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === 'string') throw new Error('no TCP address');
  return address.port;
}

/** Resolves once a TCP connect to 127.0.0.1:port succeeds (the connection is closed at once). */
export function probeConnect(port: number, timeoutMs = 1000): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const socket = net.connect({ host: '127.0.0.1', port });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`connect to 127.0.0.1:${port} timed out`));
    }, timeoutMs);
    socket.once('connect', () => {
      clearTimeout(timer);
      socket.destroy();
      resolve();
    });
    socket.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
  });
}
