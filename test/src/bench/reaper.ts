// Last line of defence for a bench process that dies without running its teardown (SIGKILL, OOM):
// a tiny child process that reads PIDs (and temp dirs) from a pipe and, when the pipe closes
// because its parent is gone, SIGKILLs whatever is still alive of them and removes the dirs.
// Normal teardown (cleanup.ts) stops everything first; the reaper then has nothing left to do.
import { spawn, type ChildProcess } from 'node:child_process';
import os from 'node:os';
import path from 'node:path';
import type { ManagedProcess } from '../fixtures/index.js';

const REAPER_SOURCE = String.raw`
const pids = new Set();
const dirs = new Set();
let buffer = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (text) => {
  buffer += text;
  let nl;
  while ((nl = buffer.indexOf('\n')) >= 0) {
    const line = buffer.slice(0, nl).trim();
    buffer = buffer.slice(nl + 1);
    if (line === 'exit') process.exit(0);
    if (line.startsWith('rm ')) { dirs.add(line.slice(3)); continue; }
    const pid = Number(line);
    if (Number.isInteger(pid) && pid > 1) pids.add(pid);
    else if (Number.isInteger(pid) && pid < -1) pids.delete(-pid);
  }
});
process.stdin.on('end', () => {
  for (const pid of pids) { try { process.kill(pid, 'SIGKILL'); } catch {} }
  // Give the killed processes a moment to let go of their files.
  setTimeout(() => {
    for (const dir of dirs) { try { require('node:fs').rmSync(dir, { recursive: true, force: true }); } catch {} }
    process.exit(0);
  }, 200);
});
`;

let reaper: ChildProcess | undefined;

/** Starts the reaper (once). */
export function startReaper(): void {
  if (reaper) return;
  reaper = spawn(process.execPath, ['-e', REAPER_SOURCE], { stdio: ['pipe', 'ignore', 'ignore'] });
  reaper.stdin?.on('error', () => {});
  reaper.on('error', () => {});
  // Neither the pipe nor the child may keep the bench alive.
  reaper.unref();
  (reaper.stdin as unknown as { unref?: () => void } | null)?.unref?.();
}

function send(line: string): void {
  if (reaper?.stdin?.writable) reaper.stdin.write(`${line}\n`);
}

/**
 * Registers a process to be SIGKILLed if the bench dies without stopping it; once it has exited
 * it is forgotten again (so a reused PID is never hit). Returns the process.
 */
export function reapOnDeath(proc: ManagedProcess): ManagedProcess {
  const pid = proc.pid;
  if (pid === undefined) return proc;
  send(String(pid));
  void proc.exited.then(() => send(String(-pid)));
  return proc;
}

/** Registers a temp directory (under the OS temp dir) to be removed if the bench dies. */
export function removeOnDeath(dir: string): void {
  const tmp = os.tmpdir();
  if (path.dirname(dir) === tmp && path.basename(dir).startsWith('cp-') && !dir.includes('\n')) send(`rm ${dir}`);
}

/** Normal end: the reaper exits without killing anything. */
export function stopReaper(): void {
  send('exit');
  reaper?.stdin?.end();
  reaper = undefined;
}
