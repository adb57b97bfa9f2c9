// The agent's proxy selection (agent/src/no-proxy.ts) against Go's own golang.org/x/net/http/httpproxy,
// through the Go judge (go-judge.ts): the same environment and target to both, the same decision and the
// same proxy, for generated cases from a fixed seed. Differences we keep on purpose are counted by name
// (docs/egress-proxy.md); any other one fails. `pnpm fuzz -- --only proxy-go` runs millions.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { GoJudge, deliberate, runDifferential } from './go-judge.js';

/** Cases from a fixed seed, stopped early on a loaded machine (the suite stays short), but never fewer than MIN_CASES. */
const CASES = 200_000;
const CAP_MS = 30_000;
const MIN_CASES = 40_000;

describe('NO_PROXY and HTTPS_PROXY: Go is the judge', () => {
  let judge: GoJudge;
  beforeAll(() => {
    judge = GoJudge.start();
  }, 180_000);
  afterAll(async () => {
    await judge?.close();
  });

  it(`decides up to ${CASES} generated cases as Go does, but for the documented differences`, async () => {
    const started = Date.now();
    let r = await runDifferential(judge, 20261129, CASES, started + CAP_MS);
    if (r.cases < MIN_CASES) r = await runDifferential(judge, 20261129, MIN_CASES);
    expect(r.cases).toBeGreaterThanOrEqual(MIN_CASES);
    expect(r.differences.map((d) => `${d.what}: ${JSON.stringify(d.case)}`)).toEqual([]);
    // The generator reaches every documented difference, so each one stays tested.
    expect(Object.keys(r.deliberate).sort()).toEqual([
      'LOCALHOST in another case is never proxied',
      'a proxy value Go keeps but cannot connect to',
      'an IPv6 proxy address with a zone',
    ]);
  }, 120_000);

  it('names each documented difference for the cases that show it', async () => {
    const [localhost, unusable, zone] = await judge.ask([
      { env: { HTTPS_PROXY: 'http://proxy:3128' }, host: 'LOCALHOST', port: 443 },
      { env: { HTTPS_PROXY: 'http://proxy:port' }, host: 'example.com', port: 443 },
      { env: { HTTPS_PROXY: 'http://[fe80::1%25eth0]:3128' }, host: 'example.com', port: 443 },
    ]);
    expect(localhost!.proxy?.hostname).toBe('proxy');
    expect(deliberate({ env: {}, host: 'LOCALHOST', port: 443 }, localhost!)).toBe('LOCALHOST in another case is never proxied');
    expect(deliberate({ env: { HTTPS_PROXY: 'http://proxy:port' }, host: 'example.com', port: 443 }, unusable!)).toBe(
      'a proxy value Go keeps but cannot connect to',
    );
    expect(deliberate({ env: { HTTPS_PROXY: 'http://[fe80::1%25eth0]:3128' }, host: 'example.com', port: 443 }, zone!)).toBe(
      'an IPv6 proxy address with a zone',
    );
  });
});
