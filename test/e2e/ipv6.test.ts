// Listening where users are: a hub and an agent started without an address flag listen on every address of
// both families (dual-stack), so every listener answers over IPv6 (::1) and IPv4 (127.0.0.1) alike: the agent
// port (an agent dialing [::1]), the client frontend (the SDK over mux and gRPC), HTTP CONNECT, the gateway,
// the health ports; and `forward --listen [::1]:0` serves IPv6 clients.
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Tunnel } from '@cluster-proxy/client';
import { echoRoundTripForTest } from '../src/join-helpers.js';
import {
  connectThrough,
  killAllSpawned,
  spawnProcess,
  startEchoServer,
  type ManagedProcess,
  type TcpTarget,
} from '../src/fixtures/index.js';
import { CLI, cliLaunchFlags, createPki, startHub, type HubProcess, type TestPki, type UserCert } from '../src/harness.js';

let pki: TestPki;
let hub: HubProcess;
let agent: ManagedProcess;
let agentHealth: number;
let echo: TcpTarget;
let user: UserCert;
const tunnels: Tunnel[] = [];

beforeAll(async () => {
  pki = await createPki();
  echo = await startEchoServer();
  hub = await startHub(pki, ['--gateway-port', '0'], { bindAddress: null });
  const cert = await pki.agent('c6');
  agent = spawnProcess({
    name: 'agent-c6',
    command: process.execPath,
    args: [
      ...cliLaunchFlags(),
      CLI,
      'agent',
      '--cluster',
      'c6',
      '--hub',
      `[::1]:${hub.ports.agent}`,
      '--server-name',
      'localhost',
      '--ca-cert',
      pki.caPath,
      '--cert',
      cert.certPath,
      '--key',
      cert.keyPath,
      '--apiserver',
      `127.0.0.1:${echo.port}`,
      '--health-port',
      '0',
      '--log-format',
      'json',
    ],
  });
  agentHealth = Number((await agent.waitForJsonLine((o) => o['msg'] === 'agent health listener up', 15_000))['healthPort']);
  await agent.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 15_000);
  user = await pki.user('v6-user');
}, 60_000);

afterAll(async () => {
  for (const t of tunnels) t.close();
  await agent?.stop(8000);
  await hub?.stop();
  await killAllSpawned();
  await echo?.close();
  await pki?.cleanup();
});

function tunnelOver(host: string, transport: 'mux' | 'grpc'): Tunnel {
  const t = new Tunnel({
    address: `${host}:${hub.ports.frontend}`,
    serverName: 'localhost',
    caCert: Buffer.from(pki.ca.certPem),
    cert: user.cert,
    key: user.key,
    transport,
  });
  tunnels.push(t);
  return t;
}

const status = (get: typeof http.get, url: string, opts: https.RequestOptions = {}): Promise<number> =>
  new Promise((resolve, reject) => {
    get(url, opts, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    }).on('error', reject);
  });

describe('listeners on both families by default', () => {
  it('the agent reached the hub over IPv6 ([::1])', async () => {
    const tables = (await hub.tables()).agents;
    expect(tables.map((a) => a.cluster)).toEqual(['c6']);
  });

  it.each([
    ['[::1]', 'mux'],
    ['[::1]', 'grpc'],
    ['127.0.0.1', 'mux'],
  ] as const)('an SDK dial through %s over %s', async (host, transport) => {
    const s = await tunnelOver(host, transport).dial('c6:443', { timeoutMs: 10_000 });
    const payload = Buffer.from(`v6 ${host} ${transport}`.repeat(100));
    expect((await echoRoundTripForTest(s, payload)).equals(payload)).toBe(true);
    s.destroy();
  });

  it.each(['::1', '127.0.0.1'])('HTTP CONNECT over %s', async (host) => {
    const socket = tls.connect({
      host,
      port: hub.ports.connect!,
      servername: 'localhost',
      ca: pki.ca.certPem,
      cert: user.cert,
      key: user.key,
    });
    const s = await connectThrough(socket, 'c6:443');
    expect((await echoRoundTripForTest(s, Buffer.from('connect v6'))).toString()).toBe('connect v6');
    s.destroy();
  });

  it.each(['[::1]', '127.0.0.1'])('the gateway and the health ports over %s', async (host) => {
    // 404: the gateway answered (c9 is no cluster of this hub).
    expect(
      await status(https.get, `https://${host}:${hub.ports.gateway}/c9/version`, {
        ca: pki.ca.certPem,
        cert: user.cert,
        key: user.key,
        servername: 'localhost',
      }),
    ).toBe(404);
    expect(await status(http.get, `http://${host}:${hub.ports.health}/healthz`)).toBe(200);
    expect(await status(http.get, `http://${host}:${agentHealth}/healthz`)).toBe(200);
  });

  it('forward --listen [::1]:0 serves IPv6 clients and says where, bracketed', async () => {
    const fwd = spawnProcess({
      name: 'forward-v6',
      command: process.execPath,
      args: [
        CLI,
        'forward',
        'c6',
        'c6:443',
        '--listen',
        '[::1]:0',
        '--frontend',
        `[::1]:${hub.ports.frontend}`,
        '--server-name',
        'localhost',
        '--ca-cert',
        pki.caPath,
        '--cert',
        user.certPath,
        '--key',
        user.keyPath,
      ],
    });
    try {
      const line = await fwd.waitForLine((l) => l.startsWith('Forwarding '), 15_000);
      const m = /^Forwarding \[::1\]:(\d+) -> c6:443/.exec(line);
      expect(m, line).not.toBeNull();
      const s = net.connect({ host: '::1', port: Number(m![1]) });
      await new Promise((r) => s.once('connect', r));
      expect((await echoRoundTripForTest(s, Buffer.from('forward v6'))).toString()).toBe('forward v6');
      s.destroy();
    } finally {
      await fwd.stop(5000);
    }
  });
});
