// The HTTP CONNECT frontend end to end: the hub core in this process (ProxyServer), a real agent
// process over mTLS, a demo HTTPS "apiserver" and TCP targets behind it, and real clients: curl
// (TLS to the proxy with a client certificate, Bearer and Basic tokens), Python's http.client
// set_tunnel, and raw Node sockets for protocol edge cases.
import { once } from 'node:events';
import { stat } from 'node:fs/promises';
import { readFileSync } from 'node:fs';
import https from 'node:https';
import { createRequire } from 'node:module';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, type TestContext } from 'vitest';
import { ProxyServer, issueServerCert } from '@cluster-proxy/server';
// Not exported from the package index yet (the hub wires it in); the built files are the same modules.
import { startConnectFrontend, TokenStore, type ConnectFrontend } from '@cluster-proxy/server';
import {
  digestStream,
  killAllSpawned,
  payloadSha256,
  snapshotHandles,
  spawnProcess,
  startBlackhole,
  startEchoServer,
  startSinkServer,
  startSourceServer,
  waitFor,
  waitForHandlesAtMost,
  writePayload,
  type Blackhole,
  type ManagedProcess,
  type SinkServer,
  type SourceServer,
  type TcpTarget,
  runCommand,
  type RunResult,
} from '../src/fixtures/index.js';
import { CLI, createPki, getJson, type AgentTables, type CertFiles, type TestPki } from '../src/harness.js';

const MiB = 1024 * 1024;
const require = createRequire(new URL('../../server/package.json', import.meta.url));
// eslint-disable-next-line @typescript-eslint/no-require-imports
const { pino } = require('pino') as { pino: (opts: object, dest: { write(s: string): void }) => import('pino').Logger };

interface AgentProc {
  proc: ManagedProcess;
  healthPort: number;
}

let pki: TestPki;
let server: ProxyServer;
let fe: ConnectFrontend;
let tokens: TokenStore;
let agent: AgentProc;
const extraAgents: AgentProc[] = [];
let apiserver: https.Server;
let echo: TcpTarget;
let sink: SinkServer;
let source: SourceServer;
let blackhole: Blackhole;
let agentCert: CertFiles;
let caPem: string;
let clientCert: Buffer;
let clientKey: Buffer;
let handles: Map<string, number>;
let curlMissing: string | null = null;
/** Every log line of the in-process hub and frontend (level debug), to check no token leaks. */
const logLines: string[] = [];
const issuedSecrets: string[] = [];
let allToken: string;
let cluster2Token: string;

// ------------------------------------------------------------ helpers

async function startAgentProcess(
  cluster: string,
  apiserverAddr: string,
  extraArgs = ['--allow', '127.0.0.1:*', '--identifiers', 'cidr=127.0.0.0/8'],
): Promise<AgentProc> {
  const cert = await pki.agent(cluster);
  const proc = spawnProcess({
    name: `agent-${cluster}`,
    command: process.execPath,
    args: [
      CLI,
      'agent',
      '--cluster',
      cluster,
      '--hub',
      `127.0.0.1:${server.ports!.agent}`,
      '--server-name',
      'localhost',
      '--ca-cert',
      pki.caPath,
      '--cert',
      cert.certPath,
      '--key',
      cert.keyPath,
      '--apiserver',
      apiserverAddr,
      '--health-bind-address',
      '127.0.0.1',
      '--health-port',
      '0',
      '--dial-timeout',
      '10s',
      ...extraArgs,
    ],
  });
  const up = await proc.waitForJsonLine((o) => o['msg'] === 'agent health listener up', 15_000);
  await proc.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 15_000);
  await waitFor(() => server.core.routes.backends().some((b) => b.cluster === cluster), {
    timeoutMs: 5000,
    message: `hub routes ${cluster}`,
  });
  return { proc, healthPort: Number(up['healthPort']) };
}

function run(cmd: string, args: string[], env: NodeJS.ProcessEnv = {}, timeoutMs = 30_000): Promise<RunResult> {
  const clean: NodeJS.ProcessEnv = { ...process.env };
  for (const k of Object.keys(clean)) if (/^(https?|all|no)_proxy$/i.test(k)) delete clean[k];
  return runCommand(cmd, args, { env: { ...clean, ...env }, timeoutMs });
}

interface CurlResult extends RunResult {
  /** Status of the proxy's answer to CONNECT (0 if none). */
  connect: number;
  /** Status of the request through the tunnel (0 if none). */
  http: number;
  body: string;
}

/** curl through the TLS listener; `args` add credentials and the URL. */
async function curl(args: string[]): Promise<CurlResult> {
  const r = await run('curl', [
    '-sS',
    '--max-time',
    '20',
    '--proxy',
    `https://127.0.0.1:${fe.ports.tls}`,
    '--proxy-cacert',
    pki.caPath,
    '--cacert',
    pki.caPath,
    '-w',
    '\n%{http_connect} %{http_code}',
    ...args,
  ]);
  const nl = r.stdout.lastIndexOf('\n');
  const [connect, http] = r.stdout
    .slice(nl + 1)
    .split(' ')
    .map(Number);
  return { ...r, connect: connect ?? 0, http: http ?? 0, body: r.stdout.slice(0, nl) };
}

const clientCertArgs = (): string[] => ['--proxy-cert', pki.client.certPath, '--proxy-key', pki.client.keyPath];

function needCurl(ctx: TestContext): void {
  if (curlMissing) {
    console.warn(`skipped: ${curlMissing}`);
    ctx.skip();
  }
}

type Via = 'tls' | 'tls-cert' | 'uds' | 'plain';

function openProxy(via: Via, frontend: ConnectFrontend = fe, cert?: { cert: Buffer; key: Buffer }): net.Socket {
  switch (via) {
    case 'tls':
    case 'tls-cert': {
      const c = via === 'tls-cert' ? (cert ?? { cert: clientCert, key: clientKey }) : undefined;
      return tls.connect({ host: '127.0.0.1', port: frontend.ports.tls!, ca: caPem, ...(c ?? {}) });
    }
    case 'uds':
      return net.connect(frontend.ports.uds!);
    case 'plain':
      return net.connect(frontend.ports.plain!, '127.0.0.1');
  }
}

interface Reply {
  status: number;
  head: string;
  headers: Map<string, string>;
  body: string;
  socket: net.Socket;
}

/** Sends `request` and reads the proxy's answer. On 200 the socket is handed back paused (call
 * resume() once listening), with any bytes after the response head unshifted, ready to be the
 * tunnel; otherwise it reads to EOF. */
function proxyRequest(socket: net.Socket, request: string | Buffer, timeoutMs = 20_000): Promise<Reply> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    let reply: Omit<Reply, 'body'> | null = null;
    const timer = setTimeout(
      () => fail(new Error(`no complete proxy reply within ${timeoutMs} ms; got ${JSON.stringify(buf.toString('latin1').slice(0, 200))}`)),
      timeoutMs,
    );
    const cleanup = (): void => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('end', onEnd);
      socket.off('error', fail);
    };
    function fail(err: Error): void {
      cleanup();
      socket.destroy();
      reject(err);
    }
    const onData = (d: Buffer): void => {
      buf = Buffer.concat([buf, d]);
      if (reply) return;
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      const head = buf.subarray(0, end + 4).toString('latin1');
      const lines = head.split('\r\n');
      const status = Number(/^HTTP\/1\.[01] (\d{3}) /.exec(lines[0]!)?.[1] ?? 0);
      const headers = new Map<string, string>();
      for (const l of lines.slice(1)) if (l) headers.set(l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim());
      reply = { status, head, headers, socket };
      buf = buf.subarray(end + 4);
      if (status === 200) {
        cleanup();
        socket.pause();
        if (buf.length > 0) socket.unshift(buf);
        resolve({ ...reply, body: '' });
      }
    };
    const onEnd = (): void => {
      cleanup();
      if (!reply) return reject(new Error(`proxy closed without a reply; got ${JSON.stringify(buf.toString('latin1'))}`));
      resolve({ ...reply, body: buf.toString('utf8') });
    };
    socket.on('data', onData);
    socket.once('end', onEnd);
    socket.once('error', fail);
    socket.write(request);
  });
}

function connectHead(target: string, headers: string[] = []): string {
  return `CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n${headers.map((h) => `${h}\r\n`).join('')}\r\n`;
}

async function openTunnel(target: string, via: Via = 'tls-cert', headers: string[] = []): Promise<net.Socket> {
  const r = await proxyRequest(openProxy(via), connectHead(target, headers));
  expect(r.head).toBe('HTTP/1.1 200 Connection Established\r\n\r\n');
  return r.socket;
}

/** Checks an error reply: status, Connection: close, a one-line text body naming the destination. */
function expectRefusal(r: Reply, status: number, destination: string, body: RegExp): void {
  expect(r.status, r.head + r.body).toBe(status);
  expect(r.headers.get('connection')).toBe('close');
  expect(r.headers.get('content-type')).toMatch(/^text\/plain/);
  expect(Number(r.headers.get('content-length'))).toBe(Buffer.byteLength(r.body));
  expect(r.body.endsWith('\n')).toBe(true);
  expect(r.body.trimEnd()).not.toContain('\n');
  expect(r.body).toContain(destination);
  expect(r.body).toMatch(body);
}

async function refusal(target: string, via: Via, headers: string[] = []): Promise<Reply> {
  const r = await proxyRequest(openProxy(via), connectHead(target, headers));
  r.socket.destroy();
  return r;
}

/** GET /version from the demo apiserver over an open tunnel (TLS end to end, verified as "cluster1"). */
async function getVersionOver(tunnel: net.Socket, servername = 'cluster1'): Promise<string> {
  const t = tls.connect({ socket: tunnel, servername, ca: caPem });
  t.write(`GET /version HTTP/1.1\r\nHost: ${servername}\r\nConnection: close\r\n\r\n`);
  let out = '';
  t.setEncoding('utf8').on('data', (s: string) => (out += s));
  await once(t, 'end');
  t.destroy();
  return out;
}

async function expectTablesEmpty(frontends: ConnectFrontend[] = [fe]): Promise<void> {
  const agents = [agent, ...extraAgents].filter((a) => a.proc.isRunning());
  await waitFor(
    async () => {
      const s = server.snapshot();
      if (s.agents.some((a) => a.pending > 0 || a.established.length > 0)) return false;
      if (frontends.some((f) => f.connections() > 0)) return false;
      for (const a of agents) {
        const t = (await getJson(a.healthPort, '/debug/connections')) as AgentTables;
        if (t.servers.some((sv) => sv.connections.length > 0)) return false;
      }
      return true;
    },
    { timeoutMs: 10_000, intervalMs: 50, message: 'connection tables did not drain' },
  ).catch((err: Error) => {
    throw new Error(
      `${err.message}: ${JSON.stringify({ hub: server.snapshot(), connect: frontends.map((f) => f.describe()) }).slice(0, 2000)}`,
    );
  });
}

// ------------------------------------------------------------ environment

beforeAll(async () => {
  const probe = await run('curl', ['--version']).catch(() => null);
  if (!probe || probe.code !== 0) {
    const apt = await run('apt-get', ['install', '-y', 'curl'], {}, 180_000).catch((e: Error) => ({
      code: -1,
      stdout: '',
      stderr: e.message,
    }));
    const again = await run('curl', ['--version']).catch(() => null);
    if (!again || again.code !== 0)
      curlMissing = `curl is not installed and "apt-get install -y curl" failed: ${apt.stderr.trim().split('\n').pop()}`;
  }
  pki = await createPki();
  caPem = pki.ca.certPem;
  clientCert = readFileSync(pki.client.certPath);
  clientKey = readFileSync(pki.client.keyPath);
  const log = pino({ level: 'debug' }, { write: (s: string) => void logLines.push(s) });
  [echo, sink, blackhole] = await Promise.all([startEchoServer(), startSinkServer(), startBlackhole()]);
  source = await startSourceServer(20 * MiB);
  const apiTls = issueServerCert(pki.ca, {
    commonName: 'cluster1-apiserver',
    dnsNames: ['cluster1', 'cluster3'],
    ipAddresses: ['127.0.0.1'],
  });
  apiserver = https.createServer({ cert: apiTls.certPem, key: apiTls.keyPem }, (req, res) => {
    res.writeHead(req.url === '/version' ? 200 : 404, { 'content-type': 'application/json' });
    res.end(`${JSON.stringify({ major: '1', minor: '33', gitVersion: 'v1.33.0-demo', cluster: 'cluster1' })}\n`);
  });
  apiserver.keepAliveTimeout = 500;
  await new Promise<void>((r) => apiserver.listen(0, '127.0.0.1', r));
  const tlsFiles = { caCert: Buffer.from(caPem), cert: readFileSync(pki.server.certPath), key: readFileSync(pki.server.keyPath) };
  server = new ProxyServer({
    bindAddress: '127.0.0.1',
    agentPort: 0,
    frontendPort: null,
    healthPort: null,
    adminPort: null,
    tls: tlsFiles,
    dialTimeoutMs: 1500,
    grants: new Map([['cluster1', { hosts: [], cidrs: ['127.0.0.0/8'], defaultRoute: false }]]),
    log,
  });
  await server.start();
  agent = await startAgentProcess('cluster1', `127.0.0.1:${(apiserver.address() as net.AddressInfo).port}`);
  agentCert = await pki.agent('cluster1', { name: 'agent-cert-for-403' });
  tokens = await TokenStore.open(path.join(pki.dir, 'hub-data', 'tokens.json'));
  allToken = (await tokens.issue({ name: 'all', clusters: '*' })).token;
  cluster2Token = (await tokens.issue({ name: 'cluster2-only', clusters: ['cluster2'] })).token;
  issuedSecrets.push(allToken, cluster2Token);
  fe = await startConnectFrontend({
    core: server.core,
    log,
    tokens,
    tls: { host: '127.0.0.1', port: 0, ...tlsFiles },
    uds: path.join(pki.dir, 'connect.sock'),
    plain: { host: '127.0.0.1', port: 0 },
  });
}, 120_000);

afterAll(async () => {
  await fe?.stop();
  await Promise.all([agent?.proc.stop(8000), ...extraAgents.map((a) => a.proc.stop(8000))]);
  await server?.stop(1000);
  await killAllSpawned();
  if (apiserver) {
    apiserver.closeAllConnections();
    await new Promise((r) => apiserver.close(r));
  }
  await Promise.all([echo?.close(), sink?.close(), source?.close(), blackhole?.close()]);
  await pki?.cleanup();
});

beforeEach(() => {
  handles = snapshotHandles();
});

afterEach(async () => {
  await expectTablesEmpty();
  await waitForHandlesAtMost(handles, 5000);
});

// ------------------------------------------------------------ tests

describe('HTTP CONNECT frontend: real clients', () => {
  it("curl over TLS with a client certificate reaches cluster1's apiserver (https://cluster1/version)", async (ctx) => {
    needCurl(ctx);
    const r = await curl([...clientCertArgs(), 'https://cluster1/version']);
    expect(r.stderr).toBe('');
    expect(r.connect).toBe(200);
    expect(r.http).toBe(200);
    expect(JSON.parse(r.body)).toMatchObject({ gitVersion: 'v1.33.0-demo', cluster: 'cluster1' });
  });

  it("curl with a Bearer token (--proxy-header) and with Basic (-U user:token, and user-info in the proxy URL as kubectl's proxy-url does)", async (ctx) => {
    needCurl(ctx);
    const bearer = await curl(['--proxy-header', `Proxy-Authorization: Bearer ${allToken}`, 'https://cluster1/version']);
    expect([bearer.connect, bearer.http]).toEqual([200, 200]);
    expect(bearer.body).toContain('v1.33.0-demo');
    const basic = await curl(['-U', `anyone:${allToken}`, 'https://cluster1/version']);
    expect([basic.connect, basic.http]).toEqual([200, 200]);
    const userinfo = await run('curl', [
      '-sS',
      '--max-time',
      '20',
      '--proxy',
      `https://kubectl:${allToken}@127.0.0.1:${fe.ports.tls}`,
      '--proxy-cacert',
      pki.caPath,
      '--cacert',
      pki.caPath,
      'https://cluster1/version',
    ]);
    expect(userinfo.stdout).toContain('v1.33.0-demo');
  });

  it('Python http.client set_tunnel (plain loopback listener that allows tokens)', async () => {
    const local = await startConnectFrontend({
      core: server.core,
      log: pino({ level: 'debug' }, { write: (s: string) => void logLines.push(s) }),
      tokens,
      plain: { host: '127.0.0.1', port: 0, allowTokens: true },
    });
    try {
      const script = `
import http.client, os, ssl
ctx = ssl.create_default_context(cafile=os.environ["CA"])
c = http.client.HTTPSConnection("127.0.0.1", int(os.environ["PORT"]), context=ctx, timeout=15)
c.set_tunnel(os.environ["TARGET"], 443, headers={"Proxy-Authorization": "Bearer " + os.environ["TOKEN"]})
try:
    c.request("GET", "/version")
    r = c.getresponse()
    print(r.status, r.read().decode().strip())
except OSError as e:
    print("ERROR", e)
c.close()
`;
      const env = { CA: pki.caPath, PORT: String(local.ports.plain), TOKEN: allToken };
      const ok = await run('python3', ['-c', script], { ...env, TARGET: 'cluster1' });
      expect(ok.stderr).toBe('');
      expect(ok.stdout).toMatch(/^200 \{.*"cluster":"cluster1"/);
      const denied = await run('python3', ['-c', script], { ...env, TARGET: 'cluster1', TOKEN: cluster2Token });
      expect(denied.stdout.trim()).toBe('ERROR Tunnel connection failed: 403 Forbidden');
      const none = await run('python3', ['-c', script], { ...env, TARGET: 'nowhere' });
      expect(none.stdout.trim()).toBe('ERROR Tunnel connection failed: 503 Service Unavailable');
      await expectTablesEmpty([fe, local]);
    } finally {
      await local.stop();
    }
  });

  it('a Unix-socket client needs no credentials; the socket is 0660', async () => {
    expect((await stat(fe.ports.uds!)).mode & 0o777).toBe(0o660);
    const out = await getVersionOver(await openTunnel('cluster1:443', 'uds'));
    expect(out).toMatch(/^HTTP\/1\.1 200 OK/);
    expect(out).toContain('"cluster":"cluster1"');
    // A token over the socket is still checked.
    const bad = await refusal('cluster1:443', 'uds', ['Proxy-Authorization: Bearer AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA']);
    expectRefusal(bad, 407, 'cluster1:443', /invalid, expired or revoked/);
  });
});

describe('HTTP CONNECT frontend: tunnel bytes', () => {
  it('delivers bytes the client pipelined right after the CONNECT head (and more than the pipeline buffer)', async () => {
    const small = Buffer.from('hello, pipelined');
    const s1 = openProxy('tls-cert');
    const r1 = await proxyRequest(s1, Buffer.concat([Buffer.from(connectHead(`127.0.0.1:${echo.port}`)), small]));
    expect(r1.head).toBe('HTTP/1.1 200 Connection Established\r\n\r\n');
    s1.end();
    expect(await readAll(s1)).toEqual(await digestOf(small));

    // 1 MiB written without waiting for the 200: held (bounded) during the dial, then forwarded in order.
    const big = Buffer.alloc(MiB, 7).map((_, i) => i % 251);
    const s2 = openProxy('uds');
    const r2Promise = proxyRequest(s2, connectHead(`127.0.0.1:${echo.port}`));
    s2.write(big);
    s2.end();
    const r2 = await r2Promise;
    expect(r2.status).toBe(200);
    expect(await readAll(s2)).toEqual(await digestOf(big));
  });

  it('a client that offers only ALPN http/1.0 and sends CONNECT … HTTP/1.0 gets its tunnel', async () => {
    const s = tls.connect({
      host: '127.0.0.1',
      port: fe.ports.tls!,
      ca: caPem,
      cert: clientCert,
      key: clientKey,
      ALPNProtocols: ['http/1.0'],
    });
    const r = await proxyRequest(s, `CONNECT 127.0.0.1:${echo.port} HTTP/1.0\r\n\r\n`);
    expect(r.status).toBe(200);
    expect((s as tls.TLSSocket).alpnProtocol).toBe('http/1.0');
    s.resume();
    s.end('hello');
    expect(await readAll(s)).toEqual(await digestOf(Buffer.from('hello')));
  });

  it('uploads 20 MiB intact (sha256)', async () => {
    const s = await openTunnel(`127.0.0.1:${sink.port}`);
    const result = sink.nextResult(60_000);
    s.resume();
    await writePayload(s, 20 * MiB, { end: true });
    expect(await result).toEqual({ bytes: 20 * MiB, sha256: payloadSha256(20 * MiB) });
    await once(s, 'close');
  });

  it('downloads 20 MiB intact (sha256)', async () => {
    const s = await openTunnel(`127.0.0.1:${source.port}`, 'tls', [`Proxy-Authorization: Bearer ${allToken}`]);
    expect(await readAll(s)).toEqual({ bytes: 20 * MiB, sha256: source.expectedSha256 });
  });

  it("half-close: the client's FIN reaches the destination, which can still answer", async () => {
    const s = await openTunnel(`127.0.0.1:${echo.port}`);
    const all = readAll(s);
    s.end('last words');
    expect(await all).toEqual(await digestOf(Buffer.from('last words')));
  });

  it('an agent that dies mid-tunnel resets the client connection (not a clean EOF that could pass for a complete stream)', async () => {
    const a3 = await startAgentProcess('cluster3', `127.0.0.1:${echo.port}`, []);
    extraAgents.push(a3);
    // Plain TCP so the reset is observable as such (over TLS/UDS the frontend can only close).
    const local = await startConnectFrontend({
      core: server.core,
      log: pino({ level: 'debug' }, { write: (s: string) => void logLines.push(s) }),
      tokens,
      plain: { host: '127.0.0.1', port: 0, allowTokens: true },
    });
    try {
      const r = await proxyRequest(openProxy('plain', local), connectHead('cluster3:443', [`Proxy-Authorization: Bearer ${allToken}`]));
      expect(r.status).toBe(200);
      const s = r.socket;
      let error: NodeJS.ErrnoException | null = null;
      s.on('error', (e) => (error = e));
      const closed = new Promise((res) => s.once('close', res)); // events.once would reject on the reset
      s.resume();
      s.write('x');
      a3.proc.kill('SIGKILL');
      await closed;
      expect(error).not.toBeNull();
      expect(error!.code).toBe('ECONNRESET');
      await a3.proc.exited;
      await expectTablesEmpty([fe, local]);
    } finally {
      await local.stop();
    }
  });
});

describe('HTTP CONNECT frontend: every refusal', () => {
  it('400 for a malformed request and for a bad authority', async () => {
    expectRefusal(await refusalRaw('GARBAGE\r\n\r\n'), 400, 'CONNECT -', /malformed request line/);
    expectRefusal(
      await refusalRaw('CONNECT cluster1:443 HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n'),
      400,
      'CONNECT cluster1:443:',
      /line folding/,
    );
    expectRefusal(await refusalRaw('CONNECT cluster1:443 HTTP/1.1\r\nno colon here\r\n\r\n'), 400, 'cluster1:443', /malformed header line/);
    for (const target of ['cluster1', 'cluster1:99999', 'http://cluster1:443', 'user@cluster1:443', '[not-ipv6]:443']) {
      expectRefusal(await refusal(target, 'tls-cert'), 400, target, /must be HOST:PORT/);
    }
  });

  it('405 with Allow: CONNECT for other methods (curl asking the proxy for an http:// URL)', async (ctx) => {
    const raw = await refusalRaw('GET http://cluster1/version HTTP/1.1\r\nHost: cluster1\r\n\r\n');
    expectRefusal(raw, 405, 'http://cluster1/version', /only CONNECT is supported, not GET/);
    expect(raw.headers.get('allow')).toBe('CONNECT');
    needCurl(ctx);
    const r = await curl([...clientCertArgs(), 'http://cluster1/version']);
    expect(r.http).toBe(405);
    expect(r.body).toMatch(/only CONNECT is supported/);
  });

  it('407 without credentials, with a bad token, and for a token on the plain listener', async (ctx) => {
    const none = await refusal('cluster1:443', 'tls');
    expectRefusal(none, 407, 'cluster1:443', /no credentials/);
    expect(none.headers.get('proxy-authenticate')).toBe('Bearer realm="cluster-proxy", Basic realm="cluster-proxy"');
    const bad = await refusal('cluster1:443', 'tls', ['Proxy-Authorization: Bearer not-a-real-token']);
    expectRefusal(bad, 407, 'cluster1:443', /invalid, expired or revoked/);
    const badBasic = await refusal('cluster1:443', 'tls', [`Proxy-Authorization: Basic ${Buffer.from('u:nope').toString('base64')}`]);
    expectRefusal(badBasic, 407, 'cluster1:443', /invalid, expired or revoked/);
    const plain = await refusal('cluster1:443', 'plain', [`Proxy-Authorization: Bearer ${allToken}`]);
    expectRefusal(plain, 407, 'cluster1:443', /tokens are not accepted on the plain-TCP listener \(they would travel unencrypted\)/);
    expect(plain.headers.get('proxy-authenticate')).toBeDefined();
    needCurl(ctx);
    const c = await curl(['https://cluster1/version']);
    expect(c.connect).toBe(407);
    expect(c.stderr).toMatch(/CONNECT tunnel failed, response 407/);
    const cb = await curl(['--proxy-header', 'Proxy-Authorization: Bearer wrong', 'https://cluster1/version']);
    expect(cb.connect).toBe(407);
  });

  it('407 once a token is revoked', async () => {
    const t = await tokens.issue({ name: 'soon-revoked', clusters: ['cluster1'] });
    issuedSecrets.push(t.token);
    const hdr = [`Proxy-Authorization: Bearer ${t.token}`];
    (await openTunnel(`127.0.0.1:${echo.port}`, 'tls', hdr)).destroy();
    expect(await tokens.revoke('soon-revoked')).toBe(true);
    expectRefusal(await refusal(`127.0.0.1:${echo.port}`, 'tls', hdr), 407, `127.0.0.1:${echo.port}`, /revoked/);
    if (!curlMissing) expect((await curl(['-U', `u:${t.token}`, 'https://cluster1/version'])).connect).toBe(407);
  });

  it('403 for a token limited to another cluster, and for an agent certificate', async (ctx) => {
    const r = await refusal('cluster1:443', 'tls', [`Proxy-Authorization: Bearer ${cluster2Token}`]);
    expectRefusal(r, 403, 'cluster1:443', /token "cluster2-only" may not reach cluster cluster1/);
    const agentTls = { cert: readFileSync(agentCert.certPath), key: readFileSync(agentCert.keyPath) };
    const a = await proxyRequest(openProxy('tls-cert', fe, agentTls), connectHead('cluster1:443'));
    a.socket.destroy();
    expectRefusal(a, 403, 'cluster1:443', /agent certificates may not use the client frontend/);
    // Even together with a valid token.
    const a2 = await proxyRequest(
      openProxy('tls-cert', fe, agentTls),
      connectHead('cluster1:443', [`Proxy-Authorization: Bearer ${allToken}`]),
    );
    a2.socket.destroy();
    expect(a2.status).toBe(403);
    needCurl(ctx);
    const c = await curl(['--proxy-cert', agentCert.certPath, '--proxy-key', agentCert.keyPath, 'https://cluster1/version']);
    expect(c.connect).toBe(403);
    const c2 = await curl(['-U', `x:${cluster2Token}`, 'https://cluster1/version']);
    expect(c2.connect).toBe(403);
  });

  it("403 when the agent's allowlist refuses the destination (decision: policy, not a bad gateway)", async () => {
    // 127.0.0.2 routes to cluster1 by its cidr grant, but the agent only allows 127.0.0.1:*.
    expectRefusal(await refusal('127.0.0.2:80', 'tls-cert'), 403, '127.0.0.2:80', /not in the agent's allowlist.*\(forbidden\)/);
  });

  it('403 from a custom authorize hook', async () => {
    const local = await startConnectFrontend({
      core: server.core,
      log: pino({ level: 'debug' }, { write: (s: string) => void logLines.push(s) }),
      tokens,
      uds: path.join(pki.dir, 'authz.sock'),
      authorize: (p, cluster) => !(p.kind === 'unix-socket' && cluster === 'cluster1'),
    });
    try {
      const r = await proxyRequest(openProxy('uds', local), connectHead('cluster1:443'));
      r.socket.destroy();
      expectRefusal(r, 403, 'cluster1:443', /unix-socket may not reach cluster cluster1/);
      await expectTablesEmpty([fe, local]);
    } finally {
      await local.stop();
    }
  });

  it('502 for a closed port, quickly', async () => {
    const closed = await startEchoServer();
    const port = closed.port;
    await closed.close();
    const t0 = Date.now();
    expectRefusal(await refusal(`127.0.0.1:${port}`, 'tls-cert'), 502, `127.0.0.1:${port}`, /could not connect.*refused.*\(endpoint\)/);
    expect(Date.now() - t0).toBeLessThan(1000);
  });

  it('503 for a host no agent serves, at once', async (ctx) => {
    const t0 = Date.now();
    expectRefusal(await refusal('nowhere:443', 'tls-cert'), 503, 'nowhere:443', /no agent is connected.*\(no_agent\)/);
    expect(Date.now() - t0).toBeLessThan(1000);
    needCurl(ctx);
    expect((await curl([...clientCertArgs(), 'https://nowhere/version'])).connect).toBe(503);
  });

  it("504 for a blackholed destination at the hub's dial deadline (1.5 s)", async () => {
    const t0 = Date.now();
    const r = await refusal(`${blackhole.host}:${blackhole.port}`, 'tls-cert');
    const took = Date.now() - t0;
    expectRefusal(r, 504, `${blackhole.host}:${blackhole.port}`, /timed out.*\(timeout\)/);
    expect(took).toBeGreaterThanOrEqual(1400);
    expect(took).toBeLessThan(4000);
  });

  it('431 for a request head over 16 KiB', async () => {
    const r = await refusalRaw(connectHead('cluster1:443', [`X-Big: ${'a'.repeat(17 * 1024)}`]));
    expectRefusal(r, 431, 'CONNECT -', /larger than 16384 bytes/);
  });
});

describe('HTTP CONNECT frontend: slow clients', () => {
  it('cuts a slow-header client off at the header timeout without blocking others, and frees its slot', async () => {
    const local = await startConnectFrontend({
      core: server.core,
      log: pino({ level: 'debug' }, { write: (s: string) => void logLines.push(s) }),
      tokens,
      tls: {
        host: '127.0.0.1',
        port: 0,
        caCert: Buffer.from(caPem),
        cert: readFileSync(pki.server.certPath),
        key: readFileSync(pki.server.keyPath),
      },
      uds: path.join(pki.dir, 'slow.sock'),
      headerTimeoutMs: 1500,
      maxConnections: 2,
    });
    try {
      // A trickling client: one byte every 100 ms never finishes its head; the deadline is absolute.
      const t0 = Date.now();
      const slow = openProxy('tls-cert', local);
      await once(slow, 'secureConnect');
      const head = connectHead('cluster1:443');
      let i = 0;
      const trickle = setInterval(() => {
        if (!slow.destroyed && i < head.length - 2) slow.write(head[i++]!);
      }, 100);
      const slowReply = proxyRequest(slow, '', 10_000).finally(() => clearInterval(trickle));
      // Meanwhile another client gets through the same listener.
      const other = await proxyRequest(openProxy('tls-cert', local), connectHead('cluster1:443'));
      expect(other.status).toBe(200);
      expect(await getVersionOver(other.socket)).toContain('v1.33.0-demo');
      const cut = await slowReply;
      const took = Date.now() - t0;
      expect(cut.status).toBe(408);
      expect(cut.body).toMatch(/did not arrive within 1500 ms/);
      expect(took).toBeGreaterThanOrEqual(1400);
      expect(took).toBeLessThan(5000);
      slow.destroy();

      // Two silent clients hold both slots: a third is turned away, and served once they are cut off.
      const silent = [openProxy('uds', local), openProxy('uds', local)];
      for (const s of silent) s.on('error', () => {}).resume(); // they read (and get their 408), they just never send
      await waitFor(() => local.connections() === 2, { timeoutMs: 2000, message: 'two silent clients accepted' });
      const turnedAway = await proxyRequest(openProxy('uds', local), connectHead('cluster1:443'));
      expectRefusal(turnedAway, 503, 'CONNECT -', /too many client connections \(limit 2\)/);
      turnedAway.socket.destroy();
      await Promise.all(silent.map((s) => once(s, 'close')));
      await waitFor(() => local.connections() === 0, { timeoutMs: 3000, message: 'slots freed' });
      const served = await proxyRequest(openProxy('uds', local), connectHead('cluster1:443'));
      expect(served.status).toBe(200);
      served.socket.destroy();

      // A TCP client that never starts its TLS handshake is dropped at the same deadline.
      const noHandshake = net.connect(local.ports.tls!, '127.0.0.1');
      noHandshake.on('error', () => {}).resume();
      const h0 = Date.now();
      await once(noHandshake, 'close');
      expect(Date.now() - h0).toBeLessThan(4000);
      await expectTablesEmpty([fe, local]);
    } finally {
      await local.stop();
    }
  });
});

describe('HTTP CONNECT frontend: options and hygiene', () => {
  it('refuses to bind the plain listener to a non-loopback address', async () => {
    await expect(
      startConnectFrontend({
        core: server.core,
        log: pino({ level: 'silent' }, { write: () => {} }),
        tokens,
        plain: { host: '0.0.0.0', port: 0 },
      }),
    ).rejects.toThrow(/refusing to serve plain-TCP CONNECT on 0\.0\.0\.0: only loopback/);
  });

  it('never logs a token', () => {
    expect(logLines.length).toBeGreaterThan(10);
    const all = logLines.join('');
    for (const secret of issuedSecrets) expect(all).not.toContain(secret);
    expect(all).toContain('CONNECT refused');
    expect(all).toContain('CONNECT tunnel open');
  });
});

// ------------------------------------------------------------ small helpers

async function refusalRaw(request: string): Promise<Reply> {
  const r = await proxyRequest(openProxy('tls-cert'), request);
  r.socket.destroy();
  return r;
}

/** digestStream on a socket proxyRequest handed back paused. */
function readAll(s: net.Socket): ReturnType<typeof digestStream> {
  const d = digestStream(s);
  s.resume();
  return d;
}

async function digestOf(b: Buffer): Promise<{ bytes: number; sha256: string }> {
  const { createHash } = await import('node:crypto');
  return { bytes: b.length, sha256: createHash('sha256').update(b).digest('hex') };
}
