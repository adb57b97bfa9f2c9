// Packets from fuzz bytes, and the codec's properties both directions, shared by the codec, mux and gRPC
// targets.
import { isDeepStrictEqual } from 'node:util';
import fc from 'fast-check';
import {
  PacketDecodeError,
  PacketType,
  decodeDataHeader,
  MAX_DATA_HEADER_BYTES,
  decodePacket,
  encodeDataHeader,
  encodePacket,
  encodePacketParts,
  type Packet,
} from '@cluster-proxy/proto';
import { check, checkBounded, checkOneLine, heldBytes, type FuzzTarget } from '../engine.js';

/** Reads fields from fuzz bytes; past the end every read is zero. */
class ByteSource {
  pos = 0;
  constructor(private readonly b: Buffer) {}
  byte(): number {
    return this.b[this.pos++] ?? 0;
  }
  /** A number spread over magnitudes: 0, small, around 2^31, up to 2^53 - 1. */
  id(): number {
    const k = this.byte() % 6;
    if (k === 0) return 0;
    if (k === 1) return this.byte();
    if (k === 2) return this.byte() * 256 + this.byte();
    if (k === 3) return 0x7fffffff + this.byte() - 128;
    if (k === 4) return Number.MAX_SAFE_INTEGER - this.byte();
    return ((this.byte() << 24) >>> 0) + (this.byte() << 16) + (this.byte() << 8) + this.byte();
  }
  int64(): bigint {
    let v = 0n;
    for (let i = 0; i < 8; i++) v = (v << 8n) | BigInt(this.byte());
    return BigInt.asIntN(64, v >> BigInt(this.byte() % 64));
  }
  bytes(): Buffer {
    const n = this.byte();
    const out = Buffer.from(this.b.subarray(this.pos, this.pos + n));
    this.pos += n;
    return out;
  }
  string(): string {
    return this.bytes().toString('utf8'); // invalid UTF-8 becomes U+FFFD, which encodes back as it decodes
  }
}

const TYPES = [
  PacketType.DIAL_REQ,
  PacketType.DIAL_RSP,
  PacketType.CLOSE_REQ,
  PacketType.CLOSE_RSP,
  PacketType.DATA,
  PacketType.DIAL_CLS,
  PacketType.DRAIN,
  PacketType.CREDIT,
  PacketType.HALF_CLOSE,
];

/** A packet of any type (ANP's and our extensions: CREDIT, HALF_CLOSE, DialResponse.reason) chosen by `input`. */
export function packetFrom(input: Buffer): Packet {
  const s = new ByteSource(input);
  const type = TYPES[s.byte() % TYPES.length]!;
  switch (type) {
    case PacketType.DIAL_REQ:
      return { type, dialRequest: { protocol: s.string(), address: s.string(), random: s.int64() } };
    case PacketType.DIAL_RSP:
      return { type, dialResponse: { error: s.string(), connectID: s.id(), random: s.int64(), reason: s.string() } };
    case PacketType.CLOSE_REQ:
      return { type, closeRequest: { connectID: s.id() } };
    case PacketType.CLOSE_RSP:
      return { type, closeResponse: { error: s.string(), connectID: s.id() } };
    case PacketType.DATA:
      return { type, data: { connectID: s.id(), error: s.byte() % 4 === 0 ? s.string() : '', data: s.bytes() } };
    case PacketType.DIAL_CLS:
      return { type, closeDial: { random: s.int64() } };
    case PacketType.DRAIN:
      return { type };
    case PacketType.CREDIT:
      return { type, credit: { connectID: s.id(), bytes: s.id() } };
    case PacketType.HALF_CLOSE:
      return { type, halfClose: { connectID: s.id() } };
  }
}

/** Several packets from one input (for streams of frames). */
export function packetsFrom(input: Buffer, max = 8): Packet[] {
  const out: Packet[] = [];
  let rest = input;
  while (rest.length > 0 && out.length < max) {
    const n = 1 + (rest[0]! % 64);
    out.push(packetFrom(rest.subarray(1, 1 + n)));
    rest = rest.subarray(1 + n);
  }
  return out;
}

export function samePacket(a: Packet, b: Packet): boolean {
  return isDeepStrictEqual(JSON.parse(JSON.stringify(a, jsonSafe)), JSON.parse(JSON.stringify(b, jsonSafe)));
}

function jsonSafe(_k: string, v: unknown): unknown {
  if (typeof v === 'bigint') return `${v}n`;
  if (v && typeof v === 'object' && (v as { type?: string }).type === 'Buffer')
    return Buffer.from((v as { data: number[] }).data).toString('hex');
  return v;
}

/** The encoder's properties for `p`: parts agree with the whole, decoding gives `p` back, re-encoding the same bytes. */
export function checkEncodes(p: Packet, where: string): Buffer {
  const bytes = encodePacket(p);
  const parts = encodePacketParts(p);
  check(Buffer.concat(parts).equals(bytes), `${where}: encodePacketParts differs from encodePacket`);
  const back = decodePacket(bytes);
  check(samePacket(back, p), `${where}: decode(encode(p)) is not p`);
  check(encodePacket(back).equals(bytes), `${where}: re-encoding a decoded packet changed its bytes`);
  if (p.type === PacketType.DATA && p.data.error === '' && p.data.data.length > 0) {
    const header = decodeDataHeader(bytes.subarray(0, Math.min(bytes.length, MAX_DATA_HEADER_BYTES)), bytes.length);
    check(header !== null, `${where}: decodeDataHeader did not read our own DATA layout`);
    check(header.connectID === p.data.connectID, `${where}: decodeDataHeader read another connectID`);
    check(
      encodeDataHeader(p.data.connectID, p.data.data.length).equals(bytes.subarray(0, header.headerLength)),
      `${where}: header length disagrees with encodeDataHeader`,
    );
  }
  return bytes;
}

/** The decoder's properties for untrusted `bytes`: a one-line PacketDecodeError, or a packet that re-encodes to a fixpoint. */
export function checkDecodes(bytes: Buffer, where: string): Packet | null {
  let p: Packet;
  try {
    p = decodePacket(bytes);
  } catch (err) {
    check(err instanceof PacketDecodeError, `${where}: decodePacket threw ${(err as Error)?.name}: ${(err as Error)?.message}`);
    checkOneLine(err.message, where);
    return null;
  }
  checkBounded(heldBytes(p), bytes.length, where);
  // Canonical form: what we send for it. It must decode to the same packet and be a fixpoint.
  const canonical = encodePacket(p);
  check(samePacket(decodePacket(canonical), p), `${where}: the canonical encoding of a decoded packet decodes differently`);
  // Invalid UTF-8 in a string field decodes to U+FFFD (three bytes) per bad byte: at most threefold.
  check(
    canonical.length <= 3 * bytes.length + 16,
    `${where}: the canonical form is ${canonical.length} bytes for a ${bytes.length}-byte input`,
  );
  // decodeDataHeader may read a prefix of this message only if it agrees with the full decoder.
  const header = decodeDataHeader(bytes.subarray(0, MAX_DATA_HEADER_BYTES), bytes.length);
  if (header !== null) {
    check(p.type === PacketType.DATA, `${where}: decodeDataHeader read a ${p.type} packet as DATA`);
    check(p.data.connectID === header.connectID, `${where}: decodeDataHeader and decodePacket disagree on connectID`);
    check(p.data.data.equals(bytes.subarray(header.headerLength)), `${where}: decodeDataHeader and decodePacket disagree on the payload`);
  }
  return p;
}

export const packetGenerator: fc.Arbitrary<Buffer> = fc.uint8Array({ maxLength: 300 }).map((a) => encodePacket(packetFrom(Buffer.from(a))));

export const packetCodecTarget: FuzzTarget = {
  name: 'packet-codec',
  about:
    "decodePacket on untrusted bytes (one-line PacketDecodeError or a packet whose canonical form is a fixpoint); encodePacket of every packet type, ANP's and our extensions (decodes back, same bytes, parts agree, DATA header agrees)",
  generate: packetGenerator,
  run(input) {
    checkDecodes(input, 'decode');
    checkEncodes(packetFrom(input), 'encode');
  },
};
