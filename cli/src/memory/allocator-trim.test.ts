import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describe, expect, it } from 'vitest';
import { AllocatorTrimmer } from './allocator-trim.js';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * Resolves once a trimmer asked now, with this delay, has trimmed: a trim due no later (the same timer
 * path, asked earlier) has run by then.
 */
function witness(delayMs: number): Promise<void> {
  return new Promise<void>((resolve) => new AllocatorTrimmer({ trim: resolve, delayMs, spacingMs: 0 }).afterMajorCollection());
}

async function until(ok: () => boolean): Promise<void> {
  for (let i = 0; i < 100 && !ok(); i++) await sleep(10);
}

describe('AllocatorTrimmer', () => {
  it('trims once, the delay after a full collection, however many end meanwhile', async () => {
    let trims = 0;
    const t = new AllocatorTrimmer({ trim: () => void trims++, delayMs: 30, spacingMs: 0 });
    try {
      t.afterMajorCollection();
      t.afterMajorCollection();
      expect(trims).toBe(0);
      await witness(30);
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
      await until(() => at.length > 0);
      expect(at).toEqual([1_000_000]);
      now += 4_960; // 40 ms before the spacing allows another: waits those, not the delay
      t.afterMajorCollection();
      await witness(10);
      expect(at).toHaveLength(1);
      await until(() => at.length > 1);
      expect(at).toHaveLength(2);
    } finally {
      t.stop();
    }
  });

  it("started, follows V8's own full collections; stopped, no longer", async () => {
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
    // A second trimmer, watching from now on with the same delay: once it has trimmed after a
    // collection, a report queued for the first has had its trim too; once it trims after another, the
    // first would have as well.
    let witnessed = 0;
    const w = new AllocatorTrimmer({ trim: () => void witnessed++, delayMs: 10, spacingMs: 0 });
    w.start();
    try {
      gc();
      await until(() => witnessed > 0);
      const seen = trims;
      gc();
      await until(() => witnessed > 1);
      expect(witnessed).toBeGreaterThanOrEqual(2);
      expect(trims).toBe(seen);
    } finally {
      w.stop();
    }
  });

  it('stop() cancels a pending trim', async () => {
    let trims = 0;
    const t = new AllocatorTrimmer({ trim: () => void trims++, delayMs: 20 });
    t.afterMajorCollection();
    t.stop();
    await witness(20);
    expect(trims).toBe(0);
  });
});
