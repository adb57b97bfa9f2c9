// Version skew (docs/upgrades.md): this checkout against the previous release, built from git history by
// scripts/build-release.sh (test/previous-release.json names it; SKEW_BASE=REF picks another commit).
// Both directions with real processes: an older agent under a newer hub and a newer agent under an older
// hub, on every path (bootstrap, mux, gRPC, CONNECT, the gateway, the lease that makes the addon
// Available, certificate renewal); the embedded store written by one version and read by the other, both
// ways; and a rolling upgrade of three replicas on the Kubernetes store, one at a time, under a steady
// load of dials through every replica that is ready, with no failed dial.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Tunnel } from '@cluster-proxy/client';
import { issueServerCert } from '@cluster-proxy/server';
import { echoRoundTripForTest } from '../src/join-helpers.js';
import {
  connectThrough,
  httpsAnswer,
  killAllSpawned,
  runCommand,
  spawnProcess,
  startEchoServer,
  startRecordingApiserver,
  waitFor,
  writeAgentKubeconfig,
  type ManagedProcess,
  type RecordingApiserver,
  type TcpTarget,
} from '../src/fixtures/index.js';
import { startHaFleet, type HaFleet } from '../src/ha-fleet.js';
import { CLI, cliLaunchFlags, createPki, getStatus, startHub, type HubProcess, type TestPki, type UserCert } from '../src/harness.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const previous = JSON.parse(readFileSync(path.join(ROOT, 'test/previous-release.json'), 'utf8')) as { version: string; commit: string };
const BASE = process.env['SKEW_BASE'] ?? previous.commit;
/** The previous release's CLI, built (or found cached) once for this file. */
let OLD: string;

beforeAll(() => {
  const dir = execFileSync('bash', [path.join(ROOT, 'scripts/build-release.sh'), BASE], {
    cwd: ROOT,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
    timeout: 600_000,
  })
    .trim()
    .split('\n')
    .at(-1)!;
  OLD = path.join(dir, 'cli/dist/main.js');
}, 660_000);

afterAll(async () => {
  await killAllSpawned();
});

type Side = 'old' | 'new';
const cliOf = (s: Side): string => (s === 'old' ? OLD : CLI);

describe.each<[Side, Side]>([
  ['new', 'old'],
  ['old', 'new'],
])('hub %s, agent %s', (hubSide, agentSide) => {
  let pki: TestPki;
  let tmp: string;
  let hub: HubProcess;
  let agent: ManagedProcess;
  let echo: TcpTarget;
  let api: RecordingApiserver;
  let user: UserCert;
  const tunnels: Tunnel[] = [];
  const cli = (args: string[]) => runCommand(process.execPath, [cliOf(hubSide), ...args], { timeoutMs: 20_000 });

  beforeAll(async () => {
    pki = await createPki();
    tmp = await mkdtemp(path.join(os.tmpdir(), 'cp-skew-'));
    echo = await startEchoServer();
    api = await startRecordingApiserver(issueServerCert(pki.ca, { commonName: 'apiserver', ipAddresses: ['127.0.0.1'] }));
    hub = await startHub(pki, ['--gateway-port', '0', '--ca-key', path.join(pki.dir, 'ca.key'), '--agent-cert-validity', '20s'], {
      cli: cliOf(hubSide),
    });
    const bundle = path.join(tmp, 'c1-bundle');
    const join = await cli(['join', 'c1', '--out', bundle, '--admin', `127.0.0.1:${hub.ports.admin}`]);
    expect(join.code, join.stderr).toBe(0);
    const kubeconfig = await writeAgentKubeconfig(path.join(tmp, 'agent.kubeconfig'), {
      server: `https://${api.address}`,
      caPath: pki.caPath,
      token: 'sa-token',
    });
    // Bootstrapped as a new cluster's agent is: the join bundle's single-use token traded for a certificate (hub API).
    agent = spawnProcess({
      name: `agent-${agentSide}`,
      command: process.execPath,
      args: [
        ...cliLaunchFlags(cliOf(agentSide)),
        cliOf(agentSide),
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
        path.join(bundle, 'credentials'),
        '--apiserver',
        `127.0.0.1:${echo.port}`,
        '--gateway-kubeconfig',
        kubeconfig,
        '--health-bind-address',
        '127.0.0.1',
        '--health-port',
        '0',
        '--log-format',
        'json',
      ],
    });
    await agent.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 30_000);
    user = await pki.user('dora', ['ops']);
  }, 90_000);

  afterAll(async () => {
    for (const t of tunnels) t.close();
    await agent?.stop(8000);
    await hub?.stop();
    await api?.close();
    await echo?.close();
    if (tmp) await rm(tmp, { recursive: true, force: true });
    await pki?.cleanup();
  });

  it.each(['mux', 'grpc'] as const)('an SDK dial over %s carries bytes both ways', async (transport) => {
    const t = hub.tunnel(transport);
    tunnels.push(t);
    const s = await t.dial('c1:443', { timeoutMs: 10_000 });
    const payload = Buffer.from(`skew ${transport} `.repeat(4096));
    expect((await echoRoundTripForTest(s, payload)).equals(payload)).toBe(true);
    s.destroy();
  });

  it('an HTTP CONNECT through the hub carries bytes both ways', async () => {
    const socket = tls.connect({
      host: '127.0.0.1',
      port: hub.ports.connect!,
      servername: 'localhost',
      ca: pki.ca.certPem,
      cert: user.cert,
      key: user.key,
    });
    const s = await connectThrough(socket, 'c1:443');
    const payload = Buffer.from('skew connect '.repeat(1000));
    expect((await echoRoundTripForTest(s, payload)).equals(payload)).toBe(true);
    s.destroy();
  });

  it("the gateway: the agent believes the hub's identity and impersonates the caller", async () => {
    const r = await httpsAnswer({
      host: '127.0.0.1',
      port: hub.ports.gateway!,
      path: '/c1/version',
      servername: 'localhost',
      ca: pki.ca.certPem,
      cert: user.cert,
      key: user.key,
    });
    expect(r.status, r.body).toBe(200);
    expect(api.requests.at(-1)?.headers['impersonate-user']).toEqual(['dora']);
    expect(api.requests.at(-1)?.headers['impersonate-group']).toEqual(['ops']);
  });

  it("the agent's lease reports make the addon Available", async () => {
    await waitFor(
      async () => {
        const r = await cli(['get', 'managedclusteraddons', '-A', '--admin', `127.0.0.1:${hub.ports.admin}`]);
        return r.code === 0 && /^c1\s+cluster-proxy\s+True\s+False\b/m.test(r.stdout);
      },
      { timeoutMs: 30_000, intervalMs: 500, message: 'the addon of c1 Available' },
    );
  });

  it('the agent renews its certificate through the hub before it expires, and keeps its tunnel', async () => {
    await agent.waitForJsonLine((o) => String(o['msg']).startsWith('agent certificate renewed'), 30_000);
    const t = hub.tunnel('mux');
    tunnels.push(t);
    const s = await t.dial('c1:443', { timeoutMs: 10_000 });
    expect((await echoRoundTripForTest(s, Buffer.from('after renewal'))).toString()).toBe('after renewal');
    s.destroy();
  }, 40_000);
});

describe('the embedded store, written by one version and read by the other', () => {
  let pki: TestPki;
  let dataDir: string;

  beforeAll(async () => {
    pki = await createPki();
    dataDir = await mkdtemp(path.join(pki.dir, 'store-'));
  });
  afterAll(async () => {
    await pki?.cleanup();
  });

  const withHub = async (
    side: Side,
    f: (hub: HubProcess, cli: (args: string[]) => ReturnType<typeof runCommand>) => Promise<void>,
  ): Promise<void> => {
    const hub = await startHub(pki, ['--ca-key', path.join(pki.dir, 'ca.key')], { dataDir, cli: cliOf(side) });
    try {
      await f(hub, (args) => runCommand(process.execPath, [cliOf(side), ...args], { timeoutMs: 20_000 }));
    } finally {
      await hub.stop();
    }
  };
  const clusters = async (cli: (args: string[]) => ReturnType<typeof runCommand>, admin: number): Promise<string[]> => {
    const r = await cli(['get', 'managedclusters', '--admin', `127.0.0.1:${admin}`]);
    expect(r.code, r.stderr).toBe(0);
    return r.stdout
      .trim()
      .split('\n')
      .slice(1)
      .map((l) => l.trim().split(/\s+/)[0]!)
      .sort();
  };

  it('old → new → old: clusters and tokens each wrote stay readable by the other', async () => {
    let oldToken = '';
    await withHub('old', async (hub, cli) => {
      expect((await cli(['join', 'from-old', '--out', path.join(pki.dir, 'b1'), '--admin', `127.0.0.1:${hub.ports.admin}`])).code).toBe(0);
      const t = await cli(['token', 'issue', '--name', 'old-token', '--data-dir', dataDir]);
      expect(t.code, t.stderr).toBe(0);
      oldToken = t.stdout.trim();
    });
    await withHub('new', async (hub, cli) => {
      expect(await clusters(cli, hub.ports.admin)).toEqual(['from-old']);
      expect((await cli(['token', 'list', '--data-dir', dataDir])).stdout).toContain('old-token');
      expect(await connectWithToken(hub, oldToken)).toBe('HTTP/1.1 503');
      expect((await cli(['join', 'from-new', '--out', path.join(pki.dir, 'b2'), '--admin', `127.0.0.1:${hub.ports.admin}`])).code).toBe(0);
    });
    await withHub('old', async (hub, cli) => {
      expect(await clusters(cli, hub.ports.admin)).toEqual(['from-new', 'from-old']);
      expect(await connectWithToken(hub, oldToken)).toBe('HTTP/1.1 503');
    });
  }, 120_000);

  /** A CONNECT with a token to a cluster with no agent: 503 means the token was accepted (407 would be refused). */
  async function connectWithToken(hub: HubProcess, token: string): Promise<string> {
    const socket = tls.connect({ host: '127.0.0.1', port: hub.ports.connect!, servername: 'localhost', ca: pki.ca.certPem });
    try {
      await connectThrough(socket, 'from-old:443', { auth: `Bearer ${token}` });
      return 'HTTP/1.1 200';
    } catch (err) {
      return /HTTP\/1\.1 \d{3}/.exec((err as Error).message)?.[0] ?? (err as Error).message;
    } finally {
      socket.destroy();
    }
  }
});

describe('a rolling upgrade of three replicas on the Kubernetes store, under load', () => {
  let fleet: HaFleet;

  beforeAll(async () => {
    // --shutdown-delay as the chart sets it (5 s there): a dial sent just before the balancer noticed is still taken.
    fleet = await startHaFleet({
      replicas: 3,
      hubArgs: ['--shutdown-delay', '1s'],
      join: 'c1',
      agentIDs: ['a1', 'a2'],
      agentArgs: [],
      cli: OLD,
    });
    await fleet.allAgentsAt(['hub-0', 'hub-1', 'hub-2']);
  }, 120_000);
  afterAll(async () => {
    await fleet?.stop();
  });

  it('each replica in turn: stopped (graceful), started as the new version; no dial fails, agents hold all three again', async () => {
    const ready = new Set([0, 1, 2]);
    const tunnels = new Map<number, Tunnel>();
    const tunnelTo = (i: number): Tunnel => {
      let t = tunnels.get(i);
      // Our own client, not the harness's hub.tunnel(): stopping a HubProcess closes the tunnels it handed out,
      // and the graceful stop under test must be the hub's alone.
      if (!t) {
        tunnels.set(
          i,
          (t = new Tunnel({
            address: `127.0.0.1:${fleet.hubs[i]!.ports.frontend}`,
            serverName: 'localhost',
            caCert: Buffer.from(fleet.pki.ca.certPem),
            cert: readFileSync(fleet.pki.client.certPath),
            key: readFileSync(fleet.pki.client.keyPath),
            transport: 'mux',
          })),
        );
      }
      return t;
    };
    let dials = 0;
    const failures: string[] = [];
    let running = true;
    /** What the upgrade is doing, for a failure's message. */
    let phase = 'before';
    const stoppedLogs: string[] = [];
    // The load: dials with a round trip each, to replicas the balancer would send them to (ready ones).
    const load = (async () => {
      let n = 0;
      while (running) {
        const live = [...ready];
        const i = live[n++ % live.length]!;
        try {
          const s = await tunnelTo(i).dial('c1:443', { timeoutMs: 10_000 });
          const seen: string[] = [];
          s.once('end', () => seen.push('end'));
          s.once('close', () => seen.push('close'));
          s.once('error', (e: Error) => seen.push(`error ${e.message}`));
          const payload = Buffer.from(`dial ${n}`);
          let timer: NodeJS.Timeout | undefined;
          const echoed = await Promise.race([
            echoRoundTripForTest(s, payload),
            new Promise<null>((r) => {
              timer = setTimeout(() => r(null), 10_000);
            }),
          ]);
          clearTimeout(timer);
          s.destroy();
          if (echoed === null) {
            const hubTables = JSON.stringify(await fleet.hubs[i]?.tables().catch(() => null));
            const agentTables = JSON.stringify(await Promise.all(fleet.agents.map((a) => a.tables().catch(() => null))));
            throw new Error(
              `no echo within 10 s (the connection saw: ${seen.join(', ') || 'nothing'}); hub: ${hubTables}; agents: ${agentTables}`,
            );
          }
          if (!echoed.equals(payload)) throw new Error('wrong bytes');
          dials++;
        } catch (err) {
          failures.push(`dial ${n} via hub-${i} (${phase}): ${(err as Error).message}`);
        }
      }
    })();
    // The load stops and its clients close however the upgrade ends (a failed wait too).
    try {
      // Every replica's client connection up and dialing before the first one goes.
      await waitFor(() => dials >= 30 || failures.length > 0, { timeoutMs: 30_000, message: 'the load under way' });
      for (const i of [0, 1, 2]) {
        // Out of the balancer first (no new dials), then a graceful stop that lets the dials in flight finish,
        // as Kubernetes does it; the client's connection to the old process goes with it.
        ready.delete(i);
        phase = `stopping hub-${i}`;
        const stopping = fleet.hubs[i]!;
        await stopping.stop();
        stoppedLogs.push(
          ...stopping.proc
            .lines()
            .slice(-40)
            .map((l) => `hub-${i}: ${l}`),
        );
        phase = `starting hub-${i}`;
        fleet.hubs[i] = null;
        tunnels.get(i)?.close();
        tunnels.delete(i);
        fleet.hubs[i] = await fleet.startReplica(i);
        await waitFor(async () => (await getStatus(fleet.hubs[i]!.ports.health, '/readyz')).status === 200, {
          timeoutMs: 30_000,
          message: `hub-${i} ready`,
        });
        phase = `hub-${i} ready, agents coming back`;
        await fleet.allAgentsAt(['hub-0', 'hub-1', 'hub-2']);
        phase = `hub-${i} back`;
        ready.add(i);
        const before = dials;
        await waitFor(() => dials >= before + 20, { timeoutMs: 30_000, message: 'dials go on after the replica came back' });
      }
    } finally {
      running = false;
      await load;
      for (const t of tunnels.values()) t.close();
    }
    expect(failures, stoppedLogs.filter((l) => !l.includes('"level":20')).join('\n')).toEqual([]);
    expect(dials).toBeGreaterThan(60);
  }, 240_000);
});
