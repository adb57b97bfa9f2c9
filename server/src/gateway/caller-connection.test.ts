// A caller's connection to the gateway (caller-connection.ts) over real TLS on loopback, with a scripted
// gateway behind it: what it answers itself (a head too slow, CONNECT, a missing Host, an Expect it does
// not take, a body that does not parse), requests pipelined one behind another, HTTP/1.0 callers.
import { once } from 'node:events';
import type net from 'node:net';
import tls from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createCA, issueServerCert } from '../pki/certificates.js';
import { CallerConnection, type CallerExchange, type CallerHost, type GatewayRequest } from './caller-connection.js';

type Handler = (req: GatewayRequest, ex: CallerExchange) => void;

let server: tls.Server;
let port = 0;
let handler: Handler = () => {};
const connections: CallerConnection[] = [];
const host: CallerHost = {
  maxHeaderBytes: 4096,
  headerTimeoutMs: 300,
  keepAliveTimeoutMs: 300,
  request: (req, ex) => handler(req, ex),
  upgrade: (req) => req.socket.destroy(),
  malformed: (socket, status) => socket.end(`HTTP/1.1 ${status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`),
};

/** Answers with the body it read: `<method> <url> <body>`, length-framed. */
const echo: Handler = (req, ex) => {
  const chunks: Buffer[] = [];
  ex.bodyTo({
    chunk: (b) => (chunks.push(Buffer.from(b)), true),
    end: () => {
      const body = Buffer.from(`${req.method} ${req.url} ${Buffer.concat(chunks).toString()}`);
      ex.head(200, 'OK', { 'content-length': [String(body.length)] });
      ex.write(body);
      ex.end();
    },
    failed: (why) => ex.refuse(400, why),
    drained: () => {},
  });
};

beforeAll(async () => {
  const ca = createCA({ commonName: 'ca' });
  const pair = issueServerCert(ca, { commonName: 'hub', ipAddresses: ['127.0.0.1'] });
  server = tls.createServer({ cert: pair.certPem, key: pair.keyPem }, (s) => connections.push(new CallerConnection(s, host)));
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  port = (server.address() as net.AddressInfo).port;
});

afterEach(() => {
  for (const c of connections.splice(0)) c.destroy();
  handler = echo;
});

afterAll(async () => {
  server.close();
  await once(server, 'close');
});

/** Writes `bytes` (in parts, `gapMs` apart), returns all that came back until the gateway closed the connection. */
async function exchange(parts: string[], gapMs = 0): Promise<string> {
  const socket = tls.connect({ port, host: '127.0.0.1', rejectUnauthorized: false });
  await once(socket, 'secureConnect');
  const chunks: Buffer[] = [];
  socket.on('data', (c: Buffer) => chunks.push(c));
  const closed = once(socket, 'close');
  for (const p of parts) {
    socket.write(p);
    if (gapMs > 0) await new Promise((r) => setTimeout(r, gapMs));
  }
  await closed;
  return Buffer.concat(chunks).toString('latin1');
}

const statuses = (answer: string): number[] => [...answer.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => Number(m[1]));

describe('a caller connection to the gateway', () => {
  it('requests pipelined in one write are answered in order, each body its own; Connection: close ends it after its answer', async () => {
    handler = echo;
    const answer = await exchange([
      'POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n' +
        'PUT /b HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nxyz' +
        'GET /c HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n' +
        'GET /never HTTP/1.1\r\nHost: h\r\n\r\n',
    ]);
    expect(statuses(answer)).toEqual([200, 200, 200]);
    expect(answer).toContain('\r\n\r\nPOST /a ab');
    expect(answer).toContain('\r\n\r\nPUT /b xyz');
    expect(answer.endsWith('\r\n\r\nGET /c ')).toBe(true);
    expect(answer).toMatch(/Connection: close\r\n\r\nGET \/c $/);
  });

  it('an answer without a length is chunked for HTTP/1.1 and runs to the close for HTTP/1.0', async () => {
    handler = (_req, ex) => {
      ex.dropBody();
      ex.head(200, 'OK', {});
      ex.write(Buffer.from('hello'));
      ex.end();
    };
    expect(await exchange(['GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n'])).toMatch(
      /Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n$/,
    );
    const old = await exchange(['GET / HTTP/1.0\r\n\r\n']);
    expect(old).not.toContain('chunked');
    expect(old).toMatch(/Connection: close\r\n\r\nhello$/);
  });

  it('answers itself: CONNECT 405, no Host 400, an Expect it does not take 417; 100-continue gets its 100 first', async () => {
    handler = echo;
    expect(statuses(await exchange(['CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n']))).toEqual([405]);
    expect(statuses(await exchange(['GET / HTTP/1.1\r\n\r\n']))).toEqual([400]);
    expect(statuses(await exchange(['GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n']))).toEqual([400]);
    expect(statuses(await exchange(['POST / HTTP/1.1\r\nHost: h\r\nExpect: tea\r\nContent-Length: 1\r\n\r\nx']))).toEqual([417]);
    const cont = await exchange(
      ['POST /e HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\n', 'ok'],
      50,
    );
    expect(cont.startsWith('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n')).toBe(true);
    expect(cont.endsWith('POST /e ok')).toBe(true);
  });

  it('a head not complete within the header timeout is 408; an idle kept connection closes after the keep-alive timeout', async () => {
    handler = echo;
    expect(statuses(await exchange(['GET / HTTP/1.1\r\nHost: h\r\n']))).toEqual([408]);
    // Kept (no Connection: close in the answer), and closed all the same: by the keep-alive timer.
    const kept = await exchange(['GET / HTTP/1.1\r\nHost: h\r\n\r\n']);
    expect(statuses(kept)).toEqual([200]);
    expect(kept).not.toMatch(/connection: close/i);
  });

  it('a request pipelined behind a long answer (a watch) waits for it, past the header timeout', async () => {
    handler = (req, ex) => {
      if (req.url === '/slow') setTimeout(() => echo(req, ex), 3 * host.headerTimeoutMs);
      else echo(req, ex);
    };
    const answer = await exchange(['GET /slow HTTP/1.1\r\nHost: h\r\n\r\nGET /next HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n']);
    expect(statuses(answer)).toEqual([200, 200]);
    expect(answer.endsWith('GET /next ')).toBe(true);
  });

  it('a body that does not parse fails its request: 400 when nothing was answered, and the connection closes', async () => {
    handler = echo;
    const answer = await exchange(['POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n']);
    expect(statuses(answer)).toEqual([400]);
    const head = await exchange([`GET / HTTP/1.1\r\nHost: h\r\nX: ${'a'.repeat(5000)}\r\n\r\n`]);
    expect(statuses(head)).toEqual([431]);
  });
});
