// The agent's relay of one tunneled gateway connection to the apiserver (agent/src/gateway/apiserver-relay.ts),
// driven as the hub drives it (node's HTTP client over ImpersonatingProxy.connect(), kept alive) against an
// HTTPS apiserver whose every answer a test scripts: kept connections the apiserver closes, answers that run to
// the end of the connection, answers that are not HTTP, request bodies both ways of framing, and what the hub
// never sends (two heads at once, a malformed one).
import { once } from 'node:events';
import http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import pino from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { ImpersonatingProxy } from '@cluster-proxy/agent';
import { IDENTITY_HEADER, IDENTITY_SIGNER_HEADER, requestLine, signIdentity } from '@cluster-proxy/proto';
import { createCA, issueServerCert, type PemPair } from '@cluster-proxy/server';

type Script = (req: http.IncomingMessage, res: http.ServerResponse, nth: number, body: string) => void;

let ca: PemPair;
let serving: PemPair;
let api: https.Server;
let apiPort = 0;
let echoNext = false;
let script: Script = (_req, res) => res.end('ok');
/** Requests the apiserver got: method, path, body. */
const seen: { method: string; url: string; body: string; te?: string; cl?: string }[] = [];
const sockets = new Set<net.Socket>();
const proxies: ImpersonatingProxy[] = [];
const agents: http.Agent[] = [];

beforeAll(async () => {
  ca = createCA({ commonName: 'hub-ca' });
  serving = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'] });
  const cert = issueServerCert(ca, { commonName: 'apiserver', ipAddresses: ['127.0.0.1'] });
  const perSocket = new WeakMap<net.Socket, number>();
  api = https.createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    if (echoNext) {
      echoNext = false;
      req.pipe(res);
      return;
    }
    const nth = (perSocket.get(req.socket) ?? 0) + 1;
    perSocket.set(req.socket, nth);
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString();
      seen.push({
        method: req.method ?? '',
        url: req.url ?? '',
        body,
        ...(req.headers['transfer-encoding'] ? { te: req.headers['transfer-encoding'] } : {}),
        ...(req.headers['content-length'] ? { cl: req.headers['content-length'] } : {}),
      });
      script(req, res, nth, body);
    });
  });
  api.on('secureConnection', (s: net.Socket) => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  api.listen(0, '127.0.0.1');
  await once(api, 'listening');
  apiPort = (api.address() as net.AddressInfo).port;
});

afterEach(() => {
  for (const a of agents.splice(0)) a.destroy();
  for (const p of proxies.splice(0)) p.close();
  seen.length = 0;
  script = (_req, res) => res.end('ok');
});

afterAll(async () => {
  for (const s of sockets) s.destroy();
  api.close();
  await once(api, 'close');
});

function proxy(): ImpersonatingProxy {
  const p = new ImpersonatingProxy({
    cluster: 'c1',
    trust: () => Buffer.from(ca.certPem),
    log: pino({ level: 'silent' }),
    kube: () =>
      Promise.resolve({ server: new URL(`https://127.0.0.1:${apiPort}`), source: 'test', ca: Buffer.from(ca.certPem), token: 'sa-token' }),
  });
  proxies.push(p);
  return p;
}

/** The hub's side: node's client, kept-alive connections to the proxy, one at a time. */
function hub(p: ImpersonatingProxy): http.Agent {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
  // What node's kept-alive pool calls on a socket beyond Duplex (the hub's TunnelSocket has them).
  (agent as unknown as { createConnection: () => Duplex }).createConnection = () => {
    const d = p.connect();
    return Object.assign(d, { ref: () => d, unref: () => d });
  };
  agents.push(agent);
  return agent;
}

function identityHeaders(method: string, path: string): Record<string, string> {
  const signed = signIdentity({ user: 'alice', groups: [] }, 'c1', requestLine(method, path), serving.certPem, serving.keyPem);
  return { [IDENTITY_HEADER]: signed.assertion, [IDENTITY_SIGNER_HEADER]: signed.signer };
}

function request(
  agent: http.Agent,
  method: string,
  path: string,
  body?: { chunks: string[]; length?: boolean },
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const length = body?.length ? { 'content-length': String(Buffer.byteLength(body.chunks.join(''))) } : {};
    const req = http.request({ agent, method, path, headers: { ...identityHeaders(method, path), ...length } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
      res.on('error', reject);
    });
    req.on('error', reject);
    for (const c of body?.chunks ?? []) req.write(c);
    req.end();
  });
}

/** Raw bytes on one tunneled connection; resolves with all that came back once the agent ended or closed it. */
function raw(p: ImpersonatingProxy, bytes: string): Promise<string> {
  const end = p.connect();
  const chunks: Buffer[] = [];
  end.on('data', (c: Buffer) => chunks.push(c));
  end.write(bytes);
  return new Promise((resolve) => {
    const done = (): void => {
      end.destroy();
      resolve(Buffer.concat(chunks).toString('latin1'));
    };
    end.once('end', done);
    end.once('close', done);
  });
}

describe("the agent's apiserver relay", () => {
  it('bodies reach the apiserver whole, chunked or with a length; answers come back on one kept connection, HEAD’s too', async () => {
    script = (req, res, _n, body) => {
      if (req.method === 'HEAD') res.writeHead(200, { 'content-length': '123' }).end();
      else res.end(`${req.method} ${body}`);
    };
    const agent = hub(proxy());
    expect(await request(agent, 'POST', '/a', { chunks: ['ab', 'cd', 'e'] })).toEqual({ status: 200, body: 'POST abcde' });
    expect(await request(agent, 'PUT', '/b', { chunks: ['xyz'], length: true })).toEqual({ status: 200, body: 'PUT xyz' });
    expect(await request(agent, 'HEAD', '/c')).toEqual({ status: 200, body: '' });
    expect(await request(agent, 'GET', '/d')).toEqual({ status: 200, body: 'GET ' });
    expect(seen.map((s) => [s.method, s.url, s.te ?? s.cl ?? '-'])).toEqual([
      ['POST', '/a', 'chunked'],
      ['PUT', '/b', '3'],
      ['HEAD', '/c', '-'],
      ['GET', '/d', '-'],
    ]);
    expect(sockets.size).toBe(1); // one apiserver connection served them all
  });

  it('an 8 MiB body streams through both ways (the apiserver answers while it reads)', async () => {
    script = (req, res) => res.end('unused');
    const agent = hub(proxy());
    expect(await request(agent, 'GET', '/warm')).toEqual({ status: 200, body: 'unused' });
    const big = 'x'.repeat(8 * 1024 * 1024);
    echoNext = true;
    const r = await request(agent, 'POST', '/echo', { chunks: [big], length: true });
    expect(r.status).toBe(200);
    expect(r.body.length).toBe(big.length);
  });

  it('a GET on a kept connection the apiserver closes unanswered goes once more on a new one; a POST gets a 502 line', async () => {
    script = (req, res, nth) => (nth === 2 ? req.socket.destroy() : res.end(`answer ${nth}`));
    const agent = hub(proxy());
    expect(await request(agent, 'GET', '/one')).toEqual({ status: 200, body: 'answer 1' });
    expect(await request(agent, 'GET', '/two')).toEqual({ status: 200, body: 'answer 1' }); // the new connection's first
    expect(seen.map((s) => s.url)).toEqual(['/one', '/two', '/two']);
    expect(await request(agent, 'POST', '/three', { chunks: ['x'], length: true })).toEqual({
      status: 502,
      body: 'the apiserver closed the connection without an answer\n',
    });
  });

  it('an answer that runs to the end of the connection comes back whole, then the connection closes', async () => {
    script = (req) => {
      req.socket.write('HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\nall of ');
      req.socket.end('it');
    };
    const answer = await raw(
      proxy(),
      `GET /x HTTP/1.1\r\n${Object.entries(identityHeaders('GET', '/x'))
        .map(([k, v]) => `${k}: ${v}\r\n`)
        .join('')}\r\n`,
    );
    expect(answer).toMatch(/^HTTP\/1\.1 200 OK\r\n/);
    expect(answer.endsWith('\r\n\r\nall of it')).toBe(true);
  });

  it('an answer that is not HTTP: 502, one line', async () => {
    script = (req) => req.socket.end('SSH-2.0-OpenSSH\r\n\r\n');
    const agent = hub(proxy());
    expect(await request(agent, 'GET', '/x')).toEqual({ status: 502, body: 'the agent could not read the apiserver’s answer\n' });
  });

  it('what the hub never sends: two heads at once close the connection unanswered, nothing sent on; a malformed head gets 400, one too large 431', async () => {
    const p = proxy();
    const h = Object.entries(identityHeaders('GET', '/x'))
      .map(([k, v]) => `${k}: ${v}\r\n`)
      .join('');
    expect(await raw(p, `GET /x HTTP/1.1\r\n${h}\r\nGET /x HTTP/1.1\r\n${h}\r\n`)).toBe('');
    expect(await raw(p, 'GET /x HTTP/1.1\r\nbad header\r\n\r\n')).toMatch(
      /^HTTP\/1\.1 400 .*\r\n\r\nthe agent could not parse the request\n$/s,
    );
    expect(await raw(p, `GET /x HTTP/1.1\r\nx: ${'a'.repeat(70 * 1024)}\r\n\r\n`)).toMatch(
      /^HTTP\/1\.1 431 .*\r\n\r\nthe request head is larger than the 65536 bytes the agent takes\n$/s,
    );
    expect(seen).toEqual([]);
  });
});
