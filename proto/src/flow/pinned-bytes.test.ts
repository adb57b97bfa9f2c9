import { describe, expect, it } from 'vitest';
import { PIN_COPY_MIN, unpinned } from './pinned-bytes.js';

describe('unpinned', () => {
  it('copies a view that pins more than twice its size into a Buffer of its own', () => {
    const frame = Buffer.alloc(64 * 1024, 1);
    frame.fill(2, 40 * 1024);
    const rest = frame.subarray(40 * 1024);
    const out = unpinned(rest);
    expect(out).not.toBe(rest);
    expect(out.buffer.byteLength).toBe(rest.length);
    expect(out.equals(rest)).toBe(true);
  });

  it('copies small views into their own memory, not into the shared pool', () => {
    const out = unpinned(Buffer.alloc(256 * 1024).subarray(0, 100));
    expect(out.buffer.byteLength).toBe(100);
  });

  it('leaves whole Buffers, views of at least half, and views of small buffers as they are', () => {
    const whole = Buffer.alloc(64 * 1024);
    expect(unpinned(whole)).toBe(whole);
    const half = whole.subarray(32 * 1024);
    expect(unpinned(half)).toBe(half);
    const record = Buffer.alloc(PIN_COPY_MIN - 1).subarray(0, 10);
    expect(unpinned(record)).toBe(record);
  });
});
