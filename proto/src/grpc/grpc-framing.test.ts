import { PassThrough } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { DataViews, encodePacket } from '../wire/codec.js';
import { GrpcFramingError, GrpcMessageReader, writeGrpcData, writeGrpcMessage } from './grpc-framing.js';
import { PacketType, packets, type Packet } from '../wire/packet.js';

/** The bytes writeGrpcMessage / writeGrpcData put on a stream. */
function written(write: (s: PassThrough) => void): Buffer {
  const s = new PassThrough();
  write(s);
  s.end();
  const out: Buffer[] = [];
  for (let c: Buffer | null; (c = s.read() as Buffer | null) !== null; ) out.push(c);
  return Buffer.concat(out);
}

/** `bytes` cut into pieces of `size`, as HTTP/2 frames would hand them over. */
function pieces(bytes: Buffer, size: number): Buffer[] {
  const out: Buffer[] = [];
  for (let i = 0; i < bytes.length; i += size) out.push(Buffer.from(bytes.subarray(i, i + size)));
  return out;
}

describe('GrpcMessageReader', () => {
  const payload = Buffer.alloc(100_000);
  for (let i = 0; i < payload.length; i++) payload[i] = i % 251;
  const stream = Buffer.concat([
    written((s) => writeGrpcMessage(s, packets.dialResponse(5n, 3))),
    written((s) => writeGrpcMessage(s, packets.data(3, payload))),
    written((s) => writeGrpcData(s, 3, [Buffer.from('one '), Buffer.from('more')], 8)),
  ]);

  it('without views: every message a Packet, however the bytes were cut', () => {
    const reader = new GrpcMessageReader(1 << 20);
    const out: (Packet | DataViews)[] = [];
    for (const c of pieces(stream, 16_384)) reader.push(c, out);
    expect(out).toEqual([packets.dialResponse(5n, 3), packets.data(3, payload), packets.data(3, Buffer.from('one more'))]);
  });

  it('with views: DATA as views of the chunks it arrived in (no copy), in order; other packets as before', () => {
    const reader = new GrpcMessageReader(1 << 20);
    reader.views = true;
    const out: (Packet | DataViews)[] = [];
    const chunks = pieces(stream, 16_384);
    for (const c of chunks) reader.push(c, out);
    expect(out[0]).toEqual(packets.dialResponse(5n, 3));
    const data = out[1] as DataViews;
    expect(data).toBeInstanceOf(DataViews);
    expect([data.connectID, data.length]).toEqual([3, payload.length]);
    expect(Buffer.concat(data.chunks).equals(payload)).toBe(true);
    const backing = new Set(chunks.map((c) => c.buffer));
    for (const c of data.chunks) expect(backing.has(c.buffer)).toBe(true);
    expect(Buffer.concat((out[2] as DataViews).chunks).toString()).toBe('one more');
    expect(reader.pending).toBe(0);
  });

  it('with views: a DATA laid out another way (payload before connectID) is still read, as a Packet', () => {
    const body = Buffer.from([0x08, 0x04, 0x22, 0x05, 0x1a, 0x01, 0x41, 0x08, 0x07]);
    const head = Buffer.from([0, 0, 0, 0, body.length]);
    const reader = new GrpcMessageReader(1 << 20);
    reader.views = true;
    const out: (Packet | DataViews)[] = [];
    reader.push(Buffer.concat([head, body]), out);
    expect(out).toEqual([packets.data(7, Buffer.from('A'))]);
  });

  it('with views: a malformed DATA message is refused as before', () => {
    const body = Buffer.from([0x08, 0x04, 0x22, 0x7f, 0x08]);
    const reader = new GrpcMessageReader(1 << 20);
    reader.views = true;
    expect(() => reader.push(Buffer.concat([Buffer.from([0, 0, 0, 0, body.length]), body]), [])).toThrow(GrpcFramingError);
  });

  it('writeGrpcData writes what writeGrpcMessage writes for the same DATA', () => {
    const a = written((s) => writeGrpcData(s, 9, [Buffer.from('ab'), Buffer.from('cd')], 4));
    const b = written((s) => writeGrpcMessage(s, packets.data(9, Buffer.from('abcd'))));
    expect(a.equals(b)).toBe(true);
    expect(
      a.subarray(5).equals(encodePacket({ type: PacketType.DATA, data: { connectID: 9, error: '', data: Buffer.from('abcd') } })),
    ).toBe(true);
  });
});
