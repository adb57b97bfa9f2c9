// A restarted hub replica fails no dial (docs/high-availability.md). Three replicas on the Kubernetes
// store behind a real haproxy, two agents of cluster c1 dialing through it. A replica is restarted and,
// from the moment its /readyz says ready, dials go to it directly (its own ports) with every kind of
// client: our SDK over mux and over gRPC, an ANP konnectivity-client, HTTP CONNECT. The replica is
// ready before the agents have reconnected to it; a dial for c1 waits for them (other replicas' leases
// say c1 has live agents) instead of failing with "No agent available". Agents frozen (SIGSTOP) while
// the replica restarts make the wait certain; the replica stopped while dials wait fails them at once;
// a cluster no replica has an agent of still fails at once, with the usual reason.
import { readFile } from 'node:fs/promises';
import type net from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Tunnel } from '@cluster-proxy/client';
import { echoRoundTripForTest } from '../src/join-helpers.js';
import { AnpClientConn, type AnpTls } from '../src/fixtures/anp-peers.js';
import { connectThrough, waitFor, type FakeKubeApiServer } from '../src/fixtures/index.js';
import { startHaFleet, type HaFleet } from '../src/ha-fleet.js';
import { getStatus, type AgentProcess, type HubProcess } from '../src/harness.js';
import { scrape } from '../src/metrics-text.js';

const REPLICAS = 3;
/** The replica that restarts. */
const R = 1;
/** Generous, so a slow machine cannot turn a wait into a failure; the default (5 s) is the unit tests' business. */
const AGENT_WAIT = '20s';

type Client = 'mux' | 'grpc' | 'anp' | 'connect';
const CLIENTS: Client[] = ['mux', 'grpc', 'anp', 'connect'];

describe('a restarted hub replica: dials wait for the agents of their cluster instead of failing', () => {
  let fleet: HaFleet;
  let api: FakeKubeApiServer;
  let anpTls: AnpTls;
  let hubs: (HubProcess | null)[] = [];
  let agents: AgentProcess[] = [];
  /** SDK tunnels to the replica under test, by transport; closed when it restarts. */
  const tunnels = new Map<'mux' | 'grpc', Tunnel>();

  const startReplica = (i: number): Promise<HubProcess> => fleet.startReplica(i);
  const allAgentsAtEveryReplica = (): Promise<void> => fleet.allAgentsAt(['hub-0', 'hub-1', 'hub-2']);
  /** Each replica's lease lists c1 among the clusters it holds tunnels for: what a restarted replica reads. */
  const leasesListC1 = () =>
    waitFor(
      async () => {
        const { items } = await api.store.list('Lease', { labels: { 'proxy.open-cluster-management.io/server-replica': 'true' } });
        return (
          items.length === REPLICAS &&
          items.every((l) => l.metadata.annotations?.['proxy.open-cluster-management.io/tunnel-clusters'] === 'c1')
        );
      },
      { timeoutMs: 20_000, intervalMs: 250, message: 'every replica lease lists c1' },
    );
  const waits = async (h: HubProcess): Promise<Record<string, number>> => {
    const m = await scrape(h.ports.health);
    return Object.fromEntries(
      ['connected', 'timeout', 'cancelled', 'shutdown', 'full'].map((r) => [
        r,
        m.value('cluster_proxy_server_agent_waits_total', { result: r }),
      ]),
    );
  };
  const waitingNow = async (h: HubProcess): Promise<number> =>
    (await scrape(h.ports.health)).value('cluster_proxy_server_agent_waiting_dials');

  const tunnel = (h: HubProcess, transport: 'mux' | 'grpc'): Tunnel => {
    let t = tunnels.get(transport);
    if (!t) tunnels.set(transport, (t = h.tunnel(transport)));
    return t;
  };
  const closeTunnels = (): void => {
    for (const t of tunnels.values()) t.close();
    tunnels.clear();
  };

  /** One dial of `destination` through replica `h` with `client`, and one echo round trip over it. */
  const dialVia = async (h: HubProcess, client: Client, destination = 'c1:443'): Promise<void> => {
    let s: net.Socket | AnpClientConn | Awaited<ReturnType<Tunnel['dial']>>;
    if (client === 'anp') {
      const c = new AnpClientConn(`127.0.0.1:${h.ports.frontend}`, anpTls, destination);
      try {
        await c.connected;
      } catch (err) {
        c.destroy();
        throw err;
      }
      s = c;
    } else if (client === 'connect') {
      s = await connectThrough(
        tls.connect({
          host: '127.0.0.1',
          port: h.ports.connect!,
          servername: 'localhost',
          ca: anpTls.ca,
          cert: anpTls.cert,
          key: anpTls.key,
        }),
        destination,
      );
    } else s = await tunnel(h, client).dial(destination, { timeoutMs: 60_000 });
    try {
      expect((await echoRoundTripForTest(s, Buffer.from(`hi ${client}`))).toString()).toBe(`hi ${client}`);
    } finally {
      s.destroy();
    }
  };

  /** SIGTERM the replica under test and start it again on its ports; resolves once its /readyz says ready. */
  const restart = async (): Promise<HubProcess> => {
    closeTunnels();
    await hubs[R]!.stop();
    hubs[R] = null;
    const h = await startReplica(R);
    hubs[R] = h;
    await waitFor(async () => (await getStatus(h.ports.health, '/readyz')).status === 200, {
      timeoutMs: 10_000,
      intervalMs: 20,
      message: 'restarted replica ready',
    });
    return h;
  };

  /** Agents frozen (SIGSTOP) for the duration of `work`: they cannot reconnect to anyone meanwhile. */
  const withAgentsFrozen = async <T>(work: () => Promise<T>): Promise<T> => {
    for (const a of agents) a.proc.kill('SIGSTOP');
    try {
      return await work();
    } finally {
      for (const a of agents) a.proc.kill('SIGCONT');
    }
  };

  beforeAll(async () => {
    // c2 is registered but no agent of it ever runs: the store knows the cluster, no replica has a tunnel.
    fleet = await startHaFleet({
      replicas: REPLICAS,
      hubArgs: ['--agent-wait', AGENT_WAIT],
      join: 'c2',
      agentIDs: ['agent-a', 'agent-b'],
      agentArgs: ['--replica-sync-interval', '500ms', '--keepalive-time', '2s', '--keepalive-timeout', '2s'],
    });
    ({ api, hubs, agents } = fleet);
    anpTls = {
      ca: Buffer.from(fleet.pki.ca.certPem),
      cert: await readFile(fleet.pki.client.certPath),
      key: await readFile(fleet.pki.client.keyPath),
      serverName: 'localhost',
    };
    await allAgentsAtEveryReplica();
    await leasesListC1();
  }, 120_000);

  afterAll(async () => {
    closeTunnels();
    await fleet?.stop();
  });

  it('SIGTERM and start again: every dial through the restarted replica from its /readyz on succeeds, with every kind of client', async () => {
    const h = await restart();
    const failures: string[] = [];
    let n = 0;
    let back = -1;
    const started = Date.now();
    // Until the agents are back at this replica and 40 dials after that (2,000 at most).
    while (n < 2000 && (back < 0 || n < back + 40)) {
      const client = CLIENTS[n % CLIENTS.length]!;
      n++;
      try {
        await dialVia(h, client);
      } catch (err) {
        failures.push(`dial ${n} (${client}, +${Date.now() - started} ms after ready): ${(err as Error).message}`);
      }
      if (back < 0 && (await h.tables()).agents.length === 2) back = n;
    }
    const w = await waits(h);
    console.log(`restarted replica: ${n} dials from /readyz, agents back after dial ${back}; ${w.connected} dials waited for them`);
    expect(failures).toEqual([]);
    expect(back).toBeGreaterThan(0);
    expect(w.timeout + w.full + w.shutdown).toBe(0);
    await allAgentsAtEveryReplica();
  }, 120_000);

  it('agents slow to come back (frozen while the replica restarts): dials wait, then go through once they connect', async () => {
    const pending = await withAgentsFrozen(async () => {
      const h = await restart();
      expect((await h.tables()).agents).toEqual([]);
      // One dial per kind of client, all waiting for an agent of c1.
      const dials = CLIENTS.map((c) =>
        dialVia(h, c).then(
          () => 'ok',
          (err: Error) => `${c}: ${err.message}`,
        ),
      );
      await waitFor(async () => (await waitingNow(h)) === CLIENTS.length, {
        timeoutMs: 15_000,
        intervalMs: 50,
        message: `${CLIENTS.length} dials waiting for an agent`,
      });
      return { h, dials };
    });
    expect(await Promise.all(pending.dials)).toEqual(CLIENTS.map(() => 'ok'));
    expect(await waits(pending.h)).toEqual({ connected: CLIENTS.length, timeout: 0, cancelled: 0, shutdown: 0, full: 0 });
    expect(await waitingNow(pending.h)).toBe(0);
    await allAgentsAtEveryReplica();
  }, 120_000);

  it('the replica stops while dials wait: they fail at once as "shutting down", and it exits', async () => {
    await withAgentsFrozen(async () => {
      const h = await restart();
      const dials = CLIENTS.map((c) =>
        dialVia(h, c).then(
          () => 'ok',
          (err: Error) => err.message,
        ),
      );
      await waitFor(async () => (await waitingNow(h)) === CLIENTS.length, {
        timeoutMs: 15_000,
        intervalMs: 50,
        message: `${CLIENTS.length} dials waiting for an agent`,
      });
      h.proc.kill('SIGTERM');
      const outcomes = await Promise.all(dials);
      for (const o of outcomes) expect(o).toMatch(/this proxy server is shutting down; dial c1:443 through another replica/);
      const exit = await h.proc.exited;
      expect(exit.code).toBe(0);
      closeTunnels();
      hubs[R] = null;
    });
    hubs[R] = await startReplica(R);
    await allAgentsAtEveryReplica();
  }, 120_000);

  it('a cluster no replica has an agent of (registered c2, unknown nobody) fails at once with the usual reason: no wait', async () => {
    const h = hubs[R]!;
    await waitFor(async () => (await h.tables()).agents.length === 2, {
      timeoutMs: 15_000,
      intervalMs: 100,
      message: 'agents at the replica',
    });
    const before = await waits(h);
    for (const destination of ['c2:443', 'nobody:443']) {
      for (const client of CLIENTS) {
        // The plain message: a dial that had waited would say what it waited for.
        const err = await dialVia(h, client, destination).then(
          () => null,
          (e: Error) => e,
        );
        expect(err?.message, `${client} ${destination}`).toContain(`No agent available for ${destination}`);
        expect(err?.message, `${client} ${destination}`).not.toMatch(/none of cluster|within/);
      }
    }
    expect(await waits(h)).toEqual(before);
    // And c1 still goes straight through.
    for (const client of CLIENTS) await dialVia(h, client);
  }, 60_000);
});
