import { describe, expect, it, vi } from 'vitest';
import { PROVEN_BULK_BYTES, ReceiveWindow, type ByteSink } from './flow-control.js';
import {
  MemoryBudget,
  bytesHeldInProcess,
  connectionsActiveInProcess,
  connectionsHoldingInProcess,
  largestBudgetInProcess,
  throttleReporter,
} from './memory-budget.js';

const KiB = 1024;
const MiB = 1024 * KiB;

/** A sink whose writes complete when the round trip ends (fast) or never (stuck). */
class Sink implements ByteSink {
  private readonly pending: Array<() => void> = [];
  fast = true;
  /** Bytes the sink has taken. */
  taken = 0;
  write(chunk: Buffer, cb: (err?: Error | null) => void): boolean {
    this.pending.push(() => {
      this.taken += chunk.length;
      cb();
    });
    return true;
  }
  /** End of a round trip: a fast sink has taken everything. */
  tick(): void {
    if (this.fast) for (const cb of this.pending.splice(0)) cb();
  }
  /** A stalled sink takes one piece now and then (the kernel making room in a full receive buffer). */
  trickle(): void {
    this.pending.shift()?.();
  }
}

/** One round trip of a sender that uses all the credit it has (in pieces of at most `piece`), up to `total`. */
function pump(w: ReceiveWindow, credit: { n: number }, total: number, sink?: Sink, piece = 16 * KiB): number {
  let sent = 0;
  while (sent < total && credit.n > 0) {
    const n = Math.min(piece, credit.n, total - sent);
    credit.n -= n;
    sent += n;
    w.write(Buffer.alloc(n));
  }
  sink?.tick();
  return sent;
}

function connection(
  budget: MemoryBudget,
  initial = 32 * KiB,
  onBulk?: () => void,
  growOnceProven?: boolean,
): { w: ReceiveWindow; sink: Sink; credit: { n: number } } {
  const sink = new Sink();
  const credit = { n: initial };
  const w = new ReceiveWindow({
    sink,
    initial,
    budget,
    direction: 'to_endpoint',
    report: (n) => {
      credit.n += n;
    },
    onBulk,
    growOnceProven,
  });
  return { w, sink, credit };
}

describe('ReceiveWindow.onBulk: a reader proven to keep up', () => {
  it('is called once, after a whole window went through quickly and PROVEN_BULK_BYTES in all', () => {
    const budget = new MemoryBudget(64 * MiB, { maxWindow: 4 * MiB });
    let calls = 0;
    let takenAtCall = -1;
    const { w, credit, sink } = connection(budget, 32 * KiB, () => {
      calls++;
      takenAtCall = sink.taken;
    });
    for (let i = 0; i < 200; i++) pump(w, credit, 8 * MiB, sink);
    expect(calls).toBe(1);
    expect(takenAtCall).toBeGreaterThanOrEqual(PROVEN_BULK_BYTES);
    expect(takenAtCall).toBeLessThan(8 * MiB);
    w.dispose();
  });

  it('lets go of the gate then: a bulk transfer asks the kernel nothing after its first MiB', () => {
    const budget = new MemoryBudget(64 * MiB, { maxWindow: 4 * MiB });
    const sink = new Sink();
    const credit = { n: 32 * KiB };
    let asked = 0;
    let disposed = false;
    let bulk = false;
    const w = new ReceiveWindow({
      sink,
      initial: 32 * KiB,
      budget,
      direction: 'to_endpoint',
      report: (n) => {
        credit.n += n;
      },
      onBulk: () => (bulk = true),
      // A kernel that sends at once: the gate always passes, and counts how often it was asked.
      gate: { passes: () => (asked++, true), dispose: () => (disposed = true) },
    });
    for (let i = 0; i < 200 && !bulk; i++) pump(w, credit, 8 * MiB, sink);
    expect(bulk).toBe(true);
    expect(disposed).toBe(true);
    const askedByThen = asked;
    expect(askedByThen).toBeGreaterThan(0);
    for (let i = 0; i < 50; i++) pump(w, credit, 8 * MiB, sink);
    expect(sink.taken).toBeGreaterThan(PROVEN_BULK_BYTES + 8 * MiB);
    expect(asked).toBe(askedByThen);
    w.dispose();
  });

  it("is not called for a destination that took its kernel buffer's worth quickly and then stopped reading", () => {
    const budget = new MemoryBudget(64 * MiB, { maxWindow: 4 * MiB });
    let calls = 0;
    const { w, credit, sink } = connection(budget, 32 * KiB, () => calls++);
    // 128 KiB go through at once (a receive buffer filling), in whole windows: what a bulk looks like, too short.
    let sent = 0;
    while (sent < 128 * KiB) sent += pump(w, credit, 128 * KiB - sent, sink);
    sink.fast = false;
    for (let i = 0; i < 100; i++) pump(w, credit, 10 * MiB, sink);
    expect(w.size).toBeGreaterThan(32 * KiB); // the window did grow: only the unsent allowance waits for more proof
    expect(calls).toBe(0);
    w.dispose();
  });

  it('is not called for a reader that takes little at a time', () => {
    const budget = new MemoryBudget(64 * MiB, { maxWindow: 4 * MiB });
    vi.useFakeTimers();
    try {
      let calls = 0;
      const { w, credit, sink } = connection(budget, 32 * KiB, () => calls++);
      for (let i = 0; i < 3000; i++) {
        pump(w, credit, 1 * KiB, sink);
        vi.advanceTimersByTime(100);
      }
      expect(calls).toBe(0);
      w.dispose();
    } finally {
      vi.useRealTimers();
    }
  });
});

describe('ReceiveWindow.growOnceProven: a window whose sender is near', () => {
  it("keeps its initial size while a destination takes its kernel buffers' worth quickly and stops", () => {
    const budget = new MemoryBudget(64 * MiB, { maxWindow: 4 * MiB });
    const { w, credit, sink } = connection(budget, 32 * KiB, undefined, true);
    // Half a MiB in whole windows that turn over at once (what the buffers past an agent take), then a stall.
    let sent = 0;
    while (sent < 512 * KiB) sent += pump(w, credit, 512 * KiB - sent, sink);
    sink.fast = false;
    for (let i = 0; i < 100; i++) pump(w, credit, 10 * MiB, sink);
    expect(w.size).toBe(32 * KiB);
    expect(w.buffered).toBe(32 * KiB); // all it holds for the stalled destination: the initial window
    w.dispose();
  });

  it('grows like any window once PROVEN_BULK_BYTES went through', () => {
    const budget = new MemoryBudget(64 * MiB, { maxWindow: 4 * MiB });
    const { w, credit, sink } = connection(budget, 32 * KiB, undefined, true);
    while (sink.taken < PROVEN_BULK_BYTES - 64 * KiB) pump(w, credit, 8 * MiB, sink);
    expect(w.size).toBe(32 * KiB);
    for (let i = 0; i < 200; i++) pump(w, credit, 8 * MiB, sink);
    expect(w.size).toBe(4 * MiB);
    w.dispose();
  });
});

describe('MemoryBudget and growing windows', () => {
  it('a bulk transfer into a sink that keeps up grows its window to the largest, charged to the budget', () => {
    const budget = new MemoryBudget(64 * MiB, { maxWindow: 4 * MiB });
    const { w, credit, sink } = connection(budget);
    expect(budget.committed).toBe(32 * KiB);
    for (let i = 0; i < 200; i++) pump(w, credit, 8 * MiB, sink);
    expect(w.size).toBe(4 * MiB);
    expect(budget.committed).toBe(4 * MiB);
    w.dispose();
    expect(budget.committed).toBe(0);
  });

  it('a connection whose sink stops reading keeps its window: the sender is held by credit, nothing more is granted', () => {
    const budget = new MemoryBudget(64 * MiB, { maxWindow: 4 * MiB });
    const { w, sink, credit } = connection(budget);
    sink.fast = false;
    let sent = 0;
    for (let i = 0; i < 100; i++) sent += pump(w, credit, 10 * MiB, sink);
    expect(sent).toBe(32 * KiB); // the initial window, then no credit
    expect(w.buffered).toBe(32 * KiB);
    expect(budget.usageByDirection()).toEqual([{ direction: 'to_endpoint', committed: 32 * KiB, buffered: 32 * KiB }]);
    w.dispose();
    expect(budget.usageByDirection()).toEqual([{ direction: 'to_endpoint', committed: 0, buffered: 0 }]);
  });

  it('an idle connection or a sender that does not use its credit does not grow', () => {
    const budget = new MemoryBudget(64 * MiB, { maxWindow: 4 * MiB });
    vi.useFakeTimers();
    try {
      const { w, credit, sink } = connection(budget);
      // The sender sends a little at a time, far below its credit, 1 KiB every 100 ms.
      for (let i = 0; i < 1000; i++) {
        pump(w, credit, 1 * KiB, sink);
        vi.advanceTimersByTime(100);
      }
      expect(w.size).toBe(32 * KiB);
      w.dispose();
    } finally {
      vi.useRealTimers();
    }
  });

  it('one bulk transfer growing to the largest window is not a throttle: the budget was not what held it', () => {
    let throttles = 0;
    const budget = new MemoryBudget(256 * MiB, { maxWindow: 4 * MiB, onThrottle: () => throttles++ });
    // 2 MiB wants to grow threefold; only 2 MiB fit under maxWindow, and the budget has them.
    expect(budget.growth('to_agent', 2 * MiB, 32 * KiB, 6 * MiB)).toBe(2 * MiB);
    expect(budget.growth('to_agent', 4 * MiB, 32 * KiB, 12 * MiB)).toBe(0);
    expect(throttles).toBe(0);
    // A budget too small for what maxWindow would allow is a throttle.
    const small = new MemoryBudget(1 * MiB, { maxWindow: 4 * MiB, onThrottle: () => throttles++ });
    small.commit('to_agent', 900 * KiB);
    expect(small.growth('to_agent', 128 * KiB, 32 * KiB, 384 * KiB)).toBeLessThan(384 * KiB);
    expect(throttles).toBe(1);
  });

  it('1024 connections moving at once share the growth part fairly and stall within the budget; a bulk beside them still grows', () => {
    let now = 0;
    let throttles = 0;
    const budget = new MemoryBudget(64 * MiB, { maxWindow: 4 * MiB, now: () => now, onThrottle: () => throttles++ });
    const conns = Array.from({ length: 1024 }, () => connection(budget));
    // Every destination takes data for a while (a kernel buffer filling), all at the same time...
    for (let round = 0; round < 40; round++) for (const c of conns) pump(c.w, c.credit, 64 * KiB, c.sink);
    // ...then stops reading: whatever they are sent from now on stays here.
    for (const c of conns) c.sink.fast = false;
    for (let round = 0; round < 10; round++) for (const c of conns) pump(c.w, c.credit, 64 * MiB, c.sink);
    const stuck = conns.reduce((n, c) => n + c.w.buffered, 0);
    expect(throttles).toBeGreaterThan(0);
    // While they all moved, the reserve (half the limit) stayed untouched, but for what the first
    // few grew before the others started moving.
    expect(stuck).toBeLessThanOrEqual(36 * MiB);
    expect(budget.committed).toBeLessThanOrEqual(36 * MiB);
    // Two quiet epochs later only the bulk is moving: it may grow into what is free.
    now += 5000;
    const bulk = connection(budget);
    for (let i = 0; i < 200; i++) pump(bulk.w, bulk.credit, 8 * MiB, bulk.sink);
    expect(bulk.w.size).toBe(4 * MiB);
    bulk.w.dispose();
    for (const c of conns) c.w.dispose();
    expect(budget.committed).toBe(0);
    expect(budget.usageByDirection()[0]!.buffered).toBe(0);
  });

  it('stalled connections that still trickle neither grow nor count as moving: a bulk beside them grows as beside quiet ones', () => {
    vi.useFakeTimers();
    try {
      const budget = new MemoryBudget(64 * MiB, { maxWindow: 4 * MiB });
      const conns = Array.from({ length: 1024 }, () => connection(budget));
      for (let round = 0; round < 40; round++) for (const c of conns) pump(c.w, c.credit, 64 * KiB, c.sink);
      for (const c of conns) c.sink.fast = false;
      for (let round = 0; round < 10; round++) for (const c of conns) pump(c.w, c.credit, 64 * MiB, c.sink);
      const stalled = budget.committed;
      vi.advanceTimersByTime(5000);
      const bulk = connection(budget);
      for (let i = 0; i < 200; i++) {
        // Every second, every stalled connection passes a piece on and is sent as much again.
        if (i % 10 === 0) {
          vi.advanceTimersByTime(1000);
          for (const c of conns) {
            c.sink.trickle();
            pump(c.w, c.credit, 64 * MiB, c.sink);
          }
        }
        pump(bulk.w, bulk.credit, 8 * MiB, bulk.sink);
      }
      expect(bulk.w.size).toBe(4 * MiB);
      expect(budget.committed).toBe(stalled + 4 * MiB);
      // Had each trickle counted as moving, the bulk could have grown to 64 KiB at most (the growth part over 1,024).
      const counting = new MemoryBudget(64 * MiB, { maxWindow: 4 * MiB, minMovingBytes: 1 });
      for (let i = 0; i < 1024; i++) counting.markMoving({}, 16 * KiB);
      expect(counting.growth('to_endpoint', 32 * KiB, 32 * KiB, 96 * KiB)).toBeLessThanOrEqual(32 * KiB);
      bulk.w.dispose();
      for (const c of conns) c.w.dispose();
      expect(budget.committed).toBe(0);
    } finally {
      vi.useRealTimers();
    }
  });

  it('an overdrawn budget takes flushed bytes back from grown windows until it is within its limit', () => {
    const budget = new MemoryBudget(8 * MiB, { maxWindow: 4 * MiB });
    const a = connection(budget);
    for (let i = 0; i < 100; i++) pump(a.w, a.credit, 8 * MiB, a.sink);
    expect(a.w.size).toBe(4 * MiB);
    // Other connections' initial windows are granted even when the budget is short.
    const others = Array.from({ length: 200 }, () => connection(budget));
    expect(budget.overdrawn).toBe(true);
    for (let i = 0; i < 100; i++) pump(a.w, a.credit, 8 * MiB, a.sink);
    expect(a.w.size).toBe(8 * MiB - 200 * 32 * KiB);
    expect(budget.committed).toBe(8 * MiB);
    expect(budget.overdrawn).toBe(false);
    for (const o of [a, ...others]) o.w.dispose();
    expect(budget.committed).toBe(0);
  });

  it('overrun counts what a sender sent beyond its credit', () => {
    const budget = new MemoryBudget(8 * MiB, { maxWindow: 4 * MiB });
    const { w, sink } = connection(budget);
    sink.fast = false;
    w.write(Buffer.alloc(32 * KiB));
    expect(w.overrun).toBe(0);
    w.write(Buffer.alloc(10));
    expect(w.overrun).toBe(10);
    w.dispose();
  });

  it('a budget must be positive', () => {
    expect(() => new MemoryBudget(0, { maxWindow: 1 })).toThrow(/must be positive/);
  });
});

describe('bytesHeldInProcess', () => {
  it('adds up what every budget of the process holds, per direction and in all', () => {
    const start = bytesHeldInProcess();
    const a = new MemoryBudget(1 << 20, { maxWindow: 1 << 16 });
    const b = new MemoryBudget(1 << 20, { maxWindow: 1 << 16 });
    a.held('to_agent', 1000, 1000);
    b.held('to_client', 500, 500);
    expect(bytesHeldInProcess() - start).toBe(1500);
    a.held('to_agent', -1000, 0);
    b.held('to_client', -200, 300);
    expect(bytesHeldInProcess() - start).toBe(300);
    b.held('to_client', -300, 0);
    expect(bytesHeldInProcess()).toBe(start);
  });
});

describe('connectionsHoldingInProcess', () => {
  it('counts the connections that hold bytes now, across budgets, each once however much it holds', () => {
    const start = connectionsHoldingInProcess();
    const a = new MemoryBudget(1 << 20, { maxWindow: 1 << 16 });
    const b = new MemoryBudget(1 << 20, { maxWindow: 1 << 16 });
    a.held('to_agent', 1000, 1000); // connection 1 starts holding
    a.held('to_agent', 500, 1500); // and holds more
    b.held('to_client', 200, 200); // connection 2
    expect(connectionsHoldingInProcess() - start).toBe(2);
    a.held('to_agent', -1500, 0); // connection 1 passed everything on
    expect(connectionsHoldingInProcess() - start).toBe(1);
    b.held('to_client', -100, 100);
    expect(connectionsHoldingInProcess() - start).toBe(1);
    b.held('to_client', -100, 0);
    expect(connectionsHoldingInProcess()).toBe(start);
  });

  it('counts what a receive window holds while its sink has not taken it', () => {
    const start = connectionsHoldingInProcess();
    const budget = new MemoryBudget(1 << 20, { maxWindow: 1 << 16 });
    const sink = new Sink();
    const w = new ReceiveWindow({ sink, initial: 64 * KiB, budget, direction: 'to_endpoint', report: () => {} });
    w.write(Buffer.alloc(1000));
    w.write(Buffer.alloc(1000));
    expect(connectionsHoldingInProcess() - start).toBe(1);
    sink.tick();
    expect(connectionsHoldingInProcess()).toBe(start);
    w.write(Buffer.alloc(1000));
    w.dispose();
    expect(connectionsHoldingInProcess()).toBe(start);
  });
});

describe('connectionsActiveInProcess', () => {
  it('counts the connections that passed bytes on in this epoch or the last, however few, across budgets', () => {
    let t = 1_000_000;
    const now = (): number => t;
    const start = connectionsActiveInProcess();
    const a = new MemoryBudget(1 << 20, { maxWindow: 1 << 16, now });
    const b = new MemoryBudget(1 << 20, { maxWindow: 1 << 16, now });
    const conns = Array.from({ length: 5 }, () => ({}));
    for (const c of conns.slice(0, 3)) a.markMoving(c, 1000); // a trickle each, far from "moving" for the fair share
    a.markMoving(conns[0]!, 1000); // one connection, counted once
    b.markMoving(conns[3]!, 10);
    expect(connectionsActiveInProcess() - start).toBe(4);
    t += 1500; // the next epoch: the last one's still count
    expect(connectionsActiveInProcess() - start).toBe(4);
    b.markMoving(conns[4]!, 10);
    expect(connectionsActiveInProcess() - start).toBe(4); // the larger of this epoch's (1) and the last's
    t += 2500; // two epochs without a byte: none
    expect(connectionsActiveInProcess()).toBe(start);
  });
});

describe('largestBudgetInProcess', () => {
  it('is the largest limit of the budgets made so far, whatever their order', () => {
    const before = largestBudgetInProcess();
    const big = before + (1 << 30);
    new MemoryBudget(big, { maxWindow: 1 << 16 });
    new MemoryBudget(1 << 20, { maxWindow: 1 << 16 });
    expect(largestBudgetInProcess()).toBe(big);
    expect(() => new MemoryBudget(0, { maxWindow: 1 << 16 })).toThrow(/must be positive/);
    expect(largestBudgetInProcess()).toBe(big);
  });
});

describe('throttleReporter', () => {
  it('reports at most once per interval, with the count since the last report', () => {
    let now = 0;
    const seen: Array<[number, string]> = [];
    const r = throttleReporter(
      1000,
      (count, dir) => seen.push([count, dir]),
      () => now,
    );
    r('a');
    r('a');
    r('b');
    expect(seen).toEqual([[1, 'a']]);
    now = 1000;
    r('b');
    expect(seen).toEqual([
      [1, 'a'],
      [3, 'b'],
    ]);
  });
});
