// The agent PROCESS behind a corporate egress proxy (contract §8): real `cluster-proxy agent` and
// `cluster-proxy hub` processes, a real squid. The agent decides proxy/direct from HTTPS_PROXY/NO_PROXY
// (process env, Go's rules), logs `egress: ...` once, and reaches the hub through a CONNECT tunnel.
//
// On loopback the hub is addressed by a name only squid resolves (`hub.internal`, squid's hosts_file),
// so a tunnel that comes up can only have come through squid. Where network namespaces are available
// the same flow also runs with agent, squid and hub in three namespaces and squid as the only path.
import { once } from 'node:events';
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { Tunnel } from '@cluster-proxy/client';
import {
  connectThrough,
  killAllSpawned,
  snapshotHandles,
  spawnProcess,
  startEchoServer,
  waitFor,
  waitForHandlesAtMost,
  type ManagedProcess,
  type SpawnOptions,
  type TcpTarget,
} from '../src/fixtures/index.js';
import { createNetnsLab, netnsUnavailableReason, type NetnsLab } from '../src/fixtures/netns.js';
import { startSquid, type SquidAccessLine, type SquidProxy } from '../src/fixtures/squid.js';
import { echoRoundTripForTest } from '../src/join-helpers.js';
import {
  CLI,
  createPki,
  expectTablesEmpty,
  getJson,
  startHub,
  type AgentProcess,
  type AgentTables,
  type HubProcess,
  type HubTables,
  type TestPki,
} from '../src/harness.js';

const USER = 'alice';
/** Characters that URL-encode differently, so both spellings can be looked for in the logs. */
const PASSWORD = 'pr0xy-S3cret!+';
const WRONG_PASSWORD = 'Wr0ng/pa55?word';
/** Only squid's private hosts file knows this name. */
const HUB_NAME = 'hub.internal';
/** Every proxy variable, removed unless a test sets it: the runner's own environment must not leak in. */
const NO_PROXY_ENV: NodeJS.ProcessEnv = {
  HTTPS_PROXY: undefined,
  https_proxy: undefined,
  HTTP_PROXY: undefined,
  http_proxy: undefined,
  NO_PROXY: undefined,
  no_proxy: undefined,
  ALL_PROXY: undefined,
  all_proxy: undefined,
};

type Json = Record<string, unknown>;

function jsonLines(p: ManagedProcess): Json[] {
  const out: Json[] = [];
  for (const line of p.lines()) {
    if (!line.startsWith('{')) continue;
    try {
      out.push(JSON.parse(line) as Json);
    } catch {
      // not JSON
    }
  }
  return out;
}

const msgOf = (o: Json): string => String(o['msg'] ?? '');
const count = (p: ManagedProcess, msg: string): number => jsonLines(p).filter((o) => msgOf(o) === msg).length;

/** The password, URL-encoded or inside a Proxy-Authorization header, appears in no line of any process. */
function expectSecretNowhere(secret: string, procs: ManagedProcess[]): void {
  const forms = [secret, encodeURIComponent(secret), Buffer.from(`${USER}:${secret}`).toString('base64')];
  for (const p of procs) {
    // lines() keeps the last 2000: make sure that is all of them.
    expect(p.lineCount(), `${p.name} printed more lines than are retained`).toBe(p.lines().length);
    for (const line of p.lines()) {
      for (const f of forms) expect(line.includes(f), `${p.name} logged the proxy password: ${line}`).toBe(false);
    }
  }
}

async function dialEcho(tunnel: Tunnel, dest: string, text = `hello ${dest}`): Promise<void> {
  const s = await tunnel.dial(dest);
  try {
    expect((await echoRoundTripForTest(s, Buffer.from(text))).toString()).toBe(text);
  } finally {
    s.destroy();
  }
}

/** Access-log lines written after `from` lines (CONNECT lines appear when a tunnel *ends*). */
async function waitForAccess(
  squid: SquidProxy,
  from: number,
  predicate: (l: SquidAccessLine) => boolean,
  timeoutMs = 5000,
): Promise<SquidAccessLine> {
  const line = await waitFor(async () => (await squid.accessLog()).slice(from).find(predicate), {
    timeoutMs,
    intervalMs: 50,
    message: `${squid.process().name}: no matching access-log line`,
  });
  if (line === undefined) throw new Error('unreachable: waitFor resolved without a value');
  return line;
}

interface ProxiedAgentOptions {
  cluster: string;
  hubAddress: string;
  apiserver: string;
  env: NodeJS.ProcessEnv;
  args?: string[];
  waitConnected?: boolean;
  /** Starts the process (default spawnProcess); e.g. inside a network namespace. */
  spawn?: (o: SpawnOptions) => ManagedProcess;
  /** Reads the agent's /debug/connections (default: over loopback from here). */
  getJson?: (port: number, path: string) => Promise<unknown>;
}

/** Like harness.startAgent, with the proxy variables in the environment and debug logs. */
async function startProxiedAgent(pki: TestPki, o: ProxiedAgentOptions): Promise<AgentProcess> {
  const cert = await pki.agent(o.cluster);
  const proc = (o.spawn ?? spawnProcess)({
    name: `agent-${o.cluster}`,
    command: process.execPath,
    args: [
      CLI,
      'agent',
      '--cluster',
      o.cluster,
      '--hub',
      o.hubAddress,
      '--server-name',
      'localhost',
      '--ca-cert',
      pki.caPath,
      '--cert',
      cert.certPath,
      '--key',
      cert.keyPath,
      '--apiserver',
      o.apiserver,
      '--health-bind-address',
      '127.0.0.1',
      '--health-port',
      '0',
      '--drain-grace',
      '1s',
      '--log-level',
      'debug',
      ...(o.args ?? []),
    ],
    env: { ...NO_PROXY_ENV, ...o.env },
  });
  const up = await proc.waitForJsonLine((l) => l['msg'] === 'agent health listener up', 15_000);
  const healthPort = Number(up['healthPort']);
  if (o.waitConnected ?? true) await proc.waitForJsonLine((l) => l['msg'] === 'connected to proxy server', 15_000);
  const get = o.getJson ?? getJson;
  return {
    proc,
    healthPort,
    tables: async () => (await get(healthPort, '/debug/connections')) as AgentTables,
    stop: async () => {
      await proc.stop(8000);
    },
  };
}

const egressLine = (a: AgentProcess): Promise<Json> => a.proc.waitForJsonLine((o) => msgOf(o).startsWith('egress: '), 5000);

let pki: TestPki;

beforeAll(async () => {
  pki = await createPki();
});

afterAll(async () => {
  await killAllSpawned();
  await pki?.cleanup();
});

describe('agent process through squid, on loopback (the hub has a name only squid resolves)', () => {
  let hub: HubProcess;
  let echo: TcpTarget;
  /** Basic auth, an extra https_port with its own CA, and `hub.internal` in its hosts file. */
  let squid: SquidProxy;
  /** Closes CONNECT tunnels idle for 10 s (`read_timeout`). */
  let idleSquid: SquidProxy;
  let proxyCaPath: string;
  let tunnel: Tunnel;
  let handles: Map<string, number>;
  let agents: AgentProcess[] = [];
  let hubAddress: string;

  const start = async (o: Omit<ProxiedAgentOptions, 'apiserver' | 'hubAddress'> & { hubAddress?: string }): Promise<AgentProcess> => {
    const a = await startProxiedAgent(pki, { hubAddress, apiserver: `127.0.0.1:${echo.port}`, ...o });
    agents.push(a);
    return a;
  };

  beforeAll(async () => {
    echo = await startEchoServer();
    [hub, squid, idleSquid] = await Promise.all([
      startHub(pki),
      startSquid({ name: 'squid', users: { [USER]: PASSWORD }, https: true, hosts: { [HUB_NAME]: '127.0.0.1' } }),
      startSquid({ name: 'squid-idle', idleTimeoutSeconds: 10, hosts: { [HUB_NAME]: '127.0.0.1' } }),
    ]);
    hubAddress = `${HUB_NAME}:${hub.ports.agent}`;
    proxyCaPath = path.join(pki.dir, 'squid-ca.pem');
    await writeFile(proxyCaPath, squid.caPem!);
  }, 300_000); // startSquid apt-get installs squid when it is missing

  afterAll(async () => {
    await Promise.all([hub?.stop(), squid?.close(), idleSquid?.close()]);
    await echo?.close();
  });

  beforeEach(() => {
    handles = snapshotHandles();
    tunnel = hub.tunnel();
  });

  afterEach(async () => {
    tunnel.close();
    try {
      await expectTablesEmpty(
        hub,
        agents.filter((a) => a.proc.isRunning()),
      );
    } finally {
      await Promise.all(agents.map((a) => a.stop()));
      agents = [];
    }
    await waitForHandlesAtMost(handles, 5000);
  });

  for (const transport of ['mux', 'grpc'] as const) {
    it(`(a) ${transport}: HTTPS_PROXY beats https_proxy and NO_PROXY beats no_proxy; the tunnel comes up through squid, which logs the CONNECT`, async () => {
      const accessFrom = (await squid.accessLog()).length;
      const cluster = `egress-a-${transport}`;
      const agent = await start({
        cluster,
        args: ['--transport', transport],
        env: {
          HTTPS_PROXY: squid.url({ user: USER, password: PASSWORD }).href,
          // Lower-case variants that would break it if they were read: nothing listens on port 1, and
          // no_proxy would send the hub direct (where its name does not resolve).
          https_proxy: 'http://127.0.0.1:1',
          NO_PROXY: 'localhost,127.0.0.1,.svc',
          no_proxy: HUB_NAME,
        },
      });
      const egress = await egressLine(agent);
      const shown = `http://${USER}@127.0.0.1:${squid.port}`;
      expect(egress).toMatchObject({
        decision: 'proxy',
        variable: 'HTTPS_PROXY',
        noProxyVariable: 'NO_PROXY',
        entry: null,
        proxy: shown,
        hub: hubAddress,
      });
      expect(msgOf(egress)).toBe(`egress: connecting to ${hubAddress} through ${shown} from HTTPS_PROXY (not bypassed by NO_PROXY)`);

      await dialEcho(tunnel, `${cluster}:443`);
      expect((await agent.tables()).servers.map((s) => s.transport)).toEqual([transport]);

      // Squid writes a CONNECT line when the tunnel ends.
      await expectTablesEmpty(hub, [agent]);
      await agent.stop();
      const line = await waitForAccess(
        squid,
        accessFrom,
        (l) => l.method === 'CONNECT' && l.url === hubAddress && l.result === 'TCP_TUNNEL/200',
      );
      expect(line.user).toBe(USER);
      expect(count(agent.proc, 'connected to proxy server')).toBe(1);
      expect(jsonLines(agent.proc).filter((o) => msgOf(o).startsWith('egress: '))).toHaveLength(1);
      expectSecretNowhere(PASSWORD, [agent.proc, hub.proc]);
    });
  }

  it('(b) the hub in NO_PROXY: the agent goes direct (and squid sees nothing)', async () => {
    const accessFrom = (await squid.accessLog()).length;
    // 0.0.0.0 is not loopback to Go, so NO_PROXY decides; Linux connects it to the local host, so the
    // direct connection succeeds here. (In namespaces, below, direct has no route and fails.)
    const direct = `0.0.0.0:${hub.ports.agent}`;
    const agent = await start({
      cluster: 'egress-b',
      hubAddress: direct,
      env: { HTTPS_PROXY: squid.url({ user: USER, password: PASSWORD }).href, NO_PROXY: 'localhost,127.0.0.1,.svc,0.0.0.0' },
    });
    const egress = await egressLine(agent);
    const shown = `http://${USER}@127.0.0.1:${squid.port}`;
    expect(egress).toMatchObject({ decision: 'direct', variable: 'HTTPS_PROXY', noProxyVariable: 'NO_PROXY', entry: '0.0.0.0' });
    expect(msgOf(egress)).toBe(
      `egress: 0.0.0.0 is NO_PROXY entry "0.0.0.0" (NO_PROXY): connecting to ${direct} directly, not through ${shown} from HTTPS_PROXY`,
    );
    await dialEcho(tunnel, 'egress-b:443');
    await expectTablesEmpty(hub, [agent]);
    await agent.stop();
    // A known tunnel through squid, opened after the agent's connection ended: once squid has logged
    // it, a tunnel of the agent's would be in the log too.
    const probe = await connectThrough(net.connect(squid.port, '127.0.0.1'), `127.0.0.1:${echo.port}`, {
      auth: `Basic ${Buffer.from(`${USER}:${PASSWORD}`).toString('base64')}`,
    });
    const echoed = once(probe, 'data');
    probe.write('probe');
    await echoed;
    probe.destroy();
    const probeLine = await waitForAccess(squid, accessFrom, (l) => l.method === 'CONNECT' && l.url === `127.0.0.1:${echo.port}`);
    expect((await squid.accessLog()).slice(accessFrom)).toEqual([probeLine]);
    expectSecretNowhere(PASSWORD, [agent.proc, hub.proc]);
  });

  it('(c) wrong proxy password: "proxy authentication failed", retries with growing delays, the password in no log line', async () => {
    const accessFrom = (await squid.accessLog()).length;
    const agent = await start({
      cluster: 'egress-c',
      env: { HTTPS_PROXY: squid.url({ user: USER, password: WRONG_PASSWORD }).href },
      waitConnected: false,
    });
    const isFailure = (o: Json): boolean => msgOf(o).startsWith('cannot connect to hub: ');
    await waitFor(() => jsonLines(agent.proc).filter(isFailure).length >= 6, {
      timeoutMs: 30_000,
      intervalMs: 50,
      message: 'six failed attempts',
    });
    const failures = jsonLines(agent.proc).filter(isFailure).slice(0, 6);
    const expected = `cannot connect to hub: proxy authentication failed (http://${USER}@127.0.0.1:${squid.port} answered 407)`;
    for (const f of failures) expect(msgOf(f)).toBe(expected);
    // The first failure at warn, the repeats at debug (one warning per distinct failure).
    expect(failures.map((f) => f['level'])).toEqual([40, 20, 20, 20, 20, 20]);

    // Exponential backoff with full jitter: attempt i waits uniformly up to 500 ms * 2^i (at least 50 ms).
    const delays = failures.map((f) => Number(f['retryInMs']));
    delays.forEach((d, i) => {
      expect(d).toBeGreaterThanOrEqual(50);
      expect(d).toBeLessThanOrEqual(500 * 2 ** i);
    });
    // Growing: with a fixed 500 ms cap, none of attempts 1-5 would wait longer than 500 ms (chance that
    // the growing caps still give that: 1/2 * 1/4 * 1/8 * 1/16 * 1/32 = 1 in 32768).
    expect(Math.max(...delays.slice(1))).toBeGreaterThan(500);
    // ...and the agent really waited that long between attempts.
    const times = failures.map((f) => Number(f['time']));
    for (let i = 0; i + 1 < times.length; i++) expect(times[i + 1]! - times[i]!).toBeGreaterThanOrEqual(delays[i]! - 2);

    expect(count(agent.proc, 'connected to proxy server')).toBe(0);
    const denied = (await squid.accessLog()).slice(accessFrom).filter((l) => l.result === 'TCP_DENIED/407' && l.url === hubAddress);
    expect(denied.length).toBeGreaterThanOrEqual(1);
    await agent.stop();
    expectSecretNowhere(WRONG_PASSWORD, [agent.proc, hub.proc]);
    expectSecretNowhere(PASSWORD, [agent.proc, hub.proc]);
  });

  it('(d) proxy stopped: "cannot reach proxy"; the tunnel recovers when squid is back on the same port', async () => {
    const agent = await start({ cluster: 'egress-d', env: { HTTPS_PROXY: squid.url({ user: USER, password: PASSWORD }).href } });
    await dialEcho(tunnel, 'egress-d:443');
    const mark = agent.proc.lineCount();
    await squid.stop();
    try {
      await agent.proc.waitForJsonLine((o) => o['msg'] === 'lost connection to proxy server', 10_000, { after: mark });
      // (An attempt that raced squid's shutdown could fail differently first; this one follows.)
      const down = `cannot connect to hub: cannot reach proxy http://${USER}@127.0.0.1:${squid.port}: ECONNREFUSED`;
      const line = await agent.proc.waitForJsonLine((o) => msgOf(o) === down, 10_000, { after: mark });
      expect(line['level']).toBe(40); // a new kind of failure is a warning
    } finally {
      await squid.start();
    }
    const started = performance.now();
    await agent.proc.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 30_000, { after: mark });
    console.log(`(d) agent reconnected ${Math.round(performance.now() - started)} ms after squid was back`);
    await waitFor(async () => (await hub.tables()).agents.some((a) => a.cluster === 'egress-d'), {
      timeoutMs: 5000,
      message: 'hub sees the agent again',
    });
    await dialEcho(tunnel, 'egress-d:443', 'after the proxy came back');
    expect(count(agent.proc, 'connected to proxy server')).toBe(2);
    expectSecretNowhere(PASSWORD, [agent.proc, hub.proc]);
  });

  it('(e) an https:// proxy port with its own CA (--proxy-ca); without it the agent names the TLS problem', async () => {
    const accessFrom = (await squid.accessLog()).length;
    const proxyUrl = squid.url({ user: USER, password: PASSWORD, https: true }).href;
    const shown = `https://${USER}@127.0.0.1:${squid.httpsPort}`;
    const agent = await start({ cluster: 'egress-e', args: ['--proxy-ca', proxyCaPath], env: { HTTPS_PROXY: proxyUrl } });
    expect(await egressLine(agent)).toMatchObject({ decision: 'proxy', variable: 'HTTPS_PROXY', proxy: shown });
    await dialEcho(tunnel, 'egress-e:443');

    // The same proxy without --proxy-ca: Node's bundled roots do not know squid's CA.
    const untrusting = await start({ cluster: 'egress-e2', env: { https_proxy: proxyUrl }, waitConnected: false });
    expect(await egressLine(untrusting)).toMatchObject({ decision: 'proxy', variable: 'https_proxy', noProxyVariable: null });
    const refused = await untrusting.proc.waitForJsonLine((o) => msgOf(o).startsWith('cannot connect to hub: '), 10_000);
    expect(msgOf(refused)).toMatch(
      new RegExp(`^cannot connect to hub: TLS to proxy ${shown.replace(/[.]/g, '\\.')} failed: .+; check the proxy CA bundle$`),
    );
    await untrusting.stop();

    await expectTablesEmpty(hub, [agent]);
    await agent.stop();
    const line = await waitForAccess(
      squid,
      accessFrom,
      (l) => l.method === 'CONNECT' && l.url === hubAddress && l.result === 'TCP_TUNNEL/200',
    );
    expect(line.user).toBe(USER);
    expectSecretNowhere(PASSWORD, [agent.proc, untrusting.proc, hub.proc]);
  });

  it('(f) squid closes tunnels idle for 10 s: with --keepalive-time 5s the tunnel survives 30 s of idle; without, squid cuts it', async () => {
    // The issue asks for 60 s of idle; 30 s (three times squid's idle timeout) keeps the suite fast and
    // proves the same thing: without keepalive traffic squid cuts the tunnel after ~10 s.
    const accessFrom = (await idleSquid.accessLog()).length;
    const env = { HTTPS_PROXY: idleSquid.url().href };
    const [kept, keptGrpc, control] = await Promise.all([
      start({ cluster: 'egress-f', args: ['--keepalive-time', '5s'], env }),
      // gRPC through the loopback shim: HTTP/2 PINGs every 5 s (grpc.keepalive_time_ms).
      start({ cluster: 'egress-fg', args: ['--keepalive-time', '5s', '--transport', 'grpc'], env }),
      // The control: pings every 60 s (the hub's own pings come every 30 s), so the tunnel sits idle.
      start({ cluster: 'egress-f0', args: ['--keepalive-time', '60s'], env }),
    ]);
    await dialEcho(tunnel, 'egress-f:443');
    await dialEcho(tunnel, 'egress-fg:443');
    await sleep(30_000);
    await dialEcho(tunnel, 'egress-f:443', 'still there after 30 s of idle');
    await dialEcho(tunnel, 'egress-fg:443', 'gRPC still there after 30 s of idle');
    // No reconnect: still the first connection.
    for (const a of [kept, keptGrpc]) {
      expect(count(a.proc, 'connected to proxy server'), a.proc.name).toBe(1);
      expect(count(a.proc, 'lost connection to proxy server'), a.proc.name).toBe(0);
    }
    expect((await keptGrpc.tables()).servers.map((s) => s.transport)).toEqual(['grpc']);
    // The control lost its tunnel to squid's read_timeout at least twice (~10 s, ~20 s) and reconnected.
    expect(count(control.proc, 'lost connection to proxy server')).toBeGreaterThanOrEqual(2);
    expect(count(control.proc, 'connected to proxy server')).toBeGreaterThanOrEqual(3);
    // The agents' hub API calls (lease, replica list) go through squid too, each a CONNECT of a few
    // milliseconds; the tunnels squid cut are the long ones.
    const cut = (await idleSquid.accessLog())
      .slice(accessFrom)
      .filter((l) => l.method === 'CONNECT' && l.url === hubAddress && l.elapsedMs > 2_000);
    expect(cut.length).toBeGreaterThanOrEqual(2);
    for (const l of cut) {
      expect(l.elapsedMs).toBeGreaterThan(9_000);
      expect(l.elapsedMs).toBeLessThan(13_000);
    }
  }, 60_000);
});

/*
 * Namespaces: agent <-> proxy <-> hub, no forwarding in the proxy's namespace, squid there as the only
 * way across. The test reaches the hub's frontend through its Unix socket (a file, so it crosses network
 * namespaces) and the hub's and agent's admin endpoints by running `node -e fetch(...)` in their namespace.
 */
describe('agent process in network namespaces: squid is the only way to the hub', () => {
  let lab: NetnsLab | null = null;
  let hub: HubProcess | undefined;
  let nsSquid: SquidProxy | undefined;
  let hubIp = '';
  let hubAddress = '';
  let agents: AgentProcess[] = [];
  let tunnel: Tunnel | undefined;
  let handles: Map<string, number>;
  const ECHO_PORT = 6443;

  const nsGetJson =
    (ns: string) =>
    async (port: number, pathName: string): Promise<unknown> => {
      const script = `fetch('http://127.0.0.1:${port}${pathName}').then(async (r) => { if (!r.ok) throw new Error('HTTP ' + r.status); process.stdout.write(await r.text()); })`;
      const { stdout } = await lab!.exec(ns, process.execPath, ['-e', script], { timeoutMs: 10_000 });
      return JSON.parse(stdout) as unknown;
    };

  beforeAll(async () => {
    lab = await createNetnsLab(['agent', 'proxy', 'hub']);
    if (!lab) {
      console.log(`skipping the namespace variant (the loopback tests above cover the same flow): ${netnsUnavailableReason()}`);
      return;
    }
    const l = lab;
    const agentLink = await l.link('agent', 'proxy');
    const hubLink = await l.link('proxy', 'hub');
    hubIp = hubLink.b.address;

    const dataDir = await mkdtemp(path.join(pki.dir, 'ns-hub-'));
    const uds = path.join(dataDir, 'frontend.sock');
    const proc = l.spawn('hub', {
      name: 'ns-hub',
      command: process.execPath,
      args: [
        CLI,
        'hub',
        '--data-dir',
        dataDir,
        '--bind-address',
        '0.0.0.0',
        '--agent-port',
        '0',
        '--frontend-port',
        '0',
        '--health-port',
        '0',
        '--admin-port',
        '0',
        '--frontend-uds',
        uds,
        '--connect-port',
        '0',
        '--ca-cert',
        pki.caPath,
        '--server-cert',
        pki.server.certPath,
        '--server-key',
        pki.server.keyPath,
      ],
    });
    await proc.waitForJsonLine((o) => o['msg'] === 'proxy server listening', 15_000);
    const ports = JSON.parse(await readFile(path.join(dataDir, 'ports.json'), 'utf8')) as HubProcess['ports'];
    const tunnels: Tunnel[] = [];
    hub = {
      proc,
      dataDir,
      ports,
      tunnel: () => {
        const t = new Tunnel({ address: `unix://${uds}` });
        tunnels.push(t);
        return t;
      },
      tables: async () => (await nsGetJson('hub')(ports.admin, '/debug/connections')) as HubTables,
      stop: async () => {
        for (const t of tunnels) t.close();
        await proc.stop(8000);
      },
    };
    hubAddress = `${HUB_NAME}:${ports.agent}`;

    const apiserver = l.spawn('agent', {
      name: 'ns-apiserver',
      command: process.execPath,
      args: ['-e', `require('node:net').createServer((s) => s.pipe(s)).listen(${ECHO_PORT}, '127.0.0.1', () => console.log('listening'))`],
    });
    await apiserver.waitForLine((line) => line === 'listening', 10_000);
    nsSquid = await startSquid({
      name: 'ns-squid',
      users: { [USER]: PASSWORD },
      listenAddress: agentLink.b.address,
      hosts: { [HUB_NAME]: hubIp },
      spawn: (o) => l.spawn('proxy', o),
    });
  }, 300_000);

  afterAll(async () => {
    await hub?.stop();
    await nsSquid?.close();
    await killAllSpawned();
    await lab?.close();
  });

  beforeEach((ctx) => {
    if (!lab) return ctx.skip();
    handles = snapshotHandles();
    tunnel = hub!.tunnel();
  });

  afterEach(async () => {
    if (!lab || !hub) return;
    tunnel?.close();
    try {
      await expectTablesEmpty(
        hub,
        agents.filter((a) => a.proc.isRunning()),
      );
    } finally {
      await Promise.all(agents.map((a) => a.stop()));
      agents = [];
    }
    await waitForHandlesAtMost(handles, 5000);
  });

  const start = async (
    o: Pick<ProxiedAgentOptions, 'cluster' | 'env' | 'waitConnected'> & { hubAddress?: string },
  ): Promise<AgentProcess> => {
    const a = await startProxiedAgent(pki, {
      hubAddress,
      apiserver: `127.0.0.1:${ECHO_PORT}`,
      spawn: (s) => lab!.spawn('agent', s),
      getJson: nsGetJson('agent'),
      ...o,
    });
    agents.push(a);
    return a;
  };

  it('(a) the tunnel comes up through squid, the only path; squid logs the CONNECT', async () => {
    const accessFrom = (await nsSquid!.accessLog()).length;
    const proxy = nsSquid!.url({ user: USER, password: PASSWORD });
    const agent = await start({ cluster: 'egress-ns', env: { HTTPS_PROXY: proxy.href, NO_PROXY: 'localhost,127.0.0.1,.svc' } });
    expect(await egressLine(agent)).toMatchObject({ decision: 'proxy', variable: 'HTTPS_PROXY', proxy: `http://${USER}@${proxy.host}` });
    await dialEcho(tunnel!, 'egress-ns:443');
    await expectTablesEmpty(hub!, [agent]);
    await agent.stop();
    const line = await waitForAccess(
      nsSquid!,
      accessFrom,
      (l) => l.method === 'CONNECT' && l.url === hubAddress && l.result === 'TCP_TUNNEL/200',
    );
    expect(line.user).toBe(USER);
    expectSecretNowhere(PASSWORD, [agent.proc, hub!.proc]);
  });

  it('(b) the hub in NO_PROXY: the agent goes direct, and fails (no route); squid sees nothing', async () => {
    const accessFrom = (await nsSquid!.accessLog()).length;
    const direct = `${hubIp}:${hub!.ports.agent}`;
    const agent = await start({
      cluster: 'egress-ns-b',
      hubAddress: direct,
      env: { https_proxy: nsSquid!.url({ user: USER, password: PASSWORD }).href, no_proxy: 'localhost,10.200.0.0/16' },
      waitConnected: false,
    });
    const egress = await egressLine(agent);
    expect(egress).toMatchObject({ decision: 'direct', variable: 'https_proxy', noProxyVariable: 'no_proxy', entry: '10.200.0.0/16' });
    expect(msgOf(egress)).toContain(`is inside NO_PROXY entry "10.200.0.0/16" (no_proxy): connecting to ${direct} directly`);
    const failed = await agent.proc.waitForJsonLine((o) => msgOf(o).startsWith('cannot connect to hub: '), 10_000);
    expect(msgOf(failed)).toMatch(/ENETUNREACH|EHOSTUNREACH/);
    await agent.stop();
    expect((await nsSquid!.accessLog()).slice(accessFrom)).toEqual([]);
    expectSecretNowhere(PASSWORD, [agent.proc, hub!.proc]);
  });
});
