import http from 'node:http';
import type { AddressInfo } from 'node:net';
import tls from 'node:tls';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { createCA, issueServerCert } from '../pki/certificates.js';
import { HUB_API_KEEPALIVE_MS, HubApi } from './hub-api.js';

const ca = createCA();
const serving = issueServerCert(ca, { commonName: 'hub', ipAddresses: ['127.0.0.1'] });

/** A TLS listener handing every connection to the hub API, as the agent port does for ALPN http/1.1. */
async function listen(api: HubApi): Promise<{ port: number; open: Set<tls.TLSSocket>; close: () => Promise<void> }> {
  const open = new Set<tls.TLSSocket>();
  const server = tls.createServer({ cert: serving.certPem, key: serving.keyPem, ALPNProtocols: ['http/1.1'] }, (s) => {
    open.add(s);
    s.once('close', () => open.delete(s));
    api.accept(s);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { port: (server.address() as AddressInfo).port, open, close: () => new Promise((r) => server.close(() => r())) };
}

function get(port: number, agent: http.Agent): Promise<{ status: number; headers: http.IncomingHttpHeaders; reused: boolean }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path: '/v1/ping', agent, createConnection: undefined }, (res) => {
      res.resume();
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, reused: req.reusedSocket }));
    });
    req.on('error', reject);
  });
}

/** An http.Agent that speaks TLS to the test listener. */
const tlsAgent = (): http.Agent => {
  const a = new http.Agent({ keepAlive: true, maxSockets: 1, timeout: 120_000 });
  a.createConnection = (o: { port?: number | null }) =>
    tls.connect({ host: '127.0.0.1', port: o.port ?? 0, ca: ca.certPem, ALPNProtocols: ['http/1.1'] });
  return a;
};

describe('HubApi keep-alive', () => {
  const cleanup: (() => Promise<void> | void)[] = [];
  afterEach(async () => {
    for (const c of cleanup.splice(0).reverse()) await c();
  });

  it('keeps a connection open between requests, announcing how long', async () => {
    const api = new HubApi(pino({ level: 'silent' }));
    api.route('GET', '/v1/ping', async () => ({ status: 200, body: { ok: true } }), { agentOnly: false });
    const l = await listen(api);
    const agent = tlsAgent();
    cleanup.push(
      () => l.close(),
      () => api.close(),
      () => agent.destroy(),
    );
    const first = await get(l.port, agent);
    expect(first.headers['keep-alive']).toBe(`timeout=${HUB_API_KEEPALIVE_MS / 1000}`);
    expect((await get(l.port, agent)).reused).toBe(true);
    expect(l.open.size).toBe(1);
  });

  it('drain() closes idle connections at once and busy ones after their answer', async () => {
    const api = new HubApi(pino({ level: 'silent' }));
    let release!: () => void;
    const held = new Promise<void>((r) => {
      release = r;
    });
    api.route('GET', '/v1/ping', async () => ({ status: 200, body: { ok: true } }), { agentOnly: false });
    api.route(
      'GET',
      '/v1/slow',
      async () => {
        await held;
        return { status: 200, body: { ok: true } };
      },
      { agentOnly: false },
    );
    const l = await listen(api);
    const idle = tlsAgent();
    const busy = tlsAgent();
    cleanup.push(
      () => l.close(),
      () => api.close(),
      () => idle.destroy(),
      () => busy.destroy(),
    );
    await get(l.port, idle);
    const slow = new Promise<http.IncomingMessage>((resolve, reject) => {
      http.get({ host: '127.0.0.1', port: l.port, path: '/v1/slow', agent: busy }, resolve).on('error', reject);
    });
    for (let i = 0; i < 100 && l.open.size < 2; i++) await new Promise((r) => setTimeout(r, 10));
    expect(l.open.size).toBe(2);
    api.drain();
    for (let i = 0; i < 100 && l.open.size > 1; i++) await new Promise((r) => setTimeout(r, 10));
    expect(l.open.size).toBe(1);
    release();
    const res = await slow;
    res.resume();
    expect(res.headers.connection).toBe('close');
    for (let i = 0; i < 100 && l.open.size > 0; i++) await new Promise((r) => setTimeout(r, 10));
    expect(l.open.size).toBe(0);
  });
});
