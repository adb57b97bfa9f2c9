import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { TLSSocket } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HubConnections, hubRequest, type HubClientOptions } from './hub-client.js';

let dir = '';
let server: https.Server;
let cert: Buffer;
let connections = 0;
const open = new Set<TLSSocket>();

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'hub-client-'));
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-days', '1', '-subj', '/CN=hub',
    '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', path.join(dir, 'tls.key'), '-out', path.join(dir, 'tls.crt')], { stdio: 'ignore' });
  cert = readFileSync(path.join(dir, 'tls.crt'));
  server = https.createServer({ cert, key: readFileSync(path.join(dir, 'tls.key')), ALPNProtocols: ['http/1.1'] }, (req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ path: req.url }));
    });
  });
  server.keepAliveTimeout = 60_000;
  server.on('secureConnection', (s: TLSSocket) => {
    connections++;
    open.add(s);
    s.once('close', () => open.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
  rmSync(dir, { recursive: true, force: true });
});

const opts = (extra: Partial<HubClientOptions> = {}): HubClientOptions => ({ address: `127.0.0.1:${(server.address() as AddressInfo).port}`, caCert: cert, ...extra });

describe('hubRequest with HubConnections', () => {
  it('sends consecutive requests over one kept connection', async () => {
    const pool = new HubConnections();
    const before = connections;
    for (let i = 0; i < 3; i++) expect(await hubRequest(opts({ connections: pool }), 'POST', `/v1/lease?i=${i}`, { n: i })).toEqual({ path: `/v1/lease?i=${i}` });
    expect(connections - before).toBe(1);
    pool.close();
  });

  it('opens a new connection after the hub closed the kept one (idle timeout, drain)', async () => {
    const pool = new HubConnections();
    const before = connections;
    await hubRequest(opts({ connections: pool }), 'GET', '/v1/replicas');
    server.closeIdleConnections();
    await new Promise((r) => setTimeout(r, 50));
    expect(await hubRequest(opts({ connections: pool }), 'GET', '/v1/replicas')).toEqual({ path: '/v1/replicas' });
    expect(connections - before).toBe(2);
    pool.close();
  });

  it('without a pool, each request has its own connection that closes after the answer', async () => {
    const before = connections;
    await hubRequest(opts(), 'GET', '/a');
    await hubRequest(opts(), 'GET', '/b');
    expect(connections - before).toBe(2);
  });

  it('close() closes the kept connection, and later requests fall back to one connection each', async () => {
    const pool = new HubConnections();
    await hubRequest(opts({ connections: pool }), 'GET', '/x');
    const kept = open.size;
    pool.close();
    for (let i = 0; i < 100 && open.size >= kept; i++) await new Promise((r) => setTimeout(r, 10));
    expect(open.size).toBeLessThan(kept);
    expect(await hubRequest(opts({ connections: pool }), 'GET', '/y')).toEqual({ path: '/y' });
  });
});
