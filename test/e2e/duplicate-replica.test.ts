// A real agent process meeting a hub replica that answers "you already hold a stream to me" (what a
// replica does when a load balancer sends an agent back to it): the refusal carries the code
// ALREADY_EXISTS, over mux as a hello with that code (proto's MuxRefusedError), over gRPC as the call's
// status. The agent must read the code, count a duplicate and try again within a second, never log it
// as a failure to connect nor back off. The replica here is a minimal TLS peer that only refuses, so
// every attempt of the agent meets it.
import { once } from 'node:events';
import http2 from 'node:http2';
import { readFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import tls from 'node:tls';
import { FramedPacketStream, GrpcStatus, MAX_MESSAGE_BYTES, MUX_ALPN, refusalHello } from '@cluster-proxy/proto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { killAllSpawned, waitFor } from '../src/fixtures/index.js';
import { createPki, startAgent, type HubProcess, type TestPki } from '../src/harness.js';
import { scrape } from '../src/metrics-text.js';

const DETAILS = 'agent already holds a stream to server replica-a';
let pki: TestPki;
let replica: tls.Server;
let h2: http2.Http2Server;
let port = 0;

beforeAll(async () => {
  pki = await createPki();
  // gRPC: every AgentService.Connect call ends at once with ALREADY_EXISTS (trailers only).
  h2 = http2.createServer();
  h2.on('stream', (stream) => {
    stream.respond(
      {
        ':status': 200,
        'content-type': 'application/grpc',
        'grpc-status': String(GrpcStatus.ALREADY_EXISTS),
        'grpc-message': encodeURIComponent(DETAILS),
      },
      { endStream: true },
    );
  });
  replica = tls.createServer({
    ca: readFileSync(pki.caPath),
    cert: readFileSync(pki.server.certPath),
    key: readFileSync(pki.server.keyPath),
    requestCert: true,
    rejectUnauthorized: true,
    ALPNProtocols: [MUX_ALPN, 'h2', 'http/1.1'],
  });
  replica.on('secureConnection', (socket: tls.TLSSocket) => {
    if (socket.alpnProtocol === 'h2') {
      h2.emit('connection', socket);
      return;
    }
    if (socket.alpnProtocol !== MUX_ALPN) {
      socket.destroy(); // the hub API (replica list): not served here
      return;
    }
    const stream = new FramedPacketStream(socket, MAX_MESSAGE_BYTES);
    stream.on('error', () => socket.destroy());
    stream.once('hello', () => {
      stream.sendHello(refusalHello('ALREADY_EXISTS', DETAILS));
      stream.end();
    });
  });
  replica.listen(0, '127.0.0.1');
  await once(replica, 'listening');
  port = (replica.address() as AddressInfo).port;
});

afterAll(async () => {
  await killAllSpawned();
  replica?.close();
  h2?.close();
  await pki?.cleanup();
});

describe.each(['mux', 'grpc'] as const)('an agent over %s refused with ALREADY_EXISTS', (transport) => {
  it('counts a duplicate and retries within a second; no error, no "cannot connect to hub"', async () => {
    const hub = { ports: { agent: port } } as HubProcess;
    const agent = await startAgent(pki, hub, {
      cluster: `dup-${transport}`,
      apiserver: '127.0.0.1:1',
      args: ['--transport', transport],
      waitConnected: false,
    });
    try {
      const started = Date.now();
      await waitFor(
        async () => (await scrape(agent.healthPort)).value('cluster_proxy_agent_tunnel_connects_total', { result: 'duplicate' }) >= 3,
        { timeoutMs: 15_000, intervalMs: 100, message: 'three duplicate tunnel attempts counted' },
      );
      // 100–600 ms between attempts; a backoff after a failure would be seconds.
      expect(Date.now() - started).toBeLessThan(5000);
      const m = await scrape(agent.healthPort);
      expect(m.value('cluster_proxy_agent_tunnel_connects_total', { result: 'error' })).toBe(0);
      expect(m.value('cluster_proxy_agent_tunnel_connects_total', { result: 'ok' })).toBe(0);
      expect(agent.proc.lines().filter((l) => l.includes('cannot connect to hub'))).toEqual([]);
    } finally {
      await agent.stop();
    }
  }, 60_000);
});
