// Command-line flags with environment fallbacks: --dial-timeout can also come from
// CLUSTER_PROXY_DIAL_TIMEOUT. Parse errors are UsageErrors: one line, exit code 2, no stack trace.
import { parseArgs } from 'node:util';

export class UsageError extends Error {
  override name = 'UsageError';
}

export interface FlagSpec {
  type: 'string' | 'boolean';
  multiple?: boolean;
  default?: string;
  help: string;
}

export type FlagSpecs = Record<string, FlagSpec>;
export type ParsedFlags = Record<string, string | boolean | string[] | undefined>;

export function envName(flag: string): string {
  return `CLUSTER_PROXY_${flag.toUpperCase().replace(/-/g, '_')}`;
}

export function parseFlags(args: string[], specs: FlagSpecs, env: NodeJS.ProcessEnv = process.env): { flags: ParsedFlags; positionals: string[] } {
  const options: Record<string, { type: 'string' | 'boolean'; multiple?: boolean }> = { help: { type: 'boolean' } };
  for (const [name, s] of Object.entries(specs)) options[name] = { type: s.type, multiple: s.multiple ?? false };
  let parsed;
  try {
    parsed = parseArgs({ args, options, allowPositionals: true, strict: true });
  } catch (err) {
    // Node's messages are long and mention internals; keep the useful first sentence.
    const msg = (err as Error).message.split('. ')[0]!.replace(/^Unknown option '(.*)'$/, 'unknown flag $1');
    throw new UsageError(msg);
  }
  const flags: ParsedFlags = { ...(parsed.values as ParsedFlags) };
  for (const [name, s] of Object.entries(specs)) {
    if (flags[name] !== undefined) continue;
    const fromEnv = env[envName(name)];
    if (fromEnv !== undefined && fromEnv !== '') {
      if (s.type === 'boolean') flags[name] = ['1', 'true', 'yes'].includes(fromEnv.toLowerCase());
      else flags[name] = s.multiple ? fromEnv.split(',').map((v) => v.trim()).filter(Boolean) : fromEnv;
    } else if (s.default !== undefined) {
      flags[name] = s.multiple ? [s.default] : s.default;
    }
  }
  return { flags, positionals: parsed.positionals };
}

export function helpText(usage: string, summary: string, specs: FlagSpecs): string {
  const rows = Object.entries(specs).map(([name, s]) => {
    const left = `  --${name}${s.type === 'string' ? ' VALUE' : ''}`;
    const def = s.default !== undefined ? ` (default ${s.default})` : '';
    return `${left.padEnd(30)} ${s.help}${def}${s.multiple ? ' [repeatable]' : ''}\n${''.padEnd(31)} env ${envName(name)}`;
  });
  return `Usage: ${usage}\n\n${summary}\n\nFlags:\n${rows.join('\n')}\n  --help${''.padEnd(24)}show this help\n`;
}

export function str(flags: ParsedFlags, name: string): string | undefined {
  const v = flags[name];
  return typeof v === 'string' ? v : undefined;
}

export function required(flags: ParsedFlags, name: string): string {
  const v = str(flags, name);
  if (v === undefined || v === '') throw new UsageError(`--${name} is required (or set ${envName(name)})`);
  return v;
}

export function list(flags: ParsedFlags, name: string): string[] {
  const v = flags[name];
  return Array.isArray(v) ? v : typeof v === 'string' ? [v] : [];
}

export function port(flags: ParsedFlags, name: string): number {
  const v = required(flags, name);
  if (!/^\d+$/.test(v) || Number(v) > 65535) throw new UsageError(`--${name} must be a port number 0-65535, got "${v}"`);
  return Number(v);
}

/** "10s", "500ms", "2m", "1h" or plain milliseconds. */
export function duration(flags: ParsedFlags, name: string): number {
  const v = required(flags, name);
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(v.trim());
  if (!m) throw new UsageError(`--${name} must be a duration like 500ms, 10s or 2m, got "${v}"`);
  const n = Number(m[1]);
  const unit = m[2] ?? 'ms';
  return Math.round(n * { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[unit]!);
}
