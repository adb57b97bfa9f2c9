// The agent's replica sync against a real hub API (TLS on the agent port): the live list reaches the
// agent; a hub without the endpoint (an ANP server answers 404) switches it off for good, leaving the
// agent on ANP's serverCount header; a malformed answer changes nothing; beside a lease renewer, a hub
// that answers renewals with the list is asked with renewals alone, an older one with GET /v1/replicas.
// The agent side is a recorder.
import pino from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import { AgentMetrics, LeaseRenewer, ReplicaSync, type Agent } from '@cluster-proxy/agent';
import { ProxyServer, createCA, issueAgentCert, issueServerCert } from '@cluster-proxy/server';
import { waitFor } from './fixtures/index.js';

const ca = createCA({ commonName: 'replica-sync-test' });
const serving = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'], ipAddresses: ['127.0.0.1'] });
const agentCert = issueAgentCert(ca, { cluster: 'c1' });

async function hubWith(answer: (() => unknown) | null, renewal?: () => unknown): Promise<{ server: ProxyServer; address: string }> {
  const server = new ProxyServer({
    bindAddress: '127.0.0.1',
    agentPort: 0,
    frontendPort: null,
    healthPort: null,
    adminPort: null,
    tls: { caCert: Buffer.from(ca.certPem), cert: Buffer.from(serving.certPem), key: Buffer.from(serving.keyPem) },
    log: pino({ level: 'silent' }),
  });
  if (answer) server.hubApi.route('GET', '/v1/replicas', async () => ({ status: 200, body: answer() }), { agentOnly: true });
  if (renewal) server.hubApi.route('POST', '/v1/lease', async () => ({ status: 200, body: renewal() }), { agentOnly: true });
  const ports = await server.start();
  return { server, address: `127.0.0.1:${ports.agent}` };
}

function recordingAgent(): { agent: Agent; calls: [string[], number][]; spreads: number[]; metrics: AgentMetrics } {
  const metrics = new AgentMetrics();
  const calls: [string[], number][] = [];
  const spreads: number[] = [];
  const agent = {
    agentID: 'agent-1',
    serverCount: 1,
    connectedServers: 1,
    currentTrust: Buffer.from(ca.certPem),
    currentCredentials: { cert: Buffer.from(agentCert.certPem), key: Buffer.from(agentCert.keyPem) },
    setReplicas: (ids: readonly string[], count: number) => {
      calls.push([[...ids], count]);
    },
    setReconnectSpread: (ms: number) => {
      spreads.push(ms);
    },
    metrics,
  } as unknown as Agent;
  return { agent, calls, spreads, metrics };
}

describe('ReplicaSync', () => {
  const stops: (() => Promise<void> | void)[] = [];
  afterAll(async () => {
    for (const s of stops.reverse()) await s();
  });

  it("hands the hub's live replica list to the agent, every interval", async () => {
    const hub = await hubWith(() => ({
      serverCount: 2,
      replicas: [{ serverID: 'hub-a' }, { serverID: 'hub-b' }],
      reconnectSpreadSeconds: 3,
    }));
    stops.push(() => hub.server.stop(100));
    const { agent, calls, spreads, metrics } = recordingAgent();
    const sync = new ReplicaSync({
      agent,
      hub: { address: hub.address, serverName: 'localhost' },
      intervalMs: 100,
      log: pino({ level: 'silent' }),
    });
    stops.push(() => sync.stop());
    sync.start();
    await waitFor(() => calls.length >= 2, { timeoutMs: 5000, message: 'two syncs' });
    expect(calls[0]).toEqual([['hub-a', 'hub-b'], 2]);
    // The hub's reconnect spread (sized from its fleet) reaches the agent too.
    expect(spreads[0]).toBe(3000);
    // Each answer counts as one of ANP's lease lists, with its HTTP status.
    const text = (await metrics.expose()).body;
    expect(
      Number(/^konnectivity_network_proxy_agent_lease_lists_total\{http_response_code="200",reason=""\} (\d+)$/m.exec(text)?.[1]),
    ).toBeGreaterThanOrEqual(2);
    expect(text).toMatch(/^konnectivity_network_proxy_agent_lease_list_latency_seconds_count\{http_response_code="200"\} [1-9]/m);
  });

  it('a hub without the endpoint (404, an ANP server) turns it off for good; a malformed answer changes nothing', async () => {
    const anp = await hubWith(null);
    stops.push(() => anp.server.stop(100));
    const lines: string[] = [];
    const log = pino(
      { level: 'info' },
      {
        write: (l: string) => {
          lines.push(l);
        },
      },
    );
    const { agent, calls } = recordingAgent();
    const sync = new ReplicaSync({ agent, hub: { address: anp.address, serverName: 'localhost' }, intervalMs: 50, log });
    stops.push(() => sync.stop());
    sync.start();
    await waitFor(() => lines.some((l) => l.includes('publishes no replica list')), { timeoutMs: 5000, message: 'fallback logged' });
    // Nothing runs and nothing is scheduled any more: no further request, ever.
    expect(sync.idle).toBe(true);
    expect(lines.filter((l) => l.includes('publishes no replica list'))).toHaveLength(1);
    expect(calls).toEqual([]);
    expect((await agent.metrics.expose()).body).toMatch(
      /^konnectivity_network_proxy_agent_lease_lists_total\{http_response_code="404",reason=""\} 1$/m,
    );

    let asked = 0;
    const odd = await hubWith(() => {
      asked++;
      return { replicas: 'hub-a' };
    });
    stops.push(() => odd.server.stop(100));
    const second = recordingAgent();
    const s2 = new ReplicaSync({
      agent: second.agent,
      hub: { address: odd.address, serverName: 'localhost' },
      intervalMs: 50,
      log: pino({ level: 'silent' }),
    });
    stops.push(() => s2.stop());
    s2.start();
    await waitFor(() => asked >= 2, { timeoutMs: 5000, message: 'the agent kept asking' });
    expect(s2.idle).toBe(false);
    expect(second.calls).toEqual([]);
  });

  it('beside a lease renewer: the list comes with the renewals, one request per interval; from an older hub, by GET', async () => {
    const list = { serverCount: 2, replicas: [{ serverID: 'hub-a' }, { serverID: 'hub-b' }], syncIntervalSeconds: 0.2 };
    const log = pino({ level: 'silent' });
    /** A hub counting renewals and list requests, an agent with a lease renewer and a sync against it. */
    const renewingAgent = async (listInRenewals: boolean) => {
      const asked = { renewals: 0, lists: 0 };
      const hub = await hubWith(
        () => {
          asked.lists++;
          return list;
        },
        () => {
          asked.renewals++;
          // renewIntervalSeconds: unchanged reports every 10 s, so the renewals after the first are the sync's.
          return { leaseDurationSeconds: 60, renewIntervalSeconds: 10, ...(listInRenewals ? { replicas: list } : {}) };
        },
      );
      stops.push(() => hub.server.stop(100));
      const { agent, calls } = recordingAgent();
      const hubClient = { address: hub.address, serverName: 'localhost', caCert: Buffer.from(ca.certPem) };
      const lease = new LeaseRenewer({ agent, hub: hubClient, apiserver: '127.0.0.1:1', leaseDurationMs: 60_000, log });
      const sync = new ReplicaSync({ agent, hub: hubClient, intervalMs: 100, lease, log });
      stops.push(() => {
        lease.stop();
        sync.stop();
      });
      lease.start();
      sync.start();
      return { asked, calls };
    };

    const current = await renewingAgent(true);
    await waitFor(() => current.asked.renewals >= 4, { timeoutMs: 10_000, message: 'renewals at the sync interval' });
    expect(current.calls.length).toBeGreaterThanOrEqual(3);
    expect(current.calls[0]).toEqual([['hub-a', 'hub-b'], 2]);
    // The first sync may run before the first renewal (nothing to renew with yet); after that, renewals only.
    expect(current.asked.lists).toBeLessThanOrEqual(1);

    // A hub whose renewal answers carry no list: the sync asks it directly, every interval.
    const older = await renewingAgent(false);
    await waitFor(() => older.asked.lists >= 4, { timeoutMs: 10_000, message: 'lists asked directly' });
    // One renewal when the agent started, at most one more to find out the hub sends no list: not one per sync.
    expect(older.asked.renewals).toBeLessThanOrEqual(2);
    expect(older.calls.length).toBeGreaterThanOrEqual(3);
  });
});
