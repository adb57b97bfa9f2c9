// Every server and agent metric moves when its event happens: an in-process ProxyServer and Agents
// over real TLS on loopback, real clients (SDK over mux and gRPC, HTTP CONNECT, a hand-driven mux
// agent for the dial paths a real agent never takes), scraping /metrics over HTTP.
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import type http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as grpc from '@grpc/grpc-js';
import { pino, type Logger } from 'pino';
import { Agent, startAgentHealthServer } from '@cluster-proxy/agent';
import { Tunnel, type TunnelSocket } from '@cluster-proxy/client';
import {
  CAP_CREDIT,
  CAP_HALF_CLOSE,
  MD_AGENT_ID,
  MD_CAPABILITIES,
  MD_WINDOW,
  PROXY_PATH,
  PacketType,
  connectMux,
  decodePacket,
  encodePacket,
  packets,
  type FramedPacketStream,
  type Packet,
} from '@cluster-proxy/proto';
import { ProxyServer, createCA, issueAgentCert, issueClientCert, issueServerCert, type BoundPorts } from '@cluster-proxy/server';
import { startEchoServer, waitFor, type TcpTarget } from './fixtures/index.js';
import { scrape, type Scrape } from './metrics-text.js';

const S = 'konnectivity_network_proxy_server_';
const SO = 'cluster_proxy_server_';
const A = 'konnectivity_network_proxy_agent_';
const AO = 'cluster_proxy_agent_';
const WINDOW = 16 * 1024;

/** JSON log lines collected in memory. */
function memoryLog(level: string): { log: Logger; lines: Record<string, unknown>[] } {
  const lines: Record<string, unknown>[] = [];
  const dest = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const l of chunk.toString().split('\n')) if (l) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  return { log: pino({ level }, dest), lines };
}

describe('metrics, readiness and connection logs (in-process server and agents)', () => {
  const ca = createCA({ commonName: 'metrics-test' });
  const serving = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'], ipAddresses: ['127.0.0.1'] });
  const user = issueClientCert(ca, { commonName: 'user' });
  const caCert = Buffer.from(ca.certPem);
  const serverLog = memoryLog('info');
  const agentLog = memoryLog('debug');
  let dir = '';
  let echo: TcpTarget;
  let server: ProxyServer;
  let ports: BoundPorts;
  let agent: Agent;
  let agentHealth: http.Server;
  let agentPort = 0;
  let storeUp = true;
  const tunnels: Tunnel[] = [];
  const agents: Agent[] = [];

  const tunnel = (transport: 'mux' | 'grpc'): Tunnel => {
    const t = new Tunnel({
      address: `127.0.0.1:${ports.frontend}`,
      serverName: 'localhost',
      caCert,
      cert: Buffer.from(user.certPem),
      key: Buffer.from(user.keyPem),
      transport,
    });
    tunnels.push(t);
    return t;
  };
  const hub = (): Promise<Scrape> => scrape(ports.health!);
  const agentScrape = (): Promise<Scrape> => scrape(agentPort);
  const newAgent = (cluster: string, extra: Partial<ConstructorParameters<typeof Agent>[0]> = {}): Agent => {
    const cert = issueAgentCert(ca, { cluster });
    const a = new Agent({
      cluster,
      namespace: 'ns',
      hubAddress: `127.0.0.1:${ports.agent}`,
      serverName: 'localhost',
      caCert,
      cert: Buffer.from(cert.certPem),
      key: Buffer.from(cert.keyPem),
      apiserver: `127.0.0.1:${echo.port}`,
      allow: ['127.0.0.1:1'],
      window: WINDOW,
      backoffInitialMs: 50,
      backoffMaxMs: 200,
      log: agentLog.log,
      ...extra,
    });
    agents.push(a);
    a.start();
    return a;
  };
  /** A mux agent we drive by hand: it answers nothing unless told to. */
  const fakeAgent = async (cluster: string): Promise<{ stream: FramedPacketStream; received: Packet[] }> => {
    const cert = issueAgentCert(ca, { cluster });
    const { stream } = await connectMux({
      address: `127.0.0.1:${ports.agent}`,
      serverName: 'localhost',
      caCert,
      cert: Buffer.from(cert.certPem),
      key: Buffer.from(cert.keyPem),
      timeoutMs: 5000,
      hello: { [MD_AGENT_ID]: [`fake-${cluster}`], [MD_CAPABILITIES]: [`${CAP_CREDIT},${CAP_HALF_CLOSE}`], [MD_WINDOW]: [String(WINDOW)] },
    });
    const received: Packet[] = [];
    stream.on('data', (p: Packet) => received.push(p));
    stream.on('error', () => {});
    await waitFor(() => server.core.routes.backends().some((b) => b.cluster === cluster), {
      timeoutMs: 5000,
      message: `fake agent ${cluster} registered`,
    });
    return { stream, received };
  };

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'cp-metrics-'));
    echo = await startEchoServer();
    server = new ProxyServer({
      bindAddress: '127.0.0.1',
      agentPort: 0,
      frontendPort: 0,
      healthPort: 0,
      adminPort: 0,
      dialTimeoutMs: 400,
      window: WINDOW,
      connectUds: path.join(dir, 'connect.sock'),
      connectPlain: { host: '127.0.0.1', port: 0 },
      dataDir: dir,
      tls: { caCert, cert: Buffer.from(serving.certPem), key: Buffer.from(serving.keyPem) },
      readinessChecks: [
        {
          name: 'store',
          check: () => {
            if (!storeUp) throw new Error('store unreachable: connection refused');
          },
        },
      ],
      log: serverLog.log,
    });
    ports = await server.start();
    agent = newAgent('c1');
    agentHealth = await startAgentHealthServer(agent, '127.0.0.1', 0);
    agentPort = (agentHealth.address() as net.AddressInfo).port;
    await waitFor(() => agent.connectedServers === 1, { timeoutMs: 10_000, message: 'agent connected' });
  });

  afterAll(async () => {
    for (const t of tunnels) t.close();
    for (const a of agents) a.stop();
    agentHealth?.closeAllConnections();
    await new Promise((r) => agentHealth?.close(r));
    await server?.stop(200);
    await echo?.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('counts the tunnel: connects, backends, server count; agent: open and known servers', async () => {
    const h = await hub();
    expect(h.value(`${SO}tunnel_connects_total`, { transport: 'mux' })).toBe(1);
    expect(h.value(`${S}ready_backend_connections`)).toBe(1);
    expect(h.value(`${SO}mux_connections`, { role: 'agent' })).toBe(1);
    expect(h.value(`${S}ready_backends`, { proxy_strategy: 'destHost' })).toBeGreaterThanOrEqual(2); // c1, c1.ns, service host
    expect(h.value(`${S}ready_backends`, { proxy_strategy: 'defaultRoute' })).toBe(0);
    expect(h.value(`${SO}server_count`)).toBe(1);
    expect(h.types.get(`${S}dial_duration_seconds`)).toBe('histogram');
    const a = await agentScrape();
    expect(a.value(`${A}open_server_connections`)).toBe(1);
    expect(a.value(`${A}known_server_count`)).toBe(1);
    expect(a.value(`${AO}tunnel_connects_total`, { result: 'ok' })).toBe(1);
    // The admin port serves the same registry.
    expect((await scrape(ports.admin!)).value(`${S}ready_backend_connections`)).toBe(1);
  });

  it('a connection moves dial durations, packets, bytes, established gauges and flow-control stalls', async () => {
    const t = tunnel('mux');
    const s = await t.dial('c1:443');
    const payload = Buffer.alloc(256 * 1024, 7);
    let got = 0;
    const echoed = new Promise<void>((resolve) =>
      s.on('data', (d: Buffer) => {
        got += d.length;
        if (got >= payload.length) resolve();
      }),
    );
    s.write(payload);
    await echoed;
    let h = await hub();
    let a = await agentScrape();
    expect(h.value(`${S}established_connections`)).toBe(1);
    expect(a.value(`${A}open_endpoint_connections`)).toBe(1);
    expect(h.value(`${S}dial_duration_seconds_count`)).toBe(1);
    expect(a.value(`${A}dial_duration_seconds_count`)).toBe(1);
    for (const [seg, type] of [
      ['from_client', 'DIAL_REQ'],
      ['to_agent', 'DIAL_REQ'],
      ['from_agent', 'DIAL_RSP'],
      ['to_client', 'DIAL_RSP'],
    ]) {
      expect(h.value(`${S}stream_packets_total`, { segment: seg!, packet_type: type! }), `${seg} ${type}`).toBe(1);
    }
    expect(h.value(`${S}stream_packets_total`, { segment: 'from_agent', packet_type: 'DATA' })).toBeGreaterThan(0);
    expect(a.value(`${A}stream_packets_total`, { segment: 'to_agent', packet_type: 'DIAL_REQ' })).toBe(1);
    expect(a.value(`${A}stream_packets_total`, { segment: 'from_agent', packet_type: 'DIAL_RSP' })).toBe(1);
    expect(a.value(`${A}stream_packets_total`, { segment: 'from_agent', packet_type: 'DATA' })).toBeGreaterThan(0);
    expect(h.value(`${SO}bytes_total`, { direction: 'to_agent' })).toBe(payload.length);
    expect(h.value(`${SO}bytes_total`, { direction: 'to_client' })).toBe(payload.length);
    expect(a.value(`${AO}bytes_total`, { direction: 'to_endpoint' })).toBe(payload.length);
    expect(a.value(`${AO}bytes_total`, { direction: 'to_server' })).toBe(payload.length);
    // 256 KiB through 16 KiB windows: both senders ran out of credit at least once.
    expect(h.value(`${SO}flow_control_stalls_total`, { direction: 'to_agent' })).toBeGreaterThan(0);
    expect(a.value(`${AO}flow_control_stalls_total`)).toBeGreaterThan(0);
    s.destroy();
    await waitFor(async () => (await hub()).value(`${S}established_connections`) === 0, {
      timeoutMs: 5000,
      message: 'established back to 0',
    });
    h = await hub();
    expect(h.value(`${S}connection_duration_seconds_count`)).toBe(1);
    await waitFor(async () => (await agentScrape()).value(`${A}open_endpoint_connections`) === 0, {
      timeoutMs: 5000,
      message: 'agent endpoints back to 0',
    });
    a = await agentScrape();
    expect(a.value(`${A}open_endpoint_connections`)).toBe(0);
  });

  it("exports every metric of ANP v0.36.0's server and agent, with its type, labels and buckets", async () => {
    // pkg/server/metrics, pkg/agent/metrics and the common stream metrics of ANP v0.36.0 (Go's process
    // metrics are checked on the real processes, test/e2e/metrics.test.ts).
    const server: [string, string][] = [
      ['dial_duration_seconds', 'histogram'],
      ['frontend_write_duration_seconds', 'histogram'],
      ['grpc_connections', 'gauge'],
      ['http_connections', 'gauge'],
      ['ready_backend_connections', 'gauge'],
      ['ready_backends', 'gauge'],
      ['pending_backend_dials', 'gauge'],
      ['established_connections', 'gauge'],
      ['full_receive_channels', 'gauge'],
      ['dial_failure_count', 'counter'],
      ['stream_packets_total', 'counter'],
      ['stream_errors_total', 'counter'],
      ['culled_leases_count', 'counter'],
      ['lease_delete_latency_seconds', 'histogram'],
      ['lease_delete_total', 'counter'],
      ['lease_list_latency_seconds', 'histogram'],
      ['lease_list_total', 'counter'],
    ];
    const agentSide: [string, string][] = [
      ['dial_duration_seconds', 'histogram'],
      ['server_connection_failure_count', 'counter'],
      ['endpoint_dial_failure_total', 'counter'],
      ['open_server_connections', 'gauge'],
      ['known_server_count', 'gauge'],
      ['open_endpoint_connections', 'gauge'],
      ['stream_packets_total', 'counter'],
      ['stream_errors_total', 'counter'],
      ['lease_lists_total', 'counter'],
      ['lease_watches_total', 'counter'],
      ['lease_list_latency_seconds', 'histogram'],
    ];
    const h = await hub();
    const a = await agentScrape();
    for (const [name, type] of server) expect(h.types.get(`${S}${name}`), `${S}${name}`).toBe(type);
    for (const [name, type] of agentSide) expect(a.types.get(`${A}${name}`), `${A}${name}`).toBe(type);
    // Label names and values as ANP's.
    const labelsOf = (sc: Scrape, name: string): string[] => [
      ...new Set(sc.samples.filter((x) => x.name === name).map((x) => Object.keys(x.labels).sort().join(','))),
    ];
    expect(labelsOf(h, `${S}full_receive_channels`)).toEqual(['service_method']);
    expect(h.value(`${S}full_receive_channels`, { service_method: 'Proxy' })).toBe(0);
    expect(h.value(`${S}full_receive_channels`, { service_method: 'Connect' })).toBe(0);
    expect(h.has(`${S}culled_leases_count`)).toBe(true);
    expect(h.value(`${S}culled_leases_count`)).toBe(0);
    expect(labelsOf(h, `${S}stream_packets_total`)).toEqual(['packet_type,segment']);
    expect(labelsOf(a, `${A}stream_packets_total`)).toEqual(['packet_type,segment']);
    // ANP's buckets: the server's latency buckets (1 µs to 12.5 s), the agent's (5 ms to 30 s).
    const les = (sc: Scrape, name: string): string[] => sc.samples.filter((x) => x.name === `${name}_bucket`).map((x) => x.labels['le']!);
    const serverBuckets = ['1e-6', '0.00001', '0.0001', '0.005', '0.025', '0.1', '0.5', '2.5', '12.5', '+Inf'].map((x) =>
      x === '+Inf' ? x : String(Number(x)),
    );
    expect(les(h, `${S}dial_duration_seconds`)).toEqual(serverBuckets);
    expect(les(h, `${S}frontend_write_duration_seconds`)).toEqual(serverBuckets);
    expect(les(a, `${A}dial_duration_seconds`)).toEqual(['0.005', '0.025', '0.1', '0.5', '2.5', '10', '30', '+Inf']);
    // The connection before moved 256 KiB back to its client: each payload handed on was timed.
    expect(h.value(`${S}frontend_write_duration_seconds_count`)).toBeGreaterThan(0);
    expect(h.value(`${S}frontend_write_duration_seconds_bucket`, { le: '+Inf' })).toBe(
      h.value(`${S}frontend_write_duration_seconds_count`),
    );
  });

  it('puts dialID and connectID on the log lines of a connection', () => {
    const ok = agentLog.lines.find((l) => l['msg'] === 'dial ok');
    expect(ok).toBeDefined();
    expect(typeof ok!['connectID']).toBe('number');
    expect(ok!['dialID']).toMatch(/^\d+$/);
    expect(ok!['serverID']).toBe(server.serverID);
  });

  it('counts dial failures by reason on both sides', async () => {
    const t = tunnel('mux');
    await expect(t.dial('nope:443')).rejects.toMatchObject({ reason: 'no_agent' });
    await expect(t.dial('c1:22')).rejects.toMatchObject({ reason: 'forbidden' });
    await expect(t.dial('c1:1')).rejects.toMatchObject({ reason: 'endpoint' });
    const h = await hub();
    expect(h.value(`${S}dial_failure_count`, { reason: 'no_agent' })).toBe(1);
    expect(h.value(`${S}dial_failure_count`, { reason: 'error_response' })).toBe(2);
    const a = await agentScrape();
    expect(a.value(`${A}endpoint_dial_failure_total`, { reason: 'forbidden' })).toBe(1);
    expect(a.value(`${A}endpoint_dial_failure_total`, { reason: 'endpoint' })).toBe(1);
    const refused = agentLog.lines.find((l) => l['msg'] === "dial refused: destination c1:22 is not in this agent's allowlist");
    expect(refused?.['dialID']).toMatch(/^\d+$/);
    const failed = agentLog.lines.find((l) => l['reason'] === 'endpoint');
    expect(failed?.['connectID']).toEqual(expect.any(Number));
  });

  it('pending dials, dial timeouts, late answers, client and agent giving up, draining, refused agents', async () => {
    const fake = await fakeAgent('c3');
    const t = tunnel('mux');
    const dialReqs = (): Packet[] => fake.received.filter((p) => p.type === PacketType.DIAL_REQ);
    // Nobody answers: pending, then the server's deadline (400 ms).
    const timedOut = t.dial('c3:443').catch((e: unknown) => e);
    await waitFor(() => dialReqs().length === 1, { timeoutMs: 5000, message: 'DIAL_REQ at the fake agent' });
    expect((await hub()).value(`${S}pending_backend_dials`)).toBe(1);
    expect(await timedOut).toMatchObject({ reason: 'timeout' });
    let h = await hub();
    expect(h.value(`${S}dial_failure_count`, { reason: 'backend_dial_timeout' })).toBe(1);
    expect(h.value(`${S}pending_backend_dials`)).toBe(0);
    // The answer comes too late: unrecognized, and the orphan is closed.
    const first = dialReqs()[0]!;
    if (first.type !== PacketType.DIAL_REQ) throw new Error('unreachable');
    fake.stream.write(packets.dialResponse(first.dialRequest.random, 7));
    await waitFor(() => fake.received.some((p) => p.type === PacketType.CLOSE_REQ && p.closeRequest.connectID === 7), {
      timeoutMs: 5000,
      message: 'CLOSE_REQ for the orphan',
    });
    expect((await hub()).value(`${S}dial_failure_count`, { reason: 'unrecognized_response' })).toBe(1);
    // The client gives up.
    const ac = new AbortController();
    const cancelled = t.dial('c3:443', { signal: ac.signal }).catch((e: unknown) => e);
    await waitFor(() => dialReqs().length === 2, { timeoutMs: 5000, message: 'second DIAL_REQ' });
    ac.abort();
    await cancelled;
    await waitFor(async () => (await hub()).value(`${S}dial_failure_count`, { reason: 'frontend_close' }) === 1, {
      timeoutMs: 5000,
      message: 'frontend_close counted',
    });
    // The agent goes away mid-dial.
    const gone = t.dial('c3:443').catch((e: unknown) => e);
    await waitFor(() => dialReqs().length === 3, { timeoutMs: 5000, message: 'third DIAL_REQ' });
    fake.stream.destroy();
    expect(await gone).toMatchObject({ reason: 'dialclosed' });
    h = await hub();
    expect(h.value(`${S}dial_failure_count`, { reason: 'backend_close' })).toBe(1);
    await waitFor(async () => (await hub()).value(`${SO}tunnel_disconnects_total`, { transport: 'mux' }) === 1, {
      timeoutMs: 5000,
      message: 'disconnect counted',
    });
    // A draining agent.
    const drainer = await fakeAgent('c4');
    drainer.stream.write(packets.drain());
    await waitFor(() => server.core.routes.backends().some((b) => b.cluster === 'c4' && b.draining), {
      timeoutMs: 5000,
      message: 'c4 draining',
    });
    await expect(t.dial('c4:443')).rejects.toMatchObject({ reason: 'draining' });
    expect((await hub()).value(`${S}dial_failure_count`, { reason: 'draining' })).toBe(1);
    drainer.stream.destroy();
    // A client certificate is not an agent.
    await connectMux({
      address: `127.0.0.1:${ports.agent}`,
      serverName: 'localhost',
      caCert,
      cert: Buffer.from(user.certPem),
      key: Buffer.from(user.keyPem),
      timeoutMs: 5000,
      hello: { [MD_AGENT_ID]: ['x'] },
    }).then(
      ({ stream }) => stream.destroy(),
      () => undefined,
    );
    await waitFor(async () => (await hub()).value(`${SO}agent_refusals_total`, { code: 'UNAUTHENTICATED' }) === 1, {
      timeoutMs: 5000,
      message: 'refusal counted',
    });
  });

  it('gRPC clients and agents: grpc_connections, and stream errors when they vanish', async () => {
    const t = tunnel('grpc');
    const s: TunnelSocket = await t.dial('c1:443');
    expect((await hub()).value(`${S}grpc_connections`, { service_method: 'Proxy' })).toBe(1);
    s.destroy();
    // A konnectivity-client-like stream cancelled while its connection is open is a stream error.
    const client = new grpc.Client(
      `127.0.0.1:${ports.frontend}`,
      grpc.credentials.createSsl(caCert, Buffer.from(user.keyPem), Buffer.from(user.certPem)),
      { 'grpc.ssl_target_name_override': 'localhost', 'grpc.default_authority': 'localhost' },
    );
    try {
      const call = client.makeBidiStreamRequest(PROXY_PATH, encodePacket, decodePacket, new grpc.Metadata());
      call.on('error', () => {});
      call.write(packets.dialRequest('c1:443', 42n));
      const [rsp] = (await once(call, 'data')) as [Packet];
      expect(rsp.type).toBe(PacketType.DIAL_RSP);
      call.cancel();
      await waitFor(async () => (await hub()).value(`${S}stream_errors_total`, { segment: 'from_client', code: 'Canceled' }) === 1, {
        timeoutMs: 5000,
        message: 'client stream error counted',
      });
    } finally {
      client.close();
    }
    await waitFor(async () => (await hub()).value(`${S}grpc_connections`, { service_method: 'Proxy' }) === 0, {
      timeoutMs: 5000,
      message: 'Proxy streams back to 0',
    });

    const g = newAgent('c5', { transport: 'grpc' });
    await waitFor(() => g.connectedServers === 1, { timeoutMs: 10_000, message: 'gRPC agent connected' });
    let h = await hub();
    expect(h.value(`${S}grpc_connections`, { service_method: 'Connect' })).toBe(1);
    expect(h.value(`${SO}tunnel_connects_total`, { transport: 'grpc' })).toBe(1);
    g.stop();
    await waitFor(async () => (await hub()).value(`${SO}tunnel_disconnects_total`, { transport: 'grpc' }) === 1, {
      timeoutMs: 5000,
      message: 'gRPC agent gone',
    });
    h = await hub();
    expect(h.value(`${S}stream_errors_total`, { segment: 'from_agent', code: 'Canceled' })).toBe(1);
    expect(h.value(`${S}grpc_connections`, { service_method: 'Connect' })).toBe(0);
  });

  it('HTTP CONNECT: requests by status, open connections', async () => {
    const sock = net.connect(path.join(dir, 'connect.sock'));
    sock.write('CONNECT c1:443 HTTP/1.1\r\nHost: c1:443\r\n\r\n');
    const [head] = (await once(sock, 'data')) as [Buffer];
    expect(head.toString()).toMatch(/^HTTP\/1.1 200/);
    let h = await hub();
    expect(h.value(`${SO}http_connect_requests_total`, { status: '200' })).toBe(1);
    expect(h.value(`${S}http_connections`)).toBe(1);
    const open = serverLog.lines.find((l) => l['msg'] === 'CONNECT tunnel open');
    expect(open?.['connectID']).toEqual(expect.any(Number));
    sock.destroy();
    const plain = net.connect(ports.connectPlain!, '127.0.0.1');
    plain.write('CONNECT c1:443 HTTP/1.1\r\nHost: c1:443\r\n\r\n');
    const [refusal] = (await once(plain, 'data')) as [Buffer];
    expect(refusal.toString()).toMatch(/^HTTP\/1.1 407/);
    plain.destroy();
    h = await hub();
    expect(h.value(`${SO}http_connect_requests_total`, { status: '407' })).toBe(1);
    await waitFor(async () => (await hub()).value(`${S}http_connections`) === 0, {
      timeoutMs: 5000,
      message: 'CONNECT connections closed',
    });
  });

  it('/readyz and /healthz list named checks; a failing one gives 503 and its reason', async () => {
    const get = async (port: number, p: string): Promise<{ status: number; body: string }> => {
      const r = await fetch(`http://127.0.0.1:${port}${p}`);
      return { status: r.status, body: await r.text() };
    };
    expect(await get(ports.health!, '/readyz')).toEqual({ status: 200, body: 'ok\n' });
    expect(await get(ports.health!, '/readyz?verbose')).toEqual({
      status: 200,
      body: '[+]listeners ok\n[+]store ok\nreadyz check passed\n',
    });
    expect(await get(ports.health!, '/healthz?verbose')).toEqual({ status: 200, body: '[+]ping ok\nhealthz check passed\n' });
    storeUp = false;
    try {
      const r = await get(ports.health!, '/readyz');
      expect(r.status).toBe(503);
      expect(r.body).toBe('[+]listeners ok\n[-]store failed: store unreachable: connection refused\nreadyz check failed\n');
      expect((await get(ports.admin!, '/readyz?verbose')).status).toBe(503);
      expect(await get(ports.health!, '/readyz?exclude=store')).toEqual({ status: 200, body: 'ok\n' });
    } finally {
      storeUp = true;
    }
    // A server that is not listening (yet) is not ready.
    const idle = new ProxyServer({
      bindAddress: '127.0.0.1',
      agentPort: 0,
      frontendPort: null,
      healthPort: null,
      adminPort: null,
      tls: { caCert, cert: Buffer.from(serving.certPem), key: Buffer.from(serving.keyPem) },
      log: pino({ level: 'silent' }),
    });
    expect(await idle.readiness.run()).toEqual({
      ok: false,
      results: [{ name: 'listeners', ok: false, reason: 'listeners not bound yet' }],
    });
    // Agent: a tunnel to at least one replica.
    expect(await get(agentPort, '/readyz?verbose')).toEqual({ status: 200, body: '[+]tunnel ok\nreadyz check passed\n' });
    expect((await get(agentPort, '/healthz?verbose')).body).toContain('[+]ping ok');
  });

  it('agent: a lost tunnel counts a reconnect, and readiness fails without tunnels', async () => {
    const before = (await agentScrape()).value(`${AO}tunnel_reconnects_total`);
    const backend = server.core.routes.backends().find((b) => b.cluster === 'c1')!;
    backend.close('test: dropping the agent');
    await waitFor(async () => (await agentScrape()).value(`${AO}tunnel_reconnects_total`) === before + 1, {
      timeoutMs: 5000,
      message: 'reconnect counted',
    });
    await waitFor(() => agent.connectedServers === 1, { timeoutMs: 10_000, message: 'agent back' });
    expect((await agentScrape()).value(`${AO}tunnel_connects_total`, { result: 'ok' })).toBe(2);
    agent.stop();
    const r = await fetch(`http://127.0.0.1:${agentPort}/readyz?verbose`);
    expect(r.status).toBe(503);
    expect(await r.text()).toMatch(/^\[-\]tunnel failed: no tunnel to any proxy server/);
    expect((await agentScrape()).value(`${A}open_server_connections`)).toBe(0);
  });
});
