// HPACK (RFC 7541), as far as our HTTP/2 needs it. The decoder is complete: peers (grpc-go, nghttp2)
// index headers in the dynamic table and Huffman-code strings. The encoder never indexes: it refers to
// the static table where it can and writes the rest as plain literals "without indexing", so the peer's
// decoder keeps no state of ours and a block we cache can be sent on any connection.
import { HUFFMAN_CODES, HUFFMAN_LENGTHS, STATIC_TABLE } from './hpack-tables.js';

/** A header block we cannot decode: a connection error (COMPRESSION_ERROR) for HTTP/2. */
export class HpackError extends Error {}

/** A header field as HPACK carries it: name and value as bytes (latin1 strings). */
export type HeaderField = readonly [name: string, value: string];

/** RFC 7541 4.1: each entry counts its name and value and 32 bytes. */
const ENTRY_OVERHEAD = 32;
/** Integers larger than this are refused (no header field or table size of ours comes near it). */
const MAX_INTEGER = 2 ** 28;

const STATIC_COUNT = STATIC_TABLE.length;

// The Huffman decoding tree, as a flat array: node n's children are at tree[2n] (bit 0) and
// tree[2n + 1] (bit 1); a child >= 0 is a node, -1 - symbol a leaf, and 0 (the root) an unused code.
// Built once; 256 symbols plus EOS make 256 inner nodes.
const EOS = 256;
const huffmanTree = buildHuffmanTree();

function buildHuffmanTree(): Int32Array {
  const tree = new Int32Array(2 * 512);
  let nodes = 1;
  const insert = (code: number, length: number, symbol: number): void => {
    let node = 0;
    for (let i = length - 1; i >= 0; i--) {
      const slot = 2 * node + ((code >>> i) & 1);
      if (i === 0) {
        tree[slot] = -1 - symbol;
        return;
      }
      if (tree[slot] === 0) tree[slot] = nodes++;
      node = tree[slot]!;
    }
  };
  for (let s = 0; s < 256; s++) insert(HUFFMAN_CODES[s]!, HUFFMAN_LENGTHS[s]!, s);
  insert(0x3fffffff, 30, EOS);
  return tree;
}

/** Decodes a Huffman-coded string (RFC 7541 5.2): padding is at most 7 bits, all ones; EOS inside is an error. */
export function decodeHuffman(src: Buffer, start: number, end: number): string {
  const out: number[] = [];
  let node = 0;
  // Bits read since the last symbol, and whether all of them were ones (valid padding so far).
  let pending = 0;
  let allOnes = true;
  for (let i = start; i < end; i++) {
    const byte = src[i]!;
    for (let b = 7; b >= 0; b--) {
      const bit = (byte >>> b) & 1;
      const next = huffmanTree[2 * node + bit]!;
      pending++;
      if (bit === 0) allOnes = false;
      if (next < 0) {
        const symbol = -1 - next;
        if (symbol === EOS) throw new HpackError('Huffman string holds EOS');
        out.push(symbol);
        node = 0;
        pending = 0;
        allOnes = true;
      } else if (next === 0) {
        throw new HpackError('invalid Huffman code');
      } else node = next;
    }
  }
  if (pending > 7 || !allOnes) throw new HpackError('invalid Huffman padding');
  return Buffer.from(out).toString('latin1');
}

/**
 * One connection's decoding context: its dynamic table lives as long as the connection, and every
 * header block the peer sends must go through it in order, also those of streams we refuse.
 */
export class HpackDecoder {
  /** The dynamic table, newest first. */
  private readonly table: HeaderField[] = [];
  private tableBytes = 0;
  /** The table's size now (the peer lowers it with a size update, up to our setting). */
  private maxTableBytes: number;

  /**
   * @param settingsMaxTableBytes SETTINGS_HEADER_TABLE_SIZE we announced (the most the peer may use).
   * @param maxListBytes a header list larger than this (RFC 7540's size: name + value + 32 each) is
   *   decoded (the table must stay in step) but reported as too large.
   */
  constructor(
    private readonly settingsMaxTableBytes = 4096,
    private readonly maxListBytes = 64 * 1024,
  ) {
    this.maxTableBytes = settingsMaxTableBytes;
  }

  /** Decodes one complete header block. Throws HpackError on a malformed one (the connection is then unusable). */
  decode(block: Buffer): { fields: HeaderField[]; tooLarge: boolean } {
    const fields: HeaderField[] = [];
    let listBytes = 0;
    let tooLarge = false;
    const add = (field: HeaderField): void => {
      listBytes += field[0].length + field[1].length + ENTRY_OVERHEAD;
      if (listBytes > this.maxListBytes) tooLarge = true;
      else fields.push(field);
    };
    const pos = { at: 0 };
    let sawField = false;
    while (pos.at < block.length) {
      const first = block[pos.at]!;
      if (first & 0x80) {
        // Indexed field.
        add(this.entry(readInteger(block, pos, 7)));
        sawField = true;
      } else if (first & 0x40) {
        // Literal with incremental indexing.
        const field = this.literal(block, pos, 6);
        this.insert(field);
        add(field);
        sawField = true;
      } else if (first & 0x20) {
        // Dynamic table size update: only before the first field of a block.
        if (sawField) throw new HpackError('table size update after a header field');
        const size = readInteger(block, pos, 5);
        if (size > this.settingsMaxTableBytes) throw new HpackError(`table size ${size} above the ${this.settingsMaxTableBytes} allowed`);
        this.maxTableBytes = size;
        this.evict(0);
      } else {
        // Literal without indexing (0000) or never indexed (0001).
        add(this.literal(block, pos, 4));
        sawField = true;
      }
    }
    return { fields, tooLarge };
  }

  private entry(index: number): HeaderField {
    if (index === 0) throw new HpackError('header index 0');
    if (index <= STATIC_COUNT) return STATIC_TABLE[index - 1]!;
    const field = this.table[index - STATIC_COUNT - 1];
    if (!field) throw new HpackError(`header index ${index} beyond the table`);
    return field;
  }

  private literal(block: Buffer, pos: { at: number }, prefixBits: number): HeaderField {
    const nameIndex = readInteger(block, pos, prefixBits);
    const name = nameIndex === 0 ? readString(block, pos) : this.entry(nameIndex)[0];
    return [name, readString(block, pos)];
  }

  private insert(field: HeaderField): void {
    const size = field[0].length + field[1].length + ENTRY_OVERHEAD;
    if (size > this.maxTableBytes) {
      // Larger than the table: it empties the table and is not added (RFC 7541 4.4).
      this.evict(this.maxTableBytes);
      return;
    }
    this.evict(size);
    this.table.unshift(field);
    this.tableBytes += size;
  }

  /** Drops the oldest entries until `room` more bytes fit. */
  private evict(room: number): void {
    while (this.tableBytes + room > this.maxTableBytes && this.table.length > 0) {
      const old = this.table.pop()!;
      this.tableBytes -= old[0].length + old[1].length + ENTRY_OVERHEAD;
    }
  }
}

function readInteger(src: Buffer, pos: { at: number }, prefixBits: number): number {
  if (pos.at >= src.length) throw new HpackError('header block cut short');
  const max = (1 << prefixBits) - 1;
  let value = src[pos.at++]! & max;
  if (value < max) return value;
  let shift = 0;
  for (;;) {
    if (pos.at >= src.length) throw new HpackError('header block cut short');
    const b = src[pos.at++]!;
    value += (b & 0x7f) * 2 ** shift;
    if (value > MAX_INTEGER) throw new HpackError('integer too large');
    if ((b & 0x80) === 0) return value;
    shift += 7;
  }
}

function readString(src: Buffer, pos: { at: number }): string {
  if (pos.at >= src.length) throw new HpackError('header block cut short');
  const huffman = (src[pos.at]! & 0x80) !== 0;
  const length = readInteger(src, pos, 7);
  const end = pos.at + length;
  if (end > src.length) throw new HpackError('header string beyond the block');
  const s = huffman ? decodeHuffman(src, pos.at, end) : src.toString('latin1', pos.at, end);
  pos.at = end;
  return s;
}

// ------------------------------------------------------------------------------------------ encoding

const staticExact = new Map<string, number>();
const staticName = new Map<string, number>();
STATIC_TABLE.forEach(([name, value], i) => {
  if (!staticExact.has(`${name}\0${value}`)) staticExact.set(`${name}\0${value}`, i + 1);
  if (!staticName.has(name)) staticName.set(name, i + 1);
});

/** What RFC 9113 8.2.1 allows in a field we send: a name of lower-case token characters (or a pseudo-header), a value without NUL, CR or LF. */
const VALID_NAME = /^:?[a-z0-9!#$%&'*+\-.^_`|~]+$/;
const INVALID_VALUE = /[\0\r\n]/;

/**
 * Encodes header fields (names lower-case, as HTTP/2 requires) into one header block: static-table
 * references where a field or its name is there, plain literals without indexing otherwise. Throws on a
 * field HTTP/2 does not allow (a peer would read the stream as malformed), as node:http2 does.
 */
export function encodeHeaderBlock(fields: readonly HeaderField[]): Buffer {
  let bytes = 0;
  for (const [name, value] of fields) {
    if (!VALID_NAME.test(name)) throw new TypeError(`invalid HTTP/2 header name ${JSON.stringify(name)}`);
    if (INVALID_VALUE.test(value)) throw new TypeError(`invalid value for HTTP/2 header ${name}`);
    bytes += name.length + value.length + 16;
  }
  const out = Buffer.allocUnsafe(bytes);
  let at = 0;
  for (const [name, value] of fields) {
    const exact = staticExact.get(`${name}\0${value}`);
    if (exact !== undefined) {
      at = writeInteger(out, at, exact, 7, 0x80);
      continue;
    }
    const nameIndex = staticName.get(name);
    if (nameIndex !== undefined) at = writeInteger(out, at, nameIndex, 4, 0x00);
    else {
      out[at++] = 0x00;
      at = writeString(out, at, name);
    }
    at = writeString(out, at, value);
  }
  return out.subarray(0, at);
}

function writeInteger(out: Buffer, at: number, value: number, prefixBits: number, pattern: number): number {
  const max = (1 << prefixBits) - 1;
  if (value < max) {
    out[at++] = pattern | value;
    return at;
  }
  out[at++] = pattern | max;
  value -= max;
  while (value >= 0x80) {
    out[at++] = (value & 0x7f) | 0x80;
    value = Math.floor(value / 0x80);
  }
  out[at++] = value;
  return at;
}

function writeString(out: Buffer, at: number, s: string): number {
  at = writeInteger(out, at, s.length, 7, 0x00);
  return at + out.write(s, at, 'latin1');
}
