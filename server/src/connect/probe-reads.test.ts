import { describe, expect, it } from 'vitest';
import { ProbeReads } from './probe-reads.js';

describe('ProbeReads', () => {
  it('lets each connection read up to its allowance, and all of them together up to the total', () => {
    const reads = new ProbeReads(100, 250);
    const [a, b, c] = [{}, {}, {}];
    reads.read(a, 60);
    expect(reads.mayRead(a)).toBe(true);
    reads.read(a, 60); // one chunk may overshoot; the next probe does not read
    expect(reads.mayRead(a)).toBe(false);
    reads.read(b, 100);
    expect(reads.mayRead(c)).toBe(true);
    reads.read(c, 40);
    expect(reads.held).toBe(260);
    expect(reads.mayRead(c)).toBe(false); // under its own allowance, but the total is spent
  });

  it('gives a connection its allowance back, and the total, once its credit returns or it closes', () => {
    const reads = new ProbeReads(100, 150);
    const [a, b] = [{}, {}];
    reads.read(a, 100);
    reads.read(b, 60);
    expect(reads.mayRead(b)).toBe(false);
    reads.release(a);
    expect(reads.held).toBe(60);
    expect(reads.mayRead(a)).toBe(true);
    expect(reads.mayRead(b)).toBe(true);
    reads.release(a); // twice: nothing more to give back
    reads.release(b);
    expect(reads.held).toBe(0);
  });
});
