import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { LAUNCH_FLAGS, tuneGarbageCollector, youngCapacityFlagFor } from './gc-tuning.js';

// The child runs the built module (the suite builds before it runs).
const tuning = fileURLToPath(new URL('../../dist/memory/gc-tuning.js', import.meta.url));
const MiB = 1024 * 1024;

/** Full (mark-compact) collections while a child allocates 2 GiB of short-lived 16 KiB Buffers, as
 * TLS reads do; with the tuning (node started with LAUNCH_FLAGS, then the run-time flag) or without. */
function majorCollections(tuned: boolean): { applied: boolean; major: number } {
  const script = `
    const { PerformanceObserver, constants } = require('node:perf_hooks');
    (async () => {
      const applied = ${tuned} ? (await import(${JSON.stringify(tuning)})).tuneGarbageCollector() : false;
      let major = 0;
      const obs = new PerformanceObserver((l) => { for (const e of l.getEntries()) if (e.detail.kind === constants.NODE_PERFORMANCE_GC_MAJOR) major++; });
      obs.observe({ entryTypes: ['gc'] });
      const inFlight = [];
      for (let i = 0; i < 131072; i++) {
        inFlight.push(Buffer.allocUnsafeSlow(16384).fill(1));
        if (inFlight.length > 64) inFlight.shift();
        if (i % 1024 === 0) await new Promise((r) => setImmediate(r));
      }
      setTimeout(() => { obs.disconnect(); process.stdout.write(JSON.stringify({ applied, major })); }, 50);
    })();`;
  return JSON.parse(
    execFileSync(process.execPath, [...(tuned ? LAUNCH_FLAGS : []), '-e', script], { encoding: 'utf8', timeout: 60_000 }),
  ) as { applied: boolean; major: number };
}

describe('tuneGarbageCollector', () => {
  it('applies only on the Node.js line it was measured on, and only with node launched with LAUNCH_FLAGS', () => {
    expect(tuneGarbageCollector('20.20.2', LAUNCH_FLAGS)).toBe(false);
    expect(tuneGarbageCollector('not-a-version', LAUNCH_FLAGS)).toBe(false);
    expect(tuneGarbageCollector('24.21.0', [])).toBe(false);
    expect(tuneGarbageCollector('24.21.0', LAUNCH_FLAGS.slice(1))).toBe(false);
  });

  it.runIf(process.versions.node.startsWith('24.'))('short-lived Buffers no longer start full collections', (ctx) => {
    const tuned = majorCollections(true);
    expect(tuned.applied).toBe(true);
    const untuned = majorCollections(false);
    expect(untuned.applied).toBe(false);
    // Untuned, V8 starts one every 64 MiB of external memory unless young collections happen to free the
    // Buffers first (about 16-30 for 2 GiB here; a busy machine has seen fewer): compare only when the
    // default showed its cost.
    if (untuned.major < 8) return ctx.skip(`V8's default started only ${untuned.major} full collections this time`);
    expect(tuned.major).toBeLessThanOrEqual(Math.floor(untuned.major / 4));
  });
});

/** The most ArrayBuffers held while a tuned child allocates 512 MiB of 16 KiB Buffers, 64 in flight
 * (1 MiB live), with few JavaScript objects per byte as TLS reads have; young Buffers limited as given
 * (bytes, or 'default': set low, then given back). */
function peakYoungBuffers(limit: number | 'default' | 'untouched'): number {
  const script = `
    (async () => {
      const t = await import(${JSON.stringify(tuning)});
      if (!t.tuneGarbageCollector()) throw new Error('not tuned');
      const limit = ${JSON.stringify(limit)};
      if (limit !== 'untouched') t.collectYoungBuffersAt(8 * 1024 * 1024);
      if (limit === 'default') t.collectYoungBuffersAt(null);
      else if (typeof limit === 'number') t.collectYoungBuffersAt(limit);
      let peak = 0;
      const inFlight = [];
      for (let i = 0; i < 32768; i++) {
        inFlight.push(Buffer.allocUnsafeSlow(16384));
        if (inFlight.length > 64) inFlight.shift();
        if (i % 64 === 0) peak = Math.max(peak, process.memoryUsage().arrayBuffers);
        if (i % 1024 === 0) await new Promise((r) => setImmediate(r));
      }
      process.stdout.write(String(peak));
    })();`;
  return Number(execFileSync(process.execPath, [...LAUNCH_FLAGS, '-e', script], { encoding: 'utf8', timeout: 60_000 }));
}

describe('collectYoungBuffersAt', () => {
  it('maps bytes to the V8 flag, doubled without pointer compression, at least 1', () => {
    expect(youngCapacityFlagFor(8 * MiB, false)).toBe(2);
    expect(youngCapacityFlagFor(8 * MiB, true)).toBe(4);
    expect(youngCapacityFlagFor(128 * MiB, false)).toBe(32); // V8's default
    expect(youngCapacityFlagFor(1024, false)).toBe(1);
  });

  it.runIf(process.versions.node.startsWith('24.'))(
    'keeps dead young Buffers near the limit set, and V8 lets them pile up again once given back',
    (ctx) => {
      const untouched = peakYoungBuffers('untouched');
      // Young collections that the Buffers' few objects start on their own may have freed them anyway.
      if (untouched < 40 * MiB) return ctx.skip(`young collections kept Buffers at ${(untouched / MiB).toFixed(0)} MiB without the limit`);
      expect(peakYoungBuffers(8 * MiB)).toBeLessThan(24 * MiB);
      expect(peakYoungBuffers('default')).toBeGreaterThan(40 * MiB);
    },
  );
});

describe('LAUNCH_FLAGS', () => {
  const repo = fileURLToPath(new URL('../../../', import.meta.url));
  const read = (file: string): string => readFileSync(path.join(repo, file), 'utf8');
  it('every launcher of the hub and the agent starts node with them', () => {
    const launchers: [string, string][] = [
      ['cli/src/main.ts (its first line)', read('cli/src/main.ts').split('\n')[0]!],
      ['deploy/Dockerfile ENTRYPOINT', /^ENTRYPOINT .*$/m.exec(read('deploy/Dockerfile'))?.[0] ?? ''],
      ['scripts/build-image.sh --entrypoint', /--entrypoint .*$/m.exec(read('scripts/build-image.sh'))?.[0] ?? ''],
      [
        'scripts/pack.mjs (the packed command)',
        /#!\/usr\/bin\/env -S node \$\{LAUNCH_FLAGS\.join\(' '\)\}/.exec(read('scripts/pack.mjs'))?.[0] ?? '',
      ],
    ];
    for (const [where, line] of launchers) {
      if (where.startsWith('scripts/pack.mjs')) expect(line, where).not.toBe('');
      else for (const flag of LAUNCH_FLAGS) expect(line, where).toContain(flag);
    }
  });
});
