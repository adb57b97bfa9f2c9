// Logs: pino, one event per line. JSON for machines (contract §9), or readable text for people: the
// default `--log-format auto` picks text when stdout is a terminal and JSON otherwise (pipes, files,
// containers, our tests). Secrets never reach a log call; `redact` guards the obvious keys anyway.
import { lazyRequire } from '@cluster-proxy/proto';
import { pino, type Logger } from 'pino';
import type PinoPretty from 'pino-pretty';
import { UsageError, type FlagSpec } from './flags.js';

/** pino-pretty is loaded only for text logs: hub and agent in containers log JSON, and it costs them ~1.4 MiB of RSS. */
const loadPretty = lazyRequire<typeof PinoPretty>('pino-pretty', import.meta.url);

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
export const LOG_FORMATS = ['auto', 'json', 'text'] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];

/** Keys whose values are replaced by "[Redacted]" wherever they appear one or two levels deep. */
export const REDACT_PATHS = ['key', 'password', 'token', 'authorization', '*.key', '*.password', '*.token', '*.authorization'];

export const LOG_LEVEL_FLAG: FlagSpec = { type: 'string', default: 'info', help: 'fatal, error, warn, info, debug, trace or silent' };
export const LOG_FORMAT_FLAG: FlagSpec = {
  type: 'string',
  default: 'auto',
  help: 'auto (text on a terminal, JSON otherwise), json or text',
};

/** Text or JSON for a `--log-format` value and whether stdout is a terminal. */
export function chooseLogFormat(format: string, isTTY: boolean): 'json' | 'text' {
  if (!(LOG_FORMATS as readonly string[]).includes(format))
    throw new UsageError(`--log-format must be one of ${LOG_FORMATS.join(', ')}, got "${format}"`);
  if (format === 'auto') return isTTY ? 'text' : 'json';
  return format as 'json' | 'text';
}

export interface LoggerOptions {
  format?: string;
  /** Where lines go (default stdout); tests pass a stream. */
  destination?: NodeJS.WritableStream;
  /** Override the terminal check (default: the destination's, or stdout's, isTTY). */
  isTTY?: boolean;
}

export function createLogger(level: string, name: string, opts: LoggerOptions = {}): Logger {
  if (!(LOG_LEVELS as readonly string[]).includes(level))
    throw new UsageError(`--log-level must be one of ${LOG_LEVELS.join(', ')}, got "${level}"`);
  const dest = opts.destination ?? process.stdout;
  const isTTY = opts.isTTY ?? (dest as { isTTY?: boolean }).isTTY === true;
  const format = chooseLogFormat(opts.format ?? 'auto', isTTY);
  const options = { level, name, base: { pid: process.pid }, redact: REDACT_PATHS };
  if (format === 'json') return opts.destination ? pino(options, opts.destination) : pino(options);
  // Synchronous: a crash or process.exit() must not lose the last lines.
  const stream = loadPretty()({ destination: dest, sync: true, colorize: isTTY, translateTime: 'SYS:HH:MM:ss.l', ignore: 'pid,hostname' });
  return pino(options, stream);
}

/**
 * For the long-running commands (hub, agent): a promise rejection nobody handled is a bug, but
 * crashing would drop every tunnel of the fleet, so it is logged with its stack and the process goes on.
 */
export function logUnhandledRejections(log: Logger): void {
  process.on('unhandledRejection', (reason: unknown) => {
    const err = reason instanceof Error ? reason : new Error(String(reason));
    log.error({ err: err.message, stack: err.stack }, `internal error (unhandled promise rejection), continuing: ${err.message}`);
  });
}
