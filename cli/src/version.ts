// What `cluster-proxy --version` prints, and the one Node.js line this command runs on. The version is the
// CLI package's; the commit is the one `pnpm build` recorded in dist/build-info.json
// (scripts/build-info.mjs), "unknown" when the build had no git checkout. The packed tarball carries both.
import { readFileSync } from 'node:fs';

/** The oldest Node.js major this command supports (what the tests and benchmarks run on). */
export const MIN_NODE_MAJOR = 24;

/** Why this Node.js cannot run the command (one line), or null. */
export function unsupportedNode(version: string = process.versions.node, execPath: string = process.execPath): string | null {
  const major = Number(version.split('.')[0]);
  if (Number.isInteger(major) && major >= MIN_NODE_MAJOR) return null;
  return `cluster-proxy needs Node.js ${MIN_NODE_MAJOR} or later, and ${execPath} is v${version}: put Node.js ${MIN_NODE_MAJOR} first on PATH (in a checkout, bash scripts/quickstart.sh installs one and links the command to it)`;
}

function readJson(url: URL): Record<string, unknown> | null {
  try {
    return JSON.parse(readFileSync(url, 'utf8')) as Record<string, unknown>;
  } catch {
    return null;
  }
}

export interface VersionInfo {
  version: string;
  commit: string;
  node: string;
}

export function versionInfo(): VersionInfo {
  const pkg = readJson(new URL('../package.json', import.meta.url));
  const build = readJson(new URL('./build-info.json', import.meta.url));
  return {
    version: typeof pkg?.['version'] === 'string' ? pkg['version'] : 'unknown',
    commit: typeof build?.['commit'] === 'string' ? build['commit'] : 'unknown',
    node: process.version,
  };
}

export function versionLine(v: VersionInfo = versionInfo()): string {
  return `cluster-proxy ${v.version} (commit ${v.commit}, Node.js ${v.node})`;
}
