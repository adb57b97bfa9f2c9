// The hub API rides the agent port (ALPN http/1.1): reachable without a client certificate for
// bootstrap, agent-only routes need a verified agent certificate, and the tunnel protocols on the same
// port still refuse unverified peers.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pino from 'pino';
import { hubRequest, HubRequestError } from '@cluster-proxy/agent';
import { connectMux } from '@cluster-proxy/proto';
import { HubApiError, ProxyServer, createCA, issueAgentCert, issueClientCert, issueServerCert } from '@cluster-proxy/server';

describe('hub API on the agent port', () => {
  const ca = createCA({ commonName: 'hub-api-test' });
  const other = createCA({ commonName: 'someone-else' });
  const serving = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'], ipAddresses: ['127.0.0.1'] });
  const agent = issueAgentCert(ca, { cluster: 'c1' });
  const user = issueClientCert(ca, { commonName: 'admin' });
  const foreign = issueAgentCert(other, { cluster: 'c1' });
  let server: ProxyServer;
  let address = '';
  const client = (cert?: { certPem: string; keyPem: string }) => ({
    address,
    caCert: Buffer.from(ca.certPem),
    serverName: 'localhost',
    ...(cert ? { cert: Buffer.from(cert.certPem), key: Buffer.from(cert.keyPem) } : {}),
  });

  beforeAll(async () => {
    server = new ProxyServer({
      bindAddress: '127.0.0.1',
      agentPort: 0,
      frontendPort: null,
      healthPort: null,
      adminPort: null,
      tls: { caCert: Buffer.from(ca.certPem), cert: Buffer.from(serving.certPem), key: Buffer.from(serving.keyPem) },
      log: pino({ level: 'silent' }),
    });
    server.hubApi.route('POST', '/v1/echo', async (req) => ({ status: 200, body: { got: req.body, authorized: req.caller.authorized } }), {
      agentOnly: false,
    });
    server.hubApi.route('GET', '/v1/whoami', async (req) => ({ status: 200, body: { cluster: req.caller.agent?.cluster } }), {
      agentOnly: true,
    });
    server.hubApi.route(
      'GET',
      '/v1/teapot',
      async () => {
        throw new HubApiError(418, 'short and stout');
      },
      { agentOnly: false },
    );
    const ports = await server.start();
    address = `127.0.0.1:${ports.agent}`;
  });
  afterAll(async () => server?.stop(100));

  it('serves public routes without a client certificate', async () => {
    expect(await hubRequest(client(), 'POST', '/v1/echo', { a: 1 })).toEqual({ got: { a: 1 }, authorized: false });
  });

  it('identifies an agent by its verified certificate', async () => {
    expect(await hubRequest(client(agent), 'GET', '/v1/whoami')).toEqual({ cluster: 'c1' });
  });

  it('refuses agent-only routes without an agent certificate, and certificates of another CA', async () => {
    for (const cert of [undefined, user, foreign]) {
      const err = await hubRequest(client(cert), 'GET', '/v1/whoami').catch((e: unknown) => e);
      expect(err).toBeInstanceOf(HubRequestError);
      expect((err as HubRequestError).status).toBe(401);
    }
  });

  it('answers unknown paths with 404 and handler errors with their status and message', async () => {
    await expect(hubRequest(client(), 'GET', '/v1/nope')).rejects.toThrow(/404.*no such hub API endpoint/);
    await expect(hubRequest(client(), 'GET', '/v1/teapot')).rejects.toThrow(/418.*short and stout/);
  });

  it('still refuses the tunnel transport to a peer without a verified certificate', async () => {
    await expect(
      connectMux({
        address,
        caCert: Buffer.from(ca.certPem),
        cert: Buffer.from(foreign.certPem),
        key: Buffer.from(foreign.keyPem),
        serverName: 'localhost',
        hello: {},
        timeoutMs: 3000,
      }),
    ).rejects.toThrow(/closed the connection/);
  });
});

describe('admin API on the loopback admin port', () => {
  it('routes /v1/ requests, including NAME-suffixed ones, and leaves the other admin paths alone', async () => {
    const ca = createCA({ commonName: 'admin-api-test' });
    const serving = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'] });
    const server = new ProxyServer({
      bindAddress: '127.0.0.1',
      agentPort: 0,
      frontendPort: null,
      healthPort: null,
      adminPort: 0,
      tls: { caCert: Buffer.from(ca.certPem), cert: Buffer.from(serving.certPem), key: Buffer.from(serving.keyPem) },
      log: pino({ level: 'silent' }),
    });
    server.adminApi.route(
      'DELETE',
      '/v1/things/*',
      async (req) => ({ status: 200, body: { deleted: req.path.split('/').pop(), authorized: req.caller.authorized } }),
      { agentOnly: false },
    );
    const ports = await server.start();
    try {
      const call = async (method: string, p: string) => {
        const res = await fetch(`http://127.0.0.1:${ports.admin}${p}`, { method });
        return { status: res.status, body: await res.text() };
      };
      expect(await call('DELETE', '/v1/things/t1')).toEqual({
        status: 200,
        body: `${JSON.stringify({ deleted: 't1', authorized: false })}\n`,
      });
      expect((await call('DELETE', '/v1/things')).status).toBe(404);
      expect((await call('GET', '/debug/connections')).status).toBe(200);
    } finally {
      await server.stop(100);
    }
  });
});
