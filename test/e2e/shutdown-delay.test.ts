// `hub --shutdown-delay`: on SIGTERM readiness turns false at once, but dials are still served for the
// delay (load balancers and Service endpoints need a moment to take the replica out); after it, new
// dials are refused and open connections get --shutdown-grace; then the process exits by itself.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { echoRoundTripForTest } from '../src/join-helpers.js';
import { waitFor } from '../src/fixtures/index.js';
import { getStatus, type HubProcess } from '../src/harness.js';
import { startEchoHub, type EchoHub } from '../src/e2e-setup.js';

describe('hub --shutdown-delay', () => {
  let setup: EchoHub;
  let hub: HubProcess;

  beforeAll(async () => {
    setup = await startEchoHub(['--shutdown-delay', '4s', '--shutdown-grace', '1s']);
    ({ hub } = setup);
    await setup.startAgent('c1');
  });
  afterAll(async () => {
    await setup?.stop();
  });

  it('readiness false at once, dials served during the delay, refused after it, then exit', async () => {
    const t = hub.tunnel();
    const first = await t.dial('c1:443');
    hub.proc.kill('SIGTERM');
    const r = await waitFor(
      async () => {
        const s = await getStatus(hub.ports.health, '/readyz?verbose');
        return s.status === 503 ? s : undefined;
      },
      { timeoutMs: 1500, intervalMs: 25, message: 'readyz 503 at once' },
    );
    expect(r.body).toContain('[-]listeners failed: shutting down');
    // Still within the delay (4 s; this takes a fraction of it): a new dial works and carries data.
    const during = await t.dial('c1:443');
    expect((await echoRoundTripForTest(during, Buffer.from('during the delay'))).toString()).toBe('during the delay');
    during.destroy();
    await hub.proc.waitForLine((l) => l.includes('told agents this server is shutting down'), 5000);
    await expect(t.dial('c1:443')).rejects.toThrow(/shutting down/);
    first.destroy();
    const exit = await hub.proc.exited;
    expect(exit.code).toBe(0);
  });
});
