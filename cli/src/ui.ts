// Terminal output for humans: colour only on a TTY (and never with NO_COLOR or TERM=dumb),
// progress lines on stderr, kubectl-style tables, and shell quoting for commands we print.
import { accessSync, constants, readFileSync, realpathSync, statSync } from 'node:fs';
import path from 'node:path';
import type { Writable } from 'node:stream';

export function colourEnabled(stream: Writable & { isTTY?: boolean }, env: NodeJS.ProcessEnv = process.env): boolean {
  if (env['NO_COLOR'] !== undefined && env['NO_COLOR'] !== '') return false;
  if (env['FORCE_COLOR'] !== undefined && env['FORCE_COLOR'] !== '' && env['FORCE_COLOR'] !== '0') return true;
  return stream.isTTY === true && env['TERM'] !== 'dumb';
}

export interface Paint {
  bold(s: string): string;
  dim(s: string): string;
  green(s: string): string;
  yellow(s: string): string;
  red(s: string): string;
  cyan(s: string): string;
}

const sgr =
  (on: boolean, code: string) =>
  (s: string): string =>
    on ? `\x1b[${code}m${s}\x1b[0m` : s;

export function paint(stream: Writable & { isTTY?: boolean }): Paint {
  const on = colourEnabled(stream);
  return { bold: sgr(on, '1'), dim: sgr(on, '2'), green: sgr(on, '32'), yellow: sgr(on, '33'), red: sgr(on, '31'), cyan: sgr(on, '36') };
}

/**
 * "Waiting for the agents to connect ... done (0.4s)" on stderr. On a TTY the step shows as it starts
 * and is completed on the same line; elsewhere (logs, tests) the same text in one piece per line.
 */
export class Progress {
  private readonly p: Paint;
  private readonly tty: boolean;

  constructor(private readonly out: Writable & { isTTY?: boolean } = process.stderr) {
    this.p = paint(out);
    this.tty = out.isTTY === true;
  }

  async step<T>(what: string, work: () => Promise<T>, doneText: (result: T) => string = () => 'done'): Promise<T> {
    const started = Date.now();
    if (this.tty) this.out.write(`${this.p.dim('•')} ${what} ...`);
    else this.out.write(`${what} ...\n`);
    let result: T;
    try {
      result = await work();
    } catch (err) {
      if (this.tty) this.out.write(` ${this.p.red('failed')}\n`);
      throw err;
    }
    const secs = ((Date.now() - started) / 1000).toFixed(1);
    if (this.tty) this.out.write(`\r${this.p.green('✔')} ${what} ... ${doneText(result)} ${this.p.dim(`(${secs}s)`)}\n`);
    else this.out.write(`${what}: ${doneText(result)} (${secs}s)\n`);
    return result;
  }

  line(msg: string): void {
    this.out.write(`${msg}\n`);
  }

  warn(msg: string): void {
    this.out.write(`${this.p.yellow('warning:')} ${msg}\n`);
  }
}

/** Quotes a word for a POSIX shell only when needed, so printed commands paste as they are. */
export function shq(s: string): string {
  if (s !== '' && /^[A-Za-z0-9_@%+=:,./-]+$/.test(s)) return s;
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/** How to run this CLI again in a printed command: `cluster-proxy` when that command, looked up on PATH as a
 * shell would, is this very CLI (scripts/install-cli.sh's launcher, an `npm install -g` link); else
 * `/abs/path/node /abs/path/main.js` (this Node: a shell's own `node` may be too old), from any directory. */
export function cliWords(argv1: string | undefined = process.argv[1], searchPath: string = process.env['PATH'] ?? ''): string[] {
  if (!argv1) return ['cluster-proxy'];
  const self = realpathOrNull(argv1);
  for (const dir of searchPath.split(path.delimiter)) {
    if (dir === '') continue;
    const candidate = path.join(dir, 'cluster-proxy');
    if (!isExecutableFile(candidate)) continue;
    // The first one on PATH is what the user's shell runs.
    if (self !== null && (realpathOrNull(candidate) === self || launches(candidate, self))) return ['cluster-proxy'];
    break;
  }
  return [process.execPath, path.resolve(argv1)];
}

/** Whether `file` is scripts/install-cli.sh's launcher of `main` (a short shell script naming it, quoted). */
function launches(file: string, main: string): boolean {
  try {
    if (statSync(file).size > 1024) return false;
    const text = readFileSync(file, 'utf8');
    return text.startsWith('#!/bin/sh\n') && text.includes(`'${main}'`);
  } catch {
    return false;
  }
}

function realpathOrNull(p: string): string | null {
  try {
    return realpathSync(p);
  } catch {
    return null;
  }
}

function isExecutableFile(p: string): boolean {
  try {
    accessSync(p, constants.X_OK);
    return statSync(p).isFile();
  } catch {
    return false;
  }
}

export function shellCommand(words: string[]): string {
  return words.map(shq).join(' ');
}

/** kubectl's table layout: upper-case headers, columns separated by three spaces, no borders. */
export function table(headers: string[], rows: string[][]): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const fmt = (cells: string[]): string =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]! + 3)))
      .join('')
      .trimEnd();
  return `${[fmt(headers), ...rows.map(fmt)].join('\n')}\n`;
}

/** "3m", "2h", "5d": kubectl's AGE column. */
export function age(fromMs: number, nowMs: number = Date.now()): string {
  const s = Math.max(0, Math.floor((nowMs - fromMs) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 2 * 3600) return `${Math.floor(s / 60)}m`;
  if (s < 48 * 3600) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}
