import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { UsageError } from './flags.js';
import { chooseLogFormat, createLogger } from './logging.js';

function sink(): { stream: Writable; text: () => string } {
  const chunks: string[] = [];
  return {
    stream: new Writable({
      write(c: Buffer, _e, cb) {
        chunks.push(c.toString());
        cb();
      },
    }),
    text: () => chunks.join(''),
  };
}

describe('log format', () => {
  it('auto is text on a terminal and JSON otherwise; json and text force it', () => {
    expect(chooseLogFormat('auto', true)).toBe('text');
    expect(chooseLogFormat('auto', false)).toBe('json');
    expect(chooseLogFormat('json', true)).toBe('json');
    expect(chooseLogFormat('text', false)).toBe('text');
  });

  it('refuses unknown formats and levels with a one-line usage error', () => {
    expect(() => chooseLogFormat('yaml', false)).toThrow(UsageError);
    expect(() => chooseLogFormat('yaml', false)).toThrow('--log-format must be one of auto, json, text, got "yaml"');
    expect(() => createLogger('loud', 'hub')).toThrow(UsageError);
    expect(() => createLogger('loud', 'hub')).toThrow(
      /^--log-level must be one of fatal, error, warn, info, debug, trace, silent, got "loud"$/,
    );
  });

  it('JSON: one object per line, level respected, secrets redacted', () => {
    const out = sink();
    const log = createLogger('info', 'hub', { destination: out.stream, isTTY: false });
    log.debug('hidden');
    log.info({ token: 's3cret', proxy: { password: 'hunter2' }, connectID: 3 }, 'hello');
    const lines = out
      .text()
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({ msg: 'hello', name: 'hub', token: '[Redacted]', proxy: { password: '[Redacted]' }, connectID: 3 });
    expect(out.text()).not.toMatch(/s3cret|hunter2/);
  });

  it('text: readable lines (level, message, fields), secrets still redacted', () => {
    const out = sink();
    const log = createLogger('info', 'agent', { destination: out.stream, isTTY: false, format: 'text' });
    log.info({ token: 's3cret', connectID: 9 }, 'connected to proxy server');
    const text = out.text();
    expect(text).toMatch(/INFO.*\(agent\): connected to proxy server/);
    expect(text).toMatch(/connectID: 9/);
    expect(text).not.toContain('s3cret');
    expect(() => JSON.parse(text.split('\n')[0]!)).toThrow();
  });
});
