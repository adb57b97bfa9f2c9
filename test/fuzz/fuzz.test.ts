// A short run of every fuzz target: its corpus replayed as it is (every fixed finding stays a regression
// test), then generated inputs from a fixed seed, so a run is the same every time. `pnpm fuzz` runs them
// for minutes (README.md).
import { describe, expect, it } from 'vitest';
import { fuzzTarget } from './engine.js';
import { TARGETS } from './targets/index.js';

/** Generated inputs per target after its corpus, and a time cap for a loaded machine. */
const RUNS = 400;
const CAP_MS = 6000;

describe('fuzz targets: corpus and a fixed-seed run', () => {
  for (const target of TARGETS) {
    it(`${target.name}: ${target.about.slice(0, 80)}…`, async () => {
      const r = await fuzzTarget(target, { seed: 20261129, runs: RUNS, timeMs: CAP_MS });
      expect(r.failure).toBeUndefined();
      expect(r.corpusFiles).toBeGreaterThan(0);
      expect(r.executions).toBeGreaterThan(r.corpusFiles);
    }, 30_000);
  }
});
