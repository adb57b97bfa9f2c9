// What Linux says about this process, for the process metrics: /proc/self/status and limits (small
// files, read when scraped), the network namespace's byte counters, and the bytes this process's TCP
// sockets hold in the kernel. Off Linux every reader answers NaN.
import { readFileSync } from 'node:fs';
import { readFile, readdir, readlink } from 'node:fs/promises';

/** A `Name:   N kB` line of /proc/self/status, in bytes (NaN when absent). */
export function procStatusBytes(text: string, name: string): number {
  const m = new RegExp(`^${name}:\\s+(\\d+) kB$`, 'm').exec(text);
  return m ? Number(m[1]) * 1024 : NaN;
}

export function readProcStatus(): string {
  try {
    return readFileSync('/proc/self/status', 'utf8');
  } catch {
    return '';
  }
}

/**
 * The soft limit of a /proc/self/limits row, e.g. `Max open files`; `unlimited` as Go's client reads it
 * (the largest uint64, 1.8446744073709552e19), so the value matches ANP's.
 */
export function procLimit(row: string): number {
  let text = '';
  try {
    text = readFileSync('/proc/self/limits', 'utf8');
  } catch {
    return NaN;
  }
  const line = text.split('\n').find((l) => l.startsWith(row));
  const soft = line?.slice(row.length).trim().split(/\s+/)[0];
  if (soft === undefined) return NaN;
  return soft === 'unlimited' ? 2 ** 64 : Number(soft);
}

/** Bytes received and sent over every interface of this network namespace (/proc/self/net/dev, as Go's client reads it). */
export function netDevTotals(): { receive: number; transmit: number } {
  let text = '';
  try {
    text = readFileSync('/proc/self/net/dev', 'utf8');
  } catch {
    return { receive: NaN, transmit: NaN };
  }
  let receive = 0;
  let transmit = 0;
  // Inter-|   Receive                                                |  Transmit
  //  face |bytes    packets errs drop fifo frame compressed multicast|bytes ...
  for (const line of text.split('\n').slice(2)) {
    const colon = line.indexOf(':');
    if (colon < 0) continue;
    const f = line
      .slice(colon + 1)
      .trim()
      .split(/\s+/);
    receive += Number(f[0] ?? 0);
    transmit += Number(f[8] ?? 0);
  }
  return { receive, transmit };
}

/** readlink() calls in flight at once while matching descriptors to sockets. */
const READLINK_BATCH = 256;

/**
 * Bytes this process's TCP sockets hold in the kernel: written and not yet acknowledged by the peer
 * (tx_queue) plus received and not yet read (rx_queue), from /proc/self/net/tcp{,6} for the sockets among
 * /proc/self/fd. The kernel charges a little more than these bytes to the cgroup (each buffer's overhead):
 * an approximation of the socket memory a pod pays, read without netlink. Asynchronous, so a process with
 * thousands of sockets does not stop its event loop for it.
 */
export async function socketQueuedBytes(): Promise<number> {
  let fds: string[];
  try {
    fds = await readdir('/proc/self/fd');
  } catch {
    return NaN;
  }
  const inodes = new Set<string>();
  for (let i = 0; i < fds.length; i += READLINK_BATCH) {
    const links = await Promise.all(fds.slice(i, i + READLINK_BATCH).map((fd) => readlink(`/proc/self/fd/${fd}`).catch(() => '')));
    for (const l of links) if (l.startsWith('socket:[')) inodes.add(l.slice(8, -1));
  }
  let total = 0;
  for (const table of ['tcp', 'tcp6']) {
    let text = '';
    try {
      text = await readFile(`/proc/self/net/${table}`, 'utf8');
    } catch {
      continue;
    }
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      if (f[9] === undefined || !inodes.has(f[9])) continue;
      const [tx, rx] = (f[4] ?? '').split(':');
      total += parseInt(tx ?? '0', 16) + parseInt(rx ?? '0', 16);
    }
  }
  return total;
}
