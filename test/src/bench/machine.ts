// Facts about the machine printed above the table, and a check that it is not busy with other work
// (on a 2-core box a concurrent test run skews every figure).
import { execFileSync } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import os from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

function git(args: string[]): string | undefined {
  try {
    const repo = fileURLToPath(new URL('../../..', import.meta.url));
    return execFileSync('git', args, { cwd: repo, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 5000 }).trim();
  } catch {
    return undefined;
  }
}

/** What the report says about the machine a run was on. */
export type MachineFacts = Record<string, string | number>;

export function machineFacts(mode: string): MachineFacts {
  const commit = git(['rev-parse', '--short', 'HEAD']);
  const dirty = commit !== undefined && (git(['status', '--porcelain', '--untracked-files=no']) ?? '') !== '';
  return {
    date: new Date().toISOString(),
    cpu: os.cpus()[0]?.model ?? 'unknown',
    cores: os.availableParallelism(),
    memory: `${(os.totalmem() / 1e9).toFixed(1)} GB`,
    os: `${os.type()} ${os.release()} ${os.arch()}`,
    node: process.version,
    commit: commit === undefined ? 'n/a' : `${commit}${dirty ? ' (with uncommitted changes)' : ''}`,
    mode,
  };
}

async function cpuTimes(): Promise<{ busy: number; total: number } | undefined> {
  try {
    const line = (await readFile('/proc/stat', 'utf8')).split('\n')[0] ?? '';
    const fields = line.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal guest guest_nice; guest time is already in user.
    const total = fields.slice(0, 8).reduce((a, b) => a + b, 0);
    const idle = (fields[3] ?? 0) + (fields[4] ?? 0);
    return { busy: total - idle, total };
  } catch {
    return undefined;
  }
}

/** Fraction (0..1) of all cores busy over `ms`, from /proc/stat; undefined where unavailable. */
export async function cpuBusy(ms: number): Promise<number | undefined> {
  const before = await cpuTimes();
  await sleep(ms);
  const after = await cpuTimes();
  if (!before || !after || after.total <= before.total) return undefined;
  return (after.busy - before.busy) / (after.total - before.total);
}

export function loadAverage(): string {
  return os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(' ');
}

/** The kernel's TCP buffer memory: pages in use, the tcp_mem thresholds, and ms spent under pressure so far. */
export interface TcpMemory {
  pages: number;
  /** tcp_mem[1]: above it the kernel is under memory pressure and caps every socket's buffers. */
  pressurePages: number;
  /** TcpExtTCPMemoryPressuresChrono: total ms spent under pressure since boot. */
  pressureMs: number;
}

/**
 * Reads /proc/net/sockstat, /proc/sys/net/ipv4/tcp_mem and /proc/net/netstat; undefined where
 * unavailable. Under TCP memory pressure (another test holding thousands of full loopback
 * sockets) every socket buffer is capped and a proxy path with several hops slows down far more
 * than the CPU load suggests: a run under pressure is not comparable.
 */
export async function tcpMemory(): Promise<TcpMemory | undefined> {
  try {
    const [sockstat, tcpMem, netstat] = await Promise.all([
      readFile('/proc/net/sockstat', 'utf8'),
      readFile('/proc/sys/net/ipv4/tcp_mem', 'utf8'),
      readFile('/proc/net/netstat', 'utf8'),
    ]);
    const pages = Number(/^TCP:.* mem (\d+)/m.exec(sockstat)?.[1]);
    const pressurePages = Number(tcpMem.trim().split(/\s+/)[1]);
    // Two "TcpExt:" lines: the field names, then their values.
    const [names, values] = netstat
      .split('\n')
      .filter((l) => l.startsWith('TcpExt:'))
      .map((l) => l.trim().split(/\s+/));
    const at = names?.indexOf('TCPMemoryPressuresChrono') ?? -1;
    const pressureMs = at > 0 ? Number(values?.[at]) : Number.NaN;
    if (!Number.isFinite(pages) || !Number.isFinite(pressurePages)) return undefined;
    return { pages, pressurePages, pressureMs };
  } catch {
    return undefined;
  }
}

export function describeTcpMemory(m: TcpMemory | undefined): string {
  if (!m) return 'n/a';
  const underPressure = m.pages >= m.pressurePages;
  return `${m.pages} pages of ${m.pressurePages} (pressure threshold)${underPressure ? ' UNDER PRESSURE: every socket buffer is capped' : ''}`;
}
