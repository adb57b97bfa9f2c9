// GrpcClient against a real node:http2 server on a Unix socket that answers as gRPC servers do (and as
// they misbehave): echo with trailers, trailers-only refusals, plain HTTP errors, resets, oversized
// messages, a "too_many_pings" GOAWAY. The hub's own server and TLS are covered end to end (test/e2e).
import { once } from 'node:events';
import http2 from 'node:http2';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { GrpcClient } from './grpc-client.js';
import type { GrpcClientCall } from './grpc-client-call.js';
import { type GrpcCallError, GrpcMessageReader, GrpcStatus, writeGrpcMessage, type GrpcCallStatus } from './grpc-framing.js';
import { PacketType, packets, type Packet } from '../wire/packet.js';

type Handler = (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders, session: http2.ServerHttp2Session) => void;

let dir: string;
let server: http2.Http2Server;
let handler: Handler;
const sessions = new Set<http2.ServerHttp2Session>();
const clients: GrpcClient[] = [];

beforeEach(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'grpc-client-'));
  server = http2.createServer();
  server.on('session', (s) => {
    sessions.add(s);
    s.on('close', () => sessions.delete(s));
  });
  server.on('stream', (stream, headers) => {
    stream.on('error', () => {}); // resets are what some tests are about
    handler(stream, headers, stream.session as http2.ServerHttp2Session);
  });
  await new Promise<void>((r) => server.listen(path.join(dir, 'grpc.sock'), r));
});

afterEach(async () => {
  for (const c of clients.splice(0)) c.close();
  for (const s of sessions) s.destroy();
  await new Promise<void>((r) => server.close(() => r()));
  rmSync(dir, { recursive: true, force: true });
});

function client(extra: Partial<ConstructorParameters<typeof GrpcClient>[0]> = {}): GrpcClient {
  const c = new GrpcClient({
    address: `unix:${path.join(dir, 'grpc.sock')}`,
    streamWindow: 1 << 20,
    connectionWindow: 1 << 22,
    maxMessageBytes: 1 << 21,
    ...extra,
  });
  clients.push(c);
  return c;
}

/** Everything a call reported, in order. */
function record(call: GrpcClientCall): {
  events: string[];
  data: Packet[];
  done: Promise<GrpcCallStatus>;
  error: () => GrpcCallError | null;
} {
  const events: string[] = [];
  const data: Packet[] = [];
  let error: GrpcCallError | null = null;
  call.on('metadata', () => events.push('metadata'));
  call.on('data', (p: Packet) => {
    data.push(p);
    if (events.at(-1) !== 'data') events.push('data');
  });
  call.on('end', () => events.push('end'));
  call.on('error', (e: GrpcCallError) => {
    error = e;
    events.push('error');
  });
  const done = new Promise<GrpcCallStatus>((resolve) =>
    call.on('status', (s: GrpcCallStatus) => {
      events.push('status');
      resolve(s);
    }),
  );
  return { events, data, done, error: () => error };
}

/** A gRPC echo: answers each request message, ends with OK (and the given trailers) after the client's end. */
const echo =
  (trailers: Record<string, string> = {}): Handler =>
  (stream, headers) => {
    const reader = new GrpcMessageReader(1 << 22);
    stream.respond(
      { ':status': 200, 'content-type': 'application/grpc', 'x-seen-capabilities': String(headers['cluster-proxy-capabilities'] ?? '') },
      { waitForTrailers: true },
    );
    stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0', ...trailers }));
    stream.on('data', (chunk: Buffer) => {
      const out: Packet[] = [];
      reader.push(chunk, out);
      for (const p of out) writeGrpcMessage(stream, p);
    });
    stream.on('end', () => stream.end());
  };

describe('GrpcClient', () => {
  it('round-trips packets (one larger than many HTTP/2 frames) and ends with OK after the data', async () => {
    handler = echo({ 'x-trailer': 'yes' });
    const call = client().call('/ProxyService/Proxy', { 'cluster-proxy-capabilities': 'half-close' });
    const r = record(call);
    const metadata = once(call, 'metadata') as Promise<[Record<string, string[]>]>;
    const big = Buffer.alloc(1 << 20, 7);
    call.write(packets.dialRequest('c1:443', 42n));
    call.write(packets.data(1, big));
    call.end();
    const [md] = await metadata;
    expect(md['x-seen-capabilities']).toEqual(['half-close']);
    const status = await r.done;
    expect(status.code).toBe(GrpcStatus.OK);
    expect(status.metadata['x-trailer']).toEqual(['yes']);
    expect(r.events).toEqual(['metadata', 'data', 'end', 'status']);
    expect(r.data.map((p) => p.type)).toEqual([PacketType.DIAL_REQ, PacketType.DATA]);
    const d = r.data[1]!;
    expect(d.type === PacketType.DATA && d.data.data.equals(big)).toBe(true);
  });

  it('holds packets and the status while paused, and delivers both in order on resume', async () => {
    let serverDone!: () => void;
    const firstServed = new Promise<void>((resolve) => (serverDone = resolve));
    handler = (stream, headers, session) => {
      stream.once('close', () => serverDone());
      echo()(stream, headers, session);
    };
    const c = client();
    const call = c.call('/ProxyService/Proxy');
    const r = record(call);
    call.pause();
    for (let i = 1; i <= 5; i++) call.write(packets.data(i, Buffer.from(`m${i}`)));
    call.end();
    await firstServed;
    // The server has sent all of the first call. A second call on the same session, answered after
    // that, proves the first call's frames (echoes and status) have reached this client by then.
    const second = c.call('/ProxyService/Proxy');
    const later = record(second);
    second.write(packets.closeRequest(9));
    second.end();
    expect((await later.done).code).toBe(GrpcStatus.OK);
    expect(later.data).toEqual([packets.closeRequest(9)]);
    expect(r.data).toEqual([]);
    expect(r.events).not.toContain('status');
    call.resume();
    const status = await r.done;
    expect(status.code).toBe(GrpcStatus.OK);
    expect(r.data.map((p) => (p.type === PacketType.DATA ? p.data.connectID : 0))).toEqual([1, 2, 3, 4, 5]);
  });

  it('reports a trailers-only refusal with its code and decoded message', async () => {
    handler = (stream) =>
      stream.respond(
        { ':status': 200, 'content-type': 'application/grpc', 'grpc-status': '7', 'grpc-message': 'agent%20certificates%20refused' },
        { endStream: true },
      );
    const r = record(client().call('/ProxyService/Proxy'));
    const status = await r.done;
    expect(status).toMatchObject({ code: GrpcStatus.PERMISSION_DENIED, details: 'agent certificates refused' });
    expect(r.error()?.message).toBe('PERMISSION_DENIED: agent certificates refused');
    expect(r.events).toEqual(['error', 'status']);
  });

  it('maps an HTTP error without grpc-status (a proxy or load balancer answering) to UNAVAILABLE', async () => {
    handler = (stream) => {
      stream.respond({ ':status': 503, 'content-type': 'text/plain' });
      stream.end('upstream down');
    };
    const status = await record(client().call('/ProxyService/Proxy')).done;
    expect(status).toMatchObject({ code: GrpcStatus.UNAVAILABLE, details: 'Received HTTP status code 503' });
  });

  it('maps the server resetting the stream (REFUSED_STREAM) to UNAVAILABLE', async () => {
    handler = (stream) => stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
    const status = await record(client().call('/ProxyService/Proxy')).done;
    expect(status.code).toBe(GrpcStatus.UNAVAILABLE);
    expect(status.details).toMatch(/RST_STREAM with code 7/);
  });

  it('reports a server that goes away mid-call as UNAVAILABLE, and one that ends without a status as UNKNOWN', async () => {
    handler = (stream, _headers, session) => {
      stream.respond({ ':status': 200, 'content-type': 'application/grpc' });
      setTimeout(() => session.destroy(), 20);
    };
    const c = client();
    expect(await record(c.call('/AgentService/Connect')).done).toMatchObject({
      code: GrpcStatus.UNAVAILABLE,
      details: 'connection closed',
    });
    handler = (stream) => {
      stream.respond({ ':status': 200, 'content-type': 'application/grpc' });
      stream.end();
    };
    expect(await record(c.call('/AgentService/Connect')).done).toMatchObject({
      code: GrpcStatus.UNKNOWN,
      details: 'server ended the stream without a status',
    });
  });

  it('refuses a message over the size limit with RESOURCE_EXHAUSTED and resets the stream', async () => {
    let serverStreamClosed: Promise<unknown> = Promise.resolve();
    handler = (stream) => {
      serverStreamClosed = once(stream, 'close');
      stream.on('error', () => {});
      stream.respond({ ':status': 200, 'content-type': 'application/grpc' });
      const head = Buffer.alloc(5);
      head.writeUInt32BE((1 << 21) + 1, 1);
      stream.write(head);
    };
    const status = await record(client().call('/ProxyService/Proxy')).done;
    expect(status).toMatchObject({
      code: GrpcStatus.RESOURCE_EXHAUSTED,
      details: `Received message larger than max (${(1 << 21) + 1} vs. ${1 << 21})`,
    });
    await serverStreamClosed;
  });

  it('reports an unreachable server as UNAVAILABLE with the cause', async () => {
    const c = new GrpcClient({
      address: `unix:${path.join(dir, 'missing.sock')}`,
      streamWindow: 1 << 16,
      connectionWindow: 1 << 16,
      maxMessageBytes: 1 << 16,
    });
    clients.push(c);
    const status = await record(c.call('/ProxyService/Proxy')).done;
    expect(status.code).toBe(GrpcStatus.UNAVAILABLE);
    expect(status.details).toMatch(/ENOENT/);
  });

  it('doubles its ping interval after a "too_many_pings" GOAWAY, and opens a new session for the next call', async () => {
    let first = true;
    handler = (stream, _headers, session) => {
      if (first) {
        first = false;
        session.goaway(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM, 0, Buffer.from('too_many_pings'));
        return;
      }
      echo()(stream, _headers, session);
    };
    const told: number[] = [];
    const c = client({ keepalive: { intervalMs: 15_000, timeoutMs: 10_000 }, onTooManyPings: (ms) => told.push(ms) });
    const refused = await record(c.call('/ProxyService/Proxy')).done;
    expect(refused.code).not.toBe(GrpcStatus.OK);
    expect(told).toEqual([30_000]);
    const call = c.call('/ProxyService/Proxy');
    const r = record(call);
    call.write(packets.drain());
    call.end();
    expect((await r.done).code).toBe(GrpcStatus.OK);
    expect(sessions.size).toBe(1); // the refused session is gone
  });

  it("refuses a call past the server's stream limit at once (RESOURCE_EXHAUSTED), and takes one again when a call ends", async () => {
    server.updateSettings({ maxConcurrentStreams: 2 });
    handler = echo();
    const c = client();
    const first = c.call('/ProxyService/Proxy');
    const second = c.call('/ProxyService/Proxy');
    const r1 = record(first);
    await Promise.all([once(first, 'metadata'), once(second, 'metadata')]);
    const refused = record(c.call('/ProxyService/Proxy'));
    expect(await refused.done).toMatchObject({
      code: GrpcStatus.RESOURCE_EXHAUSTED,
      details: 'the server allows 2 concurrent calls on one connection, and as many are open',
    });
    first.cancel();
    await r1.done;
    await once(first, 'close');
    const again = c.call('/ProxyService/Proxy');
    await once(again, 'metadata');
    again.cancel();
    second.cancel();
  });

  it('close() cancels open calls and closes the connection', async () => {
    handler = echo();
    const c = client();
    const call = c.call('/ProxyService/Proxy');
    const r = record(call);
    await once(call, 'metadata');
    expect(sessions.size).toBe(1);
    const [session] = [...sessions];
    const sessionClosed = once(session!, 'close');
    c.close();
    expect((await r.done).code).toBe(GrpcStatus.CANCELLED);
    await sessionClosed;
    const after = record(c.call('/ProxyService/Proxy'));
    expect(await after.done).toMatchObject({ code: GrpcStatus.UNAVAILABLE, details: 'client closed' });
  });
});
