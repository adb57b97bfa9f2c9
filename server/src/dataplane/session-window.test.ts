// SessionWindow: a session with one stream grows its window from the budget while the stream moves and
// the hub keeps reading; a second stream puts it back; a stalled stream keeps what it had; every open
// stream is charged its window; close returns it.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { MemoryBudget } from '@cluster-proxy/proto';
import { MIN_SHARED_WINDOW, SessionWindow } from './session-window.js';

const KiB = 1024;
const MiB = 1024 * KiB;

function setup(limit = 256 * MiB, sharedInitial?: number) {
  const settings: number[] = [];
  const session = {
    destroyed: false,
    settings: (s: { initialWindowSize?: number }) => {
      settings.push(s.initialWindowSize!);
    },
  };
  const budget = new MemoryBudget(limit, { maxWindow: 4 * MiB });
  const w = new SessionWindow(session as never, { initial: 64 * KiB, sharedInitial, max: 4 * MiB, budget, direction: 'to_agent' });
  /** The hub reads `total` bytes in pieces of 16 KiB, `ms` apart. */
  const read = (total: number, ms = 0): void => {
    for (let n = 0; n < total; n += 16 * KiB) {
      w.consumed(16 * KiB);
      if (ms) vi.advanceTimersByTime(ms);
    }
  };
  return { w, budget, settings, read };
}

describe('SessionWindow', () => {
  beforeEach(() => void vi.useFakeTimers());
  afterEach(() => void vi.useRealTimers());

  it('one stream moving data: the window grows fourfold to the largest, announced in SETTINGS, charged to the budget', () => {
    const { w, budget, settings, read } = setup();
    expect(budget.committed).toBe(0); // no stream, nothing the client may send
    w.streamOpened();
    expect(budget.committed).toBe(64 * KiB);
    read(16 * MiB);
    expect(w.size).toBe(4 * MiB);
    expect(settings).toEqual([256 * KiB, 1 * MiB, 4 * MiB]);
    expect(budget.committed).toBe(4 * MiB);
    w.close();
    expect(budget.committed).toBe(0);
  });

  it('a stream grows only once a MiB went through: a few hundred KiB taken quickly, then a stall (a destination that never reads), keep the initial window', () => {
    const { w, settings, read } = setup();
    w.streamOpened();
    read(512 * KiB); // quick: eight windows turned over within a second
    w.paused();
    expect(settings).toEqual([]);
    expect(w.size).toBe(64 * KiB);
    read(512 * KiB + 64 * KiB); // past the MiB, still quick: now it grows
    expect(settings).toEqual([256 * KiB]);
  });

  it('a slow stream (a window takes more than a second) does not grow; a paused one starts measuring again', () => {
    const { w, settings, read } = setup();
    w.streamOpened();
    read(1 * MiB, 400); // each 64 KiB takes 1.2 s
    expect(settings).toEqual([]);
    read(48 * KiB);
    w.paused(); // the destination stalled: what was read before says nothing
    read(16 * KiB);
    expect(settings).toEqual([]);
    read(64 * KiB);
    expect(settings).toEqual([256 * KiB]);
  });

  it("a second stream on the session puts the window back (it is every stream's); it grows again, charged for each stream; down to one, charged once", () => {
    const { w, budget, settings, read } = setup();
    w.streamOpened();
    read(2 * MiB); // the first MiB proves a bulk transfer; then 64 KiB → 256 KiB → 1 MiB
    expect(w.size).toBe(1 * MiB);
    w.streamOpened();
    expect(w.size).toBe(64 * KiB);
    expect(settings.at(-1)).toBe(64 * KiB);
    expect(budget.committed).toBe(2 * 64 * KiB);
    w.paused(); // the other stream stalled: the moving one still counts
    read(8 * MiB);
    expect(w.size).toBe(4 * MiB);
    expect(budget.committed).toBe(2 * 4 * MiB);
    w.streamClosed();
    expect(w.size).toBe(4 * MiB);
    expect(budget.committed).toBe(4 * MiB);
    w.streamClosed();
    expect(budget.committed).toBe(0); // open but no stream: nothing
    w.streamOpened();
    expect(budget.committed).toBe(4 * MiB);
    w.close();
    expect(budget.committed).toBe(0);
  });

  it('a shared session grows no further than its share of the budget over its streams; a new stream halves a grown window below it', () => {
    const { w, budget, read } = setup(64 * MiB); // 4 MiB for all streams of the session
    for (let i = 0; i < 4; i++) w.streamOpened();
    read(16 * MiB);
    expect(w.size).toBe(1 * MiB); // 4 streams x 1 MiB
    expect(budget.committed).toBe(4 * MiB);
    w.streamOpened();
    expect(w.size).toBe(512 * KiB); // halved below the share of five
    expect(budget.committed).toBe(5 * 512 * KiB);
    w.close();
    expect(budget.committed).toBe(0);
  });

  it('growth only from the budget: a short one leaves the window where it is', () => {
    const { w, settings, read } = setup(1 * MiB);
    w.streamOpened();
    read(16 * MiB);
    expect(w.size).toBeLessThanOrEqual(64 * KiB + 1 * MiB);
    expect(settings.length).toBeLessThanOrEqual(2);
  });

  it('many streams share a sixteenth of the budget: the window halves as they pass it, not below 16 KiB, and comes back once it would use half of it', () => {
    const { w, budget, settings } = setup(256 * MiB); // 16 MiB for all streams of the session
    const open = (n: number): void => {
      for (let i = 0; i < n; i++) w.streamOpened();
    };
    const close = (n: number): void => {
      for (let i = 0; i < n; i++) w.streamClosed();
    };
    open(256);
    expect(w.size).toBe(64 * KiB); // 256 x 64 KiB = 16 MiB
    expect(settings).toEqual([]);
    open(1);
    expect(w.size).toBe(32 * KiB);
    open(256);
    expect(w.size).toBe(16 * KiB);
    open(1024);
    expect(w.size).toBe(MIN_SHARED_WINDOW);
    expect(settings).toEqual([32 * KiB, 16 * KiB]);
    expect(budget.committed).toBe((256 + 1 + 256 + 1024) * MIN_SHARED_WINDOW); // past the share only by the floor
    close(1024 + 256); // 257 left: 32 KiB each would be more than half the share
    expect(w.size).toBe(16 * KiB);
    close(1);
    expect(w.size).toBe(32 * KiB);
    close(127); // 129 left
    expect(w.size).toBe(32 * KiB);
    close(1);
    expect(w.size).toBe(64 * KiB);
    expect(budget.committed).toBe(128 * 64 * KiB);
    w.close();
    expect(budget.committed).toBe(0);
  });

  it('a larger shared initial window: a single stream starts small, a second stream brings the shared one, back to one stream the small one unless it grew', () => {
    const { w, budget, settings, read } = setup(256 * MiB, 256 * KiB);
    w.streamOpened();
    expect(w.size).toBe(64 * KiB); // a konnectivity-client's session: what a stalled destination makes the hub hold
    w.streamOpened();
    expect(w.size).toBe(256 * KiB);
    expect(budget.committed).toBe(2 * 256 * KiB);
    w.streamClosed();
    expect(w.size).toBe(64 * KiB);
    expect(settings).toEqual([256 * KiB, 64 * KiB]);
    w.streamOpened(); // shared again, and moving data: it grows past the shared window
    read(2 * MiB);
    const grown = w.size;
    expect(grown).toBeGreaterThan(256 * KiB);
    w.streamClosed();
    expect(w.size).toBe(grown); // a grown window stays
    w.close();
    expect(budget.committed).toBe(0);
  });

  it('a small budget shrinks the window with fewer streams; back to one stream, it is the initial window again and may grow', () => {
    const { w, budget, settings, read } = setup(4 * MiB); // 256 KiB for all streams
    w.streamOpened();
    for (let i = 0; i < 4; i++) w.streamOpened();
    expect(w.size).toBe(32 * KiB); // 5 x 64 KiB > 256 KiB
    for (let i = 0; i < 4; i++) w.streamClosed();
    expect(w.size).toBe(64 * KiB);
    expect(settings).toEqual([32 * KiB, 64 * KiB]);
    // Around a step, no SETTINGS storm: back up only at half the share.
    for (let i = 0; i < 4; i++) w.streamOpened(); // 5 streams: 32 KiB
    for (let r = 0; r < 10; r++) {
      w.streamOpened();
      w.streamClosed();
    }
    expect(settings).toEqual([32 * KiB, 64 * KiB, 32 * KiB]);
    for (let i = 0; i < 4; i++) w.streamClosed();
    expect(w.size).toBe(64 * KiB); // one stream: its own window again
    read(1 * MiB);
    expect(w.size).toBeGreaterThan(64 * KiB);
    w.close();
    expect(budget.committed).toBe(0);
  });
});
