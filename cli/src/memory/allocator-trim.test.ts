import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { AllocatorTrimmer } from './allocator-trim.js';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('AllocatorTrimmer', () => {
  it('trims once, the delay after a full collection, however many end meanwhile', async () => {
    let trims = 0;
    const t = new AllocatorTrimmer({ trim: () => void trims++, delayMs: 30, spacingMs: 0 });
    try {
      t.afterMajorCollection();
      t.afterMajorCollection();
      expect(trims).toBe(0);
      await sleep(80);
      expect(trims).toBe(1);
      expect(t.trims).toBe(1);
    } finally {
      t.stop();
    }
  });

  it('keeps trims the spacing apart', async () => {
    let now = 1_000_000;
    const at: number[] = [];
    const t = new AllocatorTrimmer({ trim: () => void at.push(now), now: () => now, delayMs: 10, spacingMs: 5_000 });
    try {
      t.afterMajorCollection();
      await sleep(40);
      expect(at).toEqual([1_000_000]);
      now += 4_960; // 40 ms before the spacing allows another: waits those, not the delay
      t.afterMajorCollection();
      await sleep(20);
      expect(at).toHaveLength(1);
      await sleep(60);
      expect(at).toHaveLength(2);
    } finally {
      t.stop();
    }
  });

  it('started, follows V8\'s own full collections; stopped, no longer', async () => {
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    let trims = 0;
    const t = new AllocatorTrimmer({ trim: () => void trims++, delayMs: 10, spacingMs: 0 });
    t.start();
    try {
      gc();
      for (let i = 0; i < 100 && trims === 0; i++) await sleep(10);
      expect(trims).toBe(1);
    } finally {
      t.stop();
    }
    await sleep(30); // a report already queued may still arrive
    const seen = trims;
    gc();
    await sleep(60);
    expect(trims).toBe(seen);
  });

  it('stop() cancels a pending trim', async () => {
    let trims = 0;
    const t = new AllocatorTrimmer({ trim: () => void trims++, delayMs: 20 });
    t.afterMajorCollection();
    t.stop();
    await sleep(60);
    expect(trims).toBe(0);
  });
});
