// CPU per byte moved: utime + stime of every process a path's bytes cross, read from /proc/PID/stat
// right before and right after a timed transfer. The client runs in the bench process itself on
// every path, so its share is read with process.cpuUsage() (microseconds, not clock ticks).
import { execFileSync } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { GiB } from './stats.js';

/** The processes of a path, client first; `hub` is sshd's session process(es) and `agent` the ssh client for ssh -R. */
export const CPU_ROLES = ['client', 'hub', 'agent', 'forward', 'target'] as const;
export type CpuRole = (typeof CPU_ROLES)[number];

/** PIDs per role (the client is always the bench process); a role that is absent is not on the path. */
export type PathProcesses = Partial<Record<Exclude<CpuRole, 'client'>, readonly number[]>>;

/** Clock ticks per second of /proc/PID/stat (`getconf CLK_TCK`; 100 on Linux unless configured otherwise). */
export const CLOCK_TICKS = ((): number => {
  try {
    const n = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'], timeout: 5000 }).trim());
    return Number.isInteger(n) && n > 0 ? n : 100;
  } catch {
    return 100;
  }
})();

/** utime + stime of a process (all its threads) in clock ticks; undefined if it is gone. */
export async function cpuTicks(pid: number): Promise<number | undefined> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8');
    // pid (comm) state ppid ...: comm may contain spaces and parentheses; utime and stime are
    // fields 14 and 15, i.e. the 12th and 13th after the closing parenthesis.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const ticks = Number(fields[11]) + Number(fields[12]);
    return Number.isFinite(ticks) ? ticks : undefined;
  } catch {
    return undefined;
  }
}

/** One transfer's CPU: seconds per role, and how many /proc-read processes each role summed (for the error bound). */
export interface CpuSample {
  seconds: Partial<Record<CpuRole, number>>;
  processes: Partial<Record<CpuRole, number>>;
}

async function readAll(procs: PathProcesses): Promise<Map<number, number>> {
  const pids = [...new Set(Object.values(procs).flat())];
  const ticks = await Promise.all(pids.map(async (pid) => [pid, await cpuTicks(pid)] as const));
  const out = new Map<number, number>();
  for (const [pid, t] of ticks) {
    if (t === undefined) throw new Error(`CPU accounting: cannot read /proc/${pid}/stat (process exited?)`);
    out.set(pid, t);
  }
  return out;
}

/** Runs `fn` and returns its result with the CPU each role's processes used meanwhile. */
export async function withCpu<T>(procs: PathProcesses, fn: () => Promise<T>): Promise<{ result: T; cpu: CpuSample }> {
  const before = await readAll(procs);
  const selfBefore = process.cpuUsage();
  const result = await fn();
  const self = process.cpuUsage(selfBefore);
  const after = await readAll(procs);
  const cpu: CpuSample = { seconds: { client: (self.user + self.system) / 1e6 }, processes: {} };
  for (const [role, pids] of Object.entries(procs) as [Exclude<CpuRole, 'client'>, readonly number[]][]) {
    let ticks = 0;
    for (const pid of pids) ticks += (after.get(pid) ?? 0) - (before.get(pid) ?? 0);
    cpu.seconds[role] = ticks / CLOCK_TICKS;
    cpu.processes[role] = pids.length;
  }
  return { result, cpu };
}

/** The figures of the throughput scenarios' CPU rows: one per role, then the proxy processes together. */
export const CPU_FIGURES = [...CPU_ROLES, 'proxy'] as const;
export type CpuFigure = (typeof CPU_FIGURES)[number];
/** Row names in the table: what the hub and agent rows are on the ssh -R path. */
export const CPU_FIGURE_LABELS: Readonly<Record<CpuFigure, string>> = {
  client: 'CPU client',
  hub: 'CPU hub|sshd',
  agent: 'CPU agent|ssh',
  forward: 'CPU forward',
  target: 'CPU target',
  proxy: 'CPU hub+agent|sshd+ssh',
};
export const CPU_UNIT = 's/GiB';

/** CPU seconds per GiB over a series of transfers, per role, with the error that 10 ms ticks allow. */
export class CpuTally {
  private bytes = 0;
  private transfers = 0;
  private readonly seconds: Partial<Record<CpuRole, number>> = {};
  /** Readings of /proc per role over all transfers: each can be off by up to one tick (truncation). */
  private readonly readings: Partial<Record<CpuRole, number>> = {};
  private readonly perTransfer: Partial<Record<CpuFigure, number>>[] = [];

  add(bytes: number, cpu: CpuSample): void {
    this.bytes += bytes;
    this.transfers++;
    for (const [role, s] of Object.entries(cpu.seconds) as [CpuRole, number][]) this.seconds[role] = (this.seconds[role] ?? 0) + s;
    for (const [role, n] of Object.entries(cpu.processes) as [CpuRole, number][]) this.readings[role] = (this.readings[role] ?? 0) + n;
    const gib = bytes / GiB;
    const row: Partial<Record<CpuFigure, number>> = {};
    for (const [role, s] of Object.entries(cpu.seconds) as [CpuRole, number][]) row[role] = s / gib;
    const { hub, agent } = cpu.seconds;
    if (hub !== undefined && agent !== undefined) row.proxy = (hub + agent) / gib;
    this.perTransfer.push(row);
  }

  /** CPU seconds per GiB moved of one role, or of hub + agent together ('proxy'); null if not on the path. */
  perGiB(figure: CpuFigure): number | null {
    if (this.bytes === 0) return null;
    const s =
      figure === 'proxy'
        ? this.seconds.hub === undefined || this.seconds.agent === undefined
          ? undefined
          : this.seconds.hub + this.seconds.agent
        : this.seconds[figure];
    return s === undefined ? null : s / (this.bytes / GiB);
  }

  /** Per transfer, in the order added. */
  perRound(figure: CpuFigure): number[] {
    return this.perTransfer.map((t) => t[figure]).filter((v): v is number => v !== undefined);
  }

  /** ± s/GiB a figure can be off by from tick truncation (the client's process.cpuUsage() is exact to a microsecond). */
  boundPerGiB(figure: CpuFigure): number | null {
    if (this.bytes === 0) return null;
    const readings =
      figure === 'proxy' ? (this.readings.hub ?? 0) + (this.readings.agent ?? 0) : figure === 'client' ? 0 : (this.readings[figure] ?? 0);
    return readings / CLOCK_TICKS / (this.bytes / GiB);
  }

  /** CPU seconds measured for a figure over all transfers. */
  total(figure: CpuFigure): number | null {
    const perGiB = this.perGiB(figure);
    return perGiB === null ? null : perGiB * (this.bytes / GiB);
  }

  /** One line for the notes: the CPU seconds behind the figures, and how far tick truncation can move them. */
  note(): string {
    const parts = CPU_ROLES.flatMap((role) => {
      const total = this.total(role);
      if (total === null) return [];
      return [`${role} ${total.toFixed(2)}${role === 'client' ? '' : ` ±${((this.readings[role] ?? 0) / CLOCK_TICKS).toFixed(2)}`} s`];
    });
    return `CPU over ${this.transfers} timed transfer(s), ${(this.bytes / GiB).toFixed(2)} GiB: ${parts.join(', ')} (client: process.cpuUsage(), to the µs)`;
  }
}
