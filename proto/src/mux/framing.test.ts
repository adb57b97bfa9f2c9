import { once } from 'node:events';
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { FramedPacketStream, FrameError, type Hello } from './framing.js';
import { MuxRefusedError, refusalHello, refusalOf } from './mux-connect.js';
import { encodePacketParts, encodePacket } from '../wire/codec.js';
import { PacketType, packets, type Packet } from '../wire/packet.js';

// Real sockets: a loopback pair, with raw access to one end to send arbitrary bytes.
const cleanup: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanup.splice(0)) c();
});

async function pair(): Promise<{ a: net.Socket; b: net.Socket }> {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const accepted = once(server, 'connection') as Promise<[net.Socket]>;
  const a = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  const [b] = await accepted;
  server.close();
  cleanup.push(() => {
    a.destroy();
    b.destroy();
  });
  return { a, b };
}

/** Polls until `ok` holds (or 5 s passed: the assertion after it then says what is missing). */
async function until(ok: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !ok(); i++) await new Promise((r) => setTimeout(r, 10));
}

function frame(kind: number, body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32BE(body.length + 1, 0);
  head[4] = kind;
  return Buffer.concat([head, body]);
}

describe('FramedPacketStream', () => {
  it('exchanges a hello, then packets, both ways', async () => {
    const { a, b } = await pair();
    const sa = new FramedPacketStream(a, 1 << 20);
    const sb = new FramedPacketStream(b, 1 << 20);
    const hello = once(sb, 'hello') as Promise<[Hello]>;
    sa.sendHello({ agentid: ['x'], caps: ['credit', 'half-close'] });
    expect((await hello)[0]).toEqual({ agentid: ['x'], caps: ['credit', 'half-close'] });
    sb.sendHello({});
    await once(sa, 'hello');
    const got: Packet[] = [];
    sb.on('data', (p: Packet) => got.push(p));
    const sent = [
      packets.dialRequest('c1:443', 7n),
      packets.data(3, Buffer.alloc(300_000, 9)),
      packets.credit(3, 1024),
      packets.closeRequest(3),
    ];
    for (const p of sent) sa.write(p);
    await new Promise<void>((r) => {
      const t = setInterval(() => {
        if (got.length === sent.length) {
          clearInterval(t);
          r();
        }
      }, 5);
    });
    expect(got).toEqual(sent);
  });

  it("packets right behind the hello wait for the first 'data' listener, attached ticks later (a dial sent to a newly connected agent)", async () => {
    const { a, b } = await pair();
    const sb = new FramedPacketStream(b, 1 << 20);
    const dial = packets.dialRequest('c1:443', 7n);
    // One write: the hello and the packet arrive in one chunk and are parsed in one go.
    a.write(Buffer.concat([frame(0, Buffer.from('{}')), frame(1, Buffer.concat(encodePacketParts(dial)))]));
    await once(sb, 'hello');
    await new Promise((r) => setImmediate(r));
    const [got] = (await once(sb, 'data')) as [Packet];
    expect(got).toEqual(dial);
  }, 5000);

  it('a stream ended without a reader still sees its peer close', async () => {
    const { a, b } = await pair();
    const sb = new FramedPacketStream(b, 1 << 20);
    a.write(Buffer.concat([frame(0, Buffer.from('{}')), frame(1, Buffer.concat(encodePacketParts(packets.dialRequest('c1:443', 1n))))]));
    await once(sb, 'hello');
    const closed = once(sb, 'close');
    sb.end();
    a.end();
    await closed;
  });

  it('reassembles frames split at every byte boundary', async () => {
    const { a, b } = await pair();
    const sb = new FramedPacketStream(b, 1 << 20);
    const got: Packet[] = [];
    sb.on('data', (p: Packet) => got.push(p));
    const p = packets.data(5, Buffer.from('split me please'));
    const bytes = Buffer.concat([frame(0, Buffer.from('{}')), frame(1, Buffer.concat(encodePacketParts(p)))]);
    for (const byte of bytes) {
      a.write(Buffer.from([byte]));
      await new Promise((r) => setImmediate(r));
    }
    await until(() => got.length > 0);
    expect(got).toEqual([p]);
  });

  it('encodes DATA as header + untouched payload, decodable as one packet', () => {
    const payload = Buffer.alloc(1000, 1);
    const parts = encodePacketParts(packets.data(9, payload));
    expect(parts).toHaveLength(2);
    expect(parts[1]).toBe(payload);
    expect(Buffer.concat(parts)).toEqual(encodePacket(packets.data(9, payload)));
  });

  it("hands DATA payloads to onDataViews as views of the chunks they arrived in, in order; other packets still go to 'data'", async () => {
    const { a, b } = await pair();
    const sa = new FramedPacketStream(a, 1 << 20);
    const received: Buffer[] = [];
    b.on('data', (c: Buffer) => received.push(c)); // before the stream's own listener: sees every chunk
    const sb = new FramedPacketStream(b, 1 << 20);
    const views: { connectID: number; chunks: readonly Buffer[]; length: number }[] = [];
    const got: Packet[] = [];
    sb.on('data', (p: Packet) => got.push(p));
    sb.onDataViews((connectID, chunks, length) => views.push({ connectID, chunks, length }));
    sa.sendHello({});
    const big = Buffer.alloc(600_000);
    for (let i = 0; i < big.length; i++) big[i] = i % 251;
    sa.write(packets.data(3, big));
    sa.write(packets.credit(3, 1024));
    sa.writeData(4, [Buffer.from('one '), Buffer.from('payload')], 11);
    await new Promise<void>((r) => {
      const t = setInterval(() => {
        if (views.length === 2 && got.length === 1) {
          clearInterval(t);
          r();
        }
      }, 5);
    });
    expect(got).toEqual([packets.credit(3, 1024)]);
    expect(views.map((v) => [v.connectID, v.length])).toEqual([
      [3, big.length],
      [4, 11],
    ]);
    expect(Buffer.concat(views[0]!.chunks).equals(big)).toBe(true);
    expect(views[0]!.chunks.length).toBeGreaterThan(1); // 600 kB do not arrive in one read
    const backing = new Set(received.map((c) => c.buffer));
    for (const c of views[0]!.chunks) expect(backing.has(c.buffer)).toBe(true); // views, not copies
    expect(Buffer.concat(views[1]!.chunks).toString()).toBe('one payload');
  });

  it('without a handler (or after onDataViews(null)), a writeData frame reads as one DATA packet', async () => {
    const { a, b } = await pair();
    const sa = new FramedPacketStream(a, 1 << 20);
    const sb = new FramedPacketStream(b, 1 << 20);
    const got: Packet[] = [];
    const views: number[] = [];
    sb.on('data', (p: Packet) => got.push(p));
    sb.onDataViews((_id, _chunks, length) => views.push(length));
    sb.onDataViews(null);
    sa.sendHello({});
    sa.writeData(9, [Buffer.from('ab'), Buffer.from('cd')], 4);
    await new Promise<void>((r) => {
      const t = setInterval(() => {
        if (got.length === 1) {
          clearInterval(t);
          r();
        }
      }, 5);
    });
    expect(got).toEqual([packets.data(9, Buffer.from('abcd'))]);
    expect(views).toEqual([]);
  });

  it('with a handler, a DATA frame split at every byte boundary arrives whole, and a malformed one still fails the stream', async () => {
    const { a, b } = await pair();
    const sb = new FramedPacketStream(b, 1 << 20);
    const views: Buffer[] = [];
    sb.on('data', () => {});
    sb.onDataViews((_id, chunks) => views.push(Buffer.concat(chunks)));
    const bytes = Buffer.concat([
      frame(0, Buffer.from('{}')),
      frame(1, Buffer.concat(encodePacketParts(packets.data(5, Buffer.from('split me please'))))),
    ]);
    for (const byte of bytes) {
      a.write(Buffer.from([byte]));
      await new Promise((r) => setImmediate(r));
    }
    await until(() => views.length > 0);
    expect(views.map(String)).toEqual(['split me please']);
    const failed = once(sb, 'error') as Promise<[Error]>;
    a.write(frame(1, Buffer.from([0x08, 0x04, 0x22, 0x7f, 0x08]))); // DATA whose length runs past the frame
    const [err] = await failed;
    expect(err.message).toMatch(/malformed packet/);
  });

  it.each([
    [
      'a frame over the size limit',
      (): Buffer => {
        const h = Buffer.alloc(5);
        h.writeUInt32BE(2_000_000, 0);
        h[4] = 1;
        return Buffer.concat([frame(0, Buffer.from('{}')), h]);
      },
      /exceeds/,
    ],
    ['a first frame that is not a hello', (): Buffer => frame(1, encodePacket(packets.drain())), /not a hello/],
    ['a hello that is not JSON', (): Buffer => frame(0, Buffer.from('{nope')), /not JSON/],
    ['a hello with a non-string value', (): Buffer => frame(0, Buffer.from('{"a":[1]}')), /string arrays/],
    ['an unknown frame kind', (): Buffer => Buffer.concat([frame(0, Buffer.from('{}')), frame(9, Buffer.from('x'))]), /unknown frame kind/],
    [
      'a malformed packet',
      (): Buffer => Buffer.concat([frame(0, Buffer.from('{}')), frame(1, Buffer.from([0x08, 0x80]))]),
      /malformed packet/,
    ],
    ['an empty frame', (): Buffer => Buffer.concat([frame(0, Buffer.from('{}')), Buffer.alloc(4)]), /empty frame/],
  ])('fails the stream (only) on %s', async (_name, bytes, message) => {
    const { a, b } = await pair();
    const sb = new FramedPacketStream(b, 1 << 20);
    const failed = once(sb, 'error') as Promise<[Error]>;
    a.write(bytes());
    const [err] = await failed;
    expect(err).toBeInstanceOf(FrameError);
    expect(err.message).toMatch(message);
    await once(b, 'close');
  });

  it('fails the stream, not the process, when a packet listener throws', async () => {
    const { a, b } = await pair();
    const sa = new FramedPacketStream(a, 1 << 20);
    const sb = new FramedPacketStream(b, 1 << 20);
    sb.on('data', () => {
      throw new Error('listener bug');
    });
    const failed = once(sb, 'error') as Promise<[Error]>;
    sa.sendHello({});
    sa.write(packets.drain());
    expect((await failed)[0].message).toBe('listener bug');
  });

  it('answers pings, and fails a peer that stops answering', async () => {
    const { a, b } = await pair();
    const sa = new FramedPacketStream(a, 1 << 20);
    const sb = new FramedPacketStream(b, 1 << 20);
    sa.sendHello({});
    sb.sendHello({});
    // PONG frames (5 bytes each) that reach a, after b's hello (7 bytes).
    let received = 0;
    a.on('data', (d: Buffer) => (received += d.length));
    await until(() => received >= 7);
    sa.startKeepalive(50, 100);
    // b answers: a stays up through eight pings, well past the 150 ms a silent peer is given.
    await until(() => received >= 7 + 8 * 5 || sa.isClosed);
    expect(sa.isClosed).toBe(false);
    // b stops reading (its process froze): a gives up.
    b.pause();
    sb.pause();
    const [err] = (await once(sa, 'error')) as [Error];
    expect(err.message).toMatch(/did not answer keepalive/);
  });

  /** The kinds of the frames that arrive on `socket` (read beside its FramedPacketStream). */
  function frameKinds(socket: net.Socket): number[] {
    const kinds: number[] = [];
    let buf = Buffer.alloc(0);
    socket.on('data', (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 5 && buf.length >= 4 + buf.readUInt32BE(0)) {
        kinds.push(buf[4]!);
        buf = buf.subarray(4 + buf.readUInt32BE(0));
      }
    });
    return kinds;
  }
  const PING = 2;
  const PONG = 3;

  /** Two framed ends that said hello, and the kinds of the frames b receives. */
  async function helloPair(): Promise<{ b: net.Socket; sa: FramedPacketStream; sb: FramedPacketStream; atB: number[] }> {
    const { a, b } = await pair();
    const sa = new FramedPacketStream(a, 1 << 20);
    const sb = new FramedPacketStream(b, 1 << 20);
    const atB = frameKinds(b);
    sa.sendHello({});
    sb.sendHello({});
    return { b, sa, sb, atB };
  }

  it('whenIdle: pings no peer that pings on its own, and answers it', async () => {
    const { sa, sb, atB } = await helloPair();
    sa.startKeepalive(100, 100, { whenIdle: true });
    sb.startKeepalive(40, 200);
    // Twelve answers to b's pings: a's 100 ms period went by four times.
    await until(() => atB.filter((k) => k === PONG).length >= 12 || sa.isClosed);
    expect(atB.filter((k) => k === PONG).length).toBeGreaterThanOrEqual(12);
    expect(atB.filter((k) => k === PING)).toEqual([]);
    expect(sa.isClosed).toBe(false);
  });

  it('whenIdle: pings a quiet peer before its deadline, and fails one that stops answering', async () => {
    const { b, sa, sb, atB } = await helloPair();
    // b never pings (as a peer with a longer period than a's deadline): a pings it once quiet for 50 ms.
    sa.startKeepalive(50, 100, { whenIdle: true });
    await until(() => atB.filter((k) => k === PING).length >= 6 || sa.isClosed);
    expect(atB.filter((k) => k === PING).length).toBeGreaterThanOrEqual(6);
    expect(sa.isClosed).toBe(false);
    b.pause();
    sb.pause();
    const [err] = (await once(sa, 'error')) as [Error];
    expect(err.message).toMatch(/did not answer keepalive/);
  });

  it('stops delivering packets while paused, and resumes in order', async () => {
    const { a, b } = await pair();
    const sa = new FramedPacketStream(a, 1 << 20);
    const sb = new FramedPacketStream(b, 1 << 20);
    sa.sendHello({});
    const got: number[] = [];
    sb.on('data', (p: Packet) => {
      if (p.type === PacketType.CLOSE_REQ) {
        got.push(p.closeRequest.connectID);
        if (p.closeRequest.connectID === 2) sb.pause();
      }
    });
    for (let i = 1; i <= 5; i++) sa.write(packets.closeRequest(i));
    // Every byte a wrote has reached b: packets 3 to 5 are there, not delivered.
    await until(() => got.length >= 2 && a.writableLength === 0 && b.bytesRead === a.bytesWritten);
    expect(got).toEqual([1, 2]);
    sb.resume();
    await until(() => got.length === 5);
    expect(got).toEqual([1, 2, 3, 4, 5]);
  });
});

describe('refusal hello', () => {
  it('carries a typed code across the wire, and the message reads CODE: text', async () => {
    const { a, b } = await pair();
    const sender = new FramedPacketStream(a, 1 << 20);
    const receiver = new FramedPacketStream(b, 1 << 20);
    const got = once(receiver, 'hello') as Promise<[Hello]>;
    sender.sendHello(refusalHello('ALREADY_EXISTS', 'agent already holds a stream to server s1'));
    const [hello] = await got;
    const refused = refusalOf(hello);
    expect(refused).toBeInstanceOf(MuxRefusedError);
    expect(refused?.code).toBe('ALREADY_EXISTS');
    expect(refused?.details).toBe('agent already holds a stream to server s1');
    expect(refused?.message).toBe('ALREADY_EXISTS: agent already holds a stream to server s1');
  });

  it('is null for a metadata hello, UNKNOWN for a code it does not know', () => {
    expect(refusalOf({ serverID: ['s1'] })).toBeNull();
    expect(refusalOf({ error: ['no'], code: ['TEAPOT'] })?.code).toBe('UNKNOWN');
    expect(refusalOf({ error: ['no'] })?.code).toBe('UNKNOWN');
  });
});
