// The install story, as a new user meets it:
//  - `node scripts/pack.mjs` packs the CLI into one tarball; `npm install -g` of it with an empty cache and
//    --offline (so every dependency must be inside) gives a working `cluster-proxy`;
//  - with that installed command on PATH, every `cluster-proxy …` line of the README's "Register a cluster"
//    section runs as typed (the hub in the background, as a second shell would), plus the agent line `join`
//    prints, and `get managedclusteraddons -A` ends up printing the README's table;
//  - `scripts/install-cli.sh` (what quickstart.sh runs) leaves `cluster-proxy` on a login shell's PATH.
// The README lines use the hub's default ports; where network namespaces exist they run in one of their
// own (its own loopback), so they cannot collide with anything else on the machine.
import { existsSync, lstatSync, readFileSync, readlinkSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { killAllSpawned, runCommand, spawnProcess, waitFor, type ManagedProcess, type RunResult } from '../src/fixtures/index.js';
import { createNetnsLab, type NetnsLab } from '../src/fixtures/netns.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** The README section's commands (comments cut) and the table it shows. */
async function readmeRegisterSection(): Promise<{ commands: string[]; table: string[][] }> {
  const readme = await readFile(path.join(ROOT, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('## Register a cluster'));
  const block = /```sh\n([\s\S]*?)```/
    .exec(section)![1]!
    .split('\n')
    .filter((l) => l.trim() !== '');
  const commands = block.filter((l) => l.startsWith('cluster-proxy ')).map((l) => l.replace(/\s+#.*$/, '').trim());
  const table = block.filter((l) => !l.startsWith('cluster-proxy ') && !l.startsWith('#')).map((l) => l.trim().split(/\s+/));
  return { commands, table };
}

describe('packed CLI, installed with npm alone, runs the README\'s "Register a cluster" lines as typed', () => {
  let dir = '';
  let prefix = '';
  let lab: NetnsLab | null = null;
  const background: ManagedProcess[] = [];
  let env: NodeJS.ProcessEnv = {};

  /** `bash -c LINE` in the work dir, inside the namespace when there is one. */
  const shell = (line: string, timeoutMs = 30_000): Promise<RunResult> =>
    lab
      ? runCommand('ip', ['netns', 'exec', lab.names.get('user')!, 'bash', '-c', line], { cwd: dir, env, timeoutMs })
      : runCommand('bash', ['-c', line], { cwd: dir, env, timeoutMs });
  const shellInBackground = (name: string, line: string): ManagedProcess => {
    const p = lab
      ? lab.spawn('user', { name, command: 'bash', args: ['-c', `exec ${line}`], cwd: dir, env })
      : spawnProcess({ name, command: 'bash', args: ['-c', `exec ${line}`], cwd: dir, env });
    background.push(p);
    return p;
  };

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'cp-install-'));
    prefix = path.join(dir, 'prefix');
    lab = await createNetnsLab(['user']);
  });

  afterAll(async () => {
    await Promise.all(background.map((p) => p.stop(8000)));
    await killAllSpawned();
    await lab?.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('pack → npm install -g --offline with an empty cache → cluster-proxy --help', async () => {
    const pack = await runCommand(process.execPath, [path.join(ROOT, 'scripts/pack.mjs'), path.join(dir, 'pack')], { timeoutMs: 240_000 });
    expect(pack.code, pack.stderr).toBe(0);
    const tarball = /==> (.*\.tgz)/.exec(pack.stdout)![1]!;
    expect(existsSync(tarball)).toBe(true);
    const install = await runCommand(
      'npm',
      ['install', '-g', '--prefix', prefix, '--offline', '--cache', path.join(dir, 'empty-cache'), '--no-audit', '--no-fund', tarball],
      { timeoutMs: 240_000 },
    );
    expect(install.code, install.stderr).toBe(0);
    // Only Node and npm: no pnpm and no checkout on PATH, HOME elsewhere.
    env = { PATH: `${path.join(prefix, 'bin')}:${path.dirname(process.execPath)}:/usr/bin:/bin:/usr/sbin:/sbin`, HOME: dir };
    const help = await shell('cluster-proxy --help');
    expect(help.code, help.stderr).toBe(0);
    expect(help.stdout).toContain('proxy-config');
    const resolved = await shell('command -v cluster-proxy');
    expect(resolved.stdout.trim()).toBe(path.join(prefix, 'bin', 'cluster-proxy'));
  }, 480_000);

  it("the README lines, the agent line join prints, and the README's table at the end", async () => {
    expect(env['PATH'], 'the install test must run first').toBeDefined();
    const { commands, table } = await readmeRegisterSection();
    expect(commands[0]).toBe('cluster-proxy hub');
    expect(commands.length).toBeGreaterThanOrEqual(3);

    const hub = shellInBackground('hub', commands[0]!);
    await hub.waitForLine((l) => l.includes('proxy server listening'), 30_000);

    const join = await shell(commands[1]!);
    expect(join.code, join.stderr).toBe(0);
    const agentLine = join.stdout
      .split('\n')
      .map((l) => l.trim())
      .find((l) => l.startsWith('cluster-proxy agent '));
    expect(agentLine).toBeDefined();
    // The apiserver the agent fronts: an echo server where the printed line says HOST:PORT.
    const apiserver = shellInBackground(
      'apiserver',
      `node -e "require('node:net').createServer((s) => s.pipe(s)).listen(16443, '127.0.0.1', () => console.log('listening'))"`,
    );
    await apiserver.waitForLine((l) => l === 'listening', 10_000);
    shellInBackground('agent', agentLine!.replace('HOST:PORT', '127.0.0.1:16443'));

    let rows: string[][] = [];
    await waitFor(
      async () => {
        const get = await shell(commands[2]!);
        rows = get.stdout
          .split('\n')
          .filter((l) => l.trim() !== '')
          .map((l) => l.trim().split(/\s+/));
        return get.code === 0 && JSON.stringify(rows) === JSON.stringify(table);
      },
      { timeoutMs: 60_000, intervalMs: 1000, message: "get managedclusteraddons -A printing the README's table" },
    ).catch((err: Error) => {
      throw new Error(`${err.message}; last rows: ${JSON.stringify(rows)}`);
    });
    expect(rows).toEqual(table);
  }, 180_000);
});

describe('scripts/install-cli.sh (run by quickstart.sh)', () => {
  it("leaves cluster-proxy on a login shell's PATH, pointing at this checkout's build", async () => {
    // Where the script links by default: npm's global bin directory (or ~/.local/bin when not writable).
    const npmPrefix = (await runCommand('npm', ['prefix', '-g'])).stdout.trim();
    const candidates = [path.join(npmPrefix, 'bin', 'cluster-proxy'), path.join(os.homedir(), '.local', 'bin', 'cluster-proxy')];
    const before = new Map(candidates.map((c) => [c, whatIsAt(c)]));
    try {
      const r = await runCommand('bash', [path.join(ROOT, 'scripts/install-cli.sh')], {
        env: { ...process.env, CLUSTER_PROXY_BIN_DIR: undefined },
      });
      expect(r.code, r.stderr).toBe(0);
      // A login shell whose own node may be older: the command still runs on the Node.js this suite runs on.
      const login = await runCommand('bash', ['-lc', 'command -v cluster-proxy && cluster-proxy --help && cluster-proxy --version'], {
        env: { HOME: os.homedir(), PATH: '/usr/bin:/bin', TERM: 'dumb' },
      });
      expect(login.code, login.stderr).toBe(0);
      expect(login.stdout).toContain('Usage: cluster-proxy COMMAND');
      expect(login.stdout).toMatch(
        new RegExp(
          `^cluster-proxy \\d+\\.\\d+\\.\\d+ \\(commit [0-9a-f]{12}(-dirty)?, Node\\.js ${process.version.replace(/\./g, '\\.')}\\)$`,
          'm',
        ),
      );
      const launcher = await readFile(login.stdout.split('\n')[0]!, 'utf8');
      expect(launcher).toContain(`'${path.join(ROOT, 'cli/dist/main.js')}'`);
    } finally {
      // Put back what was there, a link or a launcher file (the test must not change the machine).
      for (const [c, was] of before) {
        await rm(c, { force: true });
        if (was.kind === 'none') continue;
        await mkdir(path.dirname(c), { recursive: true });
        if (was.kind === 'link') await symlink(was.target, c);
        else await writeFile(c, was.content, { mode: was.mode });
      }
    }
  }, 60_000);
});

type WasAt = { kind: 'none' } | { kind: 'link'; target: string } | { kind: 'file'; content: Buffer; mode: number };

/** What is at `p` now: nothing, a symbolic link (an older install-cli.sh's) or a file (its launcher now). */
function whatIsAt(p: string): WasAt {
  try {
    const st = lstatSync(p);
    return st.isSymbolicLink()
      ? { kind: 'link', target: readlinkSync(p) }
      : { kind: 'file', content: readFileSync(p), mode: st.mode & 0o777 };
  } catch {
    return { kind: 'none' };
  }
}
