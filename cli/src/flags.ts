// Command-line flags with two fallbacks: --dial-timeout can also come from the environment variable
// CLUSTER_PROXY_DIAL_TIMEOUT, or from a config file (`--config FILE`, or CLUSTER_PROXY_CONFIG) holding
// `dial-timeout: 10s`. Precedence: command line > environment > config file > default. Parse errors
// are UsageErrors: one line, exit code 2, no stack trace.
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { quoteName } from '@cluster-proxy/proto';
import { parseConfigYaml } from './config-file.js';

export class UsageError extends Error {
  override name = 'UsageError';
}

export interface FlagSpec {
  type: 'string' | 'boolean';
  multiple?: boolean;
  default?: string;
  /** One-letter alias, e.g. 'o' for --output. */
  short?: string;
  help: string;
}

export type FlagSpecs = Record<string, FlagSpec>;
export type ParsedFlags = Record<string, string | boolean | string[] | undefined>;

/** Flags every command takes besides its own. */
const BUILTIN = ['help', 'config'];

export function envName(flag: string): string {
  return `CLUSTER_PROXY_${flag.toUpperCase().replace(/-/g, '_')}`;
}

export function parseFlags(
  args: string[],
  specs: FlagSpecs,
  env: NodeJS.ProcessEnv = process.env,
): { flags: ParsedFlags; positionals: string[] } {
  const options: Record<string, { type: 'string' | 'boolean'; multiple?: boolean; short?: string }> = {
    help: { type: 'boolean', short: 'h' },
    config: { type: 'string' },
  };
  for (const [name, s] of Object.entries(specs))
    options[name] = { type: s.type, multiple: s.multiple ?? false, ...(s.short ? { short: s.short } : {}) };
  let parsed;
  try {
    parsed = parseArgs({ args, options, allowPositionals: true, strict: true });
  } catch (err) {
    // Node's messages are long and mention internals; keep the useful first sentence.
    const msg = (err as Error).message.split('. ')[0]!.replace(/^Unknown option '(.*)'$/, 'unknown flag $1');
    throw new UsageError(msg);
  }
  const flags: ParsedFlags = { ...(parsed.values as ParsedFlags) };
  const configFile = str(flags, 'config') ?? (env[envName('config')] || undefined);
  const fromConfig = configFile !== undefined && !flags['help'] ? readConfigFile(configFile, specs) : {};
  for (const [name, s] of Object.entries(specs)) {
    if (flags[name] !== undefined) continue;
    const fromEnv = env[envName(name)];
    if (fromEnv !== undefined && fromEnv !== '') {
      if (s.type === 'boolean') flags[name] = ['1', 'true', 'yes'].includes(fromEnv.toLowerCase());
      else
        flags[name] = s.multiple
          ? fromEnv
              .split(',')
              .map((v) => v.trim())
              .filter(Boolean)
          : fromEnv;
    } else if (fromConfig[name] !== undefined) {
      flags[name] = fromConfig[name];
    } else if (s.default !== undefined) {
      flags[name] = s.multiple ? [s.default] : s.default;
    }
  }
  return { flags, positionals: parsed.positionals };
}

/**
 * A config file: a YAML (flat `flag: value` lines, lists for repeatable flags) or JSON object whose
 * keys are this command's flag names. Values are checked against the flag's type; unknown keys are
 * refused (a typo would otherwise be silently ignored). Paths in it are relative to the working
 * directory, as on the command line.
 */
export function readConfigFile(file: string, specs: FlagSpecs): ParsedFlags {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new UsageError(`cannot read --config ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  let doc: unknown;
  try {
    doc = /^\s*[{[]/.test(text) ? JSON.parse(text) : parseConfigYaml(text);
  } catch (err) {
    throw new UsageError(`--config ${file}: ${(err as Error).message.split('\n')[0]}`);
  }
  if (doc === null || doc === undefined) return {}; // empty file
  if (typeof doc !== 'object' || Array.isArray(doc)) throw new UsageError(`--config ${file}: expected an object of flag: value`);
  const out: ParsedFlags = {};
  for (const [key, value] of Object.entries(doc as Record<string, unknown>)) {
    const name = key.replace(/^--/, '');
    // Quoted, with control and non-ASCII characters escaped: a key is the file's text, and the message one line.
    const shown = quoteName(key);
    const s = specs[name];
    if (!s) {
      const why = BUILTIN.includes(name) ? 'cannot be set in a config file' : 'is not a flag of this command';
      throw new UsageError(`--config ${file}: ${shown} ${why}`);
    }
    if (value === null || value === undefined) continue;
    const scalar = (v: unknown): string => {
      if (typeof v === 'string') return v;
      if (typeof v === 'number' || typeof v === 'boolean') return String(v);
      throw new UsageError(`--config ${file}: ${shown} must be ${s.multiple ? 'a value or a list of values' : 'a single value'}`);
    };
    if (s.type === 'boolean') {
      if (typeof value === 'boolean') out[name] = value;
      else if (typeof value === 'string' && /^(true|false|yes|no|1|0)$/i.test(value)) out[name] = /^(true|yes|1)$/i.test(value);
      else throw new UsageError(`--config ${file}: ${shown} must be true or false`);
    } else if (s.multiple) {
      out[name] = Array.isArray(value) ? value.map(scalar) : [scalar(value)];
    } else {
      out[name] = scalar(value);
    }
  }
  return out;
}

export function helpText(usage: string, summary: string, specs: FlagSpecs): string {
  const rows = Object.entries(specs).map(([name, s]) => {
    const left = `  ${s.short ? `-${s.short}, ` : ''}--${name}${s.type === 'string' ? ' VALUE' : ''}`;
    const def = s.default !== undefined ? ` (default ${s.default})` : '';
    return `${left.padEnd(30)} ${s.help}${def}${s.multiple ? ' [repeatable]' : ''}\n${''.padEnd(31)} env ${envName(name)}`;
  });
  const common = `  --config FILE${''.padEnd(16)} read flags from a YAML or JSON file of flag: value\n${''.padEnd(31)} env ${envName('config')}; precedence: flags > env > config file > defaults\n  -h, --help${''.padEnd(20)} show this help\n`;
  return `Usage: ${usage}\n\n${summary}\n\nFlags:\n${rows.join('\n')}\n${common}`;
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

/** "10s", "500ms", "2m", "1h", "7d" or plain milliseconds. */
export function duration(flags: ParsedFlags, name: string): number {
  const v = required(flags, name);
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$/.exec(v.trim());
  if (!m) throw new UsageError(`--${name} must be a duration like 500ms, 10s, 2m, 24h or 7d, got "${v}"`);
  const n = Number(m[1]);
  const unit = m[2] ?? 'ms';
  return Math.round(n * { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }[unit]!);
}

/** A size: "64Mi", "1Gi", "512Ki", "256M" or plain bytes. */
export function bytes(flags: ParsedFlags, name: string): number {
  const v = required(flags, name);
  const m = /^(\d+(?:\.\d+)?)(Ki|Mi|Gi|K|M|G)?$/.exec(v.trim());
  if (!m) throw new UsageError(`--${name} must be a size like 64Mi, 1Gi or 512Ki (or bytes), got "${v}"`);
  const n = Math.floor(Number(m[1]) * { '': 1, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, K: 1e3, M: 1e6, G: 1e9 }[m[2] ?? '']!);
  if (n < 1) throw new UsageError(`--${name} must be at least 1 byte, got "${v}"`);
  return n;
}

/** A positive whole number, or undefined when the flag is unset. */
export function optionalCount(flags: ParsedFlags, name: string): number | undefined {
  const v = str(flags, name);
  if (v === undefined || v === '') return undefined;
  if (!/^\d+$/.test(v.trim()) || Number(v) < 1) throw new UsageError(`--${name} must be a whole number of at least 1, got "${v}"`);
  return Number(v);
}

/** HOST:PORT (IPv6 in brackets) for a flag; the brackets are removed from the host. */
export function hostPort(flags: ParsedFlags, name: string): { host: string; port: number } {
  const v = required(flags, name);
  const m = /^(.+):(\d{1,5})$/.exec(v);
  if (!m || Number(m[2]) > 65535 || m[1]!.includes(' ')) throw new UsageError(`--${name} "${v}" is not HOST:PORT`);
  return { host: m[1]!.replace(/^\[(.*)\]$/, '$1'), port: Number(m[2]) };
}
