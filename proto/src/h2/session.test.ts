// Our HTTP/2 server session against node:http2's client (nghttp2: Huffman, the dynamic table, its own
// flow control) and against raw frames for what no well-behaved client sends.
import { createHash, randomBytes } from 'node:crypto';
import { once } from 'node:events';
import http2 from 'node:http2';
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { CLIENT_PREFACE, FrameType, Flags, H2Error, frame, settingsPayload, u32 } from './frames.js';
import { encodeHeaderBlock } from './hpack.js';
import { H2Session, type H2Headers, type H2SessionOptions, type H2Stream, type H2StreamHandler } from './session.js';

const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0).reverse()) c();
});

const OPTIONS: H2SessionOptions = { streamWindow: 64 * 1024, connectionWindow: 1 << 20, maxConcurrentStreams: 100 };

interface Served {
  port: number;
  sessions: H2Session[];
  /** Every stream with its headers, as the session hands them on. */
  streams: { stream: H2Stream; headers: H2Headers }[];
}

/** A TCP server running an H2Session per connection; `onStream` serves each request. */
async function serve(onStream: (stream: H2Stream, headers: H2Headers) => void, opts = OPTIONS): Promise<Served> {
  const served: Served = { port: 0, sessions: [], streams: [] };
  const server = net.createServer((socket) => {
    const session = new H2Session(socket, opts);
    served.sessions.push(session);
    session.on('stream', (stream: H2Stream, headers: H2Headers) => {
      served.streams.push({ stream, headers });
      onStream(stream, headers);
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  served.port = (server.address() as net.AddressInfo).port;
  cleanups.push(() => {
    for (const s of served.sessions) s.destroy();
    server.close();
  });
  return served;
}

function client(port: number, settings?: http2.Settings): http2.ClientHttp2Session {
  const c = http2.connect(`http://127.0.0.1:${port}`, { settings });
  c.on('error', () => {});
  cleanups.push(() => c.destroy());
  return c;
}

/** A handler that collects what a stream hands on; `echo` writes each chunk back and ends with trailers. */
function collector(stream: H2Stream, opts: { echo?: boolean } = {}): { chunks: Buffer[]; ended: Promise<void>; closed: Promise<void> } {
  const chunks: Buffer[] = [];
  let ended!: () => void;
  let closed!: () => void;
  const out = { chunks, ended: new Promise<void>((r) => (ended = r)), closed: new Promise<void>((r) => (closed = r)) };
  const handler: H2StreamHandler = {
    onStreamData: (c) => {
      chunks.push(Buffer.from(c));
      if (opts.echo) stream.write([Buffer.from(c)], c.length);
    },
    onStreamEnd: () => {
      ended();
      if (opts.echo) stream.sendTrailers(encodeHeaderBlock([['grpc-status', '0']]));
    },
    onStreamDrain: () => {},
    onStreamTrailersSent: () => {},
    onStreamClose: () => closed(),
  };
  stream.handler = handler;
  if (opts.echo) stream.respond(encodeHeaderBlock([[':status', '200']]), false);
  return out;
}

const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

describe('H2Session with node:http2 as the client', () => {
  it('hands on request headers as sent, through Huffman coding and the dynamic table (also once it evicts)', async () => {
    const served = await serve((stream) => stream.respond(encodeHeaderBlock([[':status', '204']]), true));
    const c = client(served.port);
    const sent: Record<string, string>[] = [];
    for (let i = 0; i < 60; i++) {
      // Values of every printable byte, repeated names: the client indexes them and evicts old ones.
      const value = randomBytes(20 + (i % 7) * 30)
        .toString('latin1')
        .replace(/[^\x21-\x7e\x80-\xff]/g, 'x');
      const headers = { ':method': 'POST', ':path': `/p/${i % 5}`, 'x-value': value, [`x-name-${i % 9}`]: `v${i}`, cookie: 'a=1' };
      sent.push(headers);
      const req = c.request({ ...headers, cookie: ['a=1', `b=${i}`] });
      req.end();
      await once(req, 'close');
    }
    expect(served.streams).toHaveLength(60);
    served.streams.forEach(({ headers }, i) => {
      const want = sent[i]!;
      expect(headers[':path']).toBe(want[':path']);
      expect(headers['x-value']).toBe(want['x-value']);
      expect(headers[`x-name-${i % 9}`]).toBe(`v${i}`);
      expect(headers.cookie).toBe(`a=1; b=${i}`);
    });
  });

  it('carries 8 MiB each way on one stream intact, through small windows on both sides', async () => {
    const served = await serve((stream) => collector(stream, { echo: true }), {
      ...OPTIONS,
      streamWindow: 16 * 1024,
      connectionWindow: 64 * 1024,
    });
    const c = client(served.port, { initialWindowSize: 20_000 });
    const body = randomBytes(8 << 20);
    const req = c.request({ ':method': 'POST', ':path': '/echo' });
    const back: Buffer[] = [];
    req.on('data', (d: Buffer) => back.push(d));
    let trailers: http2.IncomingHttpHeaders = {};
    req.on('trailers', (t) => (trailers = t));
    req.end(body);
    await once(req, 'close');
    expect(sha(Buffer.concat(back))).toBe(sha(body));
    expect(trailers['grpc-status']).toBe('0');
    expect(req.rstCode).toBe(http2.constants.NGHTTP2_NO_ERROR);
  });

  it('holds at most a stream window for a paused stream, and a paused stream does not stop the others', async () => {
    const served = await serve((stream, headers) => {
      const got = collector(stream, { echo: false });
      stream.respond(encodeHeaderBlock([[':status', '200']]), false);
      if (headers[':path'] === '/paused') stream.pause();
      void got;
    });
    const c = client(served.port);
    const paused = c.request({ ':method': 'POST', ':path': '/paused' });
    paused.write(randomBytes(1 << 20));
    const other = c.request({ ':method': 'POST', ':path': '/other' });
    other.end(randomBytes(2 << 20));
    await waitFor(() => served.streams.length === 2 && served.streams[1]!.stream.state !== 'open');
    const pausedStream = served.streams[0]!.stream;
    await waitFor(() => pausedStream.readableLength > 0);
    expect(pausedStream.readableLength).toBeLessThanOrEqual(OPTIONS.streamWindow);
    // Resumed: what it held, then the rest.
    let received = 0;
    pausedStream.handler = { ...pausedStream.handler!, onStreamData: (d) => (received += d.length) };
    pausedStream.resume();
    await waitFor(() => received === 1 << 20);
  });

  it('tells the handler of a reset by the client, with its code', async () => {
    const served = await serve((stream) => stream.respond(encodeHeaderBlock([[':status', '200']]), false));
    const c = client(served.port);
    const req = c.request({ ':method': 'POST', ':path': '/x' });
    await once(req, 'response');
    const { stream } = served.streams[0]!;
    const closed = new Promise<void>((resolve) => {
      stream.handler = {
        onStreamData: () => {},
        onStreamEnd: () => {},
        onStreamDrain: () => {},
        onStreamTrailersSent: () => {},
        onStreamClose: resolve,
      };
    });
    req.close(http2.constants.NGHTTP2_CANCEL);
    await closed;
    expect(stream.rstCode).toBe(H2Error.CANCEL);
    expect(stream.resetByPeer).toBe(true);
    expect(served.sessions[0]!.streamCount).toBe(0);
  });

  it('sends trailers only after the body that waited for the client window', async () => {
    const body = randomBytes(300_000);
    const served = await serve((stream) => {
      stream.respond(encodeHeaderBlock([[':status', '200']]), false);
      expect(stream.write([body], body.length)).toBe(false); // more than the client's window: it waits
      stream.sendTrailers(encodeHeaderBlock([['grpc-status', '0']]));
    });
    const c = client(served.port, { initialWindowSize: 16_384 });
    const req = c.request({ ':method': 'POST', ':path': '/x' }, { endStream: true });
    const chunks: Buffer[] = [];
    let bodyAtTrailers = -1;
    req.on('data', (d: Buffer) => chunks.push(d));
    req.on('trailers', () => (bodyAtTrailers = Buffer.concat(chunks).length));
    await once(req, 'close');
    expect(bodyAtTrailers).toBe(body.length);
    expect(sha(Buffer.concat(chunks))).toBe(sha(body));
  });

  it('changes every stream window with settings(), and answers pings', async () => {
    const served = await serve((stream) => {
      collector(stream);
      stream.respond(encodeHeaderBlock([[':status', '200']]), false);
      stream.pause();
    });
    const c = client(served.port);
    const session = await waitForValue(() => served.sessions[0]);
    await new Promise<void>((resolve, reject) => session.ping((err) => (err ? reject(err) : resolve())));
    session.settings({ initialWindowSize: 200_000 });
    await new Promise<void>((resolve) => session.ping(() => resolve())); // the client has the settings by its answer
    const req = c.request({ ':method': 'POST', ':path': '/x' });
    req.write(randomBytes(1 << 20));
    const { stream } = await waitForValue(() => served.streams[0]);
    await waitFor(() => stream.readableLength === 200_000);
    // A ping the session cannot send any more fails.
    session.destroy();
    expect(session.ping(() => {})).toBe(false);
  });

  it('refuses a stream beyond SETTINGS_MAX_CONCURRENT_STREAMS', async () => {
    const served = await serve((stream) => stream.respond(encodeHeaderBlock([[':status', '200']]), false), {
      ...OPTIONS,
      maxConcurrentStreams: 1,
    });
    const c = client(served.port);
    const first = c.request({ ':method': 'POST', ':path': '/1' });
    await once(first, 'response');
    // node:http2 itself queues a request beyond the limit: send it on a raw connection instead.
    const raw = await rawClient(served.port);
    raw.send(frame(FrameType.HEADERS, Flags.END_HEADERS, 1, requestBlock()));
    raw.send(frame(FrameType.HEADERS, Flags.END_HEADERS, 3, requestBlock()));
    expect(await raw.reset(3)).toBe(H2Error.REFUSED_STREAM);
  });
});

/** A request's header block; `extra` fields go as plain literals, unchecked (our encoder refuses what HTTP/2 forbids). */
function requestBlock(extra: [string, string][] = []): Buffer {
  const literals = extra.map(([n, v]) =>
    Buffer.concat([Buffer.from([0x00, n.length]), Buffer.from(n, 'latin1'), Buffer.from([v.length]), Buffer.from(v, 'latin1')]),
  );
  return Buffer.concat([
    encodeHeaderBlock([
      [':method', 'POST'],
      [':scheme', 'http'],
      [':path', '/x'],
    ]),
    ...literals,
  ]);
}

/** A client speaking raw frames: it sends the preface and empty SETTINGS, and reads the server's frames. */
async function rawClient(port: number): Promise<{
  send: (b: Buffer) => void;
  goaway: () => Promise<number>;
  reset: (streamId: number) => Promise<number>;
}> {
  const socket = net.connect(port, '127.0.0.1');
  socket.on('error', () => {});
  cleanups.push(() => socket.destroy());
  await once(socket, 'connect');
  let buf = Buffer.alloc(0);
  const frames: { type: number; streamId: number; payload: Buffer }[] = [];
  const waiters: (() => void)[] = [];
  socket.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    while (buf.length >= 9) {
      const length = buf.readUIntBE(0, 3);
      if (buf.length < 9 + length) break;
      frames.push({ type: buf[3]!, streamId: buf.readUInt32BE(5), payload: buf.subarray(9, 9 + length) });
      buf = buf.subarray(9 + length);
    }
    for (const w of waiters.splice(0)) w();
  });
  const closed = once(socket, 'close');
  const find = async (match: (f: { type: number; streamId: number; payload: Buffer }) => boolean): Promise<Buffer> => {
    for (;;) {
      const f = frames.find(match);
      if (f) return f.payload;
      const more = new Promise<void>((r) => waiters.push(r));
      const gone = await Promise.race([more.then(() => false), closed.then(() => true)]);
      if (gone && !frames.find(match)) throw new Error('connection closed without the frame');
    }
  };
  socket.write(Buffer.concat([CLIENT_PREFACE, frame(FrameType.SETTINGS, 0, 0, settingsPayload([]))]));
  return {
    send: (b) => socket.write(b),
    goaway: async () => (await find((f) => f.type === FrameType.GOAWAY)).readUInt32BE(4),
    reset: async (id) => (await find((f) => f.type === FrameType.RST_STREAM && f.streamId === id)).readUInt32BE(0),
  };
}

describe('H2Session against frames no well-behaved client sends', () => {
  const nothing = (): void => {};

  it.each([
    ['a frame larger than SETTINGS_MAX_FRAME_SIZE', () => frame(FrameType.DATA, 0, 1, Buffer.alloc(16_385)), H2Error.FRAME_SIZE_ERROR],
    ['DATA on a stream never opened', () => frame(FrameType.DATA, 0, 5, Buffer.from('x')), H2Error.PROTOCOL_ERROR],
    ['a stream with an even ID', () => frame(FrameType.HEADERS, Flags.END_HEADERS, 2, requestBlock()), H2Error.PROTOCOL_ERROR],
    [
      'a header block HPACK cannot decode',
      () => frame(FrameType.HEADERS, Flags.END_HEADERS, 1, Buffer.from([0x80])),
      H2Error.COMPRESSION_ERROR,
    ],
    ['CONTINUATION without HEADERS', () => frame(FrameType.CONTINUATION, Flags.END_HEADERS, 1, requestBlock()), H2Error.PROTOCOL_ERROR],
    [
      'another frame in the middle of a header block',
      () => Buffer.concat([frame(FrameType.HEADERS, 0, 1, requestBlock()), frame(FrameType.PING, 0, 0, Buffer.alloc(8))]),
      H2Error.PROTOCOL_ERROR,
    ],
    [
      'a header block of endless CONTINUATIONs',
      () =>
        Buffer.concat([
          frame(FrameType.HEADERS, 0, 1, Buffer.alloc(0)),
          ...Array.from({ length: 20 }, () => frame(FrameType.CONTINUATION, 0, 1, Buffer.alloc(16_000))),
        ]),
      H2Error.ENHANCE_YOUR_CALM,
    ],
    ['PUSH_PROMISE from a client', () => frame(FrameType.PUSH_PROMISE, Flags.END_HEADERS, 1, Buffer.alloc(4)), H2Error.PROTOCOL_ERROR],
    ['a PING of 7 bytes', () => frame(FrameType.PING, 0, 0, Buffer.alloc(7)), H2Error.FRAME_SIZE_ERROR],
    ['a connection WINDOW_UPDATE past 2^31-1', () => frame(FrameType.WINDOW_UPDATE, 0, 0, u32(0x7fffffff)), H2Error.FLOW_CONTROL_ERROR],
    [
      'SETTINGS_INITIAL_WINDOW_SIZE past 2^31-1',
      () => frame(FrameType.SETTINGS, 0, 0, settingsPayload([[4, 0x80000000]])),
      H2Error.FLOW_CONTROL_ERROR,
    ],
    ['a SETTINGS frame of 5 bytes', () => frame(FrameType.SETTINGS, 0, 0, Buffer.alloc(5)), H2Error.FRAME_SIZE_ERROR],
  ])('answers %s with GOAWAY and its code, and closes', async (_what, bytes, code) => {
    const served = await serve(nothing);
    const raw = await rawClient(served.port);
    raw.send(bytes());
    expect(await raw.goaway()).toBe(code);
    await waitFor(() => served.sessions[0]!.destroyed);
  });

  it('answers a client that is not HTTP/2 with GOAWAY PROTOCOL_ERROR', async () => {
    const served = await serve(nothing);
    const socket = net.connect(served.port, '127.0.0.1');
    cleanups.push(() => socket.destroy());
    let data = Buffer.alloc(0);
    socket.on('data', (d: Buffer) => (data = Buffer.concat([data, d])));
    socket.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
    await once(socket, 'end');
    // Our SETTINGS and WINDOW_UPDATE first, then the GOAWAY.
    const types: number[] = [];
    for (let at = 0; at + 9 <= data.length; at += 9 + data.readUIntBE(at, 3)) types.push(data[at + 3]!);
    expect(types).toEqual([FrameType.SETTINGS, FrameType.WINDOW_UPDATE, FrameType.GOAWAY]);
    expect(data.readUInt32BE(data.length - 4 - 'not an HTTP/2 client preface'.length)).toBe(H2Error.PROTOCOL_ERROR);
    await waitFor(() => served.sessions[0]!.destroyed);
  });

  it.each([
    ['an upper-case name', [['X-Upper', '1']] as [string, string][]],
    ['a connection-specific header', [['connection', 'close']] as [string, string][]],
    ['te other than trailers', [['te', 'gzip']] as [string, string][]],
  ])('resets a request with %s (PROTOCOL_ERROR), and serves the next', async (_what, extra) => {
    const served = await serve((stream) => stream.respond(encodeHeaderBlock([[':status', '200']]), false));
    const raw = await rawClient(served.port);
    raw.send(frame(FrameType.HEADERS, Flags.END_HEADERS, 1, requestBlock(extra)));
    expect(await raw.reset(1)).toBe(H2Error.PROTOCOL_ERROR);
    raw.send(frame(FrameType.HEADERS, Flags.END_HEADERS, 3, requestBlock()));
    await waitFor(() => served.streams.length === 1);
    expect(served.streams[0]!.stream.id).toBe(3);
  });

  it('ends the connection of a client that sends pings and never reads the answers (ENHANCE_YOUR_CALM)', { timeout: 60_000 }, async () => {
    const served = await serve(nothing);
    const socket = net.connect(served.port, '127.0.0.1');
    socket.on('error', () => {});
    cleanups.push(() => socket.destroy());
    await once(socket, 'connect');
    socket.pause(); // reads nothing
    socket.write(Buffer.concat([CLIENT_PREFACE, frame(FrameType.SETTINGS, 0, 0, settingsPayload([]))]));
    const session = await waitForValue(() => served.sessions[0]);
    const code = new Promise<number>((resolve) => session.once('protocolError', (err: { code: number }) => resolve(err.code)));
    const pings = Buffer.concat(Array.from({ length: 4096 }, () => frame(FrameType.PING, 0, 0, Buffer.alloc(8))));
    // Up to 64 MiB of answers: more than the kernel's buffers on both ends and our limit together.
    for (let i = 0; i < 1000 && !session.destroyed && !session.closed; i++) {
      if (!socket.write(pings)) await Promise.race([once(socket, 'drain'), code]);
    }
    expect(await code).toBe(H2Error.ENHANCE_YOUR_CALM);
    await waitFor(() => session.destroyed);
  });

  it('resets a stream whose client sends DATA after its END_STREAM, also while the end waits behind held bytes (STREAM_CLOSED)', async () => {
    const served = await serve((stream) => {
      collector(stream);
      stream.pause();
    });
    const raw = await rawClient(served.port);
    raw.send(frame(FrameType.HEADERS, Flags.END_HEADERS, 1, requestBlock()));
    raw.send(frame(FrameType.DATA, Flags.END_STREAM, 1, Buffer.from('a')));
    raw.send(frame(FrameType.DATA, 0, 1, Buffer.from('b')));
    expect(await raw.reset(1)).toBe(H2Error.STREAM_CLOSED);
  });

  it('tells the handler of a reset that crossed our END_STREAM, once the stream had closed', async () => {
    const late: number[] = [];
    const served = await serve((stream) => {
      stream.handler = {
        onStreamData: () => {},
        onStreamEnd: () => stream.respond(encodeHeaderBlock([[':status', '200']]), true),
        onStreamDrain: () => {},
        onStreamTrailersSent: () => {},
        onStreamClose: () => {},
        onStreamResetAfterClose: (code) => late.push(code),
      };
    });
    const raw = await rawClient(served.port);
    raw.send(frame(FrameType.HEADERS, Flags.END_HEADERS | Flags.END_STREAM, 1, requestBlock()));
    await waitFor(() => served.streams[0]?.stream.destroyed === true);
    raw.send(frame(FrameType.RST_STREAM, 0, 1, u32(H2Error.CANCEL)));
    await waitFor(() => late.length === 1);
    expect(late).toEqual([H2Error.CANCEL]);
  });

  it('resets a stream whose client sends beyond its window (FLOW_CONTROL_ERROR)', async () => {
    const served = await serve(
      (stream) => {
        collector(stream);
        stream.pause();
      },
      { ...OPTIONS, streamWindow: 65_535 },
    );
    const raw = await rawClient(served.port);
    raw.send(frame(FrameType.HEADERS, Flags.END_HEADERS, 1, requestBlock()));
    for (let i = 0; i < 5; i++) raw.send(frame(FrameType.DATA, 0, 1, Buffer.alloc(16_000)));
    expect(await raw.reset(1)).toBe(H2Error.FLOW_CONTROL_ERROR);
    expect(served.streams[0]!.stream.readableLength).toBeLessThanOrEqual(65_535);
  });
});

async function waitFor(ok: () => boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 5));
  }
}

async function waitForValue<T>(get: () => T | undefined): Promise<T> {
  await waitFor(() => get() !== undefined);
  return get()!;
}
