// The repository reads whole from a fresh clone:
//  - no tracked file points outside the repository (a sibling `shared` folder, a spec file we do not
//    ship) or cites an issue number a reader cannot look up ("issue" and a number, or a hash and a
//    number); links to other projects' issues are full URLs;
//  - every relative Markdown link resolves to a file in the repository, and its `#anchor` to a heading;
//  - the SDK reference in docs/sdk is what TypeDoc generates from the source now, and TypeDoc finds no
//    undocumented export and no broken link (typedoc.json treats its warnings as errors).
// Only tracked files count (what a clone gets); the generated lockfile is left out.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const SKIP = new Set(['pnpm-lock.yaml']);
/** Pages another change adds; a link to one is checked once it exists. */
const PENDING = new Set<string>();

function tracked(): string[] {
  return execFileSync('git', ['ls-files', '-z'], { cwd: ROOT, encoding: 'utf8' })
    .split('\0')
    .filter((f) => f !== '' && !SKIP.has(f) && existsSync(path.join(ROOT, f)));
}

function text(file: string): string | null {
  const buf = readFileSync(path.join(ROOT, file));
  return buf.includes(0) ? null : buf.toString('utf8');
}

const FORBIDDEN: { what: string; re: RegExp }[] = [
  { what: 'a path outside the repository', re: /\.\.\/shared\b|\/work\/shared\b/ },
  { what: 'a specification file the repository does not have', re: /\bSPEC\.md\b|\bSPEC §/ },
  { what: 'an issue number', re: /\bissues? #?\d+/i },
  // A hash and a number in prose; not an HTML entity, not a URL's `/issues/N`, not a Markdown heading.
  { what: 'an issue number', re: /(?<![\w/&#])#\d+\b/ },
];

describe('a fresh clone reads whole', () => {
  it('no tracked file names a path outside the repository or an issue number', () => {
    const hits: string[] = [];
    for (const file of tracked()) {
      const body = text(file);
      if (body === null) continue;
      body.split('\n').forEach((line, i) => {
        for (const f of FORBIDDEN) {
          const m = f.re.exec(line);
          if (m) hits.push(`${file}:${i + 1}: ${f.what} ("${m[0]}")`);
        }
      });
    }
    expect(hits).toEqual([]);
  });

  it('the check finds what it looks for', () => {
    const caught = (line: string): boolean => FORBIDDEN.some((f) => f.re.test(line));
    // Built from pieces, so that this file passes its own check.
    const bad = [
      ['see ..', '/shared/', 'SPEC', '.md'],
      ['the goals of iss', 'ue 3'],
      ['Iss', 'ue 13: hub RSS'],
      ['iss', 'ues 3 and 13'],
      ['fixed in ', '#', '881'],
      ['SP', 'EC §9'],
    ];
    for (const parts of bad) expect(caught(parts.join('')), parts.join('')).toBe(true);
    for (const good of [
      'https://github.com/kubernetes-sigs/apiserver-network-proxy/issues/180',
      'contract §9',
      '## Heading',
      'it&#39;s',
      'color: #fff',
    ])
      expect(caught(good), good).toBe(false);
  });

  it('every relative Markdown link resolves, anchors included', () => {
    const broken: string[] = [];
    for (const file of tracked().filter((f) => f.endsWith('.md'))) {
      const body = text(file)!.replace(/```[\s\S]*?```/g, '');
      for (const m of body.matchAll(/\[[^\]]*\]\(([^)\s]+)\)/g)) {
        const target = m[1]!;
        if (/^[a-z]+:/i.test(target)) continue; // https:, mailto:
        const [rel, anchor] = target.split('#') as [string, string | undefined];
        const resolved = rel === '' ? file : path.posix.normalize(path.posix.join(path.posix.dirname(file), rel));
        if (resolved.startsWith('..')) {
          broken.push(`${file}: ${target} leaves the repository`);
          continue;
        }
        if (!existsSync(path.join(ROOT, resolved))) {
          if (!PENDING.has(resolved)) broken.push(`${file}: ${target} (no ${resolved})`);
          continue;
        }
        if (
          anchor !== undefined &&
          resolved.endsWith('.md') &&
          !headingSlugs(readFileSync(path.join(ROOT, resolved), 'utf8')).has(anchor)
        ) {
          broken.push(`${file}: ${target} (no heading #${anchor} in ${resolved})`);
        }
      }
    }
    expect(broken).toEqual([]);
  });
});

/** GitHub's anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered. */
function headingSlugs(markdown: string): Set<string> {
  const slugs = new Set<string>();
  const seen = new Map<string, number>();
  for (const m of markdown.replace(/```[\s\S]*?```/g, '').matchAll(/^#{1,6}\s+(.+?)\s*#*$/gm)) {
    const base = m[1]!
      .toLowerCase()
      .replace(/`/g, '')
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .trim()
      .replace(/\s/g, '-');
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    slugs.add(n === 0 ? base : `${base}-${n}`);
  }
  return slugs;
}

describe('the SDK reference (docs/sdk)', () => {
  const out = mkdtempSync(path.join(os.tmpdir(), 'cp-sdk-docs-'));
  afterAll(() => rmSync(out, { recursive: true, force: true }));

  it('TypeDoc builds it without a warning (every export documented, no broken link), and the checked-in copy is current', () => {
    const typedoc = path.join(ROOT, 'node_modules', 'typedoc', 'bin', 'typedoc');
    let log = '';
    try {
      log = execFileSync(process.execPath, [typedoc, '--out', out], { cwd: ROOT, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    } catch (err) {
      const e = err as { stdout?: string; stderr?: string };
      throw new Error(`typedoc failed:\n${e.stdout ?? ''}${e.stderr ?? ''}`);
    }
    expect(log).not.toMatch(/\[warning\]|\[error\]/);
    const generated = files(out);
    const checkedIn = files(path.join(ROOT, 'docs', 'sdk'));
    expect(Object.keys(checkedIn).sort(), 'run `pnpm run sdk-docs` and commit docs/sdk').toEqual(Object.keys(generated).sort());
    for (const [name, body] of Object.entries(generated))
      expect(checkedIn[name], `docs/sdk/${name} is stale: run \`pnpm run sdk-docs\``).toBe(body);
  }, 120_000);
});

function files(dir: string, prefix = ''): Record<string, string> {
  const out: Record<string, string> = {};
  for (const name of readdirSync(dir)) {
    const p = path.join(dir, name);
    if (statSync(p).isDirectory()) Object.assign(out, files(p, `${prefix}${name}/`));
    else out[`${prefix}${name}`] = readFileSync(p, 'utf8');
  }
  return out;
}
