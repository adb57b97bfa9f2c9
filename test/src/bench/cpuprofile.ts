// Summarises V8 CPU profiles (`pnpm bench -- --cpu-prof DIR` writes one per hub and agent):
//
//   node test/dist/bench/cpuprofile.js FILE.cpuprofile [...] [--top N]
//
// Prints, per file, where the samples fell: by function (self time) and by module (self time
// summed per source file or package: node internals, grpc-js, our packages, GC, idle).
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { refuse, toolArgs } from './tool-args.js';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  hitCount?: number;
  children?: number[];
}

interface Profile {
  nodes: ProfileNode[];
  startTime: number;
  endTime: number;
  samples?: number[];
  timeDeltas?: number[];
}

function moduleOf(url: string, fn: string): string {
  if (!url) return fn.startsWith('(') ? fn : '(native)';
  const pnpm = /node_modules\/\.pnpm\/[^/]+\/node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url);
  if (pnpm?.[1]) return pnpm[1];
  const nm = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url);
  if (nm?.[1]) return nm[1];
  if (url.startsWith('node:')) return url;
  const ours = /\/(proto|server|agent|client|test)\/dist\/(.+)$/.exec(url);
  if (ours) return `${ours[1]}/${ours[2]}`;
  return path.basename(url);
}

function summarise(profile: Profile, top: number): string {
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  // Self time per node from samples and time deltas (hitCount is not always filled in).
  const selfUs = new Map<number, number>();
  const samples = profile.samples ?? [];
  const deltas = profile.timeDeltas ?? [];
  for (let i = 0; i < samples.length; i++) {
    const id = samples[i]!;
    const dt = deltas[i + 1] ?? 0;
    selfUs.set(id, (selfUs.get(id) ?? 0) + dt);
  }
  const total = [...selfUs.values()].reduce((a, b) => a + b, 0);
  const idle = [...selfUs.entries()].filter(([id]) => byId.get(id)?.callFrame.functionName === '(idle)').reduce((a, [, us]) => a + us, 0);
  const busy = total - idle;
  const fns = new Map<string, number>();
  const mods = new Map<string, number>();
  for (const [id, us] of selfUs) {
    const node = byId.get(id);
    if (!node) continue;
    const { functionName, url, lineNumber } = node.callFrame;
    if (functionName === '(idle)') continue;
    const key = `${functionName || '(anonymous)'} ${url ? `${moduleOf(url, functionName)}:${lineNumber + 1}` : ''}`.trim();
    fns.set(key, (fns.get(key) ?? 0) + us);
    const mod = moduleOf(url, functionName);
    mods.set(mod, (mods.get(mod) ?? 0) + us);
  }
  const pct = (us: number): string => `${((100 * us) / Math.max(1, busy)).toFixed(1).padStart(5)} %`;
  const lines: string[] = [];
  lines.push(
    `  wall ${((profile.endTime - profile.startTime) / 1e6).toFixed(1)} s, busy ${(busy / 1e6).toFixed(1)} s (${((100 * busy) / Math.max(1, total)).toFixed(0)} % of samples); shares below are of busy time`,
  );
  lines.push('  by module (self):');
  for (const [m, us] of [...mods].sort((a, b) => b[1] - a[1]).slice(0, top)) lines.push(`    ${pct(us)}  ${m}`);
  lines.push('  by function (self):');
  for (const [f, us] of [...fns].sort((a, b) => b[1] - a[1]).slice(0, top)) lines.push(`    ${pct(us)}  ${f}`);
  return lines.join('\n');
}

async function main(): Promise<void> {
  const usage = 'Usage: node test/dist/bench/cpuprofile.js FILE.cpuprofile [...] [--top N]\n';
  const { values, positionals } = toolArgs('cpuprofile', usage, {
    options: { top: { type: 'string', default: '15' } },
    allowPositionals: true,
  });
  if (positionals.length === 0) refuse('cpuprofile', usage, 'no profile given');
  for (const file of positionals) {
    const profile = JSON.parse(await readFile(file, 'utf8')) as Profile;
    process.stdout.write(`${file}\n${summarise(profile, Number(values.top))}\n`);
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
});
