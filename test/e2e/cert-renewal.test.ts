// Agent certificate renewal with a tunnel carrying data across it: the hub signs 20-second agent
// certificates, the agent renews at 80 % of the lifetime through POST /v1/renew with a new key, and
// the open connection keeps echoing bytes, unbroken, before, during and after.
import { copyFile, readFile, writeFile } from 'node:fs/promises';
import { X509Certificate } from 'node:crypto';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { echoRoundTripForTest } from '../src/join-helpers.js';
import { runCommand, spawnProcess, waitFor, type ManagedProcess, type TcpTarget } from '../src/fixtures/index.js';
import { CLI, startAgent, type HubProcess, type TestPki } from '../src/harness.js';
import { startEchoHub, type EchoHub } from '../src/e2e-setup.js';

describe('agent certificate renewal', () => {
  let setup: EchoHub;
  let pki: TestPki;
  let hub: HubProcess;
  let echo: TcpTarget;
  let agent: ManagedProcess | null = null;

  beforeAll(async () => {
    setup = await startEchoHub((p) => ['--ca-key', path.join(p.dir, 'ca.key'), '--agent-cert-validity', '20s']);
    ({ pki, echo, hub } = setup);
  });
  afterAll(async () => {
    await agent?.stop(5000);
    await setup?.stop();
  });

  it('renews at 80 % of the lifetime with a new key while an open connection keeps carrying data', async () => {
    const bundle = path.join(pki.dir, 'c1-bundle');
    const join = await runCommand(process.execPath, [CLI, 'join', 'c1', '--out', bundle, '--admin', `127.0.0.1:${hub.ports.admin}`], {
      timeoutMs: 20_000,
    });
    expect(join.code, join.stderr).toBe(0);
    const creds = path.join(bundle, 'credentials');
    agent = spawnProcess({
      name: 'agent-c1',
      command: process.execPath,
      args: [
        CLI,
        'agent',
        '--cluster',
        'c1',
        '--hub',
        `127.0.0.1:${hub.ports.agent}`,
        '--server-name',
        'localhost',
        '--ca-cert',
        path.join(bundle, 'ca.crt'),
        '--bootstrap-token-file',
        path.join(bundle, 'bootstrap-token'),
        '--credentials-dir',
        creds,
        '--apiserver',
        `127.0.0.1:${echo.port}`,
        '--health-port',
        '0',
        '--log-format',
        'json',
      ],
    });
    await agent.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 20_000);
    const first = new X509Certificate(await readFile(path.join(creds, 'agent.crt')));
    const firstKey = await readFile(path.join(creds, 'agent.key'), 'utf8');
    const lifetime = Date.parse(first.validTo) - Date.parse(first.validFrom);
    expect(lifetime).toBeLessThan(60_000);

    const tunnel = hub.tunnel();
    const s = await tunnel.dial('c1:443');
    let rounds = 0;
    let renewed = false;
    // Round trips on one connection until well after the renewal; every one must come back intact.
    const until = Date.now() + 40_000;
    while (Date.now() < until) {
      const payload = Buffer.from(`round ${rounds} `.repeat(50));
      expect((await echoRoundTripForTest(s, payload)).equals(payload)).toBe(true);
      rounds++;
      if (!renewed && agent.lines().some((l) => l.includes('agent certificate renewed'))) {
        renewed = true;
        // A few more seconds of traffic after the renewal.
        await new Promise((r) => setTimeout(r, 2000));
        const after = Buffer.from('after renewal');
        expect((await echoRoundTripForTest(s, after)).toString()).toBe('after renewal');
        break;
      }
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(renewed).toBe(true);
    expect(rounds).toBeGreaterThan(10);
    const second = new X509Certificate(await readFile(path.join(creds, 'agent.crt')));
    expect(second.serialNumber).not.toBe(first.serialNumber);
    expect(await readFile(path.join(creds, 'agent.key'), 'utf8')).not.toBe(firstKey);
    expect(second.subject).toBe(first.subject);
    expect(s.destroyed).toBe(false);
    s.destroy();
    tunnel.close();
    await waitFor(async () => (await hub.tables()).agents[0]?.established.length === 0, {
      timeoutMs: 5000,
      message: 'connection closed on the hub',
    });
  });

  it("--cert/--key files replaced (as OCM's CSR flow renews them): a half-swapped pair is skipped, the new pair is used, the open connection keeps carrying data", async () => {
    const first = await pki.agent('c2');
    const live = { certPath: path.join(pki.dir, 'live-c2.crt'), keyPath: path.join(pki.dir, 'live-c2.key') };
    await copyFile(first.certPath, live.certPath);
    await copyFile(first.keyPath, live.keyPath);
    const a = await startAgent(pki, hub, {
      cluster: 'c2',
      apiserver: `127.0.0.1:${echo.port}`,
      cert: live,
      args: ['--cert-reload-interval', '200ms'],
    });
    const tunnel = hub.tunnel();
    try {
      const s = await tunnel.dial('c2:443');
      const ping = async (n: number) => expect((await echoRoundTripForTest(s, Buffer.from(`ping-${n}`))).toString()).toBe(`ping-${n}`);
      await ping(1);
      const second = await pki.agent('c2');
      // The certificate arrives before its key (a swap caught half-way): refused, the old pair stays.
      let mark = a.proc.lineCount();
      await writeFile(live.certPath, await readFile(second.certPath));
      await a.proc.waitForJsonLine((o) => String(o['msg']).startsWith('cannot use the agent certificate files yet'), 10_000, {
        after: mark,
      });
      await ping(2);
      mark = a.proc.lineCount();
      await writeFile(live.keyPath, await readFile(second.keyPath));
      await a.proc.waitForJsonLine((o) => String(o['msg']).startsWith('the agent certificate files changed'), 10_000, { after: mark });
      await ping(3);
      const s2 = await tunnel.dial('c2:443');
      expect((await echoRoundTripForTest(s2, Buffer.from('new'))).toString()).toBe('new');
      s2.destroy();
      s.destroy();
    } finally {
      tunnel.close();
      await a.stop();
    }
  });
});
