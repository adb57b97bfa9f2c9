// Starting the benchmark's helper processes (targets, latency relays) and their readiness; node
// processes with a raised open-files limit; reading a process's memory from /proc.
import { readFile, readdir } from 'node:fs/promises';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { reapOnDeath } from './reaper.js';
import { spawnProcess, type ManagedProcess } from '../fixtures/index.js';

export type TargetName = 'echo' | 'sink' | 'sinkHash' | 'source' | 'stall';
export const TARGET_NAMES: readonly TargetName[] = ['echo', 'sink', 'sinkHash', 'source', 'stall'];

/** Open-files limit for every node process the bench spawns (the scale scenario holds 10,000 connections). */
export const NOFILE = 65536;

/**
 * How long after a forced full collection hub and agent RSS is read: they give free pages back a
 * second after a full collection, but at most once every 5 s (cli's allocator-trim.ts, TRIM_DELAY_MS
 * and TRIM_SPACING_MS), so a reading taken sooner can miss a trim that was put off because one ran
 * shortly before (a collection near the end of a transfer): 130 MiB instead of 93 for the idle hub.
 */
export const AFTER_TRIM_MS = 6_500;

/**
 * Spawns `node NODE_ARGS` through bash with `ulimit -n` raised to NOFILE (or to the hard limit if
 * that is lower and we may not raise it). bash execs node, so the PID is node's.
 */
export function spawnNode(name: string, nodeArgs: string[]): ManagedProcess {
  const raise = `ulimit -n ${NOFILE} 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec "$0" "$@"`;
  return spawnProcess({ name, command: 'bash', args: ['-c', raise, process.execPath, ...nodeArgs] });
}

/** A line of /proc/PID/status in KiB (VmRSS, VmHWM, ...); undefined if the process is gone. */
export async function procStatusKiB(pid: number, field: string): Promise<number | undefined> {
  try {
    const status = await readFile(`/proc/${pid}/status`, 'utf8');
    const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status);
    return m?.[1] === undefined ? undefined : Number(m[1]);
  } catch {
    return undefined;
  }
}

/** VmRSS of a process in KiB; throws if it cannot be read. */
export async function rssKiB(pid: number): Promise<number> {
  const kib = await procStatusKiB(pid, 'VmRSS');
  if (kib === undefined) throw new Error(`cannot read VmRSS of pid ${pid} (exited?)`);
  return kib;
}

/** The soft open-files limit of a process (from /proc/PID/limits). */
export async function openFilesLimit(pid: number): Promise<number | undefined> {
  try {
    const m = /^Max open files\s+(\d+|unlimited)/m.exec(await readFile(`/proc/${pid}/limits`, 'utf8'));
    return m?.[1] === undefined ? undefined : m[1] === 'unlimited' ? Infinity : Number(m[1]);
  } catch {
    return undefined;
  }
}

/** Every living descendant of `pid` (children, their children, ...), from /proc. */
export async function descendants(pid: number): Promise<number[]> {
  const parentOf = new Map<number, number>();
  for (const entry of await readdir('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = await readFile(`/proc/${entry}/stat`, 'utf8');
      // pid (comm) state ppid ...; comm may contain spaces and parentheses.
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      parentOf.set(Number(entry), ppid);
    } catch {
      // exited meanwhile
    }
  }
  const out: number[] = [];
  const queue = [pid];
  while (queue.length > 0) {
    const p = queue.shift()!;
    for (const [child, parent] of parentOf) {
      if (parent === p) {
        out.push(child);
        queue.push(child);
      }
    }
  }
  return out;
}
export type TargetPorts = Record<TargetName, number>;

export interface HelperProcess<P> {
  proc: ManagedProcess;
  ports: P;
  stop(): Promise<void>;
}

export function script(name: string): string {
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
  // Raised open-files limit: the scale scenario holds 10,000 connections to the echo target.
  const proc = reapOnDeath(spawnNode('targets', [script('target-process.js')]));
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
export async function startRelays(
  name: string,
  oneWayDelayMs: number,
  targets: Record<string, number>,
): Promise<HelperProcess<Record<string, number>>> {
  const specs = Object.entries(targets).map(([k, port]) => `${k}=${port}`);
  const proc = reapOnDeath(
    spawnProcess({ name, command: process.execPath, args: [script('relay-process.js'), '--delay-ms', String(oneWayDelayMs), ...specs] }),
  );
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
