// The gateway's proxy-service form with real processes: a hub with --gateway-services (the allowlist
// file), an agent that resolves `*.demo.svc` the way a pod does — through its own /etc/hosts (a private
// mount namespace, `unshare -m`, with a hosts file naming 127.0.0.1; nothing on the machine changes) —
// and an HTTP and an HTTPS "Service" on loopback that record what reached them.
import { spawnSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import WebSocket, { WebSocketServer } from 'ws';
import { createCA, issueServerCert } from '@cluster-proxy/server';
import {
  killAllSpawned,
  runCommand,
  writeAgentKubeconfig,
  startRecordingApiserver,
  waitFor,
  type RecordingApiserver,
} from '../src/fixtures/index.js';
import {
  CLI,
  createPki,
  expectTablesEmpty,
  startAgent,
  startHub,
  type AgentProcess,
  type HubProcess,
  type TestPki,
} from '../src/harness.js';

/** A private mount namespace needs CAP_SYS_ADMIN; without it the agent could not resolve the names. */
const unshareProbe = spawnSync('unshare', ['-m', 'true'], { timeout: 5000 });
const unavailable =
  unshareProbe.status === 0
    ? null
    : `unshare -m is not available here (${unshareProbe.error?.message ?? unshareProbe.stderr?.toString().trim() ?? 'not root?'})`;
if (unavailable) console.log(`skipping the proxy-service tests: ${unavailable}`);

const SA_TOKEN = 'agent-service-account-token';
let pki: TestPki;
let hub: HubProcess;
let agent: AgentProcess;
let api: RecordingApiserver;
let tmp: string;
let allowlistFile: string;
let gatewayPort: number;
let token: string;
let plain: Recorder;
let secure: Recorder;
let svcCaPem: string;

interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: string;
}
interface Recorder {
  port: number;
  seen: Seen[];
  server: http.Server;
}

/** A Service: answers 200 with "<name> <path>" and records each request. */
async function startService(name: string, tlsPair?: { certPem: string; keyPem: string }): Promise<Recorder> {
  const seen: Seen[] = [];
  const handler = (req: http.IncomingMessage, res: http.ServerResponse): void => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks).toString() });
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(`${name} ${req.url}`);
    });
  };
  const server = tlsPair ? https.createServer({ cert: tlsPair.certPem, key: tlsPair.keyPem }, handler) : http.createServer(handler);
  // A WebSocket endpoint too (a dashboard's live feed, say): it echoes each message back.
  const wss = new WebSocketServer({ server });
  wss.on('connection', (ws, req) => {
    seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body: '' });
    ws.on('message', (m: Buffer) => ws.send(`${name} echo ${m.toString()}`));
  });
  server.on('close', () => {
    for (const c of wss.clients) c.terminate();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { port: (server.address() as AddressInfo).port, seen, server };
}

interface Answer {
  status: number;
  body: string;
}

function gw(target: string, o: { token?: string | null; method?: string; body?: string } = {}): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const bearer = o.token === undefined ? token : o.token;
    const req = https.request(
      {
        host: '127.0.0.1',
        port: gatewayPort,
        path: target,
        method: o.method ?? 'GET',
        servername: 'localhost',
        agent: false,
        ca: pki.ca.certPem,
        headers: bearer ? { authorization: `Bearer ${bearer}` } : {},
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(o.body);
  });
}

const svcPath = (spec: string, rest = ''): string => `/cluster1/api/v1/namespaces/demo/services/${spec}/proxy-service${rest}`;

async function writeAllowlist(entries: string[]): Promise<void> {
  await writeFile(allowlistFile, `${entries.join('\n')}\n`);
}

let baseEntries: string[];

beforeAll(async () => {
  if (unavailable) return;
  pki = await createPki();
  tmp = await mkdtemp(path.join(os.tmpdir(), 'cp-gw-services-'));
  const svcCa = createCA({ commonName: 'service-ca' });
  svcCaPem = svcCa.certPem;
  await writeFile(path.join(tmp, 'service-ca.crt'), svcCaPem);
  plain = await startService('hello');
  secure = await startService(
    'secure',
    issueServerCert(svcCa, { commonName: 'secure.demo.svc', dnsNames: ['secure.demo.svc', 'untrusted.demo.svc'] }),
  );
  api = await startRecordingApiserver(issueServerCert(pki.ca, { commonName: 'cluster1-apiserver', ipAddresses: ['127.0.0.1'] }));

  allowlistFile = path.join(tmp, 'services.yaml');
  baseEntries = [
    `- { namespace: demo, service: hello, port: ${plain.port}, protocol: http }`,
    '- { namespace: demo, service: secure, protocol: https, caFile: service-ca.crt }',
    '- { namespace: demo, service: untrusted, protocol: https }',
    '- { namespace: demo, service: elsewhere, clusters: [cluster2] }',
    '- { namespace: demo, service: not-on-agent }',
  ];
  await writeAllowlist(baseEntries);
  // With a prefix on every identity the clusters see (the kube form below shows it).
  hub = await startHub(pki, ['--gateway-port', '0', '--gateway-services', allowlistFile, '--gateway-identity-prefix', 'hub:']);
  gatewayPort = hub.ports.gateway!;

  const hosts = path.join(tmp, 'hosts');
  await writeFile(hosts, '127.0.0.1 localhost\n127.0.0.1 hello.demo.svc secure.demo.svc untrusted.demo.svc not-on-agent.demo.svc\n');
  const agentKubeconfig = await writeAgentKubeconfig(path.join(tmp, 'agent.kubeconfig'), {
    server: `https://${api.address}`,
    caPath: pki.caPath,
    token: SA_TOKEN,
  });
  agent = await startAgent(pki, hub, {
    cluster: 'cluster1',
    apiserver: api.address,
    args: [
      '--gateway-kubeconfig',
      agentKubeconfig,
      '--allow',
      `hello.demo.svc:${plain.port}`,
      '--allow',
      `secure.demo.svc:${secure.port}`,
      '--allow',
      `untrusted.demo.svc:${secure.port}`,
    ],
    // Its own /etc/hosts, as a pod's resolver would name the Services.
    wrap: (command, args) => ({
      command: 'unshare',
      args: ['-m', 'sh', '-c', 'mount --bind "$0" /etc/hosts && exec "$@"', hosts, command, ...args],
    }),
  });
  const issued = await runCommand(
    process.execPath,
    [CLI, 'token', 'issue', '--name', 'svc-user', '--cluster', 'cluster1', '--data-dir', hub.dataDir],
    { timeoutMs: 20_000 },
  );
  expect(issued.code, issued.stderr).toBe(0);
  token = issued.stdout.trim();
}, 60_000);

afterAll(async () => {
  if (unavailable) return;
  await agent?.stop();
  await hub?.stop();
  await killAllSpawned();
  await api?.close();
  for (const s of [plain, secure]) if (s) await new Promise((r) => s.server.close(r));
  if (tmp) await rm(tmp, { recursive: true, force: true });
  await pki?.cleanup();
});

describe.skipIf(unavailable !== null)('HTTP gateway: the proxy-service form', () => {
  it("an allowlisted http Service: path and query arrive, a body streams, and none of the caller's credentials go with it", async () => {
    const r = await gw(svcPath(`http:hello:${plain.port}`, '/metrics/x?a=1&b=%2F'));
    expect(r).toEqual({ status: 200, body: 'hello /metrics/x?a=1&b=%2F' });
    const seen = plain.seen.at(-1)!;
    expect(seen.url).toBe('/metrics/x?a=1&b=%2F');
    expect(seen.headers['host']).toBe(`hello.demo.svc:${plain.port}`);
    expect(seen.headers['authorization']).toBeUndefined();
    expect(Object.keys(seen.headers).filter((h) => h.startsWith('impersonate-') || h.startsWith('x-cluster-proxy-'))).toEqual([]);
    expect(seen.headers['x-forwarded-for']).toBe('127.0.0.1');
    const body = 'x'.repeat(200_000);
    const posted = await gw(svcPath(`http:hello:${plain.port}`, '/upload'), { method: 'POST', body });
    expect(posted.status).toBe(200);
    expect(plain.seen.at(-1)!.body).toBe(body);
  });

  it("curl, as a user types it, gets the Service's answer", async () => {
    const url = `https://localhost:${gatewayPort}${svcPath(`http:hello:${plain.port}`, '/index.html')}`;
    const r = await runCommand(
      'curl',
      [
        '-sS',
        '--fail-with-body',
        '--resolve',
        `localhost:${gatewayPort}:127.0.0.1`,
        '--cacert',
        pki.caPath,
        '-H',
        `Authorization: Bearer ${token}`,
        url,
      ],
      { timeoutMs: 20_000 },
    );
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe('hello /index.html');
  });

  it("an https Service is verified against its entry's caFile as NAME.NAMESPACE.svc", async () => {
    const r = await gw(svcPath(`https:secure:${secure.port}`, '/ok'));
    expect(r).toEqual({ status: 200, body: 'secure /ok' });
    expect(secure.seen.at(-1)!.headers['authorization']).toBeUndefined();
  });

  it('an https Service whose certificate chains to no trusted CA: 502, one line naming the fix, nothing sent', async () => {
    const before = secure.seen.length;
    const r = await gw(svcPath(`untrusted:${secure.port}`, '/x'));
    expect(r.status).toBe(502);
    expect(r.body).toMatch(/^TLS to the service failed: .*caFile.*\n$/);
    expect(r.body.split('\n')).toHaveLength(2);
    expect(secure.seen.length).toBe(before);
  });

  it.each([
    [
      'a Service not on the list',
      () => svcPath(`http:other:${plain.port}`, '/'),
      /service demo\/other \(http, port \d+\) is not in the gateway's service allowlist for cluster cluster1/,
    ],
    [
      'the listed Service on another port',
      () => svcPath(`http:hello:${plain.port + 1}`, '/'),
      /service demo\/hello .* is not in the gateway's service allowlist/,
    ],
    [
      'the listed Service over https where only http is listed',
      () => svcPath(`https:hello:${plain.port}`, '/'),
      /not in the gateway's service allowlist/,
    ],
    ['an entry scoped to another cluster', () => svcPath('http:elsewhere:80', '/'), /service demo\/elsewhere .* for cluster cluster1/],
  ])('403 for %s, one line, nothing reaches any Service', async (_what, target, why) => {
    const before = plain.seen.length + secure.seen.length;
    const r = await gw(target());
    expect(r.status).toBe(403);
    expect(r.body).toMatch(why);
    expect(r.body.split('\n')).toHaveLength(2);
    expect(plain.seen.length + secure.seen.length).toBe(before);
  });

  it("a WebSocket to an allowlisted Service is spliced through, without the caller's credentials", async () => {
    const ws = new WebSocket(`wss://127.0.0.1:${gatewayPort}${svcPath(`http:hello:${plain.port}`, '/feed?x=1')}`, {
      ca: pki.ca.certPem,
      servername: 'localhost',
      headers: { authorization: `Bearer ${token}` },
    } as WebSocket.ClientOptions);
    try {
      await new Promise<void>((resolve, reject) => {
        ws.once('open', () => resolve());
        ws.once('error', reject);
      });
      const echoed = new Promise<string>((resolve) => ws.once('message', (m: Buffer) => resolve(m.toString())));
      ws.send('ping');
      expect(await echoed).toBe('hello echo ping');
      const seen = plain.seen.at(-1)!;
      expect(seen.url).toBe('/feed?x=1');
      expect(seen.headers['authorization']).toBeUndefined();
      expect(seen.headers['host']).toBe(`hello.demo.svc:${plain.port}`);
    } finally {
      ws.terminate();
    }
    // Not on the list: refused before any upgrade.
    const refused = new WebSocket(`wss://127.0.0.1:${gatewayPort}${svcPath(`http:other:${plain.port}`, '/feed')}`, {
      ca: pki.ca.certPem,
      servername: 'localhost',
      headers: { authorization: `Bearer ${token}` },
    } as WebSocket.ClientOptions);
    const status = await new Promise<number>((resolve) => {
      refused.once('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0));
      refused.once('error', () => resolve(-1));
    });
    refused.terminate();
    expect(status).toBe(403);
  });

  it("on the hub's list but not the agent's --allow: 403 from the cluster side, named", async () => {
    const r = await gw(svcPath('http:not-on-agent:8000', '/'));
    expect(r.status).toBe(403);
    expect(r.body).toMatch(/the cluster's agent does not allow not-on-agent\.demo\.svc:8000 \(its --allow list\)/);
  });

  it('authentication comes first: no credential is 401 even for an allowlisted Service', async () => {
    const before = plain.seen.length;
    const r = await gw(svcPath(`http:hello:${plain.port}`, '/'), { token: null });
    expect(r.status).toBe(401);
    expect(plain.seen.length).toBe(before);
  });

  it('default/kubernetes is the apiserver, as the caller by impersonation (as in OCM), with --gateway-identity-prefix on user and groups', async () => {
    const r = await gw('/cluster1/api/v1/namespaces/default/services/https:kubernetes:443/proxy-service/version');
    expect(r.status).toBe(200);
    const seen = api.requests.at(-1)!;
    expect(seen.url).toBe('/version');
    expect(seen.headers['impersonate-user']).toEqual(['hub:cluster-proxy:token:svc-user']);
    expect(seen.headers['impersonate-group']).toEqual(['hub:cluster-proxy:tokens']);
    expect(seen.headers['authorization']).toEqual([`Bearer ${SA_TOKEN}`]);
  });

  it('the list is re-read when the file changes: an entry removed is refused, restored is served again', async () => {
    await writeAllowlist(baseEntries.slice(1));
    await waitFor(async () => (await gw(svcPath(`http:hello:${plain.port}`, '/'))).status === 403, {
      timeoutMs: 15_000,
      intervalMs: 250,
      message: 'hello still allowed after its entry was removed',
    });
    // A broken file keeps the last good list (hello stays refused, secure stays served).
    await writeFile(allowlistFile, `${baseEntries.join('\n')}\n- { namespace: demo }\n`);
    // The hub has read the broken file once it says so; the last good list is what it serves then.
    await waitFor(
      () =>
        hub.proc
          .lines()
          .some((l) => l.includes('changed but cannot be used (the last good list stays)') && l.includes('entry 6: service is required')),
      { timeoutMs: 15_000, intervalMs: 100, message: 'the broken list was not reported' },
    );
    expect((await gw(svcPath(`http:hello:${plain.port}`, '/'))).status).toBe(403);
    expect((await gw(svcPath(`https:secure:${secure.port}`, '/'))).status).toBe(200);
    await writeAllowlist(baseEntries);
    await waitFor(async () => (await gw(svcPath(`http:hello:${plain.port}`, '/'))).status === 200, {
      timeoutMs: 15_000,
      intervalMs: 250,
      message: 'hello not allowed again after its entry was restored',
    });
  }, 45_000);

  it("afterwards the hub's and the agent's connection tables are empty", async () => {
    await expectTablesEmpty(hub, [agent]);
  });
});
