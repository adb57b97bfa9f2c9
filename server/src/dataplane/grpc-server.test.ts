// GrpcServer on a Unix socket with a raw node:http2 client: what an unmodified gRPC peer sees
// (statuses, trailers-only refusals, deadlines) and how shutdown ends sessions whose client never closes.
import { once } from 'node:events';
import http2 from 'node:http2';
import net from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { GrpcClient, GrpcStatus, PacketType, encodePacket, packets, type GrpcCallStatus, type Packet } from '@cluster-proxy/proto';
import { GrpcServer, type GrpcServerCall } from './grpc-server.js';

let dir: string;
let server: GrpcServer;
let sock: string;
const sessions: http2.ClientHttp2Session[] = [];

beforeEach(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'grpc-server-'));
  sock = path.join(dir, 'grpc.sock');
  server = new GrpcServer({
    streamWindow: 1 << 20,
    connectionWindow: 1 << 22,
    maxMessageBytes: 1 << 16,
    watchdog: { intervalMs: 60_000, timeoutMs: 10_000 },
  });
  // Echo, and OK once the client half-closes.
  server.handle('/ProxyService/Proxy', (call) => {
    call.sendMetadata({ serverid: 'test' });
    call.on('data', (p: Packet) => call.write(p));
    call.on('end', () => call.end());
  });
  await server.listenUnix(sock);
});

afterEach(async () => {
  for (const s of sessions.splice(0)) s.destroy();
  server.forceShutdown();
  rmSync(dir, { recursive: true, force: true });
});

async function waitUntil(ok: () => boolean, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 10));
  }
}

function connect(): http2.ClientHttp2Session {
  const s = http2.connect('http://localhost', { createConnection: () => net.connect({ path: sock }) });
  s.on('error', () => {});
  sessions.push(s);
  return s;
}

/** Response headers, trailers and body of one raw request. */
async function request(
  session: http2.ClientHttp2Session,
  headers: http2.OutgoingHttpHeaders,
  body?: Buffer,
): Promise<{ headers: http2.IncomingHttpHeaders; trailers: http2.IncomingHttpHeaders; body: Buffer }> {
  const st = session.request({ ':method': 'POST', 'content-type': 'application/grpc', te: 'trailers', ...headers });
  st.on('error', () => {});
  let trailers: http2.IncomingHttpHeaders = {};
  st.on('trailers', (t) => (trailers = t));
  const chunks: Buffer[] = [];
  st.on('data', (c: Buffer) => chunks.push(c));
  const [h] = (await once(st, 'response')) as [http2.IncomingHttpHeaders];
  if (body) st.end(body);
  else st.end();
  await once(st, 'close');
  return { headers: h, trailers, body: Buffer.concat(chunks) };
}

describe('GrpcServer', () => {
  it('serves a call to our GrpcClient: metadata, echo, OK', async () => {
    const c = new GrpcClient({ address: `unix:${sock}`, streamWindow: 1 << 20, connectionWindow: 1 << 22, maxMessageBytes: 1 << 16 });
    try {
      const call = c.call('/ProxyService/Proxy');
      const got: Packet[] = [];
      call.on('data', (p: Packet) => got.push(p));
      const md = once(call, 'metadata') as Promise<[Record<string, string[]>]>;
      const status = once(call, 'status') as Promise<[GrpcCallStatus]>;
      call.write(packets.closeRequest(7));
      call.end();
      expect((await md)[0]['serverid']).toEqual(['test']);
      expect((await status)[0].code).toBe(GrpcStatus.OK);
      expect(got).toEqual([packets.closeRequest(7)]);
    } finally {
      c.close();
    }
  });

  it("a paused call counts the client bytes it holds (Node's stream buffer, messages not handed on), and none once they are taken", async () => {
    let held: GrpcServerCall | undefined;
    const taken: Packet[] = [];
    server.handle('/Test/Paused', (call) => {
      call.sendMetadata();
      call.pause();
      call.on('data', (p: Packet) => taken.push(p));
      held = call;
    });
    const c = new GrpcClient({ address: `unix:${sock}`, streamWindow: 1 << 20, connectionWindow: 1 << 22, maxMessageBytes: 1 << 16 });
    try {
      const call = c.call('/Test/Paused');
      await once(call, 'metadata');
      const payload = 3 * 10_000;
      for (let i = 0; i < 3; i++) call.write(packets.data(1, Buffer.alloc(10_000, i)));
      await waitUntil(() => (held?.heldBytes ?? 0) >= payload);
      expect(held!.heldBytes).toBeLessThan(payload + 3 * 64); // gRPC and protobuf framing only
      expect(taken).toEqual([]);
      held!.resume();
      await waitUntil(() => taken.length === 3);
      expect(held!.heldBytes).toBe(0);
    } finally {
      c.close();
    }
  });

  it('onDataViews: DATA reaches the handler as the HTTP/2 chunks it arrived in, in order with other packets, also after a pause; writeData answers without a copy', async () => {
    let held: GrpcServerCall | undefined;
    const order: string[] = [];
    server.handle('/Test/Views', (call) => {
      call.sendMetadata();
      call.pause();
      call.on('data', (p: Packet) => order.push(PacketType[p.type]!));
      call.onDataViews((connectID, chunks, length) => {
        order.push(`views:${connectID}:${length}:${chunks.length > 1 ? 'several' : 'one'}`);
        call.writeData(connectID, chunks, length); // echo
      });
      held = call;
    });
    const c = new GrpcClient({ address: `unix:${sock}`, streamWindow: 1 << 20, connectionWindow: 1 << 22, maxMessageBytes: 1 << 16 });
    try {
      const call = c.call('/Test/Views');
      const echoed: Packet[] = [];
      call.on('data', (p: Packet) => echoed.push(p));
      await once(call, 'metadata');
      const payload = Buffer.alloc(60_000);
      for (let i = 0; i < payload.length; i++) payload[i] = i % 249;
      call.write(packets.closeRequest(4));
      call.write(packets.data(4, payload)); // more than one 16 KiB HTTP/2 frame
      await waitUntil(() => (held?.heldBytes ?? 0) >= payload.length);
      expect(order).toEqual([]); // paused: parsed, held, counted
      held!.resume();
      await waitUntil(() => echoed.length === 1);
      expect(order).toEqual(['CLOSE_REQ', `views:4:${payload.length}:several`]);
      expect(echoed).toEqual([packets.data(4, payload)]);
      expect(held!.heldBytes).toBe(0);
    } finally {
      c.close();
    }
  });

  it('answers an unknown method and a compressed call with a trailers-only UNIMPLEMENTED, and a non-gRPC request with 415', async () => {
    const s = connect();
    const unknown = await request(s, { ':path': '/Nope/Nope' });
    expect(unknown.headers).toMatchObject({
      ':status': 200,
      'grpc-status': String(GrpcStatus.UNIMPLEMENTED),
      'grpc-message': 'unknown method /Nope/Nope',
    });
    const gzip = await request(s, { ':path': '/ProxyService/Proxy', 'grpc-encoding': 'gzip' });
    expect(gzip.headers['grpc-status']).toBe(String(GrpcStatus.UNIMPLEMENTED));
    const plain = await request(s, { ':path': '/ProxyService/Proxy', 'content-type': 'text/plain' });
    expect(plain.headers[':status']).toBe(415);
  });

  it('refuses a message over the limit with RESOURCE_EXHAUSTED in the trailers, and keeps serving the session', async () => {
    const s = connect();
    const head = Buffer.alloc(5);
    head.writeUInt32BE((1 << 16) + 1, 1);
    const big = await request(s, { ':path': '/ProxyService/Proxy' }, head);
    expect(big.trailers).toMatchObject({
      'grpc-status': String(GrpcStatus.RESOURCE_EXHAUSTED),
      'grpc-message': `Received message larger than max (${(1 << 16) + 1} vs. ${1 << 16})`,
    });
    const ok = await request(s, { ':path': '/ProxyService/Proxy' });
    expect(ok.trailers['grpc-status']).toBe('0');
  });

  it('ends a call whose grpc-timeout passes with DEADLINE_EXCEEDED', async () => {
    server.handle('/Slow/Call', (call: GrpcServerCall) => call.sendMetadata());
    const s = connect();
    const st = s.request({ ':method': 'POST', ':path': '/Slow/Call', 'content-type': 'application/grpc', 'grpc-timeout': '50m' });
    st.on('error', () => {});
    const [trailers] = (await once(st, 'trailers')) as [http2.IncomingHttpHeaders];
    expect(trailers['grpc-status']).toBe(String(GrpcStatus.DEADLINE_EXCEEDED));
  });

  it('shutdown: GOAWAY, waits for open calls, then closes connections even when the client never closes its side', async () => {
    const s = connect();
    const st = s.request({ ':method': 'POST', ':path': '/ProxyService/Proxy', 'content-type': 'application/grpc' });
    st.on('error', () => {});
    await once(st, 'response');
    const goaway = once(s, 'goaway');
    let done = false;
    const stopped = server.shutdown().then(() => (done = true));
    await goaway;
    // A message sent after the GOAWAY comes back: the call is still served, and shutdown() waits for it.
    const body = encodePacket(packets.closeRequest(3));
    const message = Buffer.alloc(5 + body.length);
    message.writeUInt32BE(body.length, 1);
    body.copy(message, 5);
    const echoed = Promise.race([
      once(st, 'data') as Promise<[Buffer]>,
      once(st, 'close').then(() => {
        throw new Error('the call closed before its echo');
      }),
    ]);
    st.write(message);
    expect((await echoed)[0]).toEqual(message);
    expect(done).toBe(false);
    st.end(); // the client half-closes: the handler ends the call
    await stopped;
    await once(s, 'close'); // the server closed the connection; this client did nothing more
    expect(server.openCalls).toBe(0);
  });

  it('resets a finished stream whose client keeps its side open (RST_STREAM NO_ERROR, after a grace); one that ends its side is done too', async () => {
    server.handle('/Refuse/Call', (call: GrpcServerCall) => call.endWithStatus(GrpcStatus.PERMISSION_DENIED, 'no'));
    const s = connect();
    // This client never ends its side: the server resets the stream after the status.
    const open = s.request({ ':method': 'POST', ':path': '/Refuse/Call', 'content-type': 'application/grpc' });
    open.on('error', () => {});
    const [headers] = (await once(open, 'response')) as [http2.IncomingHttpHeaders];
    expect(headers['grpc-status']).toBe(String(GrpcStatus.PERMISSION_DENIED));
    await once(open, 'close');
    expect(open.rstCode).toBe(http2.constants.NGHTTP2_NO_ERROR);
    expect(open.readableEnded).toBe(true);
    // This one ends its side once it has read the status (as gRPC clients do): the stream closes.
    const ended = await request(s, { ':path': '/Refuse/Call' });
    expect(ended.headers['grpc-status']).toBe(String(GrpcStatus.PERMISSION_DENIED));
    await waitUntil(() => server.openCalls === 0);
  });

  it('sends the response headers with the first message when asked to, its metadata in them; request metadata is read while the handler runs', async () => {
    let later: (() => void) | undefined;
    let metadataAfter = '';
    server.handle('/Late/Call', (call: GrpcServerCall) => {
      call.sendMetadataWithFirstMessage({ capabilities: call.metadata.get('x-ask').join(',') });
      later = () => call.write(packets.closeRequest(7));
      setImmediate(() => {
        try {
          call.metadata.get('x-ask');
        } catch (err) {
          metadataAfter = (err as Error).message;
        }
      });
    });
    const s = connect();
    const st = s.request({ ':method': 'POST', ':path': '/Late/Call', 'content-type': 'application/grpc', 'x-ask': 'half-close' });
    st.on('error', () => {});
    let responded = false;
    st.once('response', () => (responded = true));
    await waitUntil(() => later !== undefined && metadataAfter !== '');
    // A ping's answer has come back: the server had its chance to send headers and did not.
    await new Promise<void>((resolve, reject) => s.ping((err) => (err ? reject(err) : resolve())));
    expect(responded).toBe(false);
    expect(metadataAfter).toMatch(/while the handler runs/);
    const response = once(st, 'response') as Promise<[http2.IncomingHttpHeaders]>;
    const data = once(st, 'data') as Promise<[Buffer]>;
    later!();
    const [h] = await response;
    expect(h['capabilities']).toBe('half-close');
    expect(h['date']).toBeUndefined();
    expect((await data)[0].length).toBeGreaterThan(5);
    st.close();
  });
});
