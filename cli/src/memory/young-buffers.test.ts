import { describe, expect, it } from 'vitest';
import { RELAX_SHARE, TIGHT_SHARE } from './budget-pressure.js';
import { TIGHT_YOUNG_BUFFERS, YoungBufferLimit } from './young-buffers.js';

const MiB = 1024 * 1024;

/** A limit over a settable held count and budget, recording what it applies. */
function limited(budget = 64 * MiB): {
  limit: YoungBufferLimit;
  hold: (mib: number) => void;
  applied: (number | null)[];
  setBudget: (b: number) => void;
} {
  let held = 0;
  let max = budget;
  const applied: (number | null)[] = [];
  const limit = new YoungBufferLimit({ held: () => held, limit: () => max, apply: (b) => void applied.push(b) });
  return {
    limit,
    hold: (mib) => {
      held = mib * MiB;
      limit.update();
    },
    applied,
    setBudget: (b) => void (max = b),
  };
}

describe('YoungBufferLimit', () => {
  it('keeps young garbage short once the budgets hold an eighth of what they may, and only then', () => {
    const { limit, hold, applied } = limited();
    expect(TIGHT_SHARE).toBe(1 / 8);
    hold(4);
    hold(7.9);
    expect(applied).toEqual([]);
    expect(limit.tight).toBe(false);
    hold(8); // 1/8 of 64 MiB: a thousand stuck connections hold 33
    expect(applied).toEqual([TIGHT_YOUNG_BUFFERS]);
    expect(limit.tight).toBe(true);
    hold(40);
    expect(applied).toHaveLength(1); // set once, not at every collection
  });

  it('gives V8 its default back below a sixteenth, not in between (no flapping at the edge)', () => {
    const { limit, hold, applied } = limited();
    expect(RELAX_SHARE).toBe(1 / 16);
    hold(10);
    hold(5);
    hold(7.9);
    hold(4.1);
    expect(applied).toEqual([TIGHT_YOUNG_BUFFERS]);
    hold(3.9);
    expect(applied).toEqual([TIGHT_YOUNG_BUFFERS, null]);
    expect(limit.tight).toBe(false);
    hold(9);
    expect(applied).toEqual([TIGHT_YOUNG_BUFFERS, null, TIGHT_YOUNG_BUFFERS]);
  });

  it('does nothing while the process has no budget yet', () => {
    const { hold, applied, setBudget } = limited(0);
    hold(100);
    expect(applied).toEqual([]);
    setBudget(256 * MiB);
    hold(100);
    expect(applied).toEqual([TIGHT_YOUNG_BUFFERS]);
  });

  it('gives the default back when stopped while tight, and only then', () => {
    const a = limited();
    a.hold(20);
    a.limit.stop();
    expect(a.applied).toEqual([TIGHT_YOUNG_BUFFERS, null]);
    const b = limited();
    b.hold(1);
    b.limit.stop();
    expect(b.applied).toEqual([]);
  });

  it('looks again after each collection V8 reports once started', async () => {
    let held = 0;
    const applied: (number | null)[] = [];
    const limit = new YoungBufferLimit({ held: () => held, limit: () => 64 * MiB, apply: (b) => void applied.push(b) });
    limit.start();
    try {
      held = 20 * MiB;
      // Young collections, started by allocation as arriving Buffers start them.
      for (let i = 0; i < 200 && applied.length === 0; i++) {
        const garbage: number[][] = [];
        for (let j = 0; j < 2000; j++) garbage.push(new Array<number>(16).fill(j));
        await new Promise((r) => setTimeout(r, 5 + (garbage.length & 1)));
      }
      expect(applied).toEqual([TIGHT_YOUNG_BUFFERS]);
    } finally {
      limit.stop();
    }
  });
});
