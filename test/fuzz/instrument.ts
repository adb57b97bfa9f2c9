// A vite plugin that instruments our packages' built JavaScript with istanbul's counters, for the fuzz
// targets only: a module imported from test/fuzz/targets/ that resolves into a package's dist/ (and every
// module of ours it imports in turn) loads as `<file>?fuzz-coverage`, a copy instrumented by
// istanbul-lib-instrument (the instrumenter nyc and jest use), whose statement, branch and function counters
// land in `globalThis.__fuzzCoverage__`, where `coverage.ts` reads them after each input. Any other importer
// (every other test) gets the plain module, so the rest of the suite runs uninstrumented. `pnpm fuzz` loads
// it through test/fuzz/vite.config.ts, the suite through vitest.config.ts.
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Instrumenter } from 'istanbul-lib-instrument';
import type { Plugin } from 'vitest/config';

/** Where the counters of every instrumented module live (one entry per file). */
export const COVERAGE_GLOBAL = '__fuzzCoverage__';
const QUERY = '?fuzz-coverage';

const FUZZ_DIR = path.dirname(fileURLToPath(import.meta.url));
const ROOT = path.resolve(FUZZ_DIR, '../..');
const TARGETS_DIR = path.join(FUZZ_DIR, 'targets') + path.sep;
const PACKAGE_DISTS = ['proto', 'server', 'agent', 'client', 'cli'].map((p) => path.join(ROOT, p, 'dist') + path.sep);

const withoutQuery = (id: string): string => id.replace(/[?#].*$/, '');
const isOurs = (file: string): boolean => file.endsWith('.js') && PACKAGE_DISTS.some((d) => file.startsWith(d));

export function fuzzCoverage(): Plugin {
  let instrumenter: Instrumenter | undefined;
  return {
    name: 'fuzz-coverage',
    enforce: 'pre',
    async resolveId(source, importer, options) {
      if (!importer) return null;
      if (!importer.endsWith(QUERY) && !withoutQuery(importer).startsWith(TARGETS_DIR)) return null;
      const resolved = await this.resolve(source, importer, { ...options, skipSelf: true });
      if (!resolved || resolved.external || !isOurs(withoutQuery(resolved.id))) return resolved;
      return { ...resolved, id: withoutQuery(resolved.id) + QUERY };
    },
    async transform(code, id) {
      if (!id.endsWith(QUERY)) return null;
      if (!instrumenter) {
        // Loaded on first use: a run that instruments nothing does not pay for babel.
        const { createInstrumenter } = await import('istanbul-lib-instrument');
        instrumenter = createInstrumenter({
          coverageVariable: COVERAGE_GLOBAL,
          esModules: true,
          compact: true,
          produceSourceMap: false,
        });
      }
      const out = instrumenter.instrumentSync(code, withoutQuery(id));
      return { code: out, map: null };
    },
  };
}
