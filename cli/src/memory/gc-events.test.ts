import { describe, expect, it } from 'vitest';
import { watchCollections } from './gc-events.js';

/** Allocates until `done()` or 200 turns; collections follow allocation. */
async function allocateUntil(done: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !done(); i++) {
    const garbage: number[][] = [];
    for (let j = 0; j < 2000; j++) garbage.push(new Array<number>(16).fill(j));
    await new Promise((r) => setTimeout(r, 5 + (garbage.length & 1)));
  }
}

describe('watchCollections', () => {
  it('tells every watcher of each collection, and one stopping leaves the others watching', async () => {
    let a = 0;
    let b = 0;
    const stopA = watchCollections(() => void a++);
    const stopB = watchCollections(() => void b++);
    try {
      await allocateUntil(() => a > 0 && b > 0);
      expect(a).toBeGreaterThan(0);
      expect(b).toBeGreaterThan(0);
      stopA();
      const aStopped = a;
      const bBefore = b;
      await allocateUntil(() => b > bBefore);
      expect(b).toBeGreaterThan(bBefore);
      expect(a).toBe(aStopped);
    } finally {
      stopA();
      stopB();
    }
  });
});
