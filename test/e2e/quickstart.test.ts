// `cluster-proxy quickstart` as a newcomer runs it: start it, read DIR/quickstart.json, paste the
// printed curl, kubectl and forward lines into a shell (bash -c, from another directory) and check
// that both demo clusters answer /version; then Ctrl+C (SIGINT): exit code 0, no listener left.
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readFile, rm, stat, symlink } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { killAllSpawned, spawnProcess, type ManagedProcess, runCommand, type RunResult } from '../src/fixtures/index.js';
import { CLI } from '../src/harness.js';
import { kubectlBinary, kubectlUnsupported } from './kubectl-binary.js';

const REPO = fileURLToPath(new URL('../..', import.meta.url));

interface QuickstartInfo {
  hub: {
    serverID: string;
    agent: string;
    frontend: string;
    frontendUds: string | null;
    connect: string;
    gateway: string;
    health: string;
    admin: string;
  };
  ca: string;
  client: { cert: string; key: string };
  token: { name: string; id: string; value: string };
  clusterNames: string[];
  clusters: Record<string, { apiserver: string; forward: string; kubeconfig: string; gatewayKubeconfig: string }>;
  commands: { curl: string[]; kubectl: string[]; forward: string; forwardCurl: string; gatewayCurl: string[]; gatewayKubectl: string[] };
}

let dir: string;
let elsewhere: string;
let qs: ManagedProcess;
let info: QuickstartInfo;
let stdoutLines: string[];
let env: NodeJS.ProcessEnv;
let kubectlDir: string | null = null;
let binDir: string;
const kubectlSkip = kubectlUnsupported();

/** What a user's shell would have after scripts/install-cli.sh: no proxy settings and no CLUSTER_PROXY_* (the
 * test runner's own environment may have them), `cluster-proxy` (a link to this checkout's build) and the
 * packaged kubectl v1.33 first on PATH. */
function userEnv(): NodeJS.ProcessEnv {
  const e: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (/^(https?|all|no)_proxy$/i.test(k) || k.startsWith('CLUSTER_PROXY_') || k === 'KUBECONFIG' || k === 'FORCE_COLOR') continue;
    e[k] = v;
  }
  e['HOME'] = elsewhere;
  e['PATH'] = [binDir, ...(kubectlDir ? [kubectlDir] : []), process.env['PATH'] ?? ''].join(path.delimiter);
  return e;
}

/** A printed line pasted into bash, run from a directory other than the repository. */
function paste(line: string, timeoutMs = 30_000): Promise<RunResult> {
  return runCommand('bash', ['-c', line], { cwd: elsewhere, env, timeoutMs });
}

/** The indented command lines of a section of the printed text that start with `word`. */
function printed(word: string): string[] {
  return stdoutLines.filter((l) => l.startsWith(`  ${word} `)).map((l) => l.trim());
}

function connectable(addr: string): Promise<boolean> {
  const [host, port] = [addr.slice(0, addr.lastIndexOf(':')), Number(addr.slice(addr.lastIndexOf(':') + 1))];
  return new Promise((resolve) => {
    const s = net.connect({ host, port });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'cp-quickstart-'));
  elsewhere = await mkdtemp(path.join(os.tmpdir(), 'cp-quickstart-cwd-'));
  binDir = await mkdtemp(path.join(os.tmpdir(), 'cp-quickstart-bin-'));
  await chmod(CLI, 0o755); // as scripts/install-cli.sh leaves it
  await symlink(CLI, path.join(binDir, 'cluster-proxy'));
  if (!kubectlSkip) kubectlDir = path.dirname(await kubectlBinary());
  env = userEnv();
  qs = spawnProcess({ name: 'quickstart', command: process.execPath, args: [CLI, 'quickstart', '--data-dir', dir], cwd: REPO, env });
  await qs.waitForLine((l) => l === 'Press Ctrl+C to stop.', 45_000);
  stdoutLines = qs.lines();
  info = JSON.parse(await readFile(path.join(dir, 'quickstart.json'), 'utf8')) as QuickstartInfo;
});

afterAll(async () => {
  await killAllSpawned();
  await rm(dir, { recursive: true, force: true });
  await rm(elsewhere, { recursive: true, force: true });
  await rm(binDir, { recursive: true, force: true });
});

describe('cluster-proxy quickstart', () => {
  it('reports progress on stderr without colour when not on a TTY', () => {
    const text = qs.lines().join('\n');
    expect(text).toMatch(/^Waiting for the agents to connect \.\.\.$/m);
    expect(text).toMatch(/^Waiting for the agents to connect: 2 connected \(\d+\.\ds\)$/m);
    expect(text).not.toContain('\x1b[');
  });

  it('writes quickstart.json with every listener, the CA, client credentials, token and clusters', async () => {
    expect(info.clusterNames).toEqual(['cluster1', 'cluster2']);
    for (const addr of [info.hub.agent, info.hub.frontend, info.hub.connect, info.hub.gateway, info.hub.health, info.hub.admin]) {
      expect(addr).toMatch(/^127\.0\.0\.1:\d+$/);
      expect(await connectable(addr), addr).toBe(true);
    }
    for (const c of info.clusterNames) {
      expect(await connectable(info.clusters[c]!.apiserver)).toBe(true);
      expect(await connectable(info.clusters[c]!.forward)).toBe(true);
      expect(existsSync(info.clusters[c]!.kubeconfig)).toBe(true);
      expect((await stat(info.clusters[c]!.kubeconfig)).mode & 0o777).toBe(0o600);
    }
    for (const f of [info.ca, info.client.cert, info.client.key]) expect(existsSync(f), f).toBe(true);
    expect(info.token.value).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect((await stat(path.join(dir, 'quickstart.json'))).mode & 0o777).toBe(0o600);
    // Same ports as the hub's ports.json (what `get --data-dir` and `kubeconfig --data-dir` read).
    const ports = JSON.parse(await readFile(path.join(dir, 'ports.json'), 'utf8')) as { connect: number; admin: number };
    expect(info.hub.connect).toBe(`127.0.0.1:${ports.connect}`);
    expect(info.hub.admin).toBe(`127.0.0.1:${ports.admin}`);
  });

  it("the printed gateway curl lines reach both clusters' apiservers through the HTTP gateway", async () => {
    const lines = printed('curl').filter((l) => l.includes(`https://${info.hub.gateway}/`));
    expect(lines).toEqual(info.commands.gatewayCurl);
    expect(lines).toHaveLength(2);
    for (const [i, cluster] of ['cluster1', 'cluster2'].entries()) {
      expect(lines[i]).toContain(`https://${info.hub.gateway}/${cluster}/version`);
      const r = await paste(lines[i]!);
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout)).toMatchObject({ gitVersion: 'v1.33.0-demo', cluster });
    }
  });

  it.skipIf(kubectlSkip !== null)(
    "the printed `kubectl auth whoami` lines: through the gateway the cluster sees the token's user, through CONNECT the apiserver token's",
    async () => {
      const lines = printed('kubectl').filter((l) => l.endsWith(' auth whoami'));
      expect(lines).toEqual(info.commands.gatewayKubectl);
      for (const [i, cluster] of ['cluster1', 'cluster2'].entries()) {
        expect(lines[i]).toBe(`kubectl --kubeconfig ${info.clusters[cluster]!.gatewayKubeconfig} auth whoami`);
        const r = await paste(lines[i]!);
        expect(r.code, r.stderr).toBe(0);
        expect(r.stdout).toMatch(/Username\s+cluster-proxy:token:quickstart/);
        expect(r.stdout).toMatch(/Groups\s+\[cluster-proxy:tokens system:authenticated\]/);
      }
      const direct = await paste(`kubectl --kubeconfig ${info.clusters['cluster1']!.kubeconfig} auth whoami`);
      expect(direct.code, direct.stderr).toBe(0);
      expect(direct.stdout).toMatch(/Username\s+demo-admin/);
    },
  );

  it('the printed curl lines reach both clusters through the CONNECT frontend', async () => {
    const lines = printed('curl').filter((l) => l.includes('--proxy '));
    expect(lines).toHaveLength(2);
    expect(lines).toEqual(info.commands.curl);
    for (const [i, cluster] of ['cluster1', 'cluster2'].entries()) {
      expect(lines[i]).toContain(`https://${cluster}/version`);
      const r = await paste(lines[i]!);
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout)).toMatchObject({ gitVersion: 'v1.33.0-demo', cluster });
    }
  });

  it.skipIf(kubectlSkip !== null)('the printed kubectl lines reach both clusters (kubectl v1.33, https proxy-url)', async () => {
    const lines = printed('kubectl').filter((l) => l.endsWith(' get --raw /version'));
    expect(lines).toHaveLength(2);
    for (const [i, cluster] of ['cluster1', 'cluster2'].entries()) {
      expect(lines[i]).toBe(`kubectl --kubeconfig ${info.clusters[cluster]!.kubeconfig} get --raw /version`);
      const r = await paste(lines[i]!);
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout)).toMatchObject({ gitVersion: 'v1.33.0-demo', cluster });
    }
  });

  it('the printed forward line serves a local port, and the curl line after it answers', async () => {
    // Printed as the user types it: `cluster-proxy` is on their PATH, so no `node …/main.js`.
    expect(stdoutLines.filter((l) => l.includes('main.js'))).toEqual([]);
    const [forwardLine] = printed('cluster-proxy');
    expect(forwardLine).toBe(info.commands.forward);
    expect(forwardLine).toContain(' forward cluster2 cluster2:443 --listen 127.0.0.1:');
    let fwd: ManagedProcess | undefined;
    try {
      fwd = spawnProcess({ name: 'forward', command: 'bash', args: ['-c', `exec ${forwardLine}`], cwd: elsewhere, env });
      await fwd.waitForLine((l) => l.startsWith('Forwarding '), 15_000);
      const curlLine = printed('curl').find((l) => !l.includes('--proxy ') && !l.includes('Authorization'))!;
      expect(curlLine).toBe(info.commands.forwardCurl);
      const r = await paste(curlLine);
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout)).toMatchObject({ cluster: 'cluster2' });
      fwd.kill('SIGINT');
      expect((await fwd.exited).code).toBe(0);
    } finally {
      await fwd?.stop(5000);
    }
  });

  it('the already-running forwards answer, and the printed `get clusters` line lists both clusters', async () => {
    for (const c of info.clusterNames) {
      const r = await paste(`curl -sS --cacert ${info.ca} https://${info.clusters[c]!.forward}/version`);
      expect(JSON.parse(r.stdout)).toMatchObject({ cluster: c });
    }
    const getLine = stdoutLines.find((l) => l.startsWith('Connected clusters: '))!.slice('Connected clusters: '.length);
    expect(getLine).toMatch(/^cluster-proxy get clusters /);
    const r = await paste(getLine);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.split('\n')[0]).toMatch(/^NAME\s+AGENTS\s+AVAILABLE\s+CONNECTIONS\s+PENDING$/);
    expect(r.stdout).toMatch(/^cluster1\s+1\s+True\s/m);
    expect(r.stdout).toMatch(/^cluster2\s+1\s+True\s/m);
  });

  it('the printed addon-health line shows both demo clusters Available, not Degraded', async () => {
    const line = stdoutLines
      .find((l) => l.startsWith('Addon health:'))!
      .slice('Addon health:'.length)
      .trim();
    const r = await paste(line);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.split('\n')[0]).toMatch(/^NAMESPACE\s+NAME\s+AVAILABLE\s+DEGRADED\s+PROGRESSING$/);
    expect(r.stdout).toMatch(/^cluster1\s+cluster-proxy\s+True\s+False\s+False$/m);
    expect(r.stdout).toMatch(/^cluster2\s+cluster-proxy\s+True\s+False\s+False$/m);
  });

  it('stops on Ctrl+C (SIGINT) with exit code 0 and leaves no listener, socket or quickstart.json behind', async () => {
    qs.kill('SIGINT');
    const exit = await Promise.race([qs.exited, new Promise<null>((r) => setTimeout(() => r(null), 15_000))]);
    expect(exit, `quickstart did not exit within 15 s:\n${qs.lines().slice(-20).join('\n')}`).not.toBeNull();
    expect(exit).toEqual({ code: 0, signal: null });
    expect(qs.lines()).toContain('Stopped.');
    const addrs = [
      info.hub.agent,
      info.hub.frontend,
      info.hub.connect,
      info.hub.health,
      info.hub.admin,
      ...info.clusterNames.flatMap((c) => [info.clusters[c]!.apiserver, info.clusters[c]!.forward]),
    ];
    for (const a of addrs) expect(await connectable(a), a).toBe(false);
    if (info.hub.frontendUds) expect(existsSync(info.hub.frontendUds)).toBe(false);
    expect(existsSync(path.join(dir, 'quickstart.json'))).toBe(false);
  });
});
