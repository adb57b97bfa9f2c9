// Connection and process lifecycles: agents and hubs that vanish, restart, freeze or run twice.
import https from 'node:https';
import http from 'node:http';
import net from 'node:net';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { TunnelError, TunnelHttpAgent, TunnelHttpsAgent, type Tunnel, type TunnelSocket } from '@cluster-proxy/client';
import { issueServerCert } from '@cluster-proxy/server';
import {
  killAllSpawned,
  snapshotHandles,
  startBlackhole,
  startEchoServer,
  waitFor,
  waitForHandlesAtMost,
  type Blackhole,
  type TcpTarget,
} from '../src/fixtures/index.js';
import { createPki, expectTablesEmpty, startAgent, startHub, type AgentProcess, type HubProcess, type TestPki } from '../src/harness.js';

let pki: TestPki;
let hub: HubProcess;
let echo: TcpTarget;
let blackhole: Blackhole;
let tunnel: Tunnel;
let handles: Map<string, number>;
const agents: AgentProcess[] = [];

async function echoOnce(s: TunnelSocket, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let got = '';
    s.on('data', (d: Buffer) => {
      got += d.toString();
      if (got.length >= text.length) resolve(got);
    });
    s.once('error', reject);
    s.write(text);
  });
}

async function freePort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as net.AddressInfo).port;
  await new Promise<void>((r) => srv.close(() => r()));
  return port;
}

beforeAll(async () => {
  pki = await createPki();
  [echo, blackhole] = await Promise.all([startEchoServer(), startBlackhole()]);
  hub = await startHub(pki);
});

afterAll(async () => {
  await Promise.all([hub?.stop(), ...agents.map((a) => a.stop())]);
  await killAllSpawned();
  await Promise.all([echo?.close(), blackhole?.close()]);
  await pki?.cleanup();
});

beforeEach(() => {
  handles = snapshotHandles();
  tunnel = hub.tunnel();
});

afterEach(async () => {
  tunnel.close();
  await expectTablesEmpty(
    hub,
    agents.filter((a) => a.proc.isRunning()),
  );
  await waitForHandlesAtMost(handles, 5000);
});

describe('lifecycle', () => {
  it('a pending dial fails at once (`dialclosed`) when its agent goes away', async () => {
    const a = await startAgent(pki, hub, {
      cluster: 'pending',
      apiserver: `${blackhole.host}:${blackhole.port}`,
      args: ['--dial-timeout', '30s'],
    });
    try {
      const p = tunnel.dial('pending:443').catch((e: unknown) => e);
      await waitFor(async () => (await hub.tables()).agents.some((x) => x.cluster === 'pending' && x.pending === 1), {
        timeoutMs: 5000,
        message: 'dial pending at the hub',
      });
      const t0 = Date.now();
      a.proc.kill('SIGKILL');
      const err = await p;
      expect(err).toBeInstanceOf(TunnelError);
      expect((err as TunnelError).reason).toBe('dialclosed');
      expect((err as Error).message).toContain('pending:443');
      expect(Date.now() - t0).toBeLessThan(2000);
    } finally {
      await a.stop();
    }
  });

  it('two streams of the same agent ID carry connections without ID collisions', async () => {
    const cert = await pki.agent('twin');
    const args = ['--agent-id', 'twin-agent'];
    const a1 = await startAgent(pki, hub, { cluster: 'twin', apiserver: `127.0.0.1:${echo.port}`, cert, args });
    const a2 = await startAgent(pki, hub, { cluster: 'twin', apiserver: `127.0.0.1:${echo.port}`, cert, args });
    agents.push(a1, a2);
    try {
      const t = await hub.tables();
      expect(t.agents.filter((x) => x.agentID === 'twin-agent')).toHaveLength(2);
      // Both agents number their connections from 1; the hub keeps them apart per stream.
      const sockets = await Promise.all(Array.from({ length: 40 }, () => tunnel.dial('twin:443')));
      for (const s of sockets) s.on('error', () => {}); // the killed agent's connections fail; asserted below
      const perAgent = (await hub.tables()).agents.filter((x) => x.agentID === 'twin-agent').map((x) => x.established.length);
      expect(perAgent.every((n) => n > 0)).toBe(true); // spread by least connections
      const replies = await Promise.all(sockets.map((s, i) => echoOnce(s, `twin-${i}`)));
      replies.forEach((r, i) => expect(r).toBe(`twin-${i}`));
      // Killing one leaves the other's connections working.
      a1.proc.kill('SIGKILL');
      await waitFor(async () => (await hub.tables()).agents.filter((x) => x.agentID === 'twin-agent').length === 1, {
        timeoutMs: 5000,
        message: 'hub dropped the killed stream',
      });
      await waitFor(
        () => sockets.filter((s) => s.destroyed).length === perAgent[0] || sockets.filter((s) => s.destroyed).length === perAgent[1],
        { timeoutMs: 5000, message: 'connections of the killed agent closed' },
      );
      const alive = sockets.filter((s) => !s.destroyed);
      expect(alive.length).toBeGreaterThan(0);
      const again = await Promise.all(alive.map((s, i) => echoOnce(s, `again-${i}`)));
      again.forEach((r, i) => expect(r.endsWith(`again-${i}`)).toBe(true));
      for (const s of sockets) s.destroy();
    } finally {
      await Promise.all([a1.stop(), a2.stop()]);
      agents.splice(agents.indexOf(a1), 1);
      agents.splice(agents.indexOf(a2), 1);
    }
  });

  it('an agent reconnects with backoff after the hub restarts on the same address', async () => {
    const agentPort = await freePort();
    const frontendPort = await freePort();
    const h1 = await startHub(pki, ['--agent-port', String(agentPort), '--frontend-port', String(frontendPort)]);
    const a = await startAgent(pki, h1, { cluster: 'phoenix', apiserver: `127.0.0.1:${echo.port}`, args: ['--log-level', 'debug'] });
    let h2: HubProcess | undefined;
    try {
      await h1.stop();
      await a.proc.waitForJsonLine((o) => o['msg'] === 'lost connection to proxy server', 10_000);
      const after = a.proc.lineCount();
      await a.proc.waitForJsonLine((o) => String(o['msg']).startsWith('cannot connect to hub'), 10_000, { after });
      h2 = await startHub(pki, ['--agent-port', String(agentPort), '--frontend-port', String(frontendPort)]);
      await a.proc.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 40_000, { after });
      const t = h2.tunnel();
      const s = await t.dial('phoenix:443');
      expect(await echoOnce(s, 'back')).toBe('back');
      s.destroy();
      t.close();
    } finally {
      await a.stop();
      await h2?.stop();
    }
  });

  it('an agent notices a frozen hub through keepalive and reconnects when it thaws', async () => {
    const h = await startHub(pki);
    const a = await startAgent(pki, h, {
      cluster: 'frozen',
      apiserver: `127.0.0.1:${echo.port}`,
      args: ['--keepalive-time', '1s', '--keepalive-timeout', '2s'],
    });
    try {
      const after = a.proc.lineCount();
      h.proc.kill('SIGSTOP');
      const t0 = Date.now();
      await a.proc.waitForJsonLine((o) => o['msg'] === 'lost connection to proxy server', 20_000, { after });
      expect(Date.now() - t0).toBeLessThan(15_000);
      h.proc.kill('SIGCONT');
      await a.proc.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 40_000, { after });
    } finally {
      h.proc.kill('SIGCONT');
      await a.stop();
      await h.stop();
    }
  });

  it('Node HTTP clients reach an HTTPS and an HTTP server through the tunnel agents', async () => {
    const tls = issueServerCert(pki.ca, { commonName: 'api', dnsNames: ['web'] });
    const api = https.createServer({ cert: tls.certPem, key: tls.keyPem }, (req, res) => res.end(JSON.stringify({ path: req.url })));
    const plain = http.createServer((req, res) => res.end(`plain ${req.url}`));
    await Promise.all([new Promise<void>((r) => api.listen(0, '127.0.0.1', r)), new Promise<void>((r) => plain.listen(0, '127.0.0.1', r))]);
    const apiPort = (api.address() as net.AddressInfo).port;
    const plainPort = (plain.address() as net.AddressInfo).port;
    const a = await startAgent(pki, hub, {
      cluster: 'web',
      apiserver: `127.0.0.1:${apiPort}`,
      args: ['--allow', `127.0.0.1:${plainPort}`],
    });
    const httpsAgent = new TunnelHttpsAgent({ tunnel, ca: pki.ca.certPem, keepAlive: true });
    const httpAgent = new TunnelHttpAgent({ tunnel });
    try {
      // TLS is end to end and verified: the certificate names `web`, the cluster's name.
      const body = await new Promise<string>((resolve, reject) => {
        https
          .get({ host: 'web', port: 443, path: '/version', agent: httpsAgent }, (res) => {
            let b = '';
            res.on('data', (d: Buffer) => (b += d.toString()));
            res.on('end', () => resolve(b));
          })
          .on('error', reject);
      });
      expect(JSON.parse(body)).toEqual({ path: '/version' });
      // Plain HTTP to an allowlisted port of the same cluster, addressed by the cluster's name.
      const text = await new Promise<string>((resolve, reject) => {
        http
          .get({ host: 'web', port: plainPort, path: '/x', agent: httpAgent }, (res) => {
            let b = '';
            res.on('data', (d: Buffer) => (b += d.toString()));
            res.on('end', () => resolve(b));
          })
          .on('error', reject);
      });
      expect(text).toBe('plain /x');
      // A dial failure reaches the request as an error naming the destination.
      const err = await new Promise<Error>((resolve) => {
        http
          .get({ host: 'nowhere', port: 80, path: '/', agent: httpAgent }, () => resolve(new Error('unexpected response')))
          .on('error', resolve);
      });
      expect(err).toBeInstanceOf(TunnelError);
      expect((err as TunnelError).reason).toBe('no_agent');
    } finally {
      httpsAgent.destroy();
      httpAgent.destroy();
      await a.stop();
      api.closeAllConnections();
      plain.closeAllConnections();
      await Promise.all([new Promise((r) => api.close(r)), new Promise((r) => plain.close(r))]);
    }
  });
});
