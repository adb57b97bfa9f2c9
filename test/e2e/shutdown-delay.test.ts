// `hub --shutdown-delay`: on SIGTERM readiness turns false at once, but dials are still served for the
// delay (load balancers and Service endpoints need a moment to take the replica out); after it, new
// dials are refused and open connections get --shutdown-grace; then the process exits by itself.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { echoRoundTripForTest } from '../src/join-helpers.js';
import { killAllSpawned, startEchoServer, waitFor, type TcpTarget } from '../src/fixtures/index.js';
import { createPki, getStatus, startAgent, startHub, type AgentProcess, type HubProcess, type TestPki } from '../src/harness.js';

describe('hub --shutdown-delay', () => {
  let pki: TestPki;
  let echo: TcpTarget;
  let hub: HubProcess;
  let agent: AgentProcess;

  beforeAll(async () => {
    pki = await createPki();
    echo = await startEchoServer();
    hub = await startHub(pki, ['--shutdown-delay', '4s', '--shutdown-grace', '1s']);
    agent = await startAgent(pki, hub, { cluster: 'c1', apiserver: `127.0.0.1:${echo.port}` });
  });
  afterAll(async () => {
    await agent?.stop();
    await hub?.stop();
    await killAllSpawned();
    await echo?.close();
    await pki?.cleanup();
  });

  it('readiness false at once, dials served during the delay, refused after it, then exit', async () => {
    const t = hub.tunnel();
    const first = await t.dial('c1:443');
    hub.proc.kill('SIGTERM');
    const r = await waitFor(async () => { const s = await getStatus(hub.ports.health, '/readyz?verbose'); return s.status === 503 ? s : undefined; }, { timeoutMs: 1500, intervalMs: 25, message: 'readyz 503 at once' });
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
