// The SDK on its own, as a program that only wants `Tunnel` gets it: `node scripts/pack-sdk.mjs` packs
// @cluster-proxy/client; `npm install` of that tarball into an empty project, with --offline and an empty
// cache (so nothing may come from a registry), installs the SDK and nothing of the hub, the agent or the
// CLI; the installed size matches what client/README.md says; and the README examples (every ```ts block
// of client/README.md and of the top-level README) compile there with `tsc --strict` against the
// installed declarations, and the installed package loads in Node. It also dials through a hub from Node
// 22.16, whose node:http2 takes request headers only as an object (24 and 22.17 take a list too).
import { readdirSync, statSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { runCommand, startEchoServer, type TcpTarget } from '../src/fixtures/index.js';
import { createPki, startAgent, startHub, type TestPki } from '../src/harness.js';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const TSC = path.join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
/** An older Node an SDK user may run: before 22.17, node:http2 refuses a header list. */
const OLDER_NODE = '22.16.0';

/** Its binary (scripts/ensure-older-node.sh installs it once; scripts/test.sh before the tests). */
async function olderNode(): Promise<string> {
  const r = await runCommand('bash', [path.join(ROOT, 'scripts/ensure-older-node.sh')], { timeoutMs: 300_000 });
  if (r.code !== 0) throw new Error(`scripts/ensure-older-node.sh: ${r.stderr.slice(-500)}`);
  return r.stdout.trim().split('\n').at(-1)!;
}

/** Dials `cluster`:443 through the hub over each transport with the installed SDK, echoes a line, prints JSON. */
const DIAL_ECHO = `
import { readFileSync } from 'node:fs';
import { Tunnel } from '@cluster-proxy/client';
const [address, ca, cert, key, cluster] = process.argv.slice(1);
const got = {};
for (const transport of ['grpc', 'mux']) {
  const tunnel = new Tunnel({ address, caCert: readFileSync(ca), cert: readFileSync(cert), key: readFileSync(key), serverName: 'localhost', transport });
  try {
    const socket = await tunnel.dial(cluster + ':443');
    socket.end('hello from ' + process.version);
    let text = '';
    for await (const chunk of socket) text += chunk;
    got[transport] = text;
  } catch (err) {
    got[transport] = 'failed: ' + err.message;
  }
  tunnel.close();
}
console.log(JSON.stringify(got));
`;

/** Every ```ts block of a Markdown file. */
async function tsBlocks(file: string): Promise<string[]> {
  const text = await readFile(path.join(ROOT, file), 'utf8');
  return [...text.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!);
}

/** Bytes of every file under dir (what `du --apparent-size` counts). */
function treeBytes(dir: string): number {
  let total = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    total += e.isDirectory() ? treeBytes(p) : statSync(p).size;
  }
  return total;
}

describe('the SDK, packed alone and installed into an empty project', () => {
  let dir = '';
  let project = '';

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'cp-sdk-'));
    project = path.join(dir, 'project');
    await mkdir(project);
    await writeFile(
      path.join(project, 'package.json'),
      `${JSON.stringify({ name: 'uses-the-sdk', private: true, type: 'module' }, null, 2)}\n`,
    );
  });

  afterAll(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('installs with npm --offline and an empty cache: one package, no hub, agent or CLI, the size its README says', async () => {
    const pack = await runCommand(process.execPath, [path.join(ROOT, 'scripts/pack-sdk.mjs'), path.join(dir, 'pack')], {
      timeoutMs: 120_000,
    });
    expect(pack.code, pack.stderr).toBe(0);
    const tarball = /==> (.*\.tgz)/.exec(pack.stdout)![1]!;
    const install = await runCommand(
      'npm',
      ['install', '--offline', '--cache', path.join(dir, 'empty-cache'), '--no-audit', '--no-fund', tarball],
      { cwd: project, timeoutMs: 120_000 },
    );
    expect(install.code, install.stderr).toBe(0);

    const modules = path.join(project, 'node_modules');
    expect(readdirSync(modules).filter((n) => !n.startsWith('.'))).toEqual(['@cluster-proxy']);
    expect(readdirSync(path.join(modules, '@cluster-proxy'))).toEqual(['client']);
    expect(readdirSync(path.join(modules, '@cluster-proxy', 'client', 'node_modules', '@cluster-proxy'))).toEqual(['proto']);

    // client/README.md: "about N KiB on disk"; within a quarter of the measured figure.
    const readme = await readFile(path.join(ROOT, 'client', 'README.md'), 'utf8');
    const stated = Number(/about (\d+) KiB on disk/.exec(readme)?.[1]);
    const measured = treeBytes(modules) / 1024;
    expect(stated, 'client/README.md states the installed size as "about N KiB on disk"').toBeGreaterThan(0);
    expect(Math.abs(measured - stated) / measured, `installed ${measured.toFixed(0)} KiB, README says ${stated} KiB`).toBeLessThan(0.25);

    const load = await runCommand(
      process.execPath,
      ['--input-type=module', '-e', "const m = await import('@cluster-proxy/client'); console.log(Object.keys(m).sort().join(','))"],
      { cwd: project },
    );
    expect(load.code, load.stderr).toBe(0);
    expect(load.stdout.trim()).toBe(
      'Tunnel,TunnelError,TunnelHttpAgent,TunnelHttpsAgent,TunnelSocket,routeKubeConfigThroughTunnel,tunnelConnector',
    );
  }, 300_000);

  it('the README examples compile there with tsc --strict against the installed declarations', async () => {
    const blocks = [...(await tsBlocks('client/README.md')), ...(await tsBlocks('README.md'))];
    expect(blocks.length).toBeGreaterThanOrEqual(2);
    const files = blocks.map((_, i) => `example-${i}.ts`);
    await Promise.all(blocks.map((b, i) => writeFile(path.join(project, files[i]!), b)));
    // A Node project has Node's types; this one borrows the workspace's copy (no registry here).
    await mkdir(path.join(project, 'node_modules', '@types'), { recursive: true });
    await symlink(path.join(ROOT, 'node_modules', '@types', 'node'), path.join(project, 'node_modules', '@types', 'node'));
    await writeFile(
      path.join(project, 'tsconfig.json'),
      `${JSON.stringify(
        {
          compilerOptions: {
            strict: true,
            target: 'ES2022',
            module: 'NodeNext',
            moduleResolution: 'NodeNext',
            types: ['node'],
            noEmit: true,
            skipLibCheck: false,
          },
          files,
        },
        null,
        2,
      )}\n`,
    );
    const tsc = await runCommand(process.execPath, [TSC, '-p', project], { cwd: project, timeoutMs: 120_000 });
    expect(tsc.code, `${tsc.stdout}${tsc.stderr}`).toBe(0);
  }, 180_000);

  describe(`on Node ${OLDER_NODE}`, () => {
    let pki: TestPki;
    let echo: TcpTarget;
    const stops: (() => Promise<void>)[] = [];
    beforeAll(async () => {
      pki = await createPki();
      echo = await startEchoServer();
      stops.push(
        () => echo.close(),
        () => pki.cleanup(),
      );
    });
    afterAll(async () => {
      for (const stop of stops.reverse()) await stop();
    });

    it('dials through a hub over gRPC and mux and gets its bytes back', async () => {
      const node = await olderNode();
      const hub = await startHub(pki);
      stops.push(() => hub.stop());
      const agent = await startAgent(pki, hub, { cluster: 'older-node', apiserver: `127.0.0.1:${echo.port}` });
      stops.push(() => agent.stop());
      const run = await runCommand(
        node,
        [
          '--input-type=module',
          '-e',
          DIAL_ECHO,
          `127.0.0.1:${hub.ports.frontend}`,
          pki.caPath,
          pki.client.certPath,
          pki.client.keyPath,
          'older-node',
        ],
        { cwd: project, timeoutMs: 60_000 },
      );
      expect(run.code, run.stderr).toBe(0);
      const greeting = `hello from v${OLDER_NODE}`;
      expect(JSON.parse(run.stdout.trim())).toEqual({ grpc: greeting, mux: greeting });
    }, 420_000);
  });
});
