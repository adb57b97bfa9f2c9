// The counters of the instrumented modules (instrument.ts) as one map, read after each input the way AFL and
// libFuzzer read theirs: every statement, branch arm and function is a slot whose hit count in one input
// falls into a bucket (1, 2, 3, 4-7, 8-15, 16-31, 32-127, 128+); an input that puts any slot into a bucket
// it never reached before has new coverage. istanbul keeps each file's counters in plain objects; on binding,
// they are replaced by views of one Uint8Array (the instrumented code does `cov().s[7]++`, which works the
// same on a typed array), so a scan is one pass over contiguous memory, eight counters a step (as two
// 32-bit words), that also zeroes it. Like AFL's, a counter is 8 bits and wraps: 256 hits read as none.
import path from 'node:path';
import { COVERAGE_GLOBAL } from './instrument.js';

interface Location {
  start?: { line?: number };
}

interface IstanbulFile {
  path: string;
  s: Record<string, number> | Uint8Array;
  f: Record<string, number> | Uint8Array;
  b: Record<string, number[] | Uint8Array>;
  /** Where each branch and each of its arms is in the module's code. */
  branchMap?: Record<string, { loc?: Location; locations?: Location[] }>;
}

interface BoundFile {
  path: string;
  data: IstanbulFile;
  /** Where its slots start in the map: statements, then functions, then branch arms. */
  start: number;
  statements: number;
  functions: number;
  /** Branch arms, per branch. */
  arms: number[];
  end: number;
}

/** AFL's hit-count buckets, as one bit each; 128 to 255 share the top bit; 0 has none. */
const BUCKET = new Uint8Array(256);
for (let v = 1; v < 256; v++) BUCKET[v] = v <= 3 ? 1 << (v - 1) : v < 8 ? 8 : v < 16 ? 16 : v < 32 ? 32 : v < 128 ? 64 : 128;

export interface CoverageSummary {
  /** Modules with any slot hit. */
  modules: number;
  /** Branch arms taken at least once, of the arms in those modules. */
  branches: number;
  branchTotal: number;
  statements: number;
  statementTotal: number;
  /** Slot-and-bucket pairs reached: what the fuzzer steers by. */
  features: number;
}

export class CoverageMap {
  private files: BoundFile[] = [];
  private counts = new Uint8Array(1 << 16);
  /** The counters eight at a time (two words each), to skip the zero ones fast. */
  private words = new Int32Array(this.counts.buffer);
  private used = 0;
  /** Per slot, the buckets any input reached since the last reset. */
  private seen = new Uint8Array(1 << 16);
  private features = 0;

  /** The map of this process's instrumented modules, or null when nothing is instrumented. */
  static current(): CoverageMap | null {
    const g = globalThis as { [COVERAGE_GLOBAL]?: Record<string, IstanbulFile>; __fuzzCoverageMap?: CoverageMap };
    if (!g[COVERAGE_GLOBAL]) return null;
    g.__fuzzCoverageMap ??= new CoverageMap(g[COVERAGE_GLOBAL]);
    return g.__fuzzCoverageMap;
  }

  private constructor(private readonly istanbul: Record<string, IstanbulFile>) {
    this.bindNew();
  }

  /** Binds modules loaded since the last call (a module's counters appear when it first runs). */
  private bindNew(): void {
    const paths = Object.keys(this.istanbul);
    if (paths.length === this.files.length) return;
    const known = new Set(this.files.map((f) => f.path));
    for (const p of paths) {
      if (known.has(p)) continue;
      const data = this.istanbul[p]!;
      const statements = Object.keys(data.s).length;
      const functions = Object.keys(data.f).length;
      const arms = Object.keys(data.b).map((k) => data.b[k]!.length);
      const start = this.used;
      const end = start + statements + functions + arms.reduce((a, b) => a + b, 0);
      this.reserve(end);
      this.used = end;
      const file: BoundFile = { path: p, data, start, statements, functions, arms, end };
      this.files.push(file);
      this.point(file, true);
    }
  }

  private reserve(n: number): void {
    if (n <= this.counts.length) return;
    let size = this.counts.length;
    while (size < n) size *= 2;
    const counts = new Uint8Array(size);
    counts.set(this.counts);
    const seen = new Uint8Array(size);
    seen.set(this.seen);
    this.counts = counts;
    this.words = new Int32Array(counts.buffer);
    this.seen = seen;
    for (const f of this.files) this.point(f, false);
  }

  /** Makes a file's counters views of the map, carrying over what they hold. */
  private point(f: BoundFile, first: boolean): void {
    const view = (at: number, n: number, from: ArrayLike<number> | Record<string, number>): Uint8Array => {
      const v = this.counts.subarray(at, at + n);
      if (first) for (let i = 0; i < n; i++) v[i] = (from as Record<number, number>)[i] ?? 0;
      return v;
    };
    let at = f.start;
    f.data.s = view(at, f.statements, f.data.s);
    at += f.statements;
    f.data.f = view(at, f.functions, f.data.f);
    at += f.functions;
    Object.keys(f.data.b).forEach((k, i) => {
      const n = f.arms[i]!;
      f.data.b[k] = view(at, n, f.data.b[k]!);
      at += n;
    });
  }

  /** Forgets what was reached and zeroes the counters: a new target starts from nothing. */
  reset(): void {
    this.bindNew();
    this.counts.fill(0, 0, this.used);
    this.seen.fill(0, 0, this.used);
    this.features = 0;
  }

  /** Zeroes the counters and keeps what was reached (work between inputs: setup, a server's own timers). */
  discard(): void {
    this.bindNew();
    this.counts.fill(0, 0, this.used);
  }

  /** Reads the counters of the input just run and zeroes them: how many slot-and-bucket pairs are new. */
  scan(): number {
    this.bindNew();
    const counts = this.counts;
    const words = this.words;
    const seen = this.seen;
    let fresh = 0;
    for (let w = 0, n = (this.used + 7) >> 3; w < n; w++) {
      if ((words[2 * w]! | words[2 * w + 1]!) === 0) continue;
      for (let i = 8 * w, end = i + 8; i < end; i++) {
        const bit = BUCKET[counts[i]!]!;
        if (bit !== 0 && (seen[i]! & bit) === 0) {
          seen[i]! |= bit;
          fresh++;
        }
      }
      words[2 * w] = 0;
      words[2 * w + 1] = 0;
    }
    this.features += fresh;
    return fresh;
  }

  summary(): CoverageSummary {
    this.bindNew();
    const out: CoverageSummary = { modules: 0, branches: 0, branchTotal: 0, statements: 0, statementTotal: 0, features: this.features };
    for (const f of this.files) {
      if (!this.reached(f)) continue;
      out.modules++;
      for (let i = f.start; i < f.start + f.statements; i++) if (this.seen[i] !== 0) out.statements++;
      out.statementTotal += f.statements;
      const armsStart = f.start + f.statements + f.functions;
      for (let i = armsStart; i < f.end; i++) if (this.seen[i] !== 0) out.branches++;
      out.branchTotal += f.end - armsStart;
    }
    return out;
  }

  /** Statements, functions and branch arms reached at all (whatever their hit counts). */
  slotsReached(): number {
    let n = 0;
    for (let i = 0; i < this.used; i++) if (this.seen[i] !== 0) n++;
    return n;
  }

  /** Where the branch arms no input took are, per module reached: `server/dist/parsers.js: lines 41, 57`. */
  untaken(root: string): string[] {
    this.bindNew();
    const out: string[] = [];
    for (const f of this.files) {
      if (!this.reached(f)) continue;
      const lines = new Set<number>();
      let i = f.start + f.statements + f.functions;
      Object.keys(f.data.b).forEach((k, n) => {
        const where = f.data.branchMap?.[k];
        for (let arm = 0; arm < f.arms[n]!; arm++, i++) {
          if (this.seen[i] !== 0) continue;
          const line = where?.locations?.[arm]?.start?.line ?? where?.loc?.start?.line;
          if (line !== undefined) lines.add(line);
        }
      });
      if (lines.size === 0) continue;
      const sorted = [...lines].sort((a, b) => a - b);
      out.push(`${path.relative(root, f.path)}: line${sorted.length > 1 ? 's' : ''} ${sorted.join(', ')}`);
    }
    return out;
  }

  private reached(f: BoundFile): boolean {
    for (let i = f.start; i < f.end; i++) if (this.seen[i] !== 0) return true;
    return false;
  }
}

/** `812 of 1430 branch arms (57 %), 950 of 1200 statements, in 12 modules; 2400 features` */
export function describeCoverage(c: CoverageSummary): string {
  const pct = c.branchTotal === 0 ? 0 : Math.round((100 * c.branches) / c.branchTotal);
  return `${c.branches} of ${c.branchTotal} branch arms (${pct} %), ${c.statements} of ${c.statementTotal} statements, in ${c.modules} modules; ${c.features} features`;
}
