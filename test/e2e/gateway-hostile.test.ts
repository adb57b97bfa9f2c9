// The gateway against a hostile caller, with real processes: a hub on the embedded store with an OIDC
// issuer (no username prefix, groups unprefixed: the caller chooses the names), agents in front of a
// recording "apiserver" that keeps every header's bytes. What a caller may not do: become a reserved
// identity in a cluster (names a header would trim or cannot carry, the hub's admin certificate), have a
// name arrive changed, leave a request running at the apiserver, get a request executed behind a refusal,
// pass a credential on, or learn an internal address from an error.
import { mkdtemp, rm } from 'node:fs/promises';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { issueServerCert } from '@cluster-proxy/server';
import {
  httpsAnswer,
  killAllSpawned,
  runCommand,
  hostileOidcHubArgs,
  startOidcIssuer,
  startRecordingApiserver,
  waitFor,
  writeAgentKubeconfig,
  type HttpsAnswer,
  type OidcIssuer,
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

const SA_TOKEN = 'agent-service-account-token';
let pki: TestPki;
let tmp: string;
let idp: OidcIssuer;
let recorder: RecordingApiserver;
let hub: HubProcess;
let agent: AgentProcess;
/** cluster2's agent: its apiserver address refuses connections. */
let agent2: AgentProcess;
let deadPort: number;
/** A hub token for cluster2 only. */
let cluster2Token: string;

interface Caller {
  token?: string;
  cert?: { cert: Buffer; key: Buffer };
  headers?: Record<string, string>;
}

function gw(target: string, o: Caller = {}): Promise<HttpsAnswer> {
  return httpsAnswer({
    host: '127.0.0.1',
    port: hub.ports.gateway!,
    path: target,
    servername: 'localhost',
    ca: pki.ca.certPem,
    ...(o.cert ?? {}),
    headers: { ...(o.token ? { authorization: `Bearer ${o.token}` } : {}), ...o.headers },
  });
}

const token = (claims: Record<string, unknown>): Promise<string> => idp.token({ sub: 'alice', ...claims });

/** A refusal: this status, one line matching `body`, and nothing reached the apiserver. */
async function expectRefused(target: string, o: Caller, status: number, body: RegExp): Promise<void> {
  const before = recorder.requests.length;
  const r = await gw(target, o);
  expect(r.status, r.body).toBe(status);
  expect(r.body).toMatch(body);
  expect(r.body.split('\n')).toHaveLength(2);
  expect(recorder.requests.length).toBe(before);
}

function lastSeen(): RecordingApiserver['requests'][number] {
  const r = recorder.requests.at(-1);
  if (!r) throw new Error('the apiserver saw no request');
  return r;
}

/** The bytes of every value of header `name` the apiserver received. */
const rawValues = (name: string): Buffer[] =>
  lastSeen()
    .raw.filter((h) => h.name === name)
    .map((h) => h.value);

beforeAll(async () => {
  pki = await createPki();
  tmp = await mkdtemp(path.join(os.tmpdir(), 'cp-gateway-hostile-'));
  recorder = await startRecordingApiserver(issueServerCert(pki.ca, { commonName: 'cluster1-apiserver', ipAddresses: ['127.0.0.1'] }));
  idp = await startOidcIssuer({ tls: issueServerCert(pki.ca, { commonName: 'idp', ipAddresses: ['127.0.0.1'] }) });
  hub = await startHub(pki, ['--gateway-port', '0', '--gateway-response-timeout', '2s', ...hostileOidcHubArgs(idp, pki.caPath)]);
  const kubeconfig = await writeAgentKubeconfig(path.join(tmp, 'agent.kubeconfig'), {
    server: `https://${recorder.address}`,
    caPath: pki.caPath,
    token: SA_TOKEN,
  });
  agent = await startAgent(pki, hub, { cluster: 'cluster1', apiserver: recorder.address, args: ['--gateway-kubeconfig', kubeconfig] });
  // A port nothing listens on: cluster2's apiserver refuses every connection.
  const probe = net.createServer();
  await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r));
  deadPort = (probe.address() as net.AddressInfo).port;
  await new Promise<void>((r) => probe.close(() => r()));
  const deadKubeconfig = await writeAgentKubeconfig(path.join(tmp, 'dead.kubeconfig'), {
    server: `https://127.0.0.1:${deadPort}`,
    caPath: pki.caPath,
    token: SA_TOKEN,
  });
  agent2 = await startAgent(pki, hub, {
    cluster: 'cluster2',
    apiserver: `127.0.0.1:${deadPort}`,
    args: ['--gateway-kubeconfig', deadKubeconfig],
  });
  const issued = await runCommand(
    process.execPath,
    [CLI, 'token', 'issue', '--name', 'c2', '--cluster', 'cluster2', '--data-dir', hub.dataDir],
    { timeoutMs: 20_000 },
  );
  expect(issued.code, issued.stderr).toBe(0);
  cluster2Token = issued.stdout.trim();
}, 90_000);

afterEach(async () => {
  // Nothing is left running: no tunneled connection, no request at the apiserver.
  if (hub && agent) await expectTablesEmpty(hub, [agent, agent2]);
  await waitFor(() => recorder.active() === 0 && recorder.sessions() === 0, {
    timeoutMs: 5000,
    message: 'the apiserver to have no open request',
  });
});

afterAll(async () => {
  await agent?.stop();
  await agent2?.stop();
  await hub?.stop();
  await killAllSpawned();
  await recorder?.close();
  await idp?.close();
  if (tmp) await rm(tmp, { recursive: true, force: true });
  await pki?.cleanup();
});

describe('gateway identities: judged as the cluster reads them', () => {
  it.each([
    ['a leading space', { groups: [' system:masters'] }, /the group " system:masters" begins or ends with whitespace/],
    ['a leading tab', { groups: ['\tsystem:masters'] }, /the group "\\u0009system:masters" begins or ends with whitespace/],
    ['a trailing space', { groups: ['admins '] }, /the group "admins " begins or ends with whitespace/],
    ['a username with a leading space', { sub: ' system:admin' }, /the user " system:admin" begins or ends with whitespace/],
    [
      'a cluster-proxy: username with a leading space',
      { sub: ' cluster-proxy:token:bob' },
      /the user " cluster-proxy:token:bob" begins or ends with whitespace/,
    ],
    ['a username with a trailing tab', { sub: 'bob\t' }, /the user "bob\\u0009" begins or ends with whitespace/],
    [
      'a line break',
      { groups: ['ops\r\nimpersonate-group: system:masters'] },
      /the group "ops\\u000d\\u000aimpersonate-group: system:masters" holds a control character/,
    ],
    ['a NUL', { groups: ['ops\u0000'] }, /the group "ops\\u0000" holds a control character/],
    ['a C1 control', { sub: 'al\u0085ice' }, /the user "al\\u0085ice" holds a control character/],
    ['a lone surrogate', { groups: ['\ud800ops'] }, /the group "\\ud800ops" is not valid Unicode/],
    ['an empty group', { groups: [''] }, /the group "" is empty/],
  ])('an OIDC identity with %s: 401, one line, nothing forwarded', async (_what, claims, why) => {
    await expectRefused(
      '/cluster1/version',
      { token: await token(claims) },
      401,
      new RegExp(`^the credential names an identity the cluster would not read as sent: ${why.source}`),
    );
  });

  it('non-ASCII names reach the apiserver as their UTF-8 bytes, as client-go sends them', async () => {
    const r = await gw('/cluster1/version', { token: await token({ sub: 'josé', groups: ['équipe', '開発', 'ops'] }) });
    expect(r.status, r.body).toBe(200);
    expect(rawValues('impersonate-user')).toEqual([Buffer.from('josé', 'utf8')]);
    expect(rawValues('impersonate-group')).toEqual([Buffer.from('équipe', 'utf8'), Buffer.from('開発', 'utf8'), Buffer.from('ops')]);
  });

  it("a certificate subject in UTF-8 (an external PKI's names) arrives as sent", async () => {
    const zoe = await pki.user('zoë', ['équipe']);
    const r = await gw('/cluster1/version', { cert: zoe });
    expect(r.status, r.body).toBe(200);
    expect(rawValues('impersonate-user')).toEqual([Buffer.from('zoë', 'utf8')]);
    expect(rawValues('impersonate-group')).toEqual([Buffer.from('équipe', 'utf8')]);
  });

  it("the hub's admin certificate (O=system:masters) is cluster:hub:system:masters in a cluster, never system:masters", async () => {
    const admin = await pki.user('hub-admin', ['system:masters', 'ops']);
    const r = await gw('/cluster1/version', { cert: admin });
    expect(r.status, r.body).toBe(200);
    expect(lastSeen().headers['impersonate-user']).toEqual(['hub-admin']);
    expect(lastSeen().headers['impersonate-group']).toEqual(['cluster:hub:system:masters', 'ops']);
  });
});

describe('gateway: nothing left running at the apiserver', () => {
  /** Opens `target` through the gateway, waits for the first bytes of the answer, then leaves (destroys the connection). */
  async function openAndLeave(target: string): Promise<void> {
    const t = await token({ groups: ['ops'] });
    const req = https.request({
      host: '127.0.0.1',
      port: hub.ports.gateway!,
      path: target,
      servername: 'localhost',
      agent: false,
      ca: pki.ca.certPem,
      headers: { authorization: `Bearer ${t}` },
    });
    await new Promise<void>((resolve, reject) => {
      req.on('response', (res) => res.once('data', () => resolve()));
      req.on('error', reject);
      req.end();
    });
    expect(recorder.active()).toBe(1);
    req.destroy();
  }

  it.each([
    ['a watch', '/cluster1/api/v1/namespaces/default/pods?watch=true'],
    ['logs -f', '/cluster1/api/v1/namespaces/default/pods/demo-pod/log?follow=true'],
  ])('%s the caller leaves ends at the apiserver too', async (_what, target) => {
    await openAndLeave(target);
    await waitFor(() => recorder.active() === 0, { timeoutMs: 3000, message: 'the apiserver request to end after its caller left' });
  });

  it('an exec session the caller leaves ends at the apiserver too', async () => {
    const t = await token({ groups: ['ops'] });
    const ws = new WebSocket(
      `wss://127.0.0.1:${hub.ports.gateway}/cluster1/api/v1/namespaces/default/pods/demo-pod/exec?command=sh&stdin=true&stdout=true`,
      ['v5.channel.k8s.io'],
      { ca: pki.ca.certPem, servername: 'localhost', headers: { authorization: `Bearer ${t}` } },
    );
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('error', reject);
    });
    expect(recorder.sessions()).toBe(1);
    ws.terminate();
    await waitFor(() => recorder.sessions() === 0, { timeoutMs: 3000, message: 'the apiserver session to end after its caller left' });
  });

  it('an agent that does not answer in time: 504, one line, and the apiserver request ends', async () => {
    const r = await gw('/cluster1/hang', { token: await token({ groups: ['ops'] }) });
    expect([r.status, r.body]).toEqual([504, "the cluster's agent did not answer within 2 s\n"]);
    await waitFor(() => recorder.active() === 0, { timeoutMs: 3000, message: 'the apiserver request to end after the 504' });
  });
});

describe('gateway: nothing is read after a refusal', () => {
  /** Two requests on one connection, the second a POST that would change something; returns all the caller got. */
  async function pipelined(first: string): Promise<string> {
    const t = await token({ groups: ['ops'] });
    const body = 'x'.repeat(64);
    const second = `POST /cluster1/echo HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer ${t}\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
    const socket = tls.connect({ host: '127.0.0.1', port: hub.ports.gateway!, servername: 'localhost', ca: pki.ca.certPem });
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    await new Promise<void>((resolve, reject) => {
      socket.once('secureConnect', () => socket.write(first + second));
      socket.once('close', () => resolve());
      socket.once('error', reject);
    });
    return Buffer.concat(chunks).toString('latin1');
  }

  it.each([
    [
      "400 (a caller's Impersonate-User)",
      async () =>
        `GET /cluster1/version HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer ${await token({ groups: ['ops'] })}\r\nImpersonate-User: root\r\n\r\n`,
      400,
    ],
    ['401 (no credentials)', async () => 'GET /cluster1/version HTTP/1.1\r\nHost: hub\r\n\r\n', 401],
    [
      '403 (a token for another cluster)',
      async () => `GET /cluster1/version HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer ${cluster2Token}\r\n\r\n`,
      403,
    ],
  ])('a POST pipelined behind a %s is never executed; the connection closes after the refusal', async (_what, first, status) => {
    const before = recorder.requests.length;
    const got = await pipelined(await first());
    expect(got.startsWith(`HTTP/1.1 ${status} `), got).toBe(true);
    expect(got.match(/HTTP\/1\.1 \d{3} /g)).toHaveLength(1);
    expect(recorder.requests.slice(before)).toEqual([]);
  });

  it('a POST pipelined behind a request with Connection: close is never executed', async () => {
    const before = recorder.requests.length;
    const got = await pipelined(
      `GET /cluster1/version HTTP/1.1\r\nHost: hub\r\nConnection: close\r\nAuthorization: Bearer ${await token({ groups: ['ops'] })}\r\n\r\n`,
    );
    expect(got.startsWith('HTTP/1.1 200 '), got).toBe(true);
    expect(got.match(/HTTP\/1\.1 \d{3} /g)).toHaveLength(1);
    expect(recorder.requests.slice(before).map((r) => `${r.method} ${r.url}`)).toEqual(['GET /version']);
  });
});

describe('gateway: request smuggling', () => {
  it.each([
    ['Content-Length and Transfer-Encoding together', 'Content-Length: 4\r\nTransfer-Encoding: chunked'],
    ['two different Content-Lengths', 'Content-Length: 4\r\nContent-Length: 40'],
  ])('%s: 400 with one line, nothing forwarded, the connection closed', async (_what, lengths) => {
    const t = await token({ groups: ['ops'] });
    const before = recorder.requests.length;
    const socket = tls.connect({ host: '127.0.0.1', port: hub.ports.gateway!, servername: 'localhost', ca: pki.ca.certPem });
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    await new Promise<void>((resolve, reject) => {
      socket.once('secureConnect', () =>
        socket.write(
          `POST /cluster1/echo HTTP/1.1\r\nHost: hub\r\nAuthorization: Bearer ${t}\r\n${lengths}\r\n\r\n0\r\n\r\nPOST /cluster1/echo HTTP/1.1\r\nHost: hub\r\nContent-Length: 0\r\n\r\n`,
        ),
      );
      socket.once('close', () => resolve());
      socket.once('error', reject);
    });
    const got = Buffer.concat(chunks).toString('latin1');
    expect(got).toMatch(/^HTTP\/1\.1 400 [^]*\r\n\r\nmalformed HTTP request\n$/);
    expect(recorder.requests.length).toBe(before);
  });
});

describe('gateway: one head limit, end to end', () => {
  it("a head just within the hub's 16 KiB passes the agent too (the identity is added on the way)", async () => {
    const t = await token({ groups: ['ops'] });
    const filler = 'f'.repeat(16 * 1024 - 400 - t.length);
    const r = await gw('/cluster1/version', { token: t, headers: { 'x-filler': filler } });
    expect(r.status, r.body).toBe(200);
    expect(lastSeen().headers['x-filler']).toEqual([filler]);
  });

  it('a head over 16 KiB: 431 from the hub with one line', async () => {
    const before = recorder.requests.length;
    const r = await gw('/cluster1/version', { token: await token({ groups: ['ops'] }), headers: { 'x-filler': 'f'.repeat(17 * 1024) } });
    expect([r.status, r.body]).toEqual([431, 'the request head is larger than 16384 bytes\n']);
    expect(recorder.requests.length).toBe(before);
  });
});

describe('gateway: no credential passes on, no internal address comes back', () => {
  it('front-proxy headers (X-Remote-*) are dropped', async () => {
    const r = await gw('/cluster1/version', {
      token: await token({ groups: ['ops'] }),
      headers: { 'x-remote-user': 'admin', 'x-remote-group': 'system:masters', 'x-remote-extra-scopes': 'all', 'x-remote-uid': '0' },
    });
    expect(r.status, r.body).toBe(200);
    expect(Object.keys(lastSeen().headers).filter((h) => h.startsWith('x-remote-'))).toEqual([]);
  });

  it('a bearer token in Sec-WebSocket-Protocol is dropped, the channel protocol kept', async () => {
    const t = await token({ groups: ['ops'] });
    const secret = Buffer.from('a-token-for-the-apiserver').toString('base64url');
    const ws = new WebSocket(
      `wss://127.0.0.1:${hub.ports.gateway}/cluster1/api/v1/namespaces/default/pods/demo-pod/exec?command=sh&stdin=true&stdout=true`,
      ['v5.channel.k8s.io', `base64url.bearer.authorization.k8s.io.${secret}`],
      { ca: pki.ca.certPem, servername: 'localhost', headers: { authorization: `Bearer ${t}` } },
    );
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('error', reject);
    });
    expect(ws.protocol).toBe('v5.channel.k8s.io');
    expect(lastSeen().headers['sec-websocket-protocol']).toEqual(['v5.channel.k8s.io']);
    expect(JSON.stringify(lastSeen().headers)).not.toContain(secret);
    ws.close();
    await new Promise((r) => ws.once('close', r));
  });

  it('an apiserver the agent cannot reach: 502 with the error code, not its address', async () => {
    const r = await gw('/cluster2/version', { token: await token({ groups: ['ops'] }) });
    expect([r.status, r.body]).toEqual([502, "the agent could not reach the cluster's apiserver (ECONNREFUSED)\n"]);
    expect(r.body).not.toContain(String(deadPort));
  });
});
