import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { unsupportedNode, versionInfo, versionLine } from './version.js';

const MAIN = fileURLToPath(new URL('../dist/main.js', import.meta.url));

describe('version and runtime', () => {
  it('refuses a Node.js older than 24 in one line that says how to get one', () => {
    expect(unsupportedNode('20.20.2', '/usr/bin/node')).toBe(
      'cluster-proxy needs Node.js 24 or later, and /usr/bin/node is v20.20.2: put Node.js 24 first on PATH (in a checkout, bash scripts/quickstart.sh installs one and links the command to it)',
    );
    expect(unsupportedNode('24.0.0')).toBeNull();
    expect(unsupportedNode('26.1.0')).toBeNull();
  });

  it("--version and version print the package version, the build's commit and the Node.js", () => {
    for (const arg of ['--version', 'version']) {
      const r = spawnSync(process.execPath, [MAIN, arg], { encoding: 'utf8' });
      expect(r.status, r.stderr).toBe(0);
      // The built command reads the commit pnpm build recorded beside it (this checkout is a git one).
      const v = versionInfo();
      expect(r.stdout).toMatch(
        new RegExp(
          `^cluster-proxy ${v.version.replace(/\./g, '\\.')} \\(commit [0-9a-f]{12}(-dirty)?, Node\\.js ${process.version.replace(/\./g, '\\.')}\\)\n$`,
        ),
      );
    }
    expect(versionLine({ version: '1.2.3', commit: 'abc', node: 'v24.1.0' })).toBe('cluster-proxy 1.2.3 (commit abc, Node.js v24.1.0)');
  });
});
