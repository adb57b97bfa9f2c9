// Received bytes not yet parsed, as the chunks they arrived in: both length-prefixed parsers (our
// framing, gRPC's) read a header, then take whole messages. Taking bytes that lie in one chunk is a
// view (zero-copy); only a message spanning chunks is copied, once.
import { DataViews, MAX_DATA_HEADER_BYTES, decodeDataHeader } from '../wire/codec.js';

const EMPTY = Buffer.alloc(0);

export class ChunkQueue {
  private chunks: Buffer[] = [];
  private size = 0;

  /** Bytes held. */
  get length(): number {
    return this.size;
  }

  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
  }

  /** At least the first `n` bytes (n <= length), without consuming them. */
  peek(n: number): Buffer {
    const first = this.chunks[0]!;
    return first.length >= n ? first : Buffer.concat(this.chunks, n);
  }

  /** Removes and returns the first `n` bytes (n <= length). */
  take(n: number): Buffer {
    if (n === 0) return EMPTY;
    this.size -= n;
    const first = this.chunks[0]!;
    if (first.length > n) {
      this.chunks[0] = first.subarray(n);
      return first.subarray(0, n);
    }
    if (first.length === n) {
      this.chunks.shift();
      return first;
    }
    const out = Buffer.allocUnsafe(n);
    let off = 0;
    while (off < n) {
      const c = this.chunks[0]!;
      const k = Math.min(c.length, n - off);
      c.copy(out, off, 0, k);
      off += k;
      if (k === c.length) this.chunks.shift();
      else this.chunks[0] = c.subarray(k);
    }
    return out;
  }

  /** Removes the first `n` bytes (n <= length) as views of the chunks they arrived in: no copy. */
  takeViews(n: number): Buffer[] {
    const out: Buffer[] = [];
    this.size -= n;
    while (n > 0) {
      const c = this.chunks[0]!;
      if (c.length <= n) {
        out.push(c);
        this.chunks.shift();
        n -= c.length;
      } else {
        out.push(c.subarray(0, n));
        this.chunks[0] = c.subarray(n);
        n = 0;
      }
    }
    return out;
  }

  /**
   * Takes a whole packet of `length` (<= length held) bytes if it is a DATA packet laid out as
   * encodePacketParts writes it, its payload as views (takeViews); null, taking nothing, otherwise.
   */
  takeDataViews(length: number): DataViews | null {
    if (length === 0) return null;
    const header = decodeDataHeader(this.peek(Math.min(length, MAX_DATA_HEADER_BYTES)), length);
    if (!header) return null;
    this.take(header.headerLength);
    const n = length - header.headerLength;
    return new DataViews(header.connectID, this.takeViews(n), n);
  }

  clear(): void {
    this.chunks = [];
    this.size = 0;
  }
}
