// raiseServerReceiveWindows on a live grpc-js server, observed from a raw HTTP/2 client: what the
// server advertises (SETTINGS, connection WINDOW_UPDATE) and what that lets a client send.
import { once } from 'node:events';
import http2 from 'node:http2';
import { setTimeout as sleep } from 'node:timers/promises';
import * as grpc from '@grpc/grpc-js';
import { afterEach, describe, expect, it } from 'vitest';
import { raiseServerReceiveWindows } from './grpc-windows.js';

const KiB = 1024;
const MiB = 1024 * 1024;
const DEFAULT_WINDOW = 65_535;

const identity = (b: Buffer): Buffer => b;
const echoService: grpc.ServiceDefinition = {
  Echo: {
    path: '/test.Echo/Echo',
    requestStream: true,
    responseStream: true,
    requestSerialize: identity,
    requestDeserialize: identity,
    responseSerialize: identity,
    responseDeserialize: identity,
  },
};

const cleanups: Array<() => void | Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

interface Started {
  port: number;
  /** Messages the handler has been handed (it reads only when `reading` is true). */
  received: () => number;
}

/** A grpc-js server with one bidi method; `reading: false` makes the handler never read. */
async function startServer(opts: { raise: boolean; reading: boolean }): Promise<Started> {
  const server = new grpc.Server();
  if (opts.raise) raiseServerReceiveWindows(server, 8 * MiB, 32 * MiB);
  let received = 0;
  server.addService(echoService, {
    Echo: (call: grpc.ServerDuplexStream<Buffer, Buffer>) => {
      call.on('error', () => {});
      if (!opts.reading) {
        call.pause();
        return;
      }
      call.on('data', (b: Buffer) => {
        received++;
        call.write(b);
      });
      call.on('end', () => call.end());
    },
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  cleanups.push(() => { server.forceShutdown(); });
  return { port, received: () => received };
}

async function connect(port: number): Promise<http2.ClientHttp2Session> {
  const session = http2.connect(`http://127.0.0.1:${port}`);
  cleanups.push(() => new Promise<void>((resolve) => {
    if (session.destroyed) return resolve();
    session.once('close', () => resolve());
    session.destroy();
  }));
  session.on('error', () => {});
  await once(session, 'remoteSettings');
  return session;
}

/** gRPC length-prefixed message framing. */
function frame(payload: Buffer): Buffer {
  const header = Buffer.alloc(5);
  header.writeUInt32BE(payload.length, 1);
  return Buffer.concat([header, payload]);
}

function openCall(session: http2.ClientHttp2Session): http2.ClientHttp2Stream {
  const stream = session.request({
    ':method': 'POST',
    ':path': '/test.Echo/Echo',
    'content-type': 'application/grpc',
    te: 'trailers',
  });
  stream.on('error', () => {});
  return stream;
}

/**
 * Writes 1 KiB gRPC messages one at a time, each once the previous one was sent (the write
 * callback fires once nghttp2 has put the data in DATA frames, which needs flow-control window),
 * while the server handler reads nothing. Returns the bytes sent before a write stalled for
 * `stallMs`, or `total` if everything went through.
 */
async function bytesSentWithoutReader(stream: http2.ClientHttp2Stream, total: number, stallMs: number): Promise<number> {
  const msg = frame(Buffer.alloc(KiB - 5, 7));
  let sent = 0;
  while (sent < total) {
    const ok = await new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), stallMs);
      stream.write(msg, (err) => { clearTimeout(timer); resolve(!err); });
    });
    if (!ok) break;
    sent += msg.length;
  }
  return sent;
}

describe('raiseServerReceiveWindows', () => {
  it('advertises the stream window in the server\'s SETTINGS', async () => {
    const { port } = await startServer({ raise: true, reading: true });
    const session = await connect(port);
    expect(session.remoteSettings.initialWindowSize).toBe(8 * MiB);
  });

  it('raises the connection-level window with a WINDOW_UPDATE', async () => {
    const { port } = await startServer({ raise: true, reading: true });
    const session = await connect(port);
    // The connection window starts at 65,535 by protocol; the server's WINDOW_UPDATE on stream 0
    // raises what we may send to 32 MiB.
    const deadline = Date.now() + 5000;
    while (session.state.remoteWindowSize !== 32 * MiB && Date.now() < deadline) await sleep(10);
    expect(session.state.remoteWindowSize).toBe(32 * MiB);
  });

  it('lets a client send far more than 64 KiB on a stream the server does not read', async () => {
    const { port } = await startServer({ raise: true, reading: false });
    const session = await connect(port);
    const stream = openCall(session);
    const sent = await bytesSentWithoutReader(stream, 4 * MiB, 1000);
    expect(sent).toBe(4 * MiB);
    stream.close(http2.constants.NGHTTP2_CANCEL);
  });

  it('(control) without it, the same client is held to the 64 KiB default', async () => {
    const { port } = await startServer({ raise: false, reading: false });
    const session = await connect(port);
    expect(session.remoteSettings.initialWindowSize).toBe(DEFAULT_WINDOW);
    const stream = openCall(session);
    const sent = await bytesSentWithoutReader(stream, 4 * MiB, 300);
    // grpc-js hands the (paused) handler a few messages; beyond that, the 64 KiB window holds.
    expect(sent).toBeGreaterThan(0);
    expect(sent).toBeLessThan(256 * KiB);
    stream.close(http2.constants.NGHTTP2_CANCEL);
  });

  it('still serves calls: a grpc-js client round-trips through the patched server', async () => {
    const { port, received } = await startServer({ raise: true, reading: true });
    const client = new grpc.Client(`127.0.0.1:${port}`, grpc.credentials.createInsecure());
    cleanups.push(() => client.close());
    const call = client.makeBidiStreamRequest('/test.Echo/Echo', identity, identity);
    const replies: Buffer[] = [];
    call.on('data', (b: Buffer) => replies.push(b));
    const status = new Promise<grpc.StatusObject>((resolve) => call.on('status', resolve));
    call.on('error', () => {});
    const big = Buffer.alloc(3 * MiB, 3);
    call.write(Buffer.from('hello'));
    call.write(big);
    call.end();
    expect((await status).code).toBe(grpc.status.OK);
    expect(received()).toBe(2);
    expect(replies.map((r) => r.length)).toEqual([5, big.length]);
    expect(replies[0]!.toString()).toBe('hello');
    expect(replies[1]!.equals(big)).toBe(true);
  });

  it('throws at once when the grpc-js hooks it needs are missing', () => {
    const notAServer = {} as unknown as grpc.Server;
    expect(() => raiseServerReceiveWindows(notAServer, 8 * MiB, 32 * MiB)).toThrow(/grpc-js/);
  });
});
