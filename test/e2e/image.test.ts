// The OCI image (deploy/README.md), built and run without a Docker daemon: `scripts/build-image.sh` (buildah,
// vfs storage, chroot isolation, FROM scratch with this machine's Node runtime and the packed CLI), then
// the image is run with `buildah run`: `--help` as the image's user, and an agent inside it that connects
// to a real hub on the host and carries an echo through the tunnel.
// chroot isolation is the runtime that works here: the container shares the host's network (so it
// reaches the hub on loopback) and gets no cgroup limits; a Kubernetes runtime adds both.
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { killAllSpawned, runCommand, spawnProcess, startEchoServer, type ManagedProcess, type TcpTarget } from '../src/fixtures/index.js';
import { cliLaunchFlags, createPki, startHub, type HubProcess, type TestPki } from '../src/harness.js';

const execFileP = promisify(execFile);
const ROOT = new URL('../../', import.meta.url).pathname;
const TAG = `localhost/cluster-proxy-test:${process.pid}`;
const CLI_IN_IMAGE = '/app/lib/node_modules/cluster-proxy/bin/cluster-proxy.js';
/** A UID from an OpenShift namespace's range (openshift.io/sa.scc.uid-range), in no /etc/passwd. */
const ARBITRARY_UID = 1000770000;
const BUILDAH_ENV = { ...process.env, STORAGE_DRIVER: 'vfs', BUILDAH_ISOLATION: 'chroot', CLUSTER_PROXY_IMAGE: TAG };

async function buildah(args: string[]): Promise<string> {
  const { stdout } = await execFileP('buildah', args, { env: BUILDAH_ENV, timeout: 120_000, maxBuffer: 16 * 1024 * 1024 });
  return stdout.trim();
}

/**
 * Why buildah cannot build here, or undefined. Installs Debian's package when missing (as root), then
 * creates and removes a container FROM scratch: what fails there is the machine, not our build.
 */
async function buildahUnavailable(): Promise<string | undefined> {
  const has = async (): Promise<boolean> => (await runCommand('bash', ['-c', 'command -v buildah'])).code === 0;
  if (!(await has())) {
    if (process.getuid?.() !== 0) return 'buildah is not installed and we are not root to apt-get install it';
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
    let r = await runCommand('apt-get', ['install', '-y', '-qq', 'buildah'], { env, timeoutMs: 280_000 });
    if (r.code !== 0) {
      await runCommand('apt-get', ['update', '-qq'], { env, timeoutMs: 120_000 });
      r = await runCommand('apt-get', ['install', '-y', '-qq', 'buildah'], { env, timeoutMs: 280_000 });
    }
    if (!(await has())) return `apt-get install buildah failed: ${r.stderr.trim().split('\n').slice(-2).join(' | ')}`;
  }
  try {
    const c = await buildah(['from', 'scratch']);
    await buildah(['rm', c]);
    return undefined;
  } catch (err) {
    return `buildah cannot create a container here: ${String((err as { stderr?: string }).stderr ?? (err as Error).message)
      .trim()
      .split('\n')
      .slice(-2)
      .join(' | ')}`;
  }
}

describe('the OCI image, built with buildah and run with buildah run', () => {
  let dir = '';
  let built = false;
  const containers: string[] = [];
  let pki: TestPki;
  let hub: HubProcess | undefined;
  let echo: TcpTarget | undefined;
  let agent: ManagedProcess | undefined;

  /** Set when buildah itself cannot work on this machine: the exact error, and every test says it. */
  let unavailable: string | undefined;

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'cp-image-'));
    unavailable = await buildahUnavailable();
    if (unavailable) console.warn(`image tests skipped: ${unavailable}`);
  }, 300_000);

  afterAll(async () => {
    await agent?.stop(5000);
    await hub?.stop();
    await echo?.close();
    await killAllSpawned();
    for (const c of containers) await buildah(['rm', c]).catch(() => undefined);
    if (built) await buildah(['rmi', '--force', TAG]).catch(() => undefined);
    await pki?.cleanup();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('scripts/build-image.sh builds it and writes the OCI archive', async (ctx) => {
    if (unavailable) return ctx.skip(unavailable);
    const r = await runCommand('bash', [path.join(ROOT, 'scripts/build-image.sh'), dir], { env: BUILDAH_ENV, timeoutMs: 600_000 });
    expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(0);
    built = true;
    expect(existsSync(path.join(dir, 'cluster-proxy.oci.tar'))).toBe(true);
    const config = JSON.parse(await buildah(['inspect', '--type', 'image', TAG])) as {
      OCIv1: { config: { Entrypoint: string[]; User: string } };
    };
    // node with the product's launch flags, as this checkout's command starts it (cli/src/memory/gc-tuning.ts).
    expect(config.OCIv1.config.Entrypoint).toEqual(['/usr/local/bin/node', ...cliLaunchFlags(), CLI_IN_IMAGE]);
    expect(config.OCIv1.config.User).toBe('65532:65532');
  }, 660_000);

  it('runs as uid 65532 and prints --help', async (ctx) => {
    if (unavailable) return ctx.skip(unavailable);
    expect(built, 'the build test must pass first').toBe(true);
    const c = await buildah(['from', TAG]);
    containers.push(c);
    const uid = await buildah(['run', c, '--', '/usr/local/bin/node', '-e', 'process.stdout.write(String(process.getuid()))']);
    expect(uid).toBe('65532');
    // The image ships the Node the suite runs on (scripts/ensure-tools.sh's, the supported LTS line).
    expect(await buildah(['run', c, '--', '/usr/local/bin/node', '--version'])).toBe(process.version);
    const help = await buildah(['run', c, '--', '/usr/local/bin/node', CLI_IN_IMAGE, '--help']);
    expect(help).toContain('Usage: cluster-proxy COMMAND');
    // OpenShift's restricted-v2 runs the pod as an arbitrary UID of the namespace's range, group 0.
    const arbitrary = await buildah([
      'run',
      '--user',
      `${ARBITRARY_UID}:0`,
      c,
      '--',
      '/usr/local/bin/node',
      '-e',
      'process.stdout.write(String(process.getuid()))',
    ]);
    expect(arbitrary).toBe(String(ARBITRARY_UID));
    expect(await buildah(['run', '--user', `${ARBITRARY_UID}:0`, c, '--', '/usr/local/bin/node', CLI_IN_IMAGE, '--help'])).toContain(
      'Usage: cluster-proxy COMMAND',
    );
  }, 120_000);

  it('an agent in the image, as an arbitrary UID (OpenShift), connects to a hub on the host; bytes go through it', async (ctx) => {
    if (unavailable) return ctx.skip(unavailable);
    expect(built, 'the build test must pass first').toBe(true);
    pki = await createPki();
    hub = await startHub(pki);
    echo = await startEchoServer();
    const cert = await pki.agent('imaged');
    const c = await buildah(['from', TAG]);
    containers.push(c);
    for (const [src, dest] of [
      [pki.caPath, '/pki/ca.crt'],
      [cert.certPath, '/pki/agent.crt'],
      [cert.keyPath, '/pki/agent.key'],
    ] as const) {
      await buildah(['copy', '--chown', `${ARBITRARY_UID}:0`, c, src, dest]);
    }
    agent = spawnProcess({
      name: 'agent-in-image',
      command: 'buildah',
      env: BUILDAH_ENV,
      args: [
        'run',
        '--user',
        `${ARBITRARY_UID}:0`,
        c,
        '--',
        '/usr/local/bin/node',
        CLI_IN_IMAGE,
        'agent',
        '--cluster',
        'imaged',
        '--hub',
        `127.0.0.1:${hub.ports.agent}`,
        '--server-name',
        'localhost',
        '--ca-cert',
        '/pki/ca.crt',
        '--cert',
        '/pki/agent.crt',
        '--key',
        '/pki/agent.key',
        '--apiserver',
        `127.0.0.1:${echo.port}`,
        '--health-port',
        '0',
        '--drain-grace',
        '1s',
      ],
    });
    await agent.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 30_000);
    const tunnel = hub.tunnel();
    const socket = await tunnel.dial('imaged:443');
    const payload = Buffer.from(`hello from the host ${Date.now()}`);
    const received = new Promise<Buffer>((resolve) => {
      const chunks: Buffer[] = [];
      socket.on('data', (d: Buffer) => {
        chunks.push(d);
        if (Buffer.concat(chunks).length >= payload.length) resolve(Buffer.concat(chunks));
      });
    });
    socket.write(payload);
    expect((await received).equals(payload)).toBe(true);
    socket.destroy();
    // SIGTERM reaches the agent through buildah run; it drains and exits.
    await agent.stop(15_000);
    agent = undefined;
  }, 120_000);
});
