// The hub CA rollover with an agent connected the whole time: add (the agent learns the new bundle
// from its lease renewal), promote (the hub serves and signs with the new CA, asks the agent to
// renew, the open connection keeps carrying data), finish (the old CA is gone; the agent, renewed,
// reconnects with its new certificate; a certificate of the old CA is refused).
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { X509Certificate } from 'node:crypto';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Tunnel, type TunnelSocket } from '@cluster-proxy/client';
import { connectMux } from '@cluster-proxy/proto';
import { echoRoundTripForTest } from '../src/join-helpers.js';
import {
  killAllSpawned,
  runCommand,
  spawnProcess,
  startEchoServer,
  waitFor,
  type ManagedProcess,
  type TcpTarget,
} from '../src/fixtures/index.js';
import { CLI } from '../src/harness.js';
import { splitBundle } from '@cluster-proxy/server';

describe('hub CA rollover', () => {
  let dir = '';
  let hub: ManagedProcess;
  let agent: ManagedProcess;
  let echo: TcpTarget;
  let ports: { agent: number; frontend: number; admin: number };
  let tunnel: Tunnel | null = null;
  let conn: TunnelSocket | null = null;
  const cli = (args: string[]) => runCommand(process.execPath, [CLI, ...args], { cwd: dir, timeoutMs: 20_000 });
  const pki = (f: string) => path.join(dir, 'hub', 'pki', f);

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'cp-ca-'));
    echo = await startEchoServer();
    hub = spawnProcess({
      name: 'hub',
      command: process.execPath,
      cwd: dir,
      args: [
        CLI,
        'hub',
        '--data-dir',
        'hub',
        '--bind-address',
        '127.0.0.1',
        '--agent-port',
        '0',
        '--frontend-port',
        '0',
        '--health-port',
        '0',
        '--admin-port',
        '0',
        '--connect-port',
        'off',
        '--tls-reload-interval',
        '300ms',
        '--log-format',
        'json',
      ],
    });
    await hub.waitForJsonLine((o) => o['msg'] === 'proxy server listening', 20_000);
    ports = JSON.parse(await readFile(path.join(dir, 'hub', 'ports.json'), 'utf8')) as typeof ports;
    expect((await cli(['join', 'c1', '--data-dir', 'hub', '--out', 'b'])).code).toBe(0);
    agent = spawnProcess({
      name: 'agent',
      command: process.execPath,
      cwd: dir,
      args: [
        CLI,
        'agent',
        '--cluster',
        'c1',
        '--hub',
        `127.0.0.1:${ports.agent}`,
        '--ca-cert',
        'b/ca.crt',
        '--bootstrap-token-file',
        'b/bootstrap-token',
        '--credentials-dir',
        'b/creds',
        '--apiserver',
        `127.0.0.1:${echo.port}`,
        '--health-port',
        '0',
        '--lease-duration',
        '1s',
        '--log-format',
        'json',
      ],
    });
    await agent.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 20_000);
  });
  afterAll(async () => {
    conn?.destroy();
    tunnel?.close();
    await agent?.stop(5000);
    await hub?.stop(8000);
    await killAllSpawned();
    await echo?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  const openTunnel = async (): Promise<Tunnel> =>
    new Tunnel({
      address: `127.0.0.1:${ports.frontend}`,
      serverName: 'localhost',
      caCert: await readFile(pki('ca.crt')),
      cert: await readFile(pki('client.crt')),
      key: await readFile(pki('client.key')),
    });
  const ping = async (s: TunnelSocket, text: string): Promise<void> =>
    expect((await echoRoundTripForTest(s, Buffer.from(text))).toString()).toBe(text);

  it('add: the hub trusts both CAs and hands the bundle to the agent; traffic flows', async () => {
    tunnel = await openTunnel();
    conn = await tunnel.dial('c1:443');
    await ping(conn, 'before');
    const mark = agent.lineCount();
    const r = await cli(['ca', 'rotate', 'add', '--data-dir', 'hub']);
    expect(r.code, r.stderr).toBe(0);
    await agent.waitForLine((l) => l.includes('the hub sent a new CA bundle'), 15_000, { after: mark });
    expect((await readFile(path.join(dir, 'b', 'creds', 'hub-ca.crt'), 'utf8')).match(/BEGIN CERTIFICATE/g)).toHaveLength(2);
    await ping(conn, 'after add');
  });

  let oldPair: { cert: Buffer; key: Buffer } | null = null;

  it('promote: the new CA signs, the agent is asked to renew and does; the open connection keeps going', async () => {
    oldPair = {
      cert: await readFile(path.join(dir, 'b', 'creds', 'agent.crt')),
      key: await readFile(path.join(dir, 'b', 'creds', 'agent.key')),
    };
    const oldCert = new X509Certificate(oldPair.cert);
    const mark = agent.lineCount();
    expect((await cli(['ca', 'rotate', 'promote', '--data-dir', 'hub'])).code).toBe(0);
    await agent.waitForLine((l) => l.includes('agent certificate renewed'), 20_000, { after: mark });
    const newCert = new X509Certificate(await readFile(path.join(dir, 'b', 'creds', 'agent.crt')));
    const signing = new X509Certificate(splitBundle(await readFile(pki('ca.crt'), 'utf8'))[0]!);
    expect(newCert.checkIssued(signing)).toBe(true);
    expect(oldCert.checkIssued(signing)).toBe(false);
    await ping(conn!, 'after promote');
  });

  it('finish: the old CA is dropped; the agent reconnects with its renewed certificate; an old-CA certificate is refused', async () => {
    expect(splitBundle(await readFile(pki('ca.crt'), 'utf8'))).toHaveLength(2);
    expect((await cli(['ca', 'rotate', 'finish', '--data-dir', 'hub'])).code).toBe(0);
    await ping(conn!, 'after finish');
    conn!.destroy();
    tunnel!.close();
    // Restart the agent: a new link, verified with the new CA, presenting the renewed certificate.
    await agent.stop(5000);
    const again = spawnProcess({
      name: 'agent-again',
      command: process.execPath,
      cwd: dir,
      args: [
        CLI,
        'agent',
        '--cluster',
        'c1',
        '--hub',
        `127.0.0.1:${ports.agent}`,
        '--ca-cert',
        'b/ca.crt',
        '--credentials-dir',
        'b/creds',
        '--apiserver',
        `127.0.0.1:${echo.port}`,
        '--health-port',
        '0',
        '--lease-duration',
        '1s',
        '--log-format',
        'json',
      ],
    });
    agent = again;
    await again.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 20_000);
    tunnel = await openTunnel();
    conn = await tunnel.dial('c1:443');
    await ping(conn, 'new link');
    expect(splitBundle(await readFile(pki('ca.crt'), 'utf8'))).toHaveLength(1);
    // The agent's pre-rollover certificate (old CA) no longer gets in: refused in the TLS handshake once the hub
    // has picked up "finish" (its next --tls-reload-interval tick; a hello refusal would mean it still trusts it).
    const caCert = await readFile(pki('ca.crt'));
    const refused = await waitFor(
      async () => {
        const err = await connectMux({
          address: `127.0.0.1:${ports.agent}`,
          caCert,
          cert: oldPair!.cert,
          key: oldPair!.key,
          serverName: 'localhost',
          hello: {},
          timeoutMs: 5000,
        }).then(
          (c) => {
            c.stream.destroy();
            return null;
          },
          (e: Error) => e,
        );
        return err && /closed the connection/.test(err.message) ? err : null;
      },
      { timeoutMs: 10_000, intervalMs: 100, message: 'an old-CA certificate still gets through the TLS handshake after finish' },
    );
    expect(refused.message).toMatch(/closed the connection/);
    await waitFor(
      async () =>
        ((await (await fetch(`http://127.0.0.1:${ports.admin}/debug/connections`)).json()) as { agents: unknown[] }).agents.length === 1,
      { timeoutMs: 5000, message: 'one agent' },
    );
  });
});
