import { describe, expect, it } from 'vitest';
import { Backoff, spreadRetryDelay } from './backoff.js';

describe('Backoff', () => {
  it('grows exponentially up to maxMs (upper end of the jitter)', () => {
    const b = new Backoff({ initialMs: 100, maxMs: 1000, random: () => 1 });
    expect(Array.from({ length: 8 }, () => b.next())).toEqual([100, 200, 400, 800, 1000, 1000, 1000, 1000]);
  });

  it('honours the factor', () => {
    const b = new Backoff({ initialMs: 10, maxMs: 10_000, factor: 3, random: () => 1 });
    expect(Array.from({ length: 5 }, () => b.next())).toEqual([10, 30, 90, 270, 810]);
  });

  it('never waits less than a tenth of the initial delay', () => {
    const b = new Backoff({ initialMs: 500, maxMs: 30_000, random: () => 0 });
    for (let i = 0; i < 10; i++) expect(b.next()).toBe(50);
  });

  it('jitters uniformly within [initial/10, ceiling] ("full jitter")', () => {
    const initialMs = 100;
    const maxMs = 3200;
    const b = new Backoff({ initialMs, maxMs });
    const samples: number[][] = Array.from({ length: 8 }, () => []);
    for (let round = 0; round < 300; round++) {
      for (let attempt = 0; attempt < 8; attempt++) samples[attempt]!.push(b.next());
      b.reset();
    }
    samples.forEach((values, attempt) => {
      const ceiling = Math.min(maxMs, initialMs * 2 ** attempt);
      for (const v of values) {
        expect(v).toBeGreaterThanOrEqual(initialMs / 10);
        expect(v).toBeLessThanOrEqual(ceiling);
      }
      // Spread over the range, not pinned to one end: the mean of a uniform draw is ceiling/2.
      const mean = values.reduce((a, c) => a + c, 0) / values.length;
      expect(mean).toBeGreaterThan(ceiling * 0.35);
      expect(mean).toBeLessThan(ceiling * 0.65 + initialMs / 10);
      expect(new Set(values).size).toBeGreaterThan(Math.min(20, ceiling / 10));
    });
  });

  it('never exceeds maxMs however many attempts', () => {
    const b = new Backoff({ initialMs: 1, maxMs: 5000, random: () => 0.999999 });
    let last = 0;
    for (let i = 0; i < 2000; i++) last = b.next();
    expect(last).toBeLessThanOrEqual(5000);
    expect(Number.isFinite(last)).toBe(true);
    expect(last).toBeGreaterThan(4990);
  });

  it('reset() starts over from the initial delay', () => {
    const b = new Backoff({ initialMs: 100, maxMs: 10_000, random: () => 1 });
    b.next();
    b.next();
    expect(b.next()).toBe(400);
    b.reset();
    expect(b.next()).toBe(100);
    expect(b.next()).toBe(200);
  });
});

describe('spreadRetryDelay', () => {
  it('waits a uniform part of the spread first, then that plus the backoff', () => {
    const b = new Backoff({ initialMs: 500, maxMs: 30_000, random: () => 1 });
    expect(spreadRetryDelay(0, 20_000, b, () => 0.25)).toBe(5000);
    expect(spreadRetryDelay(1, 20_000, b, () => 0.25)).toBe(5500);
    expect(spreadRetryDelay(2, 20_000, b, () => 0.5)).toBe(11_000);
  });

  it('a retry draws from what is left of the spread (none left: the backoff alone)', () => {
    const b = new Backoff({ initialMs: 500, maxMs: 30_000, random: () => 1 });
    expect(spreadRetryDelay(1, 20_000, b, () => 0.5, 8000)).toBe(4500);
    expect(spreadRetryDelay(2, 20_000, b, () => 0.5, -3000)).toBe(1000);
  });

  it('spreads 5,000 agents that lost a hub for 5 s over the spread: at most 10 % back in any one second', () => {
    const spreadMs = 25_000;
    const downMs = 5000;
    const perSecond = new Map<number, number>();
    for (let i = 0; i < 5000; i++) {
      const b = new Backoff({ initialMs: 500, maxMs: 30_000 });
      let t = 0;
      for (let retry = 0; t < downMs; retry++) t += spreadRetryDelay(retry, spreadMs, b, Math.random, spreadMs - t);
      const s = Math.floor((t - downMs) / 1000);
      perSecond.set(s, (perSecond.get(s) ?? 0) + 1);
    }
    expect(Math.max(...perSecond.values()) / 5000).toBeLessThan(0.1);
    // All back within the spread (and a retry's backoff), counted from the loss: not a second spread after the first.
    expect(Math.max(...perSecond.keys())).toBeLessThan((spreadMs - downMs) / 1000 + 2);
  });
});
