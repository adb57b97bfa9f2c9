import { PerformanceObserver, constants } from 'node:perf_hooks';
import { MemoryBudget } from '@cluster-proxy/proto';
import { describe, expect, it } from 'vitest';
import { DeadBufferGovernor, TIGHT_DEAD_BUFFER_ALLOWANCE, TIGHT_WINDOW, WINDOW } from './dead-buffers.js';

const MiB = 1024 * 1024;
const minor = { detail: { kind: constants.NODE_PERFORMANCE_GC_MINOR } };
const major = { detail: { kind: constants.NODE_PERFORMANCE_GC_MAJOR } };

/** A governor over a settable Buffer count, counting the full collections it asks for. */
function governed(
  allowance = 32 * MiB,
  tight = (): boolean => false,
): { gov: DeadBufferGovernor; window: (...mib: number[]) => void; asked: () => number } {
  let bytes = 0;
  let asked = 0;
  const gov = new DeadBufferGovernor({ allowance, arrayBuffers: () => bytes, collect: () => void asked++, tight });
  /** One window of young collections, reading these values in turn (the last repeated to fill it). */
  const window = (...mib: number[]): void => {
    for (let i = 0; i < (tight() ? TIGHT_WINDOW : WINDOW); i++) {
      bytes = mib[Math.min(i, mib.length - 1)]! * MiB;
      gov.afterCollection(minor);
    }
  };
  return { gov, window, asked: () => asked };
}

describe('DeadBufferGovernor', () => {
  it('asks for a full collection once the least reading of a window grew past the allowance, and once only until it comes', () => {
    const { gov, window, asked } = governed();
    for (const mib of [10, 20, 30, 40]) window(mib);
    expect(asked()).toBe(0); // 10 → 40: within 32 MiB of the least seen
    window(43);
    expect(asked()).toBe(1);
    window(90);
    expect(asked()).toBe(1); // asked already; the full collection has not run yet
    expect(gov.asks).toBe(1);
  });

  it('starts over from what the collections after a full one see (freed Buffers leave the count as they are swept)', () => {
    const { gov, window, asked } = governed();
    window(10);
    window(50);
    expect(asked()).toBe(1);
    gov.afterCollection(major); // the count still holds what it is sweeping
    window(60, 45); // live: 45 MiB (connections hold that much): the new floor
    window(70);
    expect(asked()).toBe(1);
    window(78);
    expect(asked()).toBe(2);
  });

  it('while the budgets are tight, asks once the least reading of a shorter window grew past the smaller allowance', () => {
    let tight = false;
    const { window, asked } = governed(32 * MiB, () => tight);
    window(10);
    window(10 + TIGHT_DEAD_BUFFER_ALLOWANCE / MiB + 2);
    expect(asked()).toBe(0); // relaxed: within 32 MiB
    tight = true; // stuck connections hold an eighth of the budget now
    window(12 + TIGHT_DEAD_BUFFER_ALLOWANCE / MiB);
    expect(asked()).toBe(1);
    expect(TIGHT_WINDOW).toBeLessThan(WINDOW);
    expect(TIGHT_DEAD_BUFFER_ALLOWANCE).toBeLessThan(32 * MiB);
  });

  it('is tight by itself while many connections pass bytes on at once, none of them holding any (stuck ones filling)', () => {
    let bytes = 0;
    let asked = 0;
    const budget = new MemoryBudget(256 * MiB, { maxWindow: 1 * MiB });
    const gov = new DeadBufferGovernor({ arrayBuffers: () => bytes, collect: () => void asked++, held: () => 0 });
    const readings = (mib: number, n: number): void => {
      bytes = mib * MiB;
      for (let i = 0; i < n; i++) gov.afterCollection(minor);
    };
    readings(10, WINDOW);
    readings(10 + TIGHT_DEAD_BUFFER_ALLOWANCE / MiB + 2, WINDOW);
    expect(asked).toBe(0); // few connections: the usual allowance
    const conns = Array.from({ length: 64 }, () => ({}));
    for (const c of conns) budget.markMoving(c, 4096); // a trickle each
    readings(12 + TIGHT_DEAD_BUFFER_ALLOWANCE / MiB, TIGHT_WINDOW);
    expect(asked).toBe(1);
  });

  it('leaves a bulk transfer alone: young collections free its Buffers, so each window comes back down', () => {
    const { window, asked } = governed();
    for (let i = 0; i < 1000; i++) window(60, 90, 45, 4, 80);
    expect(asked()).toBe(0);
  });

  it('asks for a full collection once the budgets hold more than the allowance less than they did since the last (connections ended)', () => {
    let held = 0;
    let asked = 0;
    const gov = new DeadBufferGovernor({ arrayBuffers: () => 0, held: () => held, collect: () => void asked++ });
    held = 180 * MiB; // a thousand stuck connections
    gov.checkReleased();
    held = 150 * MiB;
    gov.checkReleased();
    expect(asked).toBe(0); // 30 MiB released: within the allowance
    held = 10 * MiB; // their clients left
    gov.checkReleased();
    expect(asked).toBe(1);
    gov.checkReleased();
    expect(asked).toBe(1); // asked already
    gov.afterCollection(major); // the peak starts over from what is held now
    held = 30 * MiB;
    gov.checkReleased();
    held = 5 * MiB;
    gov.checkReleased();
    expect(asked).toBe(1);
    gov.afterCollection(minor); // young collections look too
    held = 0;
    gov.afterCollection(minor);
    expect(asked).toBe(1);
    held = 60 * MiB;
    gov.afterCollection(minor);
    held = 20 * MiB;
    gov.afterCollection(minor);
    expect(asked).toBe(2);
  });

  it('asks once for a full collection when a quiet process holds more Buffers than the last one left (a transfer ended)', () => {
    let bytes = 0;
    let asked = 0;
    const gov = new DeadBufferGovernor({ arrayBuffers: () => bytes, held: () => 0, collect: () => void asked++ });
    gov.afterCollection(major);
    bytes = 40 * MiB; // held for stuck connections: live
    gov.tick(); // the first tick after a full collection learns what is live
    gov.tick();
    expect(asked).toBe(0); // quiet, but no more than is live
    bytes = 50 * MiB;
    gov.afterCollection(minor); // a transfer runs
    gov.tick();
    expect(asked).toBe(0); // not quiet
    bytes = 60 * MiB; // it ended; its Buffers are dead
    gov.tick();
    expect(asked).toBe(1); // quiet, 20 MiB over what was live
    gov.tick();
    expect(asked).toBe(1); // asked already
    gov.afterCollection(major);
    bytes = 41 * MiB;
    gov.tick();
    gov.tick();
    expect(asked).toBe(1); // what the collection left is live
  });

  it('asks V8 itself: a full collection runs (gc() exposed at run time, no node flag)', async () => {
    let reading = 0;
    const gov = new DeadBufferGovernor({ allowance: 0, arrayBuffers: () => reading++ * MiB });
    let majors = 0;
    const obs = new PerformanceObserver((list) => {
      for (const e of list.getEntries())
        if ((e as { detail?: { kind?: number } }).detail?.kind === constants.NODE_PERFORMANCE_GC_MAJOR) majors++;
    });
    obs.observe({ entryTypes: ['gc'] });
    try {
      for (let i = 0; i < 2 * WINDOW; i++) gov.afterCollection(minor); // the second window's least is above the first's
      expect(gov.asks).toBe(1);
      for (let i = 0; i < 100 && majors === 0; i++) await new Promise((r) => setTimeout(r, 20));
      expect(majors).toBeGreaterThan(0);
    } finally {
      obs.disconnect();
    }
  });

  it('observes the collections V8 reports, and stops when told', async () => {
    let looked = 0;
    const gov = new DeadBufferGovernor({ arrayBuffers: () => (looked++, 0), collect: () => {} });
    gov.start();
    try {
      for (let i = 0; i < 200 && looked === 0; i++) await churn();
      expect(looked).toBeGreaterThan(0);
    } finally {
      gov.stop();
    }
    // A second governor, started now, sees the collections from here on: once it has seen one, a
    // report queued for the first has arrived too; once it has seen another, the first saw none of it.
    let witnessed = 0;
    const witness = new DeadBufferGovernor({ arrayBuffers: () => (witnessed++, 0), collect: () => {} });
    witness.start();
    try {
      for (let i = 0; i < 200 && witnessed === 0; i++) await churn();
      const seen = looked;
      const before = witnessed;
      for (let i = 0; i < 200 && witnessed === before; i++) await churn();
      expect(witnessed).toBeGreaterThan(before);
      expect(looked).toBe(seen);
    } finally {
      witness.stop();
    }
  });
});

/** Short-lived objects, enough for V8 to run young collections (and report them). */
async function churn(): Promise<void> {
  const junk: object[] = [];
  for (let j = 0; j < 50_000; j++) {
    junk.push({ j });
    if (junk.length > 100) junk.length = 0;
  }
  await new Promise((r) => setTimeout(r, 5));
}
