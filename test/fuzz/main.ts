// `pnpm fuzz -- [--minutes N] [--only NAME[,NAME]] [--seed S] [--save-corpus DIR] [--unguided] [--untaken]`: runs every
// fuzz target (and the Go differential of the agent's proxy selection, `proxy-go`) for N minutes in all
// (default 10), split evenly, from a random seed unless one is given. Prints per target the executions, the
// coverage reached and the corpus size; a failing input is written to test/fuzz/findings/<target>/ (not
// committed: fix the bug, then move the file into corpus/<target>/ as regression-<what> so the suite replays
// it). `--save-corpus DIR` writes the inputs that added coverage, minimized, to DIR/<target>/; `--unguided`
// turns the feedback off (the corpus does not grow), to compare; `--untaken` lists where the branch arms no
// input took are (lines of the packages' built JavaScript). Exits 1 when anything failed.
import { parseArgs } from 'node:util';
import { describeCoverage } from './coverage.js';
import { FINDINGS_DIR, fuzzTarget, type FuzzResult } from './engine.js';
import { GoJudge, runDifferential } from './go-judge.js';
import { TARGETS } from './targets/index.js';

const { values } = parseArgs({
  args: process.argv.slice(2).filter((a) => a !== '--'),
  options: {
    minutes: { type: 'string', default: '10' },
    only: { type: 'string' },
    seed: { type: 'string' },
    list: { type: 'boolean', default: false },
    'save-corpus': { type: 'string' },
    unguided: { type: 'boolean', default: false },
    untaken: { type: 'boolean', default: false },
  },
});

const names = [...TARGETS.map((t) => t.name), 'proxy-go'];
if (values.list) {
  for (const t of TARGETS) console.log(`${t.name}\n    ${t.about}`);
  console.log("proxy-go\n    the agent's NO_PROXY / HTTPS_PROXY decision against Go's golang.org/x/net/http/httpproxy (test/go-judge)");
  process.exit(0);
}
const only = values.only
  ?.split(',')
  .map((s) => s.trim())
  .filter((s) => s !== '');
for (const n of only ?? []) {
  if (!names.includes(n)) {
    console.error(`no fuzz target ${n}; targets: ${names.join(', ')}`);
    process.exit(2);
  }
}
const selected = names.filter((n) => !only || only.includes(n));
const minutes = Number(values.minutes);
if (!(minutes > 0)) {
  console.error(`--minutes must be a positive number, not ${values.minutes}`);
  process.exit(2);
}
const seed = values.seed !== undefined ? Number(values.seed) : Math.floor(Math.random() * 2 ** 31);
const perTarget = (minutes * 60_000) / selected.length;
const mode = values.unguided ? 'unguided (no coverage feedback)' : 'coverage-guided';
console.log(`fuzzing ${selected.length} target(s) for ${minutes} min (${Math.round(perTarget / 1000)} s each), ${mode}, seed ${seed}`);

const rows: FuzzResult[] = [];
for (const name of selected) {
  let r: FuzzResult;
  if (name === 'proxy-go') {
    const started = Date.now();
    const judge = GoJudge.start();
    try {
      const d = await runDifferential(judge, seed, Number.MAX_SAFE_INTEGER, started + perTarget, 20);
      const deliberate = Object.entries(d.deliberate)
        .map(([k, v]) => `${v} × ${k}`)
        .join('; ');
      r = {
        target: name,
        executions: d.cases,
        corpusFiles: 0,
        corpusSize: 0,
        ms: Date.now() - started,
        ...(d.differing > 0
          ? {
              failure: `${d.differing} cases differ from Go, e.g.\n${d.differences.map((x) => `  ${x.what}: ${JSON.stringify(x.case)}`).join('\n')}`,
            }
          : {}),
      };
      console.log(
        `proxy-go: ${d.cases} cases (${d.unparsed} Go cannot parse as a target), documented differences: ${deliberate || 'none'}`,
      );
    } finally {
      await judge.close();
    }
  } else {
    r = await fuzzTarget(TARGETS.find((t) => t.name === name)!, {
      seed,
      timeMs: perTarget,
      findingsDir: FINDINGS_DIR,
      unguided: values.unguided,
      ...(values['save-corpus'] ? { saveCorpusDir: values['save-corpus'] } : {}),
    });
  }
  rows.push(r);
  console.log(
    `${r.target.padEnd(16)} ${String(r.executions).padStart(10)} executions ${String(Math.round(r.executions / Math.max(1, r.ms / 1000))).padStart(7)}/s  ${r.failure ? 'FAILED' : 'ok'}`,
  );
  if (r.coverage) {
    const saved = r.saved !== undefined ? `, ${r.saved} written to ${values['save-corpus']}/${r.target}` : '';
    console.log(`  ${describeCoverage(r.coverage)}; corpus ${r.corpusFiles} files → ${r.corpusSize} entries${saved}`);
  }
  if (values.untaken) for (const u of r.untaken ?? []) console.log(`  branch arms not taken: ${u}`);
  if (r.failure) console.log(`  ${r.failure}${r.savedTo ? `\n  saved to ${r.savedTo}` : ''}`);
}
const failed = rows.filter((r) => r.failure);
console.log(
  `\n${rows.length - failed.length} of ${rows.length} targets found nothing; ${rows.reduce((n, r) => n + r.executions, 0)} executions in all`,
);
process.exit(failed.length > 0 ? 1 : 0);
