// Hand-written protobuf codec for Packet. Our transports hand us one Buffer per message; decoding by hand
// lets DATA payloads stay zero-copy views into it and avoids protobufjs object churn on the hot
// path. codec.test.ts checks byte-for-byte agreement with protobufjs loading client.proto.
import { PacketType, type Packet } from './packet.js';

export class PacketDecodeError extends Error {
  override name = 'PacketDecodeError';
}

const WIRE_VARINT = 0;
const WIRE_I64 = 1;
const WIRE_LEN = 2;
const WIRE_I32 = 5;

const EMPTY: Buffer = Buffer.alloc(0);

// ---------------------------------------------------------------- decoding

class Reader {
  pos: number;
  constructor(
    readonly buf: Buffer,
    start: number,
    readonly end: number,
  ) {
    this.pos = start;
  }

  varint(): bigint {
    let result = 0n;
    let shift = 0n;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.end) throw new PacketDecodeError('truncated varint');
      const b = this.buf[this.pos++]!;
      result |= BigInt(b & 0x7f) << shift;
      if ((b & 0x80) === 0) return BigInt.asIntN(64, result);
      shift += 7n;
    }
    throw new PacketDecodeError('varint longer than 10 bytes');
  }

  /** Fast path for small non-negative varints (tags, lengths, connection IDs). */
  smallVarint(): number {
    let result = 0;
    let mul = 1;
    for (let i = 0; i < 8; i++) {
      if (this.pos >= this.end) throw new PacketDecodeError('truncated varint');
      const b = this.buf[this.pos++]!;
      result += (b & 0x7f) * mul;
      if ((b & 0x80) === 0) {
        if (result > Number.MAX_SAFE_INTEGER) throw new PacketDecodeError('integer out of range');
        return result;
      }
      mul *= 128;
    }
    throw new PacketDecodeError('integer out of range');
  }

  bytes(): Buffer {
    const len = this.smallVarint();
    if (len > this.end - this.pos) throw new PacketDecodeError('length-delimited field runs past the end of the message');
    const out = this.buf.subarray(this.pos, this.pos + len);
    this.pos += len;
    return out;
  }

  string(): string {
    const b = this.bytes();
    return b.toString('utf8');
  }

  skip(wire: number): void {
    switch (wire) {
      case WIRE_VARINT:
        this.varint();
        return;
      case WIRE_I64:
        this.advance(8);
        return;
      case WIRE_LEN:
        this.bytes();
        return;
      case WIRE_I32:
        this.advance(4);
        return;
      default:
        throw new PacketDecodeError(`unsupported wire type ${wire}`);
    }
  }

  private advance(n: number): void {
    if (this.pos + n > this.end) throw new PacketDecodeError('truncated fixed-width field');
    this.pos += n;
  }
}

function id(v: bigint): number {
  if (v < 0n || v > BigInt(Number.MAX_SAFE_INTEGER)) throw new PacketDecodeError(`connectID ${v} out of range`);
  return Number(v);
}

/** Iterates the fields of a sub-message; `on` returns false for fields it does not know. */
function fields(buf: Buffer, on: (field: number, wire: number, r: Reader) => boolean): void {
  const r = new Reader(buf, 0, buf.length);
  while (r.pos < r.end) {
    const tag = r.smallVarint();
    const field = Math.floor(tag / 8);
    const wire = tag & 7;
    if (field === 0) throw new PacketDecodeError('field number 0');
    if (!on(field, wire, r)) r.skip(wire);
  }
}

function expectWire(actual: number, expected: number, what: string): void {
  if (actual !== expected) throw new PacketDecodeError(`${what} has wire type ${actual}, expected ${expected}`);
}

export function decodePacket(buf: Buffer): Packet {
  let type = 0;
  let payloadField = 0;
  let payload: Buffer = EMPTY;
  fields(buf, (field, wire, r) => {
    if (field === 1) {
      expectWire(wire, WIRE_VARINT, 'Packet.type');
      type = Number(r.varint());
      return true;
    }
    if ((field >= 2 && field <= 8) || field === 100 || field === 101) {
      expectWire(wire, WIRE_LEN, 'Packet payload');
      payloadField = field; // oneof: the last one on the wire wins
      payload = r.bytes();
      return true;
    }
    return false;
  });
  // Like ANP, the type decides which payload is read; a missing payload reads as its defaults.
  const own = (f: number): Buffer => (payloadField === f ? payload : EMPTY);
  switch (type) {
    case PacketType.DIAL_REQ: {
      const m = { protocol: '', address: '', random: 0n };
      fields(own(2), (f, w, r) => {
        if (f === 1) {
          expectWire(w, WIRE_LEN, 'DialRequest.protocol');
          m.protocol = r.string();
          return true;
        }
        if (f === 2) {
          expectWire(w, WIRE_LEN, 'DialRequest.address');
          m.address = r.string();
          return true;
        }
        if (f === 3) {
          expectWire(w, WIRE_VARINT, 'DialRequest.random');
          m.random = r.varint();
          return true;
        }
        return false;
      });
      return { type, dialRequest: m };
    }
    case PacketType.DIAL_RSP: {
      const m = { error: '', connectID: 0, random: 0n, reason: '' };
      fields(own(3), (f, w, r) => {
        if (f === 1) {
          expectWire(w, WIRE_LEN, 'DialResponse.error');
          m.error = r.string();
          return true;
        }
        if (f === 2) {
          expectWire(w, WIRE_VARINT, 'DialResponse.connectID');
          m.connectID = id(r.varint());
          return true;
        }
        if (f === 3) {
          expectWire(w, WIRE_VARINT, 'DialResponse.random');
          m.random = r.varint();
          return true;
        }
        if (f === 100) {
          expectWire(w, WIRE_LEN, 'DialResponse.reason');
          m.reason = r.string();
          return true;
        }
        return false;
      });
      return { type, dialResponse: m };
    }
    case PacketType.CLOSE_REQ:
    case PacketType.HALF_CLOSE: {
      const m = { connectID: 0 };
      fields(own(type === PacketType.CLOSE_REQ ? 5 : 101), (f, w, r) => {
        if (f === 1) {
          expectWire(w, WIRE_VARINT, 'connectID');
          m.connectID = id(r.varint());
          return true;
        }
        return false;
      });
      return type === PacketType.CLOSE_REQ ? { type, closeRequest: m } : { type, halfClose: m };
    }
    case PacketType.CLOSE_RSP: {
      const m = { error: '', connectID: 0 };
      fields(own(6), (f, w, r) => {
        if (f === 1) {
          expectWire(w, WIRE_LEN, 'CloseResponse.error');
          m.error = r.string();
          return true;
        }
        if (f === 2) {
          expectWire(w, WIRE_VARINT, 'CloseResponse.connectID');
          m.connectID = id(r.varint());
          return true;
        }
        return false;
      });
      return { type, closeResponse: m };
    }
    case PacketType.DATA: {
      const m: { connectID: number; error: string; data: Buffer } = { connectID: 0, error: '', data: EMPTY };
      fields(own(4), (f, w, r) => {
        if (f === 1) {
          expectWire(w, WIRE_VARINT, 'Data.connectID');
          m.connectID = id(r.varint());
          return true;
        }
        if (f === 2) {
          expectWire(w, WIRE_LEN, 'Data.error');
          m.error = r.string();
          return true;
        }
        if (f === 3) {
          expectWire(w, WIRE_LEN, 'Data.data');
          m.data = r.bytes();
          return true;
        }
        return false;
      });
      return { type, data: m };
    }
    case PacketType.DIAL_CLS: {
      const m = { random: 0n };
      fields(own(7), (f, w, r) => {
        if (f === 1) {
          expectWire(w, WIRE_VARINT, 'CloseDial.random');
          m.random = r.varint();
          return true;
        }
        return false;
      });
      return { type, closeDial: m };
    }
    case PacketType.DRAIN:
      return { type };
    case PacketType.CREDIT: {
      const m = { connectID: 0, bytes: 0 };
      fields(own(100), (f, w, r) => {
        if (f === 1) {
          expectWire(w, WIRE_VARINT, 'Credit.connectID');
          m.connectID = id(r.varint());
          return true;
        }
        if (f === 2) {
          expectWire(w, WIRE_VARINT, 'Credit.bytes');
          m.bytes = id(r.varint());
          return true;
        }
        return false;
      });
      return { type, credit: m };
    }
    default:
      throw new PacketDecodeError(`unknown packet type ${type}`);
  }
}

/** Where a DATA packet's payload starts, as encodePacketParts lays it out. */
export interface DataHeader {
  connectID: number;
  /** Bytes before the payload. */
  headerLength: number;
}

/** A DATA packet's payload as the chunks it arrived in, not copied into one Buffer (ChunkQueue.takeDataViews). */
export class DataViews {
  constructor(
    readonly connectID: number,
    readonly chunks: readonly Buffer[],
    readonly length: number,
  ) {}
}

/** Longest DATA header decodeDataHeader reads: type (2), Data's tag and length (1 + 5), connectID
 * (1 + 8), an empty error (2), the payload's tag and length (1 + 5). */
export const MAX_DATA_HEADER_BYTES = 25;

/**
 * Reads the header of a DATA packet of `length` bytes laid out as encodePacketParts and Go's protobuf
 * write it (type, then Data with connectID and the payload last), or as protobufjs does (which also
 * writes an empty `error`), from its first bytes `prefix`; null for anything else (decodePacket reads
 * those). Lets a framed transport hand the payload on as the chunks it arrived in instead of copying
 * it into one Buffer.
 */
export function decodeDataHeader(prefix: Buffer, length: number): DataHeader | null {
  if (prefix.length < 4 || prefix[0] !== 1 * 8 + WIRE_VARINT || prefix[1] !== PacketType.DATA || prefix[2] !== 4 * 8 + WIRE_LEN)
    return null;
  try {
    const r = new Reader(prefix, 3, prefix.length);
    const inner = r.smallVarint();
    if (r.pos + inner !== length) return null;
    let connectID = 0;
    if (prefix[r.pos] === 1 * 8 + WIRE_VARINT) {
      r.pos++;
      connectID = r.smallVarint();
    }
    // An empty error: proto3 encoders that write fields set to their default (protobufjs) send it.
    if (prefix[r.pos] === 2 * 8 + WIRE_LEN && prefix[r.pos + 1] === 0) r.pos += 2;
    if (prefix[r.pos] !== 3 * 8 + WIRE_LEN) return null;
    r.pos++;
    const dataLength = r.smallVarint();
    if (dataLength === 0 || r.pos + dataLength !== length) return null;
    return { connectID, headerLength: r.pos };
  } catch {
    return null; // truncated within the prefix: decodePacket reads it and says what is wrong
  }
}

// ---------------------------------------------------------------- encoding

function varintSize(v: bigint | number): number {
  if (typeof v === 'number' && v >= 0 && v < 2 ** 31) {
    let n = 1;
    while (v >= 128) {
      v = Math.floor(v / 128);
      n++;
    }
    return n;
  }
  let u = BigInt.asUintN(64, BigInt(v));
  let n = 1;
  while (u >= 128n) {
    u >>= 7n;
    n++;
  }
  return n;
}

class Writer {
  pos = 0;
  constructor(readonly buf: Buffer) {}

  varint(v: bigint | number): void {
    if (typeof v === 'number' && v >= 0 && v <= Number.MAX_SAFE_INTEGER) {
      while (v >= 128) {
        this.buf[this.pos++] = (v % 128) | 0x80;
        v = Math.floor(v / 128);
      }
      this.buf[this.pos++] = v;
      return;
    }
    let u = BigInt.asUintN(64, BigInt(v));
    while (u >= 128n) {
      this.buf[this.pos++] = Number(u & 0x7fn) | 0x80;
      u >>= 7n;
    }
    this.buf[this.pos++] = Number(u);
  }

  bytes(b: Buffer): void {
    this.varint(b.length);
    b.copy(this.buf, this.pos);
    this.pos += b.length;
  }
}

/** A sub-message field list; proto3 omits fields that hold their default value. */
type Field = [field: number, kind: 'varint', value: bigint | number] | [field: number, kind: 'bytes', value: Buffer];

function strField(field: number, s: string): Field[] {
  return s === '' ? [] : [[field, 'bytes', Buffer.from(s, 'utf8')]];
}
function intField(field: number, v: bigint | number): Field[] {
  return v === 0 || v === 0n ? [] : [[field, 'varint', v]];
}
function fieldSize(f: Field): number {
  const tag = varintSize(f[0] * 8);
  return f[1] === 'varint' ? tag + varintSize(f[2]) : tag + varintSize(f[2].length) + f[2].length;
}

function payloadOf(p: Packet): { field: number; fields: Field[] } | null {
  switch (p.type) {
    case PacketType.DIAL_REQ:
      return {
        field: 2,
        fields: [...strField(1, p.dialRequest.protocol), ...strField(2, p.dialRequest.address), ...intField(3, p.dialRequest.random)],
      };
    case PacketType.DIAL_RSP:
      return {
        field: 3,
        fields: [
          ...strField(1, p.dialResponse.error),
          ...intField(2, p.dialResponse.connectID),
          ...intField(3, p.dialResponse.random),
          ...strField(100, p.dialResponse.reason),
        ],
      };
    case PacketType.CLOSE_REQ:
      return { field: 5, fields: intField(1, p.closeRequest.connectID) };
    case PacketType.CLOSE_RSP:
      return { field: 6, fields: [...strField(1, p.closeResponse.error), ...intField(2, p.closeResponse.connectID)] };
    case PacketType.DATA: {
      const d = p.data;
      const fs: Field[] = [...intField(1, d.connectID), ...strField(2, d.error)];
      if (d.data.length > 0) fs.push([3, 'bytes', d.data]);
      return { field: 4, fields: fs };
    }
    case PacketType.DIAL_CLS:
      return { field: 7, fields: intField(1, p.closeDial.random) };
    case PacketType.DRAIN:
      return { field: 8, fields: [] };
    case PacketType.CREDIT:
      return { field: 100, fields: [...intField(1, p.credit.connectID), ...intField(2, p.credit.bytes)] };
    case PacketType.HALF_CLOSE:
      return { field: 101, fields: intField(1, p.halfClose.connectID) };
  }
}

export function encodePacket(p: Packet): Buffer {
  const payload = payloadOf(p);
  if (!payload) throw new Error(`cannot encode packet type ${(p as { type: number }).type}`);
  let inner = 0;
  for (const f of payload.fields) inner += fieldSize(f);
  const typeSize = p.type === 0 ? 0 : 1 + varintSize(p.type);
  // Go always sets the oneof, even for an empty message (Drain{}), so we always write it too.
  const total = typeSize + varintSize(payload.field * 8 + WIRE_LEN) + varintSize(inner) + inner;
  const w = new Writer(Buffer.allocUnsafe(total));
  if (p.type !== 0) {
    w.varint(1 * 8 + WIRE_VARINT);
    w.varint(p.type);
  }
  w.varint(payload.field * 8 + WIRE_LEN);
  w.varint(inner);
  for (const f of payload.fields) {
    if (f[1] === 'varint') {
      w.varint(f[0] * 8 + WIRE_VARINT);
      w.varint(f[2]);
    } else {
      w.varint(f[0] * 8 + WIRE_LEN);
      w.bytes(f[2]);
    }
  }
  return w.buf;
}

/**
 * Encodes a packet as buffers to write back to back. A DATA packet comes out as [header, payload]
 * with the payload not copied (its field is the last one), which is what a framed transport wants;
 * everything else as one buffer.
 */
export function encodePacketParts(p: Packet): Buffer[] {
  if (p.type !== PacketType.DATA || p.data.error !== '' || p.data.data.length === 0) return [encodePacket(p)];
  return [encodeDataHeader(p.data.connectID, p.data.data.length), p.data.data];
}

/** What precedes `length` (> 0) payload bytes in a DATA packet, as encodePacketParts writes it. */
export function encodeDataHeader(connectID: number, length: number): Buffer {
  const inner = (connectID === 0 ? 0 : 1 + varintSize(connectID)) + 1 + varintSize(length) + length;
  const headerLen = 2 + 1 + varintSize(inner) + (inner - length);
  const w = new Writer(Buffer.allocUnsafe(headerLen));
  w.varint(1 * 8 + WIRE_VARINT);
  w.varint(PacketType.DATA);
  w.varint(4 * 8 + WIRE_LEN);
  w.varint(inner);
  if (connectID !== 0) {
    w.varint(1 * 8 + WIRE_VARINT);
    w.varint(connectID);
  }
  w.varint(3 * 8 + WIRE_LEN);
  w.varint(length);
  return w.buf;
}
