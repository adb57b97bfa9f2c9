// The hub's HTTP/2 (proto's h2/): what a gRPC client's bytes meet first. HPACK on its own, and the whole
// server session on an in-memory socket, read whole and cut into chunks: the same streams, bytes and
// connection error either way; what it writes back bounded by what came in; it always ends.
import fc from 'fast-check';
import {
  CLIENT_PREFACE,
  FrameType,
  Flags,
  H2Session,
  HpackDecoder,
  HpackError,
  encodeHeaderBlock,
  frame,
  settingsPayload,
  u32,
  type H2Headers,
  type H2Stream,
  type HeaderField,
} from '@cluster-proxy/proto';
import { check, checkBounded, checkOneLine, chunksOf, memorySocket, within, type FuzzTarget } from '../engine.js';

/** The decoder's header list limit here: small, so that inputs reach it. */
const MAX_LIST = 4096;

const fieldArb: fc.Arbitrary<HeaderField> = fc.tuple(
  fc.oneof(
    fc.constantFrom(':method', ':path', ':scheme', ':authority', 'content-type', 'te', 'grpc-timeout', 'x-a'),
    fc.string({ maxLength: 8 }),
  ),
  fc.oneof(fc.constantFrom('POST', '/ProxyService/Proxy', 'https', 'application/grpc', 'trailers', '5S'), fc.string({ maxLength: 20 })),
);

/** A header block of plain literals (names and values as UTF-8 bytes), unchecked: what any peer may send, valid or not (our encoder refuses what HTTP/2 forbids). */
function literalBlock(fields: readonly HeaderField[]): Buffer {
  return Buffer.concat(
    fields.map(([n, v]) => {
      const name = Buffer.from(n).subarray(0, 126);
      const value = Buffer.from(v).subarray(0, 126);
      return Buffer.concat([Buffer.from([0x00, name.length]), name, Buffer.from([value.length]), value]);
    }),
  );
}

/** Splits `input` into header blocks at lengths its own first bytes give. */
function blocksOf(input: Buffer): Buffer[] {
  const out: Buffer[] = [];
  let at = 0;
  while (at < input.length) {
    const n = input[at]!;
    out.push(input.subarray(at + 1, at + 1 + n));
    at += 1 + n;
  }
  return out;
}

export const hpackTarget: FuzzTarget = {
  name: 'hpack',
  about:
    'HpackDecoder on untrusted header blocks (one decoder across several blocks, as a connection keeps it): decodes or throws a one-line HpackError; a decoded list stays within its limit and, if HTTP/2 allows its fields, encoded again decodes to the same fields',
  generate: fc.array(fc.array(fieldArb, { maxLength: 6 }), { maxLength: 4 }).map((lists) =>
    Buffer.concat(
      lists.map((fields) => {
        const block = literalBlock(fields);
        return Buffer.concat([Buffer.from([Math.min(255, block.length)]), block.subarray(0, 255)]);
      }),
    ),
  ),
  run(input) {
    const decoder = new HpackDecoder(256, MAX_LIST);
    for (const block of blocksOf(input)) {
      let decoded: { fields: HeaderField[]; tooLarge: boolean };
      try {
        decoded = decoder.decode(block);
      } catch (err) {
        check(err instanceof HpackError, `hpack: decode threw ${(err as Error)?.name}: ${(err as Error)?.message}`);
        checkOneLine(err.message, 'hpack error');
        return; // the connection would end here
      }
      let bytes = 0;
      for (const [n, v] of decoded.fields) bytes += n.length + v.length + 32;
      check(bytes <= MAX_LIST, `hpack: a list of ${bytes} bytes passed the ${MAX_LIST}-byte limit`);
      checkBounded(bytes, input.length, 'hpack: bytes decoded');
      let encoded: Buffer;
      try {
        encoded = encodeHeaderBlock(decoded.fields);
      } catch (err) {
        // Fields HTTP/2 forbids (an upper-case name, a line break in a value): decoded, but never sent by us.
        check(err instanceof TypeError, `hpack: encode threw ${(err as Error)?.name}`);
        continue;
      }
      const again = new HpackDecoder(256, 1 << 20).decode(encoded).fields;
      check(
        again.length === decoded.fields.length && again.every(([n, v], i) => n === decoded.fields[i]![0] && v === decoded.fields[i]![1]),
        'hpack: encoding a decoded list again did not decode to the same fields',
      );
    }
  },
};

interface SessionRun {
  events: string[];
  written: number;
}

/** Feeds the preface and `chunks` to an H2Session on an in-memory socket; each stream answers and echoes. Resolves once it closed. */
async function runSession(chunks: readonly Buffer[], inputBytes: number): Promise<SessionRun> {
  const { socket, written } = memorySocket();
  const session = new H2Session(socket, {
    streamWindow: 4096,
    connectionWindow: 8192,
    maxConcurrentStreams: 4,
    maxHeaderListBytes: MAX_LIST,
  });
  const events: string[] = [];
  const closed = new Promise<void>((resolve) => session.once('close', resolve));
  session.on('protocolError', (err: Error & { code: number }) => {
    checkOneLine(err.message, 'h2 connection error');
    events.push(`goaway ${err.code}`);
  });
  session.on('stream', (stream: H2Stream, headers: H2Headers) => {
    events.push(`stream ${stream.id} ${JSON.stringify(headers)}`);
    stream.respond(encodeHeaderBlock([[':status', '200']]), false);
    stream.handler = {
      onStreamData: (d) => {
        events.push(`data ${stream.id} ${d.toString('hex')}`);
        stream.write([Buffer.from(d)], d.length);
        checkBounded(stream.readableLength + stream.writableLength, inputBytes, 'h2: stream bytes held');
      },
      onStreamEnd: () => {
        events.push(`end ${stream.id}`);
        stream.sendTrailers(encodeHeaderBlock([['grpc-status', '0']]));
      },
      onStreamDrain: () => {},
      onStreamTrailersSent: () => {},
      onStreamClose: () => events.push(`close ${stream.id} ${stream.rstCode ?? '-'} ${stream.resetByPeer}`),
    };
  });
  socket.push(CLIENT_PREFACE);
  for (const c of chunks) socket.push(c);
  socket.push(null);
  await within(closed, 2000, 'h2: the session did not close after its input ended');
  check(session.destroyed, 'h2: closed but not destroyed');
  check(session.streamCount === 0, `h2: ${session.streamCount} streams left after close`);
  return { events: mergeData(events), written: written() };
}

/** Joins consecutive body events of a stream: how a DATA payload is cut into chunks is the socket's choice. */
function mergeData(events: readonly string[]): string[] {
  const out: string[] = [];
  for (const e of events) {
    const last = out[out.length - 1];
    const m = /^data (\d+) /.exec(e);
    if (m && last?.startsWith(`data ${m[1]} `)) out[out.length - 1] = last + e.slice(m[0].length);
    else out.push(e);
  }
  return out;
}

const requestFields: HeaderField[] = [
  [':method', 'POST'],
  [':scheme', 'https'],
  [':path', '/ProxyService/Proxy'],
  ['content-type', 'application/grpc'],
];

const frameArb: fc.Arbitrary<Buffer> = fc.oneof(
  fc
    .tuple(fc.integer({ min: 0, max: 7 }), fc.boolean())
    .map(([i, end]) =>
      frame(FrameType.HEADERS, Flags.END_HEADERS | (end ? Flags.END_STREAM : 0), 2 * i + 1, encodeHeaderBlock(requestFields)),
    ),
  fc
    .tuple(fc.integer({ min: 0, max: 7 }), fc.uint8Array({ maxLength: 64 }), fc.boolean())
    .map(([i, d, end]) => frame(FrameType.DATA, end ? Flags.END_STREAM : 0, 2 * i + 1, Buffer.from(d))),
  fc.integer({ min: 0, max: 7 }).map((i) => frame(FrameType.RST_STREAM, 0, 2 * i + 1, u32(8))),
  fc
    .tuple(fc.integer({ min: 0, max: 7 }), fc.integer({ min: 0, max: 70000 }))
    .map(([i, n]) => frame(FrameType.WINDOW_UPDATE, 0, i === 0 ? 0 : 2 * i - 1, u32(n))),
  fc.integer({ min: 0, max: 70000 }).map((n) => frame(FrameType.SETTINGS, 0, 0, settingsPayload([[4, n]]))),
  fc.constant(frame(FrameType.SETTINGS, Flags.ACK, 0)),
  fc.constant(frame(FrameType.PING, 0, 0, Buffer.alloc(8, 1))),
  fc.constant(frame(FrameType.GOAWAY, 0, 0, Buffer.alloc(8))),
);

export const h2SessionTarget: FuzzTarget = {
  name: 'h2-session',
  about:
    "H2Session (the hub's HTTP/2, server side) on untrusted frames after the preface: the same streams, bytes, resets and GOAWAY code however the bytes are chunked; connection errors one line; written bytes bounded by the input; always closes with no stream left",
  generate: fc
    .array(frameArb, { maxLength: 12 })
    .map((frames) => Buffer.concat([frame(FrameType.SETTINGS, 0, 0, settingsPayload([])), ...frames])),
  async run(input) {
    const whole = await runSession([input], input.length);
    const cut = await runSession(chunksOf(input, 5), input.length);
    check(
      cut.events.length === whole.events.length && cut.events.every((e, i) => e === whole.events[i]),
      `h2: chunking changed what the session did:\n${whole.events.join('\n')}\n---\n${cut.events.join('\n')}`,
    );
    // Our SETTINGS, WINDOW_UPDATE and GOAWAY (with its one-line reason), then at most a few answers per input byte.
    check(whole.written <= 4 * input.length + 512, `h2: wrote ${whole.written} bytes for a ${input.length}-byte input`);
  },
};
