// Facts about the machine printed above the table, and a check that it is not busy with other work
// (on a 2-core box a concurrent test run skews every figure).
import { execFileSync } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import os from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import type { MachineFacts } from './report.js';

function git(args: string[]): string | undefined {
  try {
    const repo = fileURLToPath(new URL('../../..', import.meta.url));
    return execFileSync('git', args, { cwd: repo, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 5000 }).trim();
  } catch {
    return undefined;
  }
}

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
  return os.loadavg().map((l) => l.toFixed(2)).join(' ');
}
