// A vite plugin that instruments our packages' built JavaScript with istanbul's counters, for the fuzz
// targets only: a module imported from test/fuzz/targets/ that resolves into a package's dist/ (and every
// module of ours it imports in turn) loads as `<file>?fuzz-coverage`, a copy instrumented by
// istanbul-lib-instrument (the instrumenter nyc and jest use), whose statement, branch and function counters
// land in `globalThis.__fuzzCoverage__`, where `coverage.ts` reads them after each input. Any other importer
// (every other test) gets the plain module, so the rest of the suite runs uninstrumented. `pnpm fuzz` loads
// it through test/fuzz/vite.config.ts, the suite through vitest.config.ts. Instrumenting is babel's work of
// seconds for the whole server, so each result is kept in ~/.cache/cluster-proxy/fuzz-instrument, keyed by
// the module's path and text and the instrumenter's version and options (never committed).
import { createHash } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
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

const CACHE = path.join(process.env['XDG_CACHE_HOME'] ?? path.join(os.homedir(), '.cache'), 'cluster-proxy', 'fuzz-instrument');
/** Cache entries unused this long are removed when the plugin first instruments. */
const CACHE_DAYS = 30;

const OPTIONS = { coverageVariable: COVERAGE_GLOBAL, esModules: true, compact: true, produceSourceMap: true };
const VERSION = (createRequire(import.meta.url)('istanbul-lib-instrument/package.json') as { version: string }).version;

interface Instrumented {
  code: string;
  map: unknown;
}

const withoutQuery = (id: string): string => id.replace(/[?#].*$/, '');
const isOurs = (file: string): boolean => file.endsWith('.js') && PACKAGE_DISTS.some((d) => file.startsWith(d));

export function fuzzCoverage(): Plugin {
  let instrumenter: Instrumenter | undefined;
  let pruned = false;
  const instrument = async (code: string, file: string): Promise<Instrumented> => {
    const key = createHash('sha256')
      .update(JSON.stringify([VERSION, OPTIONS, file, code]))
      .digest('hex');
    const cached = path.join(CACHE, `${key}.json`);
    try {
      return JSON.parse(readFileSync(cached, 'utf8')) as Instrumented;
    } catch {
      // not instrumented yet (or a torn entry): instrument it now
    }
    if (!instrumenter) {
      // Loaded on first use: a run that finds everything in the cache does not load babel.
      const { createInstrumenter } = await import('istanbul-lib-instrument');
      instrumenter = createInstrumenter(OPTIONS);
    }
    const out: Instrumented = { code: instrumenter.instrumentSync(code, file), map: instrumenter.lastSourceMap() };
    mkdirSync(CACHE, { recursive: true });
    if (!pruned) {
      pruned = true;
      pruneCache();
    }
    // Written whole under another name first: a parallel run never reads half an entry.
    const tmp = `${cached}.${process.pid}.tmp`;
    writeFileSync(tmp, JSON.stringify(out));
    renameSync(tmp, cached);
    return out;
  };
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
      const out = await instrument(code, withoutQuery(id));
      // The map leads back to the package's JavaScript (and vite chains that file's own map to its TypeScript).
      return { code: out.code, map: out.map as never };
    },
  };
}

function pruneCache(): void {
  const before = Date.now() - CACHE_DAYS * 86_400_000;
  for (const name of readdirSync(CACHE)) {
    const file = path.join(CACHE, name);
    try {
      const s = statSync(file);
      if (s.atimeMs < before && s.mtimeMs < before) rmSync(file, { force: true });
    } catch {
      // gone already (a parallel run pruned it)
    }
  }
}
