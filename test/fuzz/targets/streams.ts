// The two framings a peer's bytes arrive in: our mux frames (FramedPacketStream) and gRPC messages
// (GrpcMessageReader). Each input is read whole and cut into chunks at points it chooses, with the
// zero-copy DATA path on and off: every way must give the same hellos, packets and error, and end.
import fc from 'fast-check';
import {
  DataViews,
  FrameError,
  FramedPacketStream,
  GrpcFramingError,
  GrpcMessageReader,
  PacketType,
  encodePacket,
  packets,
  type Packet,
} from '@cluster-proxy/proto';
import { check, checkBounded, checkOneLine, chunksOf, memorySocket, within, type FuzzTarget } from '../engine.js';
import { packetFrom, packetsFrom, samePacket } from './packets.js';

/** Small limits, so that inputs reach them. */
const MAX_FRAME = 4096;
const MAX_MESSAGE = 4096;

function frame(kind: number, body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32BE(body.length + 1, 0);
  head[4] = kind;
  return Buffer.concat([head, body]);
}

function normalized(p: Packet): string {
  return JSON.stringify(p, (_k, v: unknown) =>
    typeof v === 'bigint'
      ? `${v}n`
      : v && typeof v === 'object' && (v as { type?: string }).type === 'Buffer'
        ? Buffer.from((v as { data: number[] }).data).toString('hex')
        : v,
  );
}

interface MuxRun {
  events: string[];
  written: number;
}

/** Feeds `chunks` to a FramedPacketStream on an in-memory socket; resolves once it closed. */
async function readMux(chunks: readonly Buffer[], views: boolean, inputBytes: number): Promise<MuxRun> {
  const { socket, written } = memorySocket();
  const stream = new FramedPacketStream(socket, MAX_FRAME);
  const events: string[] = [];
  const closed = new Promise<void>((resolve) => stream.once('close', resolve));
  stream.on('hello', (h: unknown) => events.push(`hello ${JSON.stringify(h)}`));
  stream.on('data', (p: Packet) => {
    events.push(`packet ${normalized(p)}`);
    const held = stream['received'].length;
    checkBounded(held, inputBytes, 'mux: bytes held');
  });
  if (views)
    stream.onDataViews((connectID, cs, length) => {
      check(cs.reduce((n, c) => n + c.length, 0) === length, 'mux: DataViews length is not the sum of its chunks');
      check(length > 0, 'mux: an empty DATA payload came as views');
      events.push(`packet ${normalized(packets.data(connectID, Buffer.concat(cs, length)))}`);
    });
  stream.on('error', (err: Error) => {
    check(err instanceof FrameError, `mux: 'error' with ${err.name}: ${err.message}`);
    checkOneLine(err.message, 'mux error');
    events.push(`error ${err.message}`);
  });
  // The peer's end: the socket closes after it (as a net.Socket without allowHalfOpen does).
  stream.on('end', () => socket.destroy());
  for (const c of chunks) socket.push(c);
  socket.push(null);
  await within(closed, 2000, 'mux: the stream did not close after its input ended');
  check(stream.isClosed, 'mux: closed but isClosed is false');
  return { events, written: written() };
}

const helloArb = fc.dictionary(
  fc.constantFrom('agentID', 'identifiers', 'capabilities', 'serverID', 'error', 'x'),
  fc.array(fc.string({ maxLength: 12 }), { maxLength: 3 }),
  { maxKeys: 4 },
);

export const muxFramesTarget: FuzzTarget = {
  name: 'mux-frames',
  about:
    'FramedPacketStream (hello, PACKET, PING/PONG) on untrusted bytes: same hellos, packets and one-line FrameError however the bytes are chunked and with zero-copy DATA on or off; always closes; held bytes and PONG bytes bounded',
  generate: fc
    .tuple(helloArb, fc.array(fc.oneof(fc.uint8Array({ maxLength: 80 }), fc.constant(null)), { maxLength: 8 }))
    .map(([hello, items]) =>
      Buffer.concat([
        frame(0, Buffer.from(JSON.stringify(hello))),
        ...items.map((it) => (it === null ? frame(2, Buffer.alloc(0)) : frame(1, encodePacket(packetFrom(Buffer.from(it)))))),
      ]),
    ),
  async run(input) {
    const whole = await readMux([input], false, input.length);
    const cut = await readMux(chunksOf(input, 7), true, input.length);
    const bytewise =
      input.length <= 256
        ? await readMux(
            chunksOf(input, 0).flatMap((c) => [...c].map((b) => Buffer.from([b]))),
            true,
            input.length,
          )
        : cut;
    for (const other of [cut, bytewise]) {
      check(
        other.events.length === whole.events.length && other.events.every((e, i) => e === whole.events[i]),
        `mux: chunking or zero-copy DATA changed what was read:\n${whole.events.join('\n')}\n---\n${other.events.join('\n')}`,
      );
    }
    // A PONG (5 bytes) per PING (5 bytes), nothing else is written back.
    check(whole.written <= input.length, `mux: wrote back ${whole.written} bytes for a ${input.length}-byte input`);
  },
};

interface GrpcRun {
  out: string[];
  error?: string;
  pending: number;
}

function readGrpc(chunks: readonly Buffer[], views: boolean, inputBytes: number): GrpcRun {
  const reader = new GrpcMessageReader(MAX_MESSAGE);
  reader.views = views;
  const out: string[] = [];
  for (const c of chunks) {
    const got: (Packet | DataViews)[] = [];
    try {
      reader.push(c, got);
    } catch (err) {
      check(err instanceof GrpcFramingError, `grpc: push threw ${(err as Error)?.name}: ${(err as Error)?.message}`);
      checkOneLine(err.message, 'grpc error');
      for (const m of got) out.push(describeMessage(m));
      return { out, error: `${err.code} ${err.message}`, pending: reader.pending };
    }
    for (const m of got) out.push(describeMessage(m));
    checkBounded(reader.pending, inputBytes, 'grpc: bytes held');
    check(reader.pending < 5 + MAX_MESSAGE + c.length, `grpc: holds ${reader.pending} bytes, more than one message and a chunk`);
  }
  return { out, pending: reader.pending };
}

function describeMessage(m: Packet | DataViews): string {
  if (m instanceof DataViews) {
    check(m.chunks.reduce((n, c) => n + c.length, 0) === m.length, 'grpc: DataViews length is not the sum of its chunks');
    return normalized(packets.data(m.connectID, Buffer.concat(m.chunks as Buffer[], m.length)));
  }
  check(m.type !== PacketType.DATA || samePacket(m, m), 'grpc: unreachable');
  return normalized(m);
}

function grpcMessage(body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32BE(body.length, 1);
  return Buffer.concat([head, body]);
}

export const grpcMessagesTarget: FuzzTarget = {
  name: 'grpc-messages',
  about:
    'GrpcMessageReader on untrusted bytes: same packets and one-line GrpcFramingError however chunked and with DataViews on or off; held bytes within one message plus a chunk',
  generate: fc
    .array(fc.uint8Array({ maxLength: 120 }), { maxLength: 8 })
    .map((items) =>
      Buffer.concat(packetsFrom(Buffer.concat(items.map((i) => Buffer.from(i))), 8).map((p) => grpcMessage(encodePacket(p)))),
    ),
  run(input) {
    const whole = readGrpc([input], false, input.length);
    for (const [chunks, views] of [
      [chunksOf(input, 3), true],
      [chunksOf(input, 11), false],
    ] as const) {
      const other = readGrpc(chunks, views, input.length);
      // A message the whole read refused may come out of a chunked read's earlier pushes only up to the error.
      check(other.error === whole.error, `grpc: chunking changed the error: ${whole.error} vs ${other.error}`);
      check(
        other.out.length === whole.out.length && other.out.every((e, i) => e === whole.out[i]),
        'grpc: chunking or DataViews changed the packets read',
      );
      if (!whole.error) check(other.pending === whole.pending, 'grpc: chunking changed the bytes left pending');
    }
  },
};
