// A coverage-guided mutational fuzzer on fast-check. Every input is a corpus file (replayed as it is first),
// a corpus entry mutated (bit flips, byte and length overwrites, inserted, deleted, duplicated or spliced
// ranges), a target's own structured input, or random bytes. Our packages' code runs instrumented
// (instrument.ts) and after each input its counters are read (coverage.ts): an input that reaches a
// statement, branch arm or function not reached before, or reaches one a number of times in a bucket not
// seen before, joins the in-memory corpus that later mutations start from, as in libFuzzer. fast-check
// makes the stream reproducible from a seed (the feedback is deterministic too) and shrinks a failure.
import { createHash } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Duplex } from 'node:stream';
import { fileURLToPath } from 'node:url';
import fc from 'fast-check';
import { CoverageMap, type CoverageSummary } from './coverage.js';

export { fc };
export type { CoverageSummary };

export interface FuzzTarget {
  name: string;
  /** What the target reads and which properties it asserts (one line, for the runner's list). */
  about: string;
  /** Structured inputs of its own, besides corpus mutations and random bytes. */
  generate?: fc.Arbitrary<Buffer>;
  /** Inputs made at run time that mutations start from too (signed with this run's keys, say). */
  seeds?(): Buffer[];
  /** Checks one input: throws (or rejects) when a property does not hold. */
  run(input: Buffer): void | Promise<void>;
  /** Runs once before the first input and once after the last (servers, processes). */
  setup?(): Promise<void>;
  teardown?(): Promise<void>;
}

export const FUZZ_DIR = path.dirname(fileURLToPath(import.meta.url));
export const CORPUS_DIR = path.join(FUZZ_DIR, 'corpus');
export const FINDINGS_DIR = path.join(FUZZ_DIR, 'findings');

export function readCorpus(target: string): { file: string; data: Buffer }[] {
  const dir = path.join(CORPUS_DIR, target);
  let names: string[];
  try {
    names = readdirSync(dir)
      .filter((n) => !n.startsWith('.'))
      .sort();
  } catch {
    return [];
  }
  return names.map((n) => ({ file: path.join(dir, n), data: readFileSync(path.join(dir, n)) }));
}

/** Values that find off-by-ones and overflows in lengths and counts. */
const INTERESTING_32 = [
  0, 1, 2, 4, 5, 127, 128, 255, 256, 0x3fff, 0x4000, 0xffff, 0x10000, 0x100000, 0x400400, 0x7fffffff, 0x80000000, 0xffffffff,
];

type Mutation = (b: Buffer, other: Buffer) => Buffer;

const at = (b: Buffer, p: number): number => (b.length === 0 ? 0 : p % b.length);

const mutation: fc.Arbitrary<Mutation> = fc.oneof(
  fc.record({ p: fc.nat(), bit: fc.integer({ min: 0, max: 7 }) }).map(
    ({ p, bit }): Mutation =>
      (b) => {
        if (b.length === 0) return b;
        const c = Buffer.from(b);
        c[at(c, p)]! ^= 1 << bit;
        return c;
      },
  ),
  fc.record({ p: fc.nat(), v: fc.integer({ min: 0, max: 255 }) }).map(
    ({ p, v }): Mutation =>
      (b) => {
        if (b.length === 0) return Buffer.from([v]);
        const c = Buffer.from(b);
        c[at(c, p)] = v;
        return c;
      },
  ),
  fc.record({ p: fc.nat(), v: fc.constantFrom(...INTERESTING_32), width: fc.constantFrom(1, 2, 4) }).map(
    ({ p, v, width }): Mutation =>
      (b) => {
        if (b.length < width) return b;
        const c = Buffer.from(b);
        const i = p % (c.length - width + 1);
        if (width === 1) c[i] = v & 0xff;
        else if (width === 2) c.writeUInt16BE(v & 0xffff, i);
        else c.writeUInt32BE(v >>> 0, i);
        return c;
      },
  ),
  fc.record({ p: fc.nat(), bytes: fc.uint8Array({ minLength: 1, maxLength: 16 }) }).map(
    ({ p, bytes }): Mutation =>
      (b) => {
        const i = b.length === 0 ? 0 : p % (b.length + 1);
        return Buffer.concat([b.subarray(0, i), bytes, b.subarray(i)]);
      },
  ),
  fc.record({ p: fc.nat(), n: fc.integer({ min: 1, max: 64 }) }).map(
    ({ p, n }): Mutation =>
      (b) => {
        if (b.length === 0) return b;
        const i = at(b, p);
        return Buffer.concat([b.subarray(0, i), b.subarray(Math.min(b.length, i + n))]);
      },
  ),
  fc.record({ p: fc.nat(), n: fc.integer({ min: 1, max: 64 }), times: fc.integer({ min: 1, max: 8 }) }).map(
    ({ p, n, times }): Mutation =>
      (b) => {
        if (b.length === 0) return b;
        const i = at(b, p);
        const piece = b.subarray(i, Math.min(b.length, i + n));
        return Buffer.concat([b.subarray(0, i), ...new Array<Buffer>(times).fill(piece), b.subarray(i)]);
      },
  ),
  fc.record({ p: fc.nat(), q: fc.nat() }).map(
    ({ p, q }): Mutation =>
      (b, other) => {
        // Splice: the head of this input, the tail of another.
        const i = b.length === 0 ? 0 : p % (b.length + 1);
        const j = other.length === 0 ? 0 : q % (other.length + 1);
        return Buffer.concat([b.subarray(0, i), other.subarray(j)]);
      },
  ),
  fc.nat().map(
    (p): Mutation =>
      (b) =>
        b.subarray(0, b.length === 0 ? 0 : p % (b.length + 1)),
  ),
);

/** Inputs for a target: mutated corpus files most of the time, its own generator, random bytes. */
export function inputs(target: FuzzTarget, corpus: readonly Buffer[]): fc.Arbitrary<Buffer> {
  const seeds = corpus.length > 0 ? corpus : [Buffer.alloc(0)];
  const mutated = fc.tuple(fc.nat(), fc.nat(), fc.array(mutation, { minLength: 1, maxLength: 6 })).map(([i, j, ms]) => {
    const other = seeds[j % seeds.length]!;
    return ms.reduce((b, m) => m(b, other), seeds[i % seeds.length]!);
  });
  const random = fc.uint8Array({ maxLength: 512 }).map((a) => Buffer.from(a));
  const own: fc.WeightedArbitrary<Buffer>[] = target.generate ? [{ arbitrary: target.generate, weight: 3 }] : [];
  return fc.oneof({ arbitrary: mutated, weight: 6 }, ...own, { arbitrary: random, weight: 1 });
}

export interface FuzzOptions {
  seed: number;
  /** Stop after this many generated inputs (the corpus replay comes on top)... */
  runs?: number;
  /** ...or after this long, whichever comes first. */
  timeMs?: number;
  /** Where a failing input is written (the long runner); nothing is written without it. */
  findingsDir?: string;
  /** No feedback: the corpus stays the files it starts from (coverage is still measured), for comparison. */
  unguided?: boolean;
  /** Where the inputs that added coverage are written, minimized, as `<dir>/<target>/cov-<hash>`. */
  saveCorpusDir?: string;
}

export interface FuzzResult {
  target: string;
  /** Inputs run: the corpus replay and the generated ones. */
  executions: number;
  corpusFiles: number;
  /** The in-memory corpus at the end: the files, the target's run-time seeds and the inputs that added coverage. */
  corpusSize: number;
  ms: number;
  /** What the inputs reached in our packages' code (the Go differential has none)... */
  coverage?: CoverageSummary;
  /** ...and where the branch arms they did not take are, per module. */
  untaken?: string[];
  /** The first property that failed, with the (shrunk) input, as a message; undefined: none failed. */
  failure?: string;
  /** Where the failing input was saved. */
  savedTo?: string;
  /** How many new-coverage inputs were written to `saveCorpusDir` (after minimizing). */
  saved?: number;
}

/** One line about a failing input: its size, its first bytes in hex, what went wrong. */
function describe(input: Buffer, err: unknown): string {
  const e = err as Error;
  const first = input.subarray(0, 48).toString('hex');
  return `${input.length}-byte input ${first}${input.length > 48 ? '…' : ''}: ${e?.stack ?? String(err)}`;
}

function coverageMap(): CoverageMap {
  const map = CoverageMap.current();
  if (!map) {
    throw new Error(
      'the fuzz targets run uninstrumented: run them through `pnpm fuzz` or vitest, whose configs load instrument.ts (test/fuzz/README.md)',
    );
  }
  return map;
}

export async function fuzzTarget(target: FuzzTarget, opts: FuzzOptions): Promise<FuzzResult> {
  const started = Date.now();
  const files = readCorpus(target.name);
  const cov = coverageMap();
  const guided = !opts.unguided;
  let executions = 0;
  /** The corpus mutations draw from; grows while fuzzing (the arbitrary reads it live). */
  const pool: Buffer[] = [];
  /** Inputs that added coverage, in the order found. */
  const added: Buffer[] = [];
  let coverage: CoverageSummary | undefined;
  let untaken: string[] | undefined;
  const result = (extra: Partial<FuzzResult>): FuzzResult => ({
    target: target.name,
    executions,
    corpusFiles: files.length,
    corpusSize: pool.length,
    ms: Date.now() - started,
    coverage: (coverage ??= cov.summary()),
    untaken: (untaken ??= cov.untaken(path.resolve(FUZZ_DIR, '../..'))),
    ...extra,
  });
  await target.setup?.();
  cov.reset();
  try {
    // The corpus first, each file as it is: every fixed finding stays a regression test.
    for (const { file, data } of files) {
      executions++;
      try {
        await target.run(data);
      } catch (err) {
        return result({ failure: `corpus file ${path.relative(FUZZ_DIR, file)}: ${describe(data, err)}` });
      }
      cov.scan();
      pool.push(data);
    }
    pool.push(...(target.seeds?.() ?? []));
    if (pool.length === 0) pool.push(Buffer.alloc(0));
    const timeMs = opts.timeMs ?? Number.POSITIVE_INFINITY;
    const left = timeMs - (Date.now() - started);
    let growing = guided;
    const out =
      left <= 0
        ? null
        : await fc.check(
            fc.asyncProperty(inputs(target, pool), async (input) => {
              executions++;
              try {
                await target.run(input);
              } catch (err) {
                // Shrinking runs the property again on smaller inputs: they must not join the corpus.
                growing = false;
                throw err;
              }
              // Read after every input in both modes: the 8-bit counters would wrap over a whole run.
              if (cov.scan() > 0 && growing) {
                pool.push(input);
                added.push(input);
              }
            }),
            {
              seed: opts.seed,
              numRuns: opts.runs ?? Number.MAX_SAFE_INTEGER,
              ...(Number.isFinite(left) ? { interruptAfterTimeLimit: left, markInterruptAsFailure: false } : {}),
              // Shrinking a failure is worth its time, but not unbounded.
              endOnFailure: false,
              skipEqualValues: false,
            },
          );
    coverage = cov.summary();
    untaken = cov.untaken(path.resolve(FUZZ_DIR, '../..'));
    const saved = opts.saveCorpusDir && added.length > 0 ? await saveCorpus(target, files, added, opts.saveCorpusDir) : undefined;
    const extra = saved === undefined ? {} : { saved };
    if (!out?.failed || !out.counterexample) return result(extra);
    const [input] = out.counterexample;
    const message = `${describe(input, out.errorInstance)} (seed ${opts.seed}, path ${out.counterexamplePath ?? ''})`;
    if (!opts.findingsDir) return result({ ...extra, failure: message });
    const dir = path.join(opts.findingsDir, target.name);
    mkdirSync(dir, { recursive: true });
    const file = path.join(dir, hashName(input));
    writeFileSync(file, input);
    return result({ ...extra, failure: message, savedTo: file });
  } finally {
    await target.teardown?.();
  }
}

const hashName = (input: Buffer): string => createHash('sha1').update(input).digest('hex').slice(0, 16);

/**
 * Writes the inputs that added coverage, minimized for keeping: from nothing reached, the corpus files are
 * replayed, then the new inputs smallest first, and an input is kept only if it reaches a statement, function
 * or branch arm the ones before it did not (a new hit count alone steers a run but is not worth a file).
 * Returns how many were written.
 */
async function saveCorpus(target: FuzzTarget, files: { data: Buffer }[], added: Buffer[], dir: string): Promise<number> {
  const cov = coverageMap();
  cov.reset();
  const replay = async (input: Buffer): Promise<void> => {
    try {
      await target.run(input);
    } catch {
      // An input that fails now (a flaky property) is no corpus file; the run reports failures itself.
    }
    cov.scan();
  };
  for (const { data } of files) await replay(data);
  const out = path.join(dir, target.name);
  mkdirSync(out, { recursive: true });
  let kept = 0;
  for (const input of [...added].sort((a, b) => a.length - b.length)) {
    const before = cov.slotsReached();
    await replay(input);
    if (cov.slotsReached() === before) continue;
    writeFileSync(path.join(out, `cov-${hashName(input)}`), input);
    kept++;
  }
  return kept;
}

// --- helpers the targets share -------------------------------------------------------------------------

export class PropertyError extends Error {
  override name = 'PropertyError';
}

export function check(condition: unknown, what: string): asserts condition {
  if (!condition) throw new PropertyError(what);
}

/** An error users see: one line, not empty, no stack or object dump in it. */
export function checkOneLine(message: string, where: string): void {
  check(typeof message === 'string' && message.trim() !== '', `${where}: empty error message`);
  check(!/[\r\n]/.test(message), `${where}: error message is not one line: ${JSON.stringify(message)}`);
  check(message.length <= 2048, `${where}: error message of ${message.length} characters`);
  check(!/\[object |undefined|NaN/.test(message), `${where}: error message leaks an internal value: ${JSON.stringify(message)}`);
}

/** Rough bytes a value holds: strings at 2 bytes a character, buffers at their length, 16 per slot. */
export function heldBytes(v: unknown, seen = new Set<unknown>()): number {
  if (v === null || v === undefined) return 0;
  if (typeof v === 'string') return 16 + 2 * v.length;
  if (typeof v !== 'object') return 16;
  if (seen.has(v)) return 0;
  seen.add(v);
  if (Buffer.isBuffer(v) || v instanceof Uint8Array) return 16 + v.byteLength;
  let n = 16;
  if (v instanceof Map) for (const [k, x] of v) n += heldBytes(k, seen) + heldBytes(x, seen);
  else for (const x of Object.values(v)) n += 16 + heldBytes(x, seen);
  return n;
}

/** The memory property: what a parser holds for an input of N bytes stays under 1,000 × N (and a floor). */
export function checkBounded(held: number, inputBytes: number, where: string): void {
  const limit = 1000 * inputBytes + 64 * 1024;
  check(held <= limit, `${where}: holds ${held} bytes for a ${inputBytes}-byte input (limit ${limit})`);
}

/** Resolves with `p`, or fails when it takes longer than `ms`: no input may make a parser wait forever. */
export async function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      p,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new PropertyError(`${what}: still waiting after ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** An in-memory socket for a parser under test: what it is pushed is the peer's bytes; `written()` counts what the parser wrote back. */
export function memorySocket(): { socket: Duplex; written: () => number } {
  let written = 0;
  const socket = new Duplex({
    read() {},
    write(chunk: Buffer, _enc, cb) {
      written += chunk.length;
      cb();
    },
  });
  return { socket, written: () => written };
}

/** Splits `input` into chunks at the cut points its own bytes choose (so a replay cuts the same way). */
export function chunksOf(input: Buffer, salt: number): Buffer[] {
  const out: Buffer[] = [];
  let i = 0;
  let k = salt;
  while (i < input.length) {
    k = (k * 1103515245 + 12345 + (input[i] ?? 0)) >>> 0;
    const n = 1 + (k % 23 === 0 ? input.length : k % 97);
    out.push(input.subarray(i, i + n));
    i += n;
  }
  return out;
}
