// A short run of every fuzz target: its corpus replayed as it is (every fixed finding stays a regression
// test), then generated inputs from a fixed seed, steered by coverage, so a run is the same every time.
// `pnpm fuzz` runs them for minutes (README.md).
import { describe, expect, it } from 'vitest';
import { fuzzTarget } from './engine.js';
import { TARGETS } from './targets/index.js';

/** Generated inputs per target after its corpus, and a time cap for a loaded machine. */
const RUNS = 400;
const CAP_MS = 6000;
const SEED = 20261129;

describe('fuzz targets: corpus and a fixed-seed run', () => {
  for (const target of TARGETS) {
    it(`${target.name}: ${target.about.slice(0, 80)}…`, async () => {
      const r = await fuzzTarget(target, { seed: SEED, runs: RUNS, timeMs: CAP_MS });
      expect(r.failure).toBeUndefined();
      expect(r.corpusFiles).toBeGreaterThan(0);
      expect(r.executions).toBeGreaterThan(r.corpusFiles);
      // The target's code ran instrumented: the run is steered by what it reached.
      expect(r.coverage?.branches).toBeGreaterThan(0);
    }, 30_000);
  }

  it('inputs that reach new coverage join the corpus; without feedback it stays the files; a seed gives the same run', async () => {
    const target = TARGETS.find((t) => t.name === 'gateway-target')!;
    const guided = await fuzzTarget(target, { seed: SEED, runs: RUNS });
    const again = await fuzzTarget(target, { seed: SEED, runs: RUNS });
    const unguided = await fuzzTarget(target, { seed: SEED, runs: RUNS, unguided: true });
    expect(guided.corpusSize).toBeGreaterThan(guided.corpusFiles);
    expect(unguided.corpusSize).toBe(unguided.corpusFiles);
    expect({ corpus: again.corpusSize, coverage: again.coverage }).toEqual({ corpus: guided.corpusSize, coverage: guided.coverage });
  }, 30_000);
});
