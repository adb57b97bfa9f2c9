import { describe, expect, it } from 'vitest';
import * as protoLoader from '@grpc/proto-loader';
import {
  decodeDataHeader,
  decodePacket,
  encodeDataHeader,
  encodePacket,
  encodePacketParts,
  MAX_DATA_HEADER_BYTES,
  PacketDecodeError,
} from './codec.js';
import { PacketType, packets, type Packet } from './packet.js';
import { PROTO_DIR } from '../index.js';
import { AGENT_CONNECT_PATH, PROXY_PATH } from './services.js';

// protobufjs (through proto-loader) is the reference implementation of the .proto files.
const def = protoLoader.loadSync(['client.proto', 'agent.proto'], {
  includeDirs: [PROTO_DIR],
  longs: String,
  enums: Number,
  defaults: true,
  oneofs: true,
});
const proxy = (def['ProxyService'] as Record<string, protoLoader.MethodDefinition<object, object>>)['Proxy']!;
const agent = (def['AgentService'] as Record<string, protoLoader.MethodDefinition<object, object>>)['Connect']!;
const refEncode = (o: object): Buffer => proxy.requestSerialize(o);
const refDecode = (b: Buffer): Record<string, unknown> => proxy.requestDeserialize(b) as Record<string, unknown>;

const big = 0x7fff_ffff_ffff_fff0n;
const samples: Packet[] = [
  packets.dialRequest('cluster1:443', big),
  packets.dialRequest('[::1]:8443', 1n),
  packets.dialResponse(big, 7),
  packets.dialResponse(5n, 0, 'dial tcp 127.0.0.1:1: connect: connection refused', 'endpoint'),
  packets.closeRequest(9),
  packets.closeResponse(9, 'Unknown connectID'),
  packets.data(3, Buffer.from('hello world')),
  packets.data(Number.MAX_SAFE_INTEGER, Buffer.alloc(70_000, 7)),
  packets.closeDial(-5n),
  packets.drain(),
  packets.credit(4, 1 << 20),
  packets.halfClose(12),
];

function toReference(p: Packet): Record<string, unknown> {
  const r = refDecode(encodePacket(p));
  return r;
}

describe('packet codec', () => {
  it('uses the ANP method paths', () => {
    expect(proxy.path).toBe(PROXY_PATH);
    expect(agent.path).toBe(AGENT_CONNECT_PATH);
  });

  it.each(samples.map((p) => [PacketType[p.type], p] as const))('%s round-trips through protobufjs', (_name, p) => {
    const ref = toReference(p);
    expect(ref['type']).toBe(p.type);
    // Re-encode with protobufjs and decode with ours: same packet.
    const back = decodePacket(refEncode(ref));
    expect(back).toEqual(p);
    expect(decodePacket(encodePacket(p))).toEqual(p);
  });

  it('decodes fields exactly as protobufjs reads them', () => {
    const ref = toReference(packets.dialResponse(big, 42, 'boom', 'timeout'));
    expect(ref['dialResponse']).toMatchObject({ error: 'boom', connectID: '42', random: big.toString(), reason: 'timeout' });
    const data = toReference(packets.data(3, Buffer.from('abc')));
    expect(Buffer.from((data['data'] as { data: Uint8Array }).data).toString()).toBe('abc');
  });

  it('keeps DATA payloads as views into the message buffer (no copy)', () => {
    const wire = encodePacket(packets.data(1, Buffer.alloc(1000, 1)));
    const p = decodePacket(wire);
    if (p.type !== PacketType.DATA) throw new Error('not data');
    expect(p.data.data.buffer).toBe(wire.buffer);
  });

  it('reads a missing payload as defaults, like Go getters', () => {
    const p = decodePacket(refEncode({ type: PacketType.CLOSE_REQ }));
    expect(p).toEqual({ type: PacketType.CLOSE_REQ, closeRequest: { connectID: 0 } });
  });

  it('skips unknown fields', () => {
    const wire = Buffer.concat([encodePacket(packets.closeRequest(5)), Buffer.from([0xf8, 0x07, 0x01])]); // field 127 varint 1
    expect(decodePacket(wire)).toEqual(packets.closeRequest(5));
  });

  it.each([
    ['truncated varint', Buffer.from([0x08, 0x80])],
    ['length past the end', Buffer.from([0x22, 0x10, 0x08])],
    ['unknown packet type', Buffer.from([0x08, 0x2a])],
    ['wrong wire type', Buffer.from([0x0a, 0x00])],
    ['connectID out of range', Buffer.from([0x08, 0x02, 0x2a, 0x0b, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f])],
  ])('rejects %s', (_name, wire) => {
    expect(() => decodePacket(wire)).toThrow(PacketDecodeError);
  });
});

describe('DATA headers (a framed transport passes payloads on as the chunks they arrived in)', () => {
  it.each([0, 1, 300, Number.MAX_SAFE_INTEGER])('reads where the payload starts, connectID %d', (connectID) => {
    for (const size of [1, 127, 128, 70_000, 4 * 1024 * 1024]) {
      const [header, payload] = encodePacketParts(packets.data(connectID, Buffer.alloc(size, 5)));
      expect(header!.equals(encodeDataHeader(connectID, size))).toBe(true);
      expect(header!.length).toBeLessThanOrEqual(MAX_DATA_HEADER_BYTES);
      const length = header!.length + payload!.length;
      // Only the first bytes are looked at; what follows the header may belong to a later frame.
      const prefix = Buffer.concat([header!, payload!.subarray(0, 8)]);
      expect(decodeDataHeader(prefix, length)).toEqual({ connectID, headerLength: header!.length });
    }
  });

  it('agrees with decodePacket and protobufjs on the bytes it reads', () => {
    const wire = Buffer.concat(encodePacketParts(packets.data(42, Buffer.from('payload'))));
    const h = decodeDataHeader(wire, wire.length)!;
    expect(wire.subarray(h.headerLength).toString()).toBe('payload');
    expect(decodePacket(wire)).toEqual(packets.data(42, Buffer.from('payload')));
    expect(toReference(packets.data(42, Buffer.from('payload')))['data']).toMatchObject({ connectID: '42' });
  });

  it('reads the layout protobufjs writes, an empty error before the payload', () => {
    for (const connectID of [0, 7, Number.MAX_SAFE_INTEGER]) {
      const wire = refEncode({ type: PacketType.DATA, data: { connectID: String(connectID), error: '', data: Buffer.from('payload') } });
      const h = decodeDataHeader(wire.subarray(0, MAX_DATA_HEADER_BYTES), wire.length);
      expect(h).not.toBeNull();
      expect(h!.connectID).toBe(connectID);
      expect(wire.subarray(h!.headerLength).toString()).toBe('payload');
      expect(decodePacket(wire)).toEqual(packets.data(connectID, Buffer.from('payload')));
    }
  });

  it.each([
    ['another packet type', encodePacket(packets.credit(3, 1024))],
    [
      'an error that is not empty, from protobufjs',
      refEncode({ type: PacketType.DATA, data: { connectID: '3', error: 'x', data: Buffer.from('y') } }),
    ],
    ['DATA with an error', encodePacket({ type: PacketType.DATA, data: { connectID: 3, error: 'boom', data: Buffer.from('x') } })],
    ['DATA with no payload', encodePacket(packets.data(3, Buffer.alloc(0)))],
    ['a truncated header', Buffer.from([0x08, 0x04, 0x22, 0x85])],
    [
      'connectID out of range',
      Buffer.from([0x08, 0x04, 0x22, 0x0d, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x1a, 0x01, 0x00]),
    ],
  ])('leaves %s to decodePacket (null)', (_name, wire) => {
    expect(decodeDataHeader(wire, wire.length)).toBeNull();
  });

  it('returns null when the lengths inside disagree with the frame', () => {
    const wire = Buffer.concat(encodePacketParts(packets.data(3, Buffer.alloc(100))));
    expect(decodeDataHeader(wire, wire.length + 1)).toBeNull();
    expect(decodeDataHeader(wire, wire.length - 1)).toBeNull();
  });

  it('fields in another order (a peer encoding its own way) are not read as a header', () => {
    // Data with the payload before connectID: valid protobuf, decodePacket reads it.
    const wire = Buffer.from([0x08, 0x04, 0x22, 0x05, 0x1a, 0x01, 0x41, 0x08, 0x07]);
    expect(decodeDataHeader(wire, wire.length)).toBeNull();
    expect(decodePacket(wire)).toEqual(packets.data(7, Buffer.from('A')));
  });
});
