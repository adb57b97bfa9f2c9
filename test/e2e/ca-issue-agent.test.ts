// `cluster-proxy ca issue-agent CLUSTER`: a certificate with OCM's agent subject for an agent that has
// no bootstrap token (an unmodified ANP agent; here ours on the gRPC transport stands in for one).
// The hub admits it for CLUSTER and routes dials to it.
import { X509Certificate } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { writePemPair } from '@cluster-proxy/server';
import { echoRoundTripForTest } from '../src/join-helpers.js';
import { runCommand, spawnProcess, type ManagedProcess, type TcpTarget } from '../src/fixtures/index.js';
import { CLI, expectTablesEmpty, type HubProcess, type TestPki } from '../src/harness.js';
import { startEchoHub, type EchoHub } from '../src/e2e-setup.js';

describe('ca issue-agent', () => {
  let setup: EchoHub;
  let pki: TestPki;
  let hub: HubProcess;
  let echo: TcpTarget;
  let agent: ManagedProcess | null = null;
  let dataDir: string;

  beforeAll(async () => {
    setup = await startEchoHub();
    ({ pki, echo, hub } = setup);
    // The CLI signs with the data-dir PKI: the same CA the hub trusts.
    dataDir = path.join(pki.dir, 'admin');
    await mkdir(path.join(dataDir, 'pki'), { recursive: true });
    await writePemPair(path.join(dataDir, 'pki'), 'ca', pki.ca);
  });
  afterAll(async () => {
    await agent?.stop(5000);
    await setup?.stop();
  });

  it("writes a certificate with OCM's agent subject that the hub accepts from a gRPC (ANP-style) agent", async () => {
    const out = path.join(pki.dir, 'issued');
    const r = await runCommand(
      process.execPath,
      [CLI, 'ca', 'issue-agent', 'c7', '--agent-id', 'anp-agent-1', '--out', out, '--data-dir', dataDir],
      { timeoutMs: 20_000 },
    );
    expect(r.code, r.stderr).toBe(0);
    const certPath = path.join(out, 'c7-agent.crt');
    const keyPath = path.join(out, 'c7-agent.key');
    expect(r.stdout).toBe(`${certPath}\n${keyPath}\n`);
    const { readFile } = await import('node:fs/promises');
    const cert = new X509Certificate(await readFile(certPath));
    // Longer than X.509's suggested 64 characters: OCM's names are, and Go and Node accept them.
    expect(cert.subject).toBe(
      'O=system:open-cluster-management:cluster:c7:addon:cluster-proxy\nCN=system:open-cluster-management:cluster:c7:addon:cluster-proxy:agent:anp-agent-1',
    );
    expect(r.stdout + r.stderr).not.toContain('PRIVATE KEY');

    agent = spawnProcess({
      name: 'agent-c7',
      command: process.execPath,
      args: [
        CLI,
        'agent',
        '--cluster',
        'c7',
        '--transport',
        'grpc',
        '--hub',
        `127.0.0.1:${hub.ports.agent}`,
        '--server-name',
        'localhost',
        '--ca-cert',
        pki.caPath,
        '--cert',
        certPath,
        '--key',
        keyPath,
        '--apiserver',
        `127.0.0.1:${echo.port}`,
        '--health-bind-address',
        '127.0.0.1',
        '--health-port',
        '0',
        '--log-format',
        'json',
      ],
    });
    const connected = await agent.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 20_000);
    expect(connected['transport']).toBe('grpc');
    const s = hub.tunnel('mux').connect('c7:443');
    await new Promise<void>((resolve, reject) => {
      s.once('connect', resolve);
      s.once('error', reject);
    });
    const payload = Buffer.from('through an agent with an issued certificate\n');
    expect((await echoRoundTripForTest(s, payload)).equals(payload)).toBe(true);
    s.end();
    await new Promise((resolve) => s.once('close', resolve));
    await expectTablesEmpty(hub, []);
  });

  it('user mistakes: one line, exit 2', async () => {
    const cases: [string[], RegExp][] = [
      [['ca', 'issue-agent', '--data-dir', dataDir], /^cluster-proxy: ca issue-agent takes one CLUSTER/],
      [['ca', 'issue-agent', 'Bad_Name', '--data-dir', dataDir], /^cluster-proxy: ca issue-agent: .*cluster name/],
      [['ca', 'issue-agent', 'c8', '--agent-id', 'a:b', '--data-dir', dataDir], /^cluster-proxy: ca issue-agent: .*agent name/],
      [
        ['ca', 'issue-agent', 'c8', '--data-dir', path.join(pki.dir, 'no-hub')],
        /^cluster-proxy: ca issue-agent needs the hub's data-dir PKI: /,
      ],
    ];
    for (const [args, want] of cases) {
      const r = await runCommand(process.execPath, [CLI, ...args], { timeoutMs: 20_000, cwd: pki.dir });
      expect(r.code, r.stderr).toBe(2);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toMatch(want);
    }
  });
});
