// The hub's HTTP API as agents and admins reach it: a real Hub (memory store, its own CA) takes requests
// built from the input, over TLS with an agent certificate on the agent port (bootstrap, renewal, lease,
// replica list) and over plain HTTP on the loopback admin port (join, proxy settings, cluster deletion).
// Every answer is JSON; a refusal is a 4xx with a one-line error, never a 500; no request hangs; the hub
// still answers afterwards.
import http from 'node:http';
import https from 'node:https';
import pino from 'pino';
import { Hub, MemoryStore, createCA, issueAgentCert, issueServerCert } from '@cluster-proxy/server';
import { check, checkOneLine, fc, within, type FuzzTarget } from '../engine.js';

const ca = createCA({ commonName: 'fuzz-hub-ca' });
const serving = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'], ipAddresses: ['127.0.0.1'] });
const agentCert = issueAgentCert(ca, { cluster: 'c1' });

let hub: Hub | null = null;
let ports: { agent: number; admin: number } | null = null;
let tlsAgent: https.Agent | null = null;
let plainAgent: http.Agent | null = null;

const ROUTES: readonly [string, string, 'agent' | 'admin'][] = [
  ['POST', '/v1/bootstrap', 'agent'],
  ['POST', '/v1/renew', 'agent'],
  ['POST', '/v1/lease', 'agent'],
  ['GET', '/v1/replicas', 'agent'],
  ['POST', '/v1/clusters', 'admin'],
  ['GET', '/v1/proxy-config/c1', 'admin'],
  ['POST', '/v1/proxy-config', 'admin'],
  ['DELETE', '/v1/clusters/c2', 'admin'],
  ['GET', '/v1/managedclusters', 'admin'],
  ['GET', '/v1/nope', 'agent'],
  ['PUT', '/v1/lease', 'agent'],
];

const BODIES = [
  '{"cluster":"c1","token":"abc.def","publicKey":"-----BEGIN PUBLIC KEY-----\\nMIIB\\n-----END PUBLIC KEY-----\\n","proof":"x"}',
  '{"agentID":"a1","version":"v1","phase":"Running","leaseDurationSeconds":60,"connectedServers":1,"serverCount":1,"apiserverReachable":true}',
  '{"cluster":"c2","labels":{"a":"b"}}',
  '{"cluster":"c1","httpsProxy":"http://u:pw@proxy:3128","noProxy":"10.0.0.0/8"}',
  '[]',
  'null',
  '{}',
  '"x"',
  '{"cluster":"C1"}',
  '{"cluster":"' + 'a'.repeat(300) + '"}',
  '',
  '{',
  '\u0000',
];

interface Answer {
  status: number;
  body: string;
}

function send(method: string, path: string, port: 'agent' | 'admin', body: Buffer): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const opts = { host: '127.0.0.1', method, path, headers: { 'content-type': 'application/json', 'content-length': body.length } };
    // The agent port serves the hub API to ALPN http/1.1 (the tunnel protocols otherwise).
    const tlsOpts: https.RequestOptions & { ALPNProtocols: string[] } = {
      ...opts,
      port: ports!.agent,
      agent: tlsAgent!,
      servername: 'localhost',
      ca: ca.certPem,
      cert: agentCert.certPem,
      key: agentCert.keyPem,
      ALPNProtocols: ['http/1.1'],
    };
    const req = port === 'agent' ? https.request(tlsOpts) : http.request({ ...opts, port: ports!.admin, agent: plainAgent! });
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

/** A request from the input: its first byte picks the route, the second the body (or the rest is the body). */
function requestFrom(input: Buffer): { method: string; path: string; port: 'agent' | 'admin'; body: Buffer } {
  const [method, route, port] = ROUTES[(input[0] ?? 0) % ROUTES.length]!;
  const pick = input[1] ?? 0;
  const rest = input.subarray(2);
  // Half the time a path with the input's own bytes after the route (URL-encoded: node refuses raw controls).
  const suffix = pick & 1 ? `/${encodeURIComponent(rest.subarray(0, 16).toString('latin1'))}` : '';
  const body = pick & 2 ? rest : Buffer.from(BODIES[(pick >> 2) % BODIES.length]!);
  return { method, path: `${route}${suffix}`, port, body };
}

export const hubApiTarget: FuzzTarget = {
  name: 'hub-api',
  about:
    'the hub API (bootstrap, renew, lease, replicas on the agent port; join, proxy settings, deletion on the admin port) on a real in-process hub: JSON answers, a refusal is a 4xx with a one-line error (never a 500), no request hangs, the hub answers afterwards',
  generate: fc
    .tuple(fc.nat(ROUTES.length - 1), fc.nat(255), fc.oneof(fc.constantFrom(...BODIES), fc.json({ maxDepth: 2 })))
    .map(([r, pick, body]) => Buffer.concat([Buffer.from([r, pick | 2]), Buffer.from(body)])),
  async setup() {
    hub = new Hub({
      server: {
        bindAddress: '127.0.0.1',
        agentPort: 0,
        frontendPort: null,
        healthPort: null,
        adminPort: 0,
        tls: { caCert: Buffer.from(ca.certPem), cert: Buffer.from(serving.certPem), key: Buffer.from(serving.keyPem) },
      },
      store: new MemoryStore(),
      signer: ca,
      log: pino({ level: 'silent' }),
    });
    const bound = await hub.start();
    ports = { agent: bound.agent, admin: bound.admin! };
    tlsAgent = new https.Agent({ keepAlive: true, maxSockets: 1 });
    plainAgent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    // Cluster c1 registered, so that the agent's routes get past "not registered".
    const joined = await send('POST', '/v1/clusters', 'admin', Buffer.from('{"cluster":"c1"}'));
    check(joined.status === 201, `hub API: registering c1 answered ${joined.status} ${joined.body}`);
  },
  async teardown() {
    tlsAgent?.destroy();
    plainAgent?.destroy();
    await hub?.stop(100);
    hub = null;
  },
  async run(input) {
    const { method, path, port, body } = requestFrom(input);
    const answer = await within(send(method, path, port, body), 5000, `hub API ${method} ${path}`);
    check(
      answer.status !== 500 && answer.status >= 200 && answer.status < 600,
      `hub API ${method} ${path}: status ${answer.status} ${answer.body}`,
    );
    let parsed: unknown;
    try {
      parsed = JSON.parse(answer.body);
    } catch {
      throw new Error(`hub API ${method} ${path}: the answer is not JSON: ${answer.body.slice(0, 200)}`);
    }
    if (answer.status >= 400) {
      const error = (parsed as { error?: unknown }).error;
      check(typeof error === 'string', `hub API ${method} ${path}: a ${answer.status} without an error message`);
      checkOneLine(error, `hub API ${method} ${path} (${answer.status})`);
    }
    // Still serving.
    const alive = await within(send('GET', '/v1/replicas', 'agent', Buffer.alloc(0)), 5000, 'hub API after the input');
    check(alive.status === 200, `the hub stopped answering: ${alive.status}`);
  },
};
