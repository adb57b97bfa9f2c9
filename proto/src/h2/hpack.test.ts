import { describe, expect, it } from 'vitest';
import { HUFFMAN_CODES, HUFFMAN_LENGTHS } from './hpack-tables.js';
import { HpackDecoder, HpackError, decodeHuffman, encodeHeaderBlock, type HeaderField } from './hpack.js';

const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex');

/** A Huffman encoder for the tests only (ours never Huffman-codes): the code table applied bit by bit. */
function huffman(bytes: Buffer): Buffer {
  const bits: number[] = [];
  for (const b of bytes) for (let i = HUFFMAN_LENGTHS[b]! - 1; i >= 0; i--) bits.push((HUFFMAN_CODES[b]! >>> i) & 1);
  while (bits.length % 8 !== 0) bits.push(1);
  const out = Buffer.alloc(bits.length / 8);
  bits.forEach((bit, i) => (out[i >> 3]! |= bit << (7 - (i & 7))));
  return out;
}

describe('HPACK decoding (RFC 7541 appendix C)', () => {
  it('decodes the requests of C.3 (plain literals) in order, through the dynamic table', () => {
    const d = new HpackDecoder();
    expect(d.decode(hex('828684410f7777772e6578616d706c652e636f6d')).fields).toEqual([
      [':method', 'GET'],
      [':scheme', 'http'],
      [':path', '/'],
      [':authority', 'www.example.com'],
    ]);
    expect(d.decode(hex('828684be58086e6f2d6361636865')).fields).toEqual([
      [':method', 'GET'],
      [':scheme', 'http'],
      [':path', '/'],
      [':authority', 'www.example.com'],
      ['cache-control', 'no-cache'],
    ]);
    expect(d.decode(hex('828785bf400a637573746f6d2d6b65790c637573746f6d2d76616c7565')).fields).toEqual([
      [':method', 'GET'],
      [':scheme', 'https'],
      [':path', '/index.html'],
      [':authority', 'www.example.com'],
      ['custom-key', 'custom-value'],
    ]);
  });

  it('decodes the requests of C.4 (Huffman-coded)', () => {
    const d = new HpackDecoder();
    expect(d.decode(hex('828684418cf1e3c2e5f23a6ba0ab90f4ff')).fields[3]).toEqual([':authority', 'www.example.com']);
    expect(d.decode(hex('828684be5886a8eb10649cbf')).fields[4]).toEqual(['cache-control', 'no-cache']);
    expect(d.decode(hex('828785bf408825a849e95ba97d7f8925a849e95bb8e8b4bf')).fields[4]).toEqual(['custom-key', 'custom-value']);
  });

  it('evicts the oldest entries once the table is full, and honours size updates within our setting', () => {
    const d = new HpackDecoder(100);
    // Each entry below is 32 + 1 + 40 = 73 bytes: the second evicts the first.
    const literal = (name: string, value: string): Buffer =>
      Buffer.concat([Buffer.from([0x40, name.length]), Buffer.from(name), Buffer.from([value.length]), Buffer.from(value)]);
    d.decode(literal('a', 'x'.repeat(40)));
    d.decode(literal('b', 'y'.repeat(40)));
    expect(d.decode(Buffer.from([0x80 | 62])).fields).toEqual([['b', 'y'.repeat(40)]]);
    expect(() => d.decode(Buffer.from([0x80 | 63]))).toThrow(HpackError);
    // Size update to 0 empties the table.
    d.decode(Buffer.from([0x20]));
    expect(() => d.decode(Buffer.from([0x80 | 62]))).toThrow(/beyond the table/);
    // Above what we announced: refused.
    expect(() => d.decode(Buffer.from([0x3f, 0x46]))).toThrow(/above the 100 allowed/);
  });

  it.each([
    ['index 0', '80', /index 0/],
    ['an index beyond both tables', 'be', /beyond the table/],
    ['a size update after a field', '8220', /after a header field/],
    ['an integer cut short', '7fff', /cut short/],
    ['a string beyond the block', '0085', /cut short|beyond the block/],
    ['an integer too large', '7fffffffffff7f', /too large/],
    ['Huffman padding of 8 bits', '000161' + '81ff', /padding/],
  ])('refuses %s with an HpackError', (_what, block, message) => {
    expect(() => new HpackDecoder().decode(hex(block))).toThrow(message);
  });

  it('reports a header list over its limit as too large, still keeping the table in step', () => {
    const d = new HpackDecoder(4096, 150);
    // 3 + 80 + 32 = 115 bytes a field: twice is over the limit, once is not.
    const field = Buffer.concat([Buffer.from([0x40, 3]), Buffer.from('big'), Buffer.from([80]), Buffer.from('v'.repeat(80))]);
    const { fields, tooLarge } = d.decode(Buffer.concat([field, field]));
    expect(tooLarge).toBe(true);
    expect(fields).toEqual([['big', 'v'.repeat(80)]]);
    // The field went into the table all the same: the next block may refer to it.
    expect(d.decode(Buffer.from([0x80 | 62])).fields).toEqual([['big', 'v'.repeat(80)]]);
  });
});

describe('Huffman decoding', () => {
  it('decodes every byte value as the code table codes it', () => {
    const all = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
    expect(Buffer.from(decodeHuffman(huffman(all), 0, huffman(all).length), 'latin1')).toEqual(all);
    for (let b = 0; b < 256; b++) {
      const one = huffman(Buffer.from([b, b, 255 - b]));
      expect(decodeHuffman(one, 0, one.length)).toBe(String.fromCharCode(b, b, 255 - b));
    }
  });

  it('refuses padding that is not all ones, and EOS inside the string', () => {
    const a = huffman(Buffer.from('a')); // 5 bits, then 3 bits of padding
    a[0]! &= 0xfe;
    expect(() => decodeHuffman(a, 0, a.length)).toThrow(/padding/);
    // EOS (30 ones) then padding: four bytes of ones.
    expect(() => decodeHuffman(hex('ffffffff'), 0, 4)).toThrow(/EOS/);
  });
});

describe('HPACK encoding', () => {
  it.each([
    ['an upper-case name', [['X-Id', '1']]],
    ['an empty name', [['', '1']]],
    ['a value with a line break', [['x-id', 'a\r\nx-forged: 1']]],
    ['a value with NUL', [['x-id', 'a\0']]],
  ] as [string, HeaderField[]][])('refuses %s, as a peer would read it as malformed', (_what, fields) => {
    expect(() => encodeHeaderBlock(fields)).toThrow(TypeError);
  });

  it('refers to the static table where it can, and decodes back to the same fields', () => {
    const fields: HeaderField[] = [
      [':status', '200'],
      ['content-type', 'application/grpc'],
      ['grpc-status', '0'],
      ['grpc-message', 'x'.repeat(300) + '%0A\u00ff'],
      ['serverid', 'hub-1'],
    ];
    const block = encodeHeaderBlock(fields);
    expect(block[0]).toBe(0x88); // :status 200 is static entry 8
    expect(block[1]).toBe(0x0f); // content-type: static name 31, 15 + 16 in the next byte
    expect(block[2]).toBe(16);
    expect(new HpackDecoder().decode(block).fields).toEqual(fields);
  });
});
