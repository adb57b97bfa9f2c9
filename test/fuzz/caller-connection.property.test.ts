// The gateway's caller connection judged by node:http's own server: the same bytes (requests one behind
// another, bodies with a length or chunked, cut into pieces anywhere) to both, the same requests out: method,
// target, header lines and body, in order, none after a `Connection: close`. Both run llhttp, so what this
// checks is our plumbing around it (held and pipelined events, pauses, bodies handed over late).
import { once } from 'node:events';
import http from 'node:http';
import { type Duplex, duplexPair } from 'node:stream';
import type tls from 'node:tls';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { CallerConnection, type CallerHost } from '@cluster-proxy/server/parsers';

interface Seen {
  method: string;
  url: string;
  headers: string[];
  body: string;
}

const token = fc.stringMatching(/^[a-z][a-z0-9-]{0,8}$/);
const value = fc.stringMatching(/^[\x21-\x7e]([\x20-\x7e]{0,10}[\x21-\x7e])?$/);
const request = fc.record({
  method: fc.constantFrom('GET', 'POST', 'PUT', 'DELETE', 'PATCH'),
  path: fc.stringMatching(/^\/[a-z0-9/?=&.-]{0,20}$/),
  headers: fc.array(
    fc.tuple(
      token.map((t) => `x-${t}`),
      value,
    ),
    { maxLength: 3 },
  ),
  body: fc.oneof(
    fc.constant(null),
    fc.record({ chunked: fc.constant(false), parts: fc.array(fc.string({ maxLength: 40 }), { maxLength: 3 }) }),
    fc.record({ chunked: fc.constant(true), parts: fc.array(fc.string({ minLength: 1, maxLength: 40 }), { maxLength: 4 }) }),
  ),
  close: fc.boolean(),
});

interface RequestCase {
  method: string;
  path: string;
  headers: [string, string][];
  body: { chunked: boolean; parts: string[] } | null;
  close: boolean;
}

function wire(c: RequestCase): string {
  let head = `${c.method} ${c.path} HTTP/1.1\r\nHost: h\r\n`;
  for (const [k, v] of c.headers) head += `${k}: ${v}\r\n`;
  if (c.close) head += 'Connection: close\r\n';
  if (!c.body) return `${head}\r\n`;
  const parts = c.body.parts.map((p) => Buffer.from(p).toString('latin1'));
  if (!c.body.chunked) return `${head}Content-Length: ${Buffer.byteLength(parts.join(''), 'latin1')}\r\n\r\n${parts.join('')}`;
  return `${head}Transfer-Encoding: chunked\r\n\r\n${parts.map((p) => `${p.length.toString(16)};ext=1\r\n${p}\r\n`).join('')}0\r\n\r\n`;
}

/** Writes `bytes` in the given pieces, a turn apart; resolves once the server side ended or closed the connection. */
async function feed(end: Duplex, bytes: Buffer, cuts: number[]): Promise<void> {
  const closed = new Promise<void>((resolve) => {
    end.once('end', resolve);
    end.once('close', resolve);
  });
  end.resume(); // answers are read and dropped
  let at = 0;
  for (const cut of [...cuts.filter((c) => c > 0 && c < bytes.length)].sort((a, b) => a - b).concat(bytes.length)) {
    if (cut <= at) continue;
    end.write(bytes.subarray(at, cut));
    at = cut;
    await new Promise((r) => setImmediate(r));
  }
  await closed;
  end.destroy();
}

async function throughOurs(bytes: Buffer, cuts: number[]): Promise<Seen[]> {
  const seen: Seen[] = [];
  const host: CallerHost = {
    maxHeaderBytes: 16 * 1024,
    headerTimeoutMs: 5000,
    keepAliveTimeoutMs: 5000,
    request: (req, ex) => {
      const chunks: Buffer[] = [];
      const rawHeaders = Object.entries(req.headersDistinct).flatMap(([k, vs]) => vs.flatMap((v) => [k, v]));
      // Handed over a turn later, as after an authentication that took a while.
      setImmediate(() =>
        ex.bodyTo({
          // Every other chunk "fills" the next hop: the caller is paused until it drained, a turn later.
          chunk: (b) => (chunks.push(Buffer.from(b)), chunks.length % 2 === 0),
          end: () => {
            seen.push({ method: req.method, url: req.url, headers: rawHeaders, body: Buffer.concat(chunks).toString('latin1') });
            ex.head(200, 'OK', { 'content-length': ['0'] });
            ex.end();
          },
          failed: () => ex.destroy(),
          drained: (f) => setImmediate(f),
        }),
      );
    },
    upgrade: (req) => req.socket.destroy(),
    malformed: (socket) => socket.destroy(),
  };
  const [client, server] = duplexPair();
  const c = new CallerConnection(server as unknown as tls.TLSSocket, host);
  await feed(client, bytes, cuts);
  c.destroy();
  return seen;
}

async function throughNode(bytes: Buffer, cuts: number[]): Promise<Seen[]> {
  const seen: Seen[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (b: Buffer) => chunks.push(b));
    req.on('end', () => {
      const byName = new Map<string, string[]>();
      for (let i = 0; i < req.rawHeaders.length; i += 2) {
        const k = req.rawHeaders[i]!.toLowerCase();
        byName.set(k, [...(byName.get(k) ?? []), req.rawHeaders[i + 1]!]);
      }
      seen.push({
        method: req.method ?? '',
        url: req.url ?? '',
        headers: [...byName].flatMap(([k, vs]) => vs.flatMap((v) => [k, v])),
        body: Buffer.concat(chunks).toString('latin1'),
      });
      res.writeHead(200, { 'content-length': '0' }).end();
    });
  });
  // As the gateway's node:http server had it: bytes after a `Connection: close` request are not an error.
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    if (err.code !== 'HPE_CLOSED_CONNECTION') socket.destroy();
  });
  const [client, end] = duplexPair();
  server.emit('connection', Object.assign(end, { setTimeout: () => end, setNoDelay: () => end, setKeepAlive: () => end }));
  await feed(client, bytes, cuts);
  server.close();
  server.closeAllConnections();
  await once(server, 'close').catch(() => {});
  return seen;
}

describe('a caller connection reads what node:http reads', () => {
  it('the same requests, headers and bodies, in order, for any cut of the bytes', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(request, { minLength: 1, maxLength: 4 }), fc.array(fc.nat(2000), { maxLength: 6 }), async (reqs, cuts) => {
        // The last asks to close, so both servers end the connection once they answered what they read.
        const all = reqs.map((r, i) => (i === reqs.length - 1 ? { ...r, close: true } : r));
        const bytes = Buffer.from(all.map((r) => wire(r)).join(''), 'latin1');
        const ours = await throughOurs(bytes, cuts);
        const node = await throughNode(bytes, cuts);
        expect(ours).toEqual(node);
        // What node:http reads is what was sent: up to and including the first Connection: close.
        expect(ours.length).toBe(all.findIndex((r) => r.close) + 1);
      }),
      { numRuns: Number(process.env.PROP_RUNS ?? 150), seed: Number(process.env.PROP_SEED ?? 20261130) },
    );
  });
});
