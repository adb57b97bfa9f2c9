import { pino, type Logger } from 'pino';

const LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'];

/** JSON lines on stdout (SPEC §9). Secrets never reach a log call; redact guards the obvious keys anyway. */
export function createLogger(level: string, name: string): Logger {
  if (!LEVELS.includes(level)) throw new Error(`--log-level must be one of ${LEVELS.join(', ')}`);
  return pino({ level, name, base: { pid: process.pid }, redact: ['key', 'password', 'token', '*.key', '*.password', '*.token'] });
}
