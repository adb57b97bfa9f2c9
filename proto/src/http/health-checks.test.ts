import { describe, expect, it } from 'vitest';
import { HealthChecks } from './health-checks.js';

const url = (q = ''): URL => new URL(`http://x/readyz${q}`);

describe('HealthChecks', () => {
  it('answers ok, or every check Kubernetes-style with ?verbose', async () => {
    const c = new HealthChecks('readyz', [
      { name: 'a', check: () => undefined },
      { name: 'b', check: async () => undefined },
    ]);
    expect(await c.respond(url())).toEqual({ status: 200, body: 'ok\n' });
    expect(await c.respond(url('?verbose'))).toEqual({ status: 200, body: '[+]a ok\n[+]b ok\nreadyz check passed\n' });
  });

  it('fails with 503 naming the failed check and its one-line reason; ?exclude skips it', async () => {
    const c = new HealthChecks('readyz', [
      { name: 'a', check: () => undefined },
      {
        name: 'store',
        check: async () => {
          throw new Error('unreachable:\n  ECONNREFUSED');
        },
      },
    ]);
    expect(await c.respond(url())).toEqual({
      status: 503,
      body: '[+]a ok\n[-]store failed: unreachable: ECONNREFUSED\nreadyz check failed\n',
    });
    expect(await c.respond(url('?exclude=store'))).toEqual({ status: 200, body: 'ok\n' });
  });

  it('fails a check that does not answer within the timeout, and clears its timer', async () => {
    let release: () => void = () => undefined;
    const c = new HealthChecks(
      'healthz',
      [
        {
          name: 'slow',
          check: () =>
            new Promise<void>((r) => {
              release = r;
            }),
        },
      ],
      50,
    );
    const r = await c.run();
    release();
    expect(r).toEqual({ ok: false, results: [{ name: 'slow', ok: false, reason: 'timed out after 50 ms' }] });
  });

  it('refuses bad and duplicate names', () => {
    const c = new HealthChecks('readyz');
    expect(() => c.add({ name: 'has space', check: () => undefined })).toThrow(/must be letters/);
    c.add({ name: 'x', check: () => undefined });
    expect(() => c.add({ name: 'x', check: () => undefined })).toThrow(/already registered/);
    expect(c.names).toEqual(['x']);
  });
});
