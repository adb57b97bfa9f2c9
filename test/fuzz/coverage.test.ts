// The coverage map the fuzzer steers by, on counters laid out as istanbul lays them out (the fuzz targets'
// own run, fuzz.test.ts, reads real instrumented modules).
import { describe, expect, it } from 'vitest';
import { CoverageMap, describeCoverage } from './coverage.js';
import { COVERAGE_GLOBAL } from './instrument.js';

type Counters = Record<string, number> | Uint8Array;
interface File {
  path: string;
  s: Counters;
  f: Counters;
  b: Record<string, number[] | Uint8Array>;
}

const file = (path: string, statements: number, functions: number, arms: number[]): File => ({
  path,
  s: Object.fromEntries(Array.from({ length: statements }, (_, i) => [i, 0])),
  f: Object.fromEntries(Array.from({ length: functions }, (_, i) => [i, 0])),
  b: Object.fromEntries(arms.map((n, i) => [i, new Array<number>(n).fill(0)])),
});

/** What the instrumented code does: `cov().s[i]++`, on whatever the property holds now. */
const hit = (c: Counters | number[] | Uint8Array, i: number, times = 1): void => {
  for (let k = 0; k < times; k++) (c as Record<number, number>)[i]! += 1;
};

describe('coverage map', () => {
  it('new slots and new hit-count buckets are new coverage; the same again is not; modules bind as they load', () => {
    const g = globalThis as Record<string, unknown>;
    const files: Record<string, File> = { a: file('a', 3, 1, [2, 2]) };
    files['a']!.s = { 0: 5, 1: 0, 2: 0 }; // counted while the module loaded, before binding
    g[COVERAGE_GLOBAL] = files;
    const map = CoverageMap.current()!;
    expect(map).not.toBeNull();
    const a = files['a']!;
    expect(a.s).toBeInstanceOf(Uint8Array);
    expect((a.s as Uint8Array)[0]).toBe(5);
    map.reset();

    hit(a.s, 0);
    hit(a.b['0']!, 1);
    expect(map.scan()).toBe(2);
    expect(map.scan()).toBe(0); // zeroed by the scan: nothing ran
    hit(a.s, 0);
    hit(a.b['0']!, 1);
    expect(map.scan()).toBe(0);
    hit(a.s, 0, 2); // 2 hits: a bucket of its own
    expect(map.scan()).toBe(1);
    hit(a.s, 0, 5); // 4-7
    expect(map.scan()).toBe(1);
    hit(a.s, 0, 6); // 4-7 again
    expect(map.scan()).toBe(0);
    hit(a.s, 0, 200); // 128 to 255
    expect(map.scan()).toBe(1);
    hit(a.s, 0, 256); // 8 bits wrap, as AFL's do
    expect(map.scan()).toBe(0);

    // A module that loads later (a dynamic import) binds on the next scan, past the map's first size.
    files['b'] = file('b', 70_000, 2, [3]);
    const b = files['b'];
    hit(b.s, 69_999);
    expect(map.scan()).toBe(1);
    expect(b.s).toBeInstanceOf(Uint8Array);
    hit(a.s, 1); // a's counters follow the map when it grows
    hit(b.b['0']!, 2);
    expect(map.scan()).toBe(2);

    map.discard(); // work between inputs is not counted...
    hit(a.s, 2);
    map.discard();
    expect(map.scan()).toBe(0);
    const s = map.summary(); // ...and what was reached stays
    expect(s).toEqual({ modules: 2, branches: 2, branchTotal: 7, statements: 3, statementTotal: 70_003, features: 8 });
    expect(map.slotsReached()).toBe(5);
    expect(describeCoverage(s)).toBe('2 of 7 branch arms (29 %), 3 of 70003 statements, in 2 modules; 8 features');

    map.reset();
    expect(map.summary().modules).toBe(0);
    hit(a.s, 0);
    expect(map.scan()).toBe(1);
    delete g[COVERAGE_GLOBAL];
    delete g['__fuzzCoverageMap'];
  });
});
