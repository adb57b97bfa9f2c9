// The agent's egress-proxy building blocks against a real squid on loopback: CONNECT tunnels
// (http:// and https:// proxy ports), Basic auth, policy refusals, a stopped proxy, and how squid
// treats idle tunnels.
import { once } from 'node:events';
import type net from 'node:net';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { createCA } from '@cluster-proxy/server';
import { connectThroughProxy, EgressProxyError } from '@cluster-proxy/agent';
import {
  killAllSpawned,
  snapshotHandles,
  startEchoServer,
  startSinkServer,
  waitFor,
  waitForHandlesAtMost,
  type SinkServer,
  type TcpTarget,
} from '../src/fixtures/index.js';
import { createNetnsLab, netnsUnavailableReason, type NetnsLab } from '../src/fixtures/netns.js';
import { startSquid, type SquidProxy } from '../src/fixtures/squid.js';
import { echoRoundTripForTest as echoRoundTrip } from '../src/join-helpers.js';

const USER = 'alice';
const PASSWORD = 'pr0xy-S3cret!';
/** Only squid's private hosts file knows this name (it stands in for a hub reachable only via the proxy). */
const HUB_NAME = 'hub.squid-only.test';

let squid: SquidProxy;
let idleSquid: SquidProxy;
let echo: TcpTarget;
let denied: TcpTarget;
let sink: SinkServer;
let handles: Map<string, number>;

beforeAll(async () => {
  [echo, denied, sink] = await Promise.all([startEchoServer(), startEchoServer(), startSinkServer()]);
  [squid, idleSquid] = await Promise.all([
    startSquid({ name: 'squid', users: { [USER]: PASSWORD }, https: true, denyPorts: [denied.port], hosts: { [HUB_NAME]: '127.0.0.1' } }),
    startSquid({ name: 'squid-idle', idleTimeoutSeconds: 10 }),
  ]);
}, 300_000); // startSquid apt-get installs squid when it is missing

afterAll(async () => {
  await Promise.all([squid?.close(), idleSquid?.close()]);
  await killAllSpawned();
  await Promise.all([echo?.close(), denied?.close(), sink?.close()]);
});

beforeEach(() => {
  handles = snapshotHandles();
});

afterEach(async () => {
  await waitForHandlesAtMost(handles, 5000);
});

async function destroyAndWait(s: net.Socket): Promise<void> {
  if (s.closed) return;
  const closed = once(s, 'close');
  s.destroy();
  await closed;
}

async function expectProxyError(p: Promise<net.Socket>): Promise<EgressProxyError> {
  let socket: net.Socket | undefined;
  try {
    socket = await p;
  } catch (err) {
    expect(err).toBeInstanceOf(EgressProxyError);
    return err as EgressProxyError;
  }
  await destroyAndWait(socket);
  throw new Error('expected connectThroughProxy to fail');
}

async function squidLogs(): Promise<string> {
  const access = (await squid.accessLog()).map((l) => l.raw).join('\n');
  return `${access}\n${await squid.cacheLog()}\n${squid.process().lines().join('\n')}`;
}

describe('connectThroughProxy through squid', () => {
  it('tunnels to a name only squid can resolve, and squid logs the CONNECT', async () => {
    const s = await connectThroughProxy({
      proxy: squid.url({ user: USER, password: PASSWORD }),
      target: { host: HUB_NAME, port: echo.port },
      timeoutMs: 5000,
    });
    expect((await echoRoundTrip(s, Buffer.from('hello through squid'))).toString()).toBe('hello through squid');
    await destroyAndWait(s);
    // Squid writes a CONNECT line when the tunnel ends.
    const line = await squid.waitForAccessLog((l) => l.method === 'CONNECT' && l.url === `${HUB_NAME}:${echo.port}`, 5000);
    expect(line.result).toBe('TCP_TUNNEL/200');
    expect(line.user).toBe(USER);
  });

  it('a wrong password is "proxy authentication failed", and the password is in no message or log', async () => {
    const wrong = 'not-the-password-42';
    const e = await expectProxyError(
      connectThroughProxy({
        proxy: squid.url({ user: USER, password: wrong }),
        target: { host: '127.0.0.1', port: echo.port },
        timeoutMs: 5000,
      }),
    );
    expect(e.kind).toBe('auth');
    expect(e.statusCode).toBe(407);
    expect(e.message).toBe(`proxy authentication failed (http://${USER}@127.0.0.1:${squid.port} answered 407)`);
    expect(`${e.message}\n${e.proxy}\n${e.stack}`).not.toContain(wrong);
    await squid.waitForAccessLog((l) => l.result === 'TCP_DENIED/407' && l.url === `127.0.0.1:${echo.port}`, 5000);
    const logs = await squidLogs();
    expect(logs).not.toContain(wrong);
    expect(logs).not.toContain(PASSWORD);
  });

  it('no credentials at all: "proxy authentication required"', async () => {
    const e = await expectProxyError(
      connectThroughProxy({ proxy: squid.url(), target: { host: '127.0.0.1', port: echo.port }, timeoutMs: 5000 }),
    );
    expect(e.kind).toBe('auth');
    expect(e.message).toBe(
      `proxy authentication required (http://127.0.0.1:${squid.port} answered 407 and the proxy URL has no user name and password)`,
    );
  });

  it('a port squid denies: "proxy refused CONNECT to HOST:PORT (403 Forbidden ...)"', async () => {
    const e = await expectProxyError(
      connectThroughProxy({
        proxy: squid.url({ user: USER, password: PASSWORD }),
        target: { host: '127.0.0.1', port: denied.port },
        timeoutMs: 5000,
      }),
    );
    expect(e.kind).toBe('refused');
    expect(e.statusCode).toBe(403);
    expect(e.message).toBe(
      `proxy refused CONNECT to 127.0.0.1:${denied.port} (403 Forbidden from http://${USER}@127.0.0.1:${squid.port}, ERR_ACCESS_DENIED 0)`,
    );
  });

  it('a destination squid cannot reach: the status squid answers with', async () => {
    const e = await expectProxyError(
      connectThroughProxy({
        proxy: squid.url({ user: USER, password: PASSWORD }),
        target: { host: '127.0.0.1', port: 1 },
        timeoutMs: 5000,
      }),
    );
    expect(e.kind).toBe('status');
    expect(e.statusCode).toBe(503);
    expect(e.message).toMatch(
      new RegExp(
        `^proxy http://${USER}@127.0.0.1:${squid.port} answered CONNECT to 127.0.0.1:1 with 503 Service Unavailable, ERR_CONNECT_FAIL 111$`,
      ),
    );
  });

  it('https:// proxy port: TLS verified against its CA; a wrong CA or the system roots fail clearly', async () => {
    const proxy = squid.url({ user: USER, password: PASSWORD, https: true });
    const s = await connectThroughProxy({ proxy, ca: squid.caPem!, target: { host: HUB_NAME, port: echo.port }, timeoutMs: 5000 });
    expect(s.constructor.name).toBe('TLSSocket');
    expect((await echoRoundTrip(s, Buffer.from('over tls to the proxy'))).toString()).toBe('over tls to the proxy');
    await destroyAndWait(s);

    const otherCa = createCA({ commonName: 'not-the-squid-ca' });
    for (const ca of [otherCa.certPem, undefined]) {
      const e = await expectProxyError(
        connectThroughProxy({ proxy, ...(ca ? { ca } : {}), target: { host: HUB_NAME, port: echo.port }, timeoutMs: 5000 }),
      );
      expect(e.kind).toBe('tls');
      expect(e.message).toMatch(
        new RegExp(`^TLS to proxy https://${USER}@127.0.0.1:${squid.httpsPort} failed: .+; check the proxy CA bundle$`),
      );
      expect(e.message).not.toContain('\n');
      expect(e.message).not.toContain(PASSWORD);
    }
  });

  it('http:// pointed at the TLS port is a protocol error that says so', async () => {
    const e = await expectProxyError(
      connectThroughProxy({
        proxy: new URL(`http://127.0.0.1:${squid.httpsPort}`),
        target: { host: HUB_NAME, port: echo.port },
        timeoutMs: 5000,
      }),
    );
    expect(e.kind).toBe('protocol');
    expect(e.message).toBe(`proxy http://127.0.0.1:${squid.httpsPort} answered CONNECT with TLS, not HTTP: is it an https:// proxy?`);
  });

  it('a stopped proxy is "cannot reach proxy"; it works again once squid is back', async () => {
    const proxy = squid.url({ user: USER, password: PASSWORD });
    await squid.stop();
    const e = await expectProxyError(connectThroughProxy({ proxy, target: { host: HUB_NAME, port: echo.port }, timeoutMs: 5000 }));
    expect(e).toMatchObject({ kind: 'unreachable', code: 'ECONNREFUSED' });
    expect(e.message).toBe(`cannot reach proxy http://${USER}@127.0.0.1:${squid.port}: ECONNREFUSED`);
    await squid.start();
    const s = await connectThroughProxy({ proxy, target: { host: HUB_NAME, port: echo.port }, timeoutMs: 5000 });
    expect((await echoRoundTrip(s, Buffer.from('back'))).toString()).toBe('back');
    await destroyAndWait(s);
  });
});

describe('squid closing idle tunnels (read_timeout 10 s)', () => {
  it('closes an idle CONNECT tunnel after ~10 s; tunnels with traffic every 2 s (echoed or one-way) survive', async () => {
    const open = (port: number): Promise<net.Socket> =>
      connectThroughProxy({ proxy: idleSquid.url(), target: { host: '127.0.0.1', port }, timeoutMs: 5000 });
    const [idle, pinged, oneWay] = await Promise.all([open(echo.port), open(echo.port), open(sink.port)]);
    const t0 = performance.now();
    const closedAt = new Map<string, number>();
    for (const [name, s] of [
      ['idle', idle],
      ['pinged', pinged],
      ['oneWay', oneWay],
    ] as const) {
      s.on('error', () => {});
      s.on('data', () => {});
      s.once('close', () => closedAt.set(name, performance.now() - t0));
    }
    // Pings sent and echoed, and bytes of the one-way tunnel the sink has read: the passes that came through.
    let pings = 0;
    let echoed = 0;
    pinged.on('data', (d: Buffer) => (echoed += d.length));
    const sunk = sink.bytesReceived();
    const timer = setInterval(() => {
      pings++;
      pinged.write('p');
      oneWay.write('q');
    }, 2000);
    try {
      await once(idle, 'close');
      const idleMs = closedAt.get('idle')!;
      // Measured, for the transport: the keepalive interval must stay well below this.
      console.log(`squid read_timeout 10 s closed the idle tunnel after ${Math.round(idleMs)} ms`);
      expect(idleMs).toBeGreaterThan(9_000);
      expect(idleMs).toBeLessThan(13_000);
      // Two more passes through both tunnels after the idle one was gone: had squid not counted their
      // traffic, they would have been closed with it.
      const passes = pings;
      await waitFor(() => echoed >= passes + 2 && sink.bytesReceived() - sunk >= passes + 2, {
        timeoutMs: 10_000,
        intervalMs: 50,
        message: 'two more pings through both tunnels',
      });
      expect(closedAt.has('pinged')).toBe(false);
      expect(closedAt.has('oneWay')).toBe(false);
      clearInterval(timer);
      await waitFor(() => echoed === pings, { timeoutMs: 5000, message: "the last ping's echo" });
      expect((await echoRoundTrip(pinged, Buffer.from('still here'))).toString()).toBe('still here');
    } finally {
      clearInterval(timer);
      await Promise.all([destroyAndWait(idle), destroyAndWait(pinged), destroyAndWait(oneWay)]);
    }
    const line = await idleSquid.waitForAccessLog((l) => l.method === 'CONNECT' && l.elapsedMs >= 9_000 && l.elapsedMs < 13_000, 5000);
    expect(line.result).toBe('TCP_TUNNEL/200');
  });
});

/*
 * "The agent cannot reach the hub except through the proxy", for real: three network namespaces,
 * agent <-> proxy <-> hub, no forwarding in the proxy's namespace, squid there as the only way across.
 * The agent side runs in a child process inside its namespace, using the built agent modules.
 */
const EGRESS_MODULE = fileURLToPath(new URL('../../agent/dist/egress-proxy.js', import.meta.url));
const NO_PROXY_MODULE = fileURLToPath(new URL('../../agent/dist/no-proxy.js', import.meta.url));

/** Decides like the agent (proxyFromEnvironment), then dials; prints one JSON line. */
const AGENT_SCRIPT = `
const net = await import('node:net');
const { connectThroughProxy } = await import(process.argv[1]);
const { proxyFromEnvironment } = await import(process.argv[2]);
const [host, port] = [process.argv[3], Number(process.argv[4])];
const d = proxyFromEnvironment(process.env, host, port);
const out = { decision: d.decision, variable: d.variable, reason: d.reason };
try {
  const s = d.proxy
    ? await connectThroughProxy({ proxy: d.proxy, target: { host, port }, timeoutMs: 5000 })
    : await new Promise((resolve, reject) => {
        const c = net.connect({ host, port, timeout: 2000 });
        c.once('connect', () => resolve(c));
        c.once('error', reject);
        c.once('timeout', () => { c.destroy(); reject(Object.assign(new Error('timeout'), { code: 'ETIMEDOUT' })); });
      });
  // No half-close: squid tears a CONNECT tunnel down both ways when one side sends FIN.
  const msg = 'ping through the proxy';
  s.write(msg);
  let got = '';
  for await (const chunk of s) {
    got += chunk;
    if (got.length >= msg.length) break;
  }
  s.destroy();
  out.echo = got;
} catch (e) {
  out.error = e.code ?? e.kind ?? e.message;
  out.message = e.message;
}
console.log(JSON.stringify(out));
`;

const NS_ECHO = `
const net = require('node:net');
net.createServer((s) => s.pipe(s)).listen(8091, process.argv[1], () => console.log('listening'));
`;

describe('through network namespaces (agent <-> proxy <-> hub)', () => {
  let lab: NetnsLab | null = null;
  let nsSquid: SquidProxy | undefined;
  let hubAddress = '';

  beforeAll(async () => {
    lab = await createNetnsLab(['agent', 'proxy', 'hub']);
    if (!lab) {
      console.log(`skipping the namespace tests (the loopback tests above cover the same flow): ${netnsUnavailableReason()}`);
      return;
    }
    const agentLink = await lab.link('agent', 'proxy');
    const hubLink = await lab.link('proxy', 'hub');
    hubAddress = hubLink.b.address;
    const hubEcho = lab.spawn('hub', { name: 'ns-hub-echo', command: process.execPath, args: ['-e', NS_ECHO, hubAddress] });
    await hubEcho.waitForLine((l) => l === 'listening', 10_000);
    const l = lab;
    nsSquid = await startSquid({
      name: 'ns-squid',
      users: { [USER]: PASSWORD },
      listenAddress: agentLink.b.address,
      hosts: { 'hub.internal': hubAddress },
      spawn: (o) => l.spawn('proxy', o),
    });
  });

  afterAll(async () => {
    await nsSquid?.close();
    await killAllSpawned();
    await lab?.close();
  });

  async function runAgent(env: Record<string, string>, host: string): Promise<Record<string, string>> {
    const { stdout } = await lab!.exec('agent', 'env', [
      ...Object.entries(env).map(([k, v]) => `${k}=${v}`),
      process.execPath,
      '--input-type=module',
      '-e',
      AGENT_SCRIPT,
      EGRESS_MODULE,
      NO_PROXY_MODULE,
      host,
      '8091',
    ]);
    return JSON.parse(stdout.trim().split('\n').at(-1)!) as Record<string, string>;
  }

  it('the agent reaches the hub only through squid; squid logs the CONNECT', async (ctx) => {
    if (!lab || !nsSquid) return ctx.skip();
    const proxy = nsSquid.url({ user: USER, password: PASSWORD }).href;
    // Without the proxy there is no way across.
    const direct = await runAgent({}, hubAddress);
    expect(direct).toMatchObject({ decision: 'direct', error: 'ENETUNREACH' });
    // Through squid, by a name only squid can resolve.
    const viaProxy = await runAgent({ HTTPS_PROXY: proxy, NO_PROXY: 'localhost,127.0.0.1,.svc' }, 'hub.internal');
    expect(viaProxy).toMatchObject({ decision: 'proxy', variable: 'HTTPS_PROXY', echo: 'ping through the proxy' });
    expect(viaProxy.reason).not.toContain(PASSWORD);
    const line = await nsSquid.waitForAccessLog((l) => l.method === 'CONNECT' && l.url === 'hub.internal:8091', 5000);
    expect(line).toMatchObject({ result: 'TCP_TUNNEL/200', user: USER });
  });

  it('with the hub in NO_PROXY the agent goes direct, and fails: there is no route', async (ctx) => {
    if (!lab || !nsSquid) return ctx.skip();
    const r = await runAgent(
      {
        https_proxy: nsSquid.url({ user: USER, password: PASSWORD }).href,
        no_proxy: `${hubAddress.split('.').slice(0, 3).join('.')}.0/24`,
      },
      hubAddress,
    );
    expect(r).toMatchObject({ decision: 'direct', variable: 'https_proxy', error: 'ENETUNREACH' });
    expect(r.reason).toContain('NO_PROXY entry');
  });
});
