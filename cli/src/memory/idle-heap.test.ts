import { constants } from 'node:perf_hooks';
import { getHeapSpaceStatistics } from 'node:v8';
import { describe, expect, it } from 'vitest';
import { exposedGc } from './exposed-gc.js';
import { IdleHeapReducer } from './idle-heap.js';

const minor = { detail: { kind: constants.NODE_PERFORMANCE_GC_MINOR } };
const major = { detail: { kind: constants.NODE_PERFORMANCE_GC_MAJOR } };

/** Resolves once a reducer armed now, with this quiet time, has run: one armed earlier with it has run by then. */
function witness(quietMs: number): Promise<void> {
  return new Promise<void>((resolve) =>
    new IdleHeapReducer({ reduce: resolve, quietMs, heapUsed: () => 0, cpuMs: () => 0 }).afterCollection(major),
  );
}

async function until(ok: () => boolean, ms = 5_000): Promise<void> {
  for (const end = performance.now() + ms; !ok() && performance.now() < end; ) await new Promise((r) => setTimeout(r, 10));
}

function newSpaceResident(): number {
  return getHeapSpaceStatistics().find((s) => s.space_name === 'new_space')?.physical_space_size ?? 0;
}

describe('IdleHeapReducer', () => {
  it('reduces once when a full collection is followed by a quiet time, however many came before it', async () => {
    let reductions = 0;
    const r = new IdleHeapReducer({ reduce: () => void reductions++, quietMs: 30, heapUsed: () => 0, cpuMs: () => 0 });
    try {
      r.afterCollection(major);
      r.afterCollection(major);
      expect(reductions).toBe(0);
      await witness(30);
      expect(reductions).toBe(1);
      expect(r.reductions).toBe(1);
    } finally {
      r.stop();
    }
  });

  it('a young collection within the quiet time (the process allocates) cancels it', async () => {
    let reductions = 0;
    const r = new IdleHeapReducer({ reduce: () => void reductions++, quietMs: 30, heapUsed: () => 0, cpuMs: () => 0 });
    try {
      r.afterCollection(major);
      r.afterCollection(minor);
      await witness(30);
      expect(reductions).toBe(0);
    } finally {
      r.stop();
    }
  });

  it('a busy CPU within the quiet time (a transfer between young collections) cancels it', async () => {
    let reductions = 0;
    let cpu = 0;
    const r = new IdleHeapReducer({ reduce: () => void reductions++, quietMs: 30, heapUsed: () => 0, cpuMs: () => cpu });
    try {
      r.afterCollection(major);
      cpu += 4; // more than a tenth of the 30 ms
      await witness(30);
      expect(reductions).toBe(0);
      r.afterCollection(major);
      cpu += 2;
      await witness(30);
      expect(reductions).toBe(1);
    } finally {
      r.stop();
    }
  });

  it('leaves a heap larger than the limit to V8 (the collections would stop the process longer)', async () => {
    let reductions = 0;
    let used = 65;
    const r = new IdleHeapReducer({ reduce: () => void reductions++, quietMs: 30, heapUsed: () => used, heapLimit: 64, cpuMs: () => 0 });
    try {
      r.afterCollection(major);
      await witness(30);
      expect(reductions).toBe(0);
      used = 64;
      r.afterCollection(major);
      await witness(30);
      expect(reductions).toBe(1);
    } finally {
      r.stop();
    }
  });

  it('stop() cancels a pending reduction', async () => {
    let reductions = 0;
    const r = new IdleHeapReducer({ reduce: () => void reductions++, quietMs: 20, heapUsed: () => 0, cpuMs: () => 0 });
    r.afterCollection(major);
    r.stop();
    await witness(20);
    expect(reductions).toBe(0);
  });

  it("follows V8's full collections, not its own, and shrinks the young generation an ordinary one leaves", async () => {
    const plainGc = exposedGc() as unknown as () => void;
    // The test runner's heap may be past the product's limit: not what this test is about.
    const r = new IdleHeapReducer({ quietMs: 50, heapLimit: Number.POSITIVE_INFINITY, cpuMs: () => 0 });
    // Young objects that survive a few young collections make V8 grow its young generation.
    let kept: object[] = [];
    for (let i = 0; i < 400_000; i++) kept.push({ i, s: `young ${i}` });
    kept = [];
    r.start();
    try {
      plainGc();
      const ordinary = newSpaceResident();
      await until(() => r.reductions > 0);
      expect(r.reductions).toBe(1);
      expect(kept).toHaveLength(0);
      expect(newSpaceResident()).toBeLessThan(ordinary / 2);
      // The reduction's own collections are reported meanwhile; had they armed it, it would have run
      // again before a reducer armed after them, with the same quiet time.
      await witness(50);
      expect(r.reductions).toBe(1);
    } finally {
      r.stop();
    }
  });
});
