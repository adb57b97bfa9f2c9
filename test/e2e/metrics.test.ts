// Observability of real processes: the hub's /metrics on its health and admin ports, the agent's on
// its health port, moving with real traffic and with a hub killed under the agent; readiness;
// --log-level and --log-format on the command line.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { killAllSpawned, runCommand, spawnProcess, waitFor } from '../src/fixtures/index.js';
import { CLI, createPki, expectTablesEmpty, getStatus, type AgentProcess, type HubProcess } from '../src/harness.js';
import { startEchoHub, type EchoHub } from '../src/e2e-setup.js';
import { scrape } from '../src/metrics-text.js';

const S = 'konnectivity_network_proxy_server_';
const A = 'konnectivity_network_proxy_agent_';

describe('metrics and readiness of real hub and agent processes', () => {
  let setup: EchoHub;
  let hub: HubProcess;
  let agent: AgentProcess;

  beforeAll(async () => {
    setup = await startEchoHub();
    ({ hub } = setup);
    // gRPC: a hub that dies mid-stream is a stream error (UNAVAILABLE) for ANP's transport.
    agent = await setup.startAgent('c1', {
      args: ['--transport', 'grpc', '--keepalive-time', '1s', '--keepalive-timeout', '1s', '--replica-sync-interval', '200ms'],
    });
  });

  afterAll(async () => {
    await setup?.stop();
  });

  it('hub (health and admin ports) and agent serve /metrics that move with a connection', async () => {
    const before = await scrape(hub.ports.health);
    expect(before.value(`${S}ready_backend_connections`)).toBe(1);
    expect(before.has('process_cpu_user_seconds_total')).toBe(true); // process metrics in the CLI
    // The hub lists the replica Leases (ANP's lease_list metrics); the agent asks for the replicas (ANP's lease lists).
    await waitFor(async () => (await scrape(hub.ports.health)).value(`${S}lease_list_total`, { http_status_code: '200', reason: '' }) > 0, {
      timeoutMs: 10_000,
      message: 'hub lease list counted',
    });
    await waitFor(
      async () => (await scrape(agent.healthPort)).value(`${A}lease_lists_total`, { http_response_code: '200', reason: '' }) > 0,
      { timeoutMs: 10_000, message: 'agent lease list counted' },
    );
    const t = hub.tunnel();
    const s = await t.dial('c1:443');
    const got = new Promise<Buffer>((resolve) => s.once('data', resolve));
    s.write('ping');
    expect((await got).toString()).toBe('ping');
    const during = await scrape(hub.ports.admin);
    expect(during.value(`${S}established_connections`)).toBe(1);
    expect(during.value(`${S}dial_duration_seconds_count`)).toBe(1);
    expect(during.value('cluster_proxy_server_bytes_total', { direction: 'to_agent' })).toBe(4);
    const a = await scrape(agent.healthPort);
    expect(a.value(`${A}open_server_connections`)).toBe(1);
    expect(a.value(`${A}known_server_count`)).toBe(1);
    expect(a.value(`${A}open_endpoint_connections`)).toBe(1);
    expect(a.value(`${A}dial_duration_seconds_count`)).toBe(1);
    s.destroy();
    t.close();
    await expectTablesEmpty(hub, [agent]);
    expect((await scrape(hub.ports.health)).value(`${S}established_connections`)).toBe(0);
  });

  it("process metrics: Go's process collector's (as ANP exports them) and the memory a pod is charged", async () => {
    for (const port of [hub.ports.health, agent.healthPort]) {
      const m = await scrape(port);
      for (const name of [
        'process_cpu_seconds_total',
        'process_open_fds',
        'process_max_fds',
        'process_virtual_memory_bytes',
        'process_virtual_memory_max_bytes',
        'process_resident_memory_bytes',
        'process_start_time_seconds',
        'process_network_receive_bytes_total',
        'process_network_transmit_bytes_total',
      ]) {
        expect(m.value(name), `${name} on ${port}`).toBeGreaterThan(0);
      }
      const rss = m.value('process_resident_memory_bytes');
      const anon = m.value('cluster_proxy_process_anon_memory_bytes');
      // Anonymous memory is a part of RSS (the node binary's pages are the rest): more than the V8 heap, less than RSS.
      expect(anon).toBeGreaterThan(m.value('nodejs_heap_size_used_bytes'));
      expect(anon).toBeLessThan(rss);
      expect(m.types.get('cluster_proxy_process_socket_memory_bytes')).toBe('gauge');
      expect(m.value('cluster_proxy_process_socket_memory_bytes')).toBeGreaterThanOrEqual(0);
    }
  });

  it('readiness: verbose checks on both; the agent loses readiness and counts a stream error and a reconnect when the hub is killed', async () => {
    expect(await getStatus(hub.ports.health, '/readyz?verbose')).toEqual({
      status: 200,
      body: '[+]listeners ok\n[+]store ok\nreadyz check passed\n',
    });
    expect(await getStatus(agent.healthPort, '/readyz?verbose')).toEqual({ status: 200, body: '[+]tunnel ok\nreadyz check passed\n' });
    hub.proc.kill('SIGKILL');
    await hub.proc.exited;
    await waitFor(async () => (await scrape(agent.healthPort)).value('cluster_proxy_agent_tunnel_reconnects_total') === 1, {
      timeoutMs: 10_000,
      message: 'reconnect counted',
    });
    const a = await scrape(agent.healthPort);
    expect(a.value(`${A}stream_errors_total`, { segment: 'to_agent', code: 'Unavailable', packet_type: 'Unknown' })).toBe(1);
    expect(a.value(`${A}server_connection_failure_count`, { direction: 'from_server' })).toBe(1); // ANP's deprecated twin
    expect(a.value(`${A}open_server_connections`)).toBe(0);
    const r = await getStatus(agent.healthPort, '/readyz?verbose');
    expect(r.status).toBe(503);
    expect(r.body).toMatch(/^\[-\]tunnel failed: no tunnel to any proxy server/);
  });
});

describe('--log-level and --log-format', () => {
  it('a bad --log-level or --log-format is a one-line usage error (exit 2)', async () => {
    for (const [flag, value] of [
      ['--log-level', 'loud'],
      ['--log-format', 'yaml'],
    ] as const) {
      const r = await runCommand(process.execPath, [CLI, 'hub', '--data-dir', '/nonexistent-cp-dir', flag, value], { timeoutMs: 15_000 });
      expect(r.code).toBe(2);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toContain(`${flag} must be one of`);
      expect(r.stderr).toContain(`"${value}"`);
    }
    const pki = await createPki();
    try {
      const cert = await pki.agent('c1');
      const r = await runCommand(
        process.execPath,
        [
          CLI,
          'agent',
          '--cluster',
          'c1',
          '--ca-cert',
          pki.caPath,
          '--cert',
          cert.certPath,
          '--key',
          cert.keyPath,
          '--log-level',
          'verbose',
        ],
        { timeoutMs: 15_000 },
      );
      expect(r.code).toBe(2);
      expect(r.stderr).toMatch(/^cluster-proxy: --log-level must be one of .*"verbose"\n$/);
    } finally {
      await pki.cleanup();
    }
  });

  it('JSON when stdout is not a terminal; --log-format text forces readable lines', async () => {
    const pki = await createPki();
    const args = (extra: string[]): string[] => [
      CLI,
      'hub',
      '--data-dir',
      pki.dir,
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
      '--ca-cert',
      pki.caPath,
      '--server-cert',
      pki.server.certPath,
      '--server-key',
      pki.server.keyPath,
      ...extra,
    ];
    try {
      const json = spawnProcess({ name: 'hub-json', command: process.execPath, args: args([]) });
      const line = await json.waitForJsonLine((o) => o['msg'] === 'proxy server listening', 15_000);
      expect(line['level']).toBe(30);
      await json.stop(5000);
      const text = spawnProcess({
        name: 'hub-text',
        command: process.execPath,
        args: args(['--log-format', 'text', '--log-level', 'debug']),
      });
      const l = await text.waitForLine((s) => s.includes('proxy server listening'), 15_000);
      expect(l).toMatch(/INFO.*\(hub\): proxy server listening/);
      expect(() => JSON.parse(l)).toThrow();
      await text.stop(5000);
    } finally {
      await killAllSpawned();
      await pki.cleanup();
    }
  });
});
