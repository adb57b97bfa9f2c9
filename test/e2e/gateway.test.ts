// The hub's HTTP gateway with real processes: a hub with --gateway-port, an agent in front of a
// recording HTTPS "apiserver" (test/src/fixtures/recording-apiserver.ts) whose own credentials for it
// come from a kubeconfig (--gateway-kubeconfig, a token the "apiserver" sees), the real kubectl v1.33
// with `server: https://127.0.0.1:PORT/cluster1`, and node:https for the error cases.
import { createHash } from 'node:crypto';
import { readdir, readFile, writeFile } from 'node:fs/promises';
import https from 'node:https';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { payloadSha256, runCommand, waitFor, type RecordingApiserver, type RunResult } from '../src/fixtures/index.js';
import { CLI, expectTablesEmpty, getStatus, type AgentProcess, type HubProcess, type TestPki, type UserCert } from '../src/harness.js';
import { GATEWAY_SA_TOKEN, startGatewayHub, type GatewayHub } from '../src/e2e-setup.js';
import { kubectlBinary, kubectlUnsupported } from './kubectl-binary.js';

const SA_TOKEN = GATEWAY_SA_TOKEN;
let setup: GatewayHub;
let pki: TestPki;
let hub: HubProcess;
let agent: AgentProcess;
let api: RecordingApiserver;
let tmp: string;
let port: number;
let token: string;
let userCert: UserCert;
const skipKubectl = kubectlUnsupported();

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: Buffer;
}

function gw(
  target: string,
  o: { cert?: boolean; token?: string; headers?: Record<string, string>; method?: string; body?: Buffer | Buffer[] } = {},
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1',
        port,
        path: target,
        method: o.method ?? 'GET',
        servername: 'localhost',
        agent: false,
        ca: pki.ca.certPem,
        ...(o.cert ? { cert: userCert.cert, key: userCert.key } : {}),
        headers: { ...(o.token ? { authorization: `Bearer ${o.token}` } : {}), ...o.headers },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    // Parts are written one by one (with no length given, node sends them chunked).
    if (Array.isArray(o.body)) for (const p of o.body) req.write(p);
    req.end(Array.isArray(o.body) ? undefined : o.body);
  });
}

function lastRequest(): RecordedLike {
  const r = api.requests.at(-1);
  if (!r) throw new Error('the apiserver saw no request');
  return r;
}
type RecordedLike = RecordingApiserver['requests'][number];

const cli = (args: string[]): Promise<RunResult> => runCommand(process.execPath, [CLI, ...args], { timeoutMs: 20_000 });

beforeAll(async () => {
  setup = await startGatewayHub('cp-gateway-', (p) => ['--ca-key', path.join(p.dir, 'ca.key')]);
  ({ pki, tmp, api, hub, agent } = setup);
  port = hub.ports.gateway!;
  userCert = await pki.user('alice', ['team-a', 'viewers']);
  const issued = await cli(['token', 'issue', '--name', 'bob', '--cluster', 'cluster1', '--data-dir', hub.dataDir]);
  expect(issued.code, issued.stderr).toBe(0);
  token = issued.stdout.trim();
  // Registered, no agent: the gateway's 503.
  const joined = await cli(['join', 'cluster3', '--out', path.join(tmp, 'cluster3-bundle'), '--admin', `127.0.0.1:${hub.ports.admin}`]);
  expect(joined.code, joined.stderr).toBe(0);
}, 60_000);

afterAll(async () => {
  await setup?.stop();
});

describe('HTTP gateway', () => {
  it("a client certificate: the apiserver sees the agent's token and Impersonate-User/Group of the certificate, never the caller's headers", async () => {
    const r = await gw('/cluster1/version', { cert: true, headers: { 'x-forwarded-for': '10.9.9.9' } });
    expect(r.status, r.body.toString()).toBe(200);
    expect(JSON.parse(r.body.toString())).toMatchObject({ gitVersion: 'v1.33.0-gateway-test' });
    const seen = lastRequest();
    expect(seen.url).toBe('/version');
    expect(seen.headers['authorization']).toEqual([`Bearer ${SA_TOKEN}`]);
    expect(seen.headers['impersonate-user']).toEqual(['alice']);
    expect(seen.headers['impersonate-group']).toEqual(['team-a', 'viewers']);
    expect(seen.headers['impersonate-uid']).toBeUndefined();
    expect(seen.headers['x-forwarded-for']).toEqual(['10.9.9.9, 127.0.0.1']);
    expect(Object.keys(seen.headers).filter((h) => h.startsWith('x-cluster-proxy'))).toEqual([]);
  });

  it("a hub token: namespaced user, the token id as uid; the caller's Authorization is not passed on", async () => {
    const r = await gw('/cluster1/api/v1/namespaces/default/pods?limit=1&labelSelector=app%3Dweb', { token });
    expect(r.status, r.body.toString()).toBe(200);
    const seen = lastRequest();
    expect(seen.url).toBe('/api/v1/namespaces/default/pods?limit=1&labelSelector=app%3Dweb');
    expect(seen.headers['authorization']).toEqual([`Bearer ${SA_TOKEN}`]);
    expect(seen.headers['impersonate-user']).toEqual(['cluster-proxy:token:bob']);
    expect(seen.headers['impersonate-group']).toEqual(['cluster-proxy:tokens']);
    expect(seen.headers['impersonate-uid']?.[0]).toMatch(/^[0-9a-f]{16}$/);
    expect(JSON.stringify(seen.headers)).not.toContain(token);
  });

  it("the caller's Impersonate-* headers are refused (400) and never reach the apiserver", async () => {
    const before = api.requests.length;
    for (const h of ['Impersonate-User', 'Impersonate-Group', 'Impersonate-Uid', 'Impersonate-Extra-scopes']) {
      const r = await gw('/cluster1/version', { cert: true, headers: { [h]: 'system:admin' } });
      expect(r.status).toBe(400);
      expect(r.body.toString()).toMatch(/^impersonate-[a-z-]+: the gateway impersonates the authenticated caller itself.*\n$/);
    }
    expect(api.requests.length).toBe(before);
  });

  it('header tricks: a forged identity is replaced, a bare CR or a folded line is a malformed request (400), nothing forwarded', async () => {
    // The hub's own hand-off headers, sent by a caller: dropped, the real caller's identity goes instead.
    const forged = await gw('/cluster1/version', {
      cert: true,
      headers: {
        'x-cluster-proxy-identity': 'eyJ1c2VyIjoiYWRtaW4ifQ.AAAA',
        'x-cluster-proxy-identity-signer': 'AAAA',
        'x-cluster-proxy-identity-mac': 'eyJ1c2VyIjoiYWRtaW4ifQ.AAAA',
      },
    });
    expect(forged.status, forged.body.toString()).toBe(200);
    expect(lastRequest().headers['impersonate-user']).toEqual(['alice']);
    // Header lines that a lenient parser (or a proxy behind us) could read as a second header.
    const before = api.requests.length;
    for (const injected of [
      'X-Note: a\rImpersonate-User: system:admin\r\n',
      'X-Note: a\r\n Impersonate-User: system:admin\r\n',
      'X-Note: a\nImpersonate-User: system:admin\r\n',
    ]) {
      const answer = await new Promise<string>((resolve, reject) => {
        const s = tls.connect(
          { host: '127.0.0.1', port, servername: 'localhost', ca: pki.ca.certPem, cert: userCert.cert, key: userCert.key },
          () => {
            s.write(`GET /cluster1/version HTTP/1.1\r\nHost: hub\r\n${injected}\r\n`);
          },
        );
        let text = '';
        s.on('data', (d: Buffer) => (text += d.toString()));
        s.on('end', () => resolve(text));
        s.on('error', reject);
      });
      expect(answer.split('\r\n')[0], JSON.stringify(injected)).toBe('HTTP/1.1 400 Bad Request');
      expect(answer.endsWith('\n') && answer.slice(answer.indexOf('\r\n\r\n') + 4).split('\n').length, JSON.stringify(injected)).toBe(2);
    }
    expect(api.requests.length).toBe(before);
  });

  it('401 without credentials or with a bad token, one line, nothing forwarded', async () => {
    const before = api.requests.length;
    const none = await gw('/cluster1/version');
    expect(none.status).toBe(401);
    expect(none.body.toString()).toMatch(
      /^no credentials: present a client certificate of the hub CA or send Authorization: Bearer <hub token>\n$/,
    );
    expect(none.headers['www-authenticate']).toBe('Bearer realm="cluster-proxy"');
    const bad = await gw('/cluster1/version', { token: 'A'.repeat(43) });
    expect(bad.status).toBe(401);
    expect(bad.body.toString()).toBe('the token is invalid, expired or revoked\n');
    const basic = await gw('/cluster1/version', { headers: { authorization: 'Basic dTpw' } });
    expect(basic.status).toBe(401);
    expect(api.requests.length).toBe(before);
  });

  it('404 unknown cluster, 503 a registered cluster without an agent, 403 a token for another cluster', async () => {
    const unknown = await gw('/nosuch/version', { cert: true });
    expect([unknown.status, unknown.body.toString()]).toEqual([404, 'cluster nosuch is not known to this hub\n']);
    const noAgent = await gw('/cluster3/version', { cert: true });
    expect([noAgent.status, noAgent.body.toString()]).toEqual([503, 'no agent of cluster cluster3 is connected\n']);
    const scoped = await gw('/cluster3/version', { token });
    expect(scoped.status).toBe(403);
    expect(scoped.body.toString()).toMatch(/^token "bob" \([0-9a-f]{16}\) may not reach cluster cluster3\n$/);
  });

  it('path tricks are 400: dot segments, encoded slashes, //, a missing cluster', async () => {
    const before = api.requests.length;
    const cases: [string, RegExp][] = [
      ['/cluster1/api/../version', /dot segments/],
      ['/cluster1/api/%2e%2e/version', /dot segments/],
      ['/cluster1/api%2Fv1/pods', /encoded slashes/],
      ['/cluster1/api//v1', /empty path segments/],
      ['//cluster1/version', /must start with a cluster name/],
      ['/', /must start with a cluster name/],
      ['/Cluster_1/version', /not a cluster name/],
    ];
    for (const [target, why] of cases) {
      const r = await gw(target, { cert: true });
      expect(r.status, target).toBe(400);
      expect(r.body.toString(), target).toMatch(why);
      expect(r.body.toString().split('\n').length, target).toBe(2);
    }
    expect(api.requests.length).toBe(before);
  });

  it('oversized headers are 431, one line; an upgrade is forwarded (here the apiserver refuses it, and that answer comes back as it is)', async () => {
    const big = await gw('/cluster1/version', { cert: true, headers: { 'x-big': 'a'.repeat(20_000) } });
    expect(big.status).toBe(431);
    expect(big.body.toString()).toBe('the request head is larger than 16384 bytes\n');
    // The recording apiserver serves upgrades on pods' exec/attach/portforward only (test/e2e/gateway-streams.test.ts has those).
    const up = await gw('/cluster1/api/v1/namespaces/default/pods/p/status', {
      cert: true,
      headers: { connection: 'Upgrade', upgrade: 'SPDY/3.1' },
    });
    expect([up.status, up.body.toString()]).toEqual([404, 'not found\n']);
    const seen = lastRequest();
    expect([seen.url, seen.upgrade]).toEqual(['/api/v1/namespaces/default/pods/p/status', 'SPDY/3.1']);
    expect(seen.headers['impersonate-user']).toEqual(['alice']);
  });

  it('the reserved destination is refused to ordinary clients: SDK and CONNECT', async () => {
    const t = hub.tunnel();
    await expect(t.dial('cluster-proxy-gateway.invalid:443', { timeoutMs: 5000 })).rejects.toThrow(/reserved for the hub's HTTP gateway/);
    const status = await new Promise<string>((resolve, reject) => {
      const s = tls.connect(
        {
          host: '127.0.0.1',
          port: hub.ports.connect!,
          servername: 'localhost',
          ca: pki.ca.certPem,
          cert: userCert.cert,
          key: userCert.key,
        },
        () => {
          s.write('CONNECT cluster-proxy-gateway.invalid:443 HTTP/1.1\r\nHost: cluster-proxy-gateway.invalid:443\r\n\r\n');
        },
      );
      let text = '';
      s.on('data', (d: Buffer) => {
        text += d.toString();
        if (text.includes('\n')) {
          resolve(text.split('\r\n')[0]!);
          s.destroy();
        }
      });
      s.on('error', reject);
    });
    expect(status).toBe('HTTP/1.1 403 Forbidden');
    t.close();
  });

  it('a streamed response of 64 MiB arrives whole, and a reader that stops holds the writer back (nothing buffered whole)', async () => {
    const mib = 64;
    const sha = createHash('sha256');
    let received = 0;
    let writtenWhilePaused = 0;
    await new Promise<void>((resolve, reject) => {
      const req = https.request(
        {
          host: '127.0.0.1',
          port,
          path: `/cluster1/stream?mib=${mib}`,
          servername: 'localhost',
          agent: false,
          ca: pki.ca.certPem,
          cert: userCert.cert,
          key: userCert.key,
        },
        (res) => {
          expect(res.statusCode).toBe(200);
          expect(res.headers['transfer-encoding']).toBe('chunked');
          let paused = false;
          res.on('data', (c: Buffer) => {
            sha.update(c);
            received += c.length;
            if (!paused && received >= 1024 * 1024) {
              paused = true;
              res.pause();
              setTimeout(() => {
                writtenWhilePaused = api.written();
                res.resume();
              }, 2000);
            }
          });
          res.on('end', resolve);
          res.on('error', reject);
        },
      );
      req.on('error', reject);
      req.end();
    });
    expect(received).toBe(mib * 1024 * 1024);
    expect(sha.digest('hex')).toBe(payloadSha256(mib * 1024 * 1024));
    // Held in flight while the caller did not read: socket buffers and flow-control windows, far from 64 MiB.
    expect(writtenWhilePaused).toBeLessThan(32 * 1024 * 1024);
  }, 60_000);

  it('a streamed request body (8 MiB POST) reaches the apiserver and comes back whole', async () => {
    const body = Buffer.alloc(8 * 1024 * 1024, 7);
    const r = await gw('/cluster1/echo', { cert: true, method: 'POST', body, headers: { 'content-type': 'application/octet-stream' } });
    expect(r.status).toBe(200);
    expect(r.body.equals(body)).toBe(true);
  }, 30_000);

  it('an answer that comes before the request body is all sent: the caller gets it, and its upload is taken to the end', async () => {
    const r = await gw('/cluster1/answers-at-once', { cert: true, method: 'POST', body: Buffer.alloc(8 * 1024 * 1024, 5) });
    expect(r.status).toBe(200);
    expect(JSON.parse(r.body.toString())).toMatchObject({ method: 'POST' });
  }, 30_000);

  it('a chunked request body (no length) arrives whole, in chunks of any size, through both hops', async () => {
    const parts = [Buffer.alloc(1, 1), Buffer.alloc(70_000, 2), Buffer.alloc(3, 3), Buffer.alloc(200_000, 4)];
    const r = await gw('/cluster1/echo', { cert: true, method: 'POST', body: parts, headers: { 'transfer-encoding': 'chunked' } });
    expect(r.status).toBe(200);
    expect(r.body.equals(Buffer.concat(parts))).toBe(true);
    expect(lastRequest().headers['transfer-encoding']).toEqual(['chunked']);
  });

  it('an HTTP/1.0 client that offers only ALPN http/1.0 (curl --http1.0) is served, and the answer runs to the close', async () => {
    const { protocol, answer } = await new Promise<{ protocol: string | false | null; answer: string }>((resolve, reject) => {
      const s = tls.connect(
        {
          host: '127.0.0.1',
          port,
          servername: 'localhost',
          ca: pki.ca.certPem,
          cert: userCert.cert,
          key: userCert.key,
          ALPNProtocols: ['http/1.0'],
        },
        () => s.write('GET /cluster1/version HTTP/1.0\r\nHost: hub\r\n\r\n'),
      );
      let text = '';
      s.on('data', (d: Buffer) => (text += d.toString()));
      s.on('end', () => resolve({ protocol: s.alpnProtocol, answer: text }));
      s.on('error', reject);
    });
    expect(protocol).toBe('http/1.0');
    expect(answer.split('\r\n')[0]).toMatch(/^HTTP\/1\.[01] 200 /);
    expect(lastRequest().headers['impersonate-user']).toEqual(['alice']);
  });

  it('requests reuse a kept-alive tunneled connection to the agent: one dial for a burst, each request its own identity; idle ones close', async () => {
    const dials = async (): Promise<number> =>
      Number(
        /konnectivity_network_proxy_server_dial_duration_seconds_count (\d+)/.exec(
          (await getStatus(hub.ports.admin, '/metrics')).body,
        )?.[1] ?? NaN,
      );
    await expectTablesEmpty(hub, [agent]);
    const before = await dials();
    const users: string[] = [];
    for (let i = 0; i < 5; i++) {
      const r = await gw(`/cluster1/version?n=${i}`, { cert: true });
      expect(r.status).toBe(200);
      users.push(lastRequest().headers['impersonate-user']?.[0] ?? '');
    }
    expect(await dials()).toBe(before + 1);
    // Another caller does not get alice's connection.
    await gw('/cluster1/version', { token });
    expect(lastRequest().headers['impersonate-user']).toEqual(['cluster-proxy:token:bob']);
    expect(await dials()).toBe(before + 2);
    expect(users).toEqual(Array(5).fill('alice'));
    // Idle connections close after a few seconds: the tables drain.
    await expectTablesEmpty(hub, [agent]);
  });

  it('one audit line per request and the metrics by cluster and code', async () => {
    await gw('/cluster1/version', { cert: true });
    const line = await hub.proc.waitForJsonLine(
      (o) => o['msg'] === 'gateway request' && o['user'] === 'alice' && o['status'] === 200 && o['path'] === '/cluster1/version',
      5000,
    );
    expect(line).toMatchObject({ groups: ['team-a', 'viewers'], cluster: 'cluster1', method: 'GET' });
    expect(typeof line['bytesOut']).toBe('number');
    expect(typeof line['durationMs']).toBe('number');
    expect(hub.proc.lines().some((l) => l.includes(token))).toBe(false);
    const metrics = (await getStatus(hub.ports.admin, '/metrics')).body;
    expect(metrics).toMatch(/cluster_proxy_server_gateway_requests_total\{cluster="cluster1",code="200"\} \d+/);
    expect(metrics).toMatch(/cluster_proxy_server_gateway_requests_total\{cluster="",code="404"\} \d+/);
    expect(metrics).toMatch(/cluster_proxy_server_gateway_requests_total\{cluster="cluster3",code="503"\} 1/);
    expect(metrics).toMatch(/cluster_proxy_server_gateway_request_duration_seconds_count \d+/);
  });

  describe.skipIf(skipKubectl !== null)('kubectl v1.33 with server: https://127.0.0.1:PORT/cluster1', () => {
    const kubeconfig = async (name: string, user: Record<string, string>): Promise<string> => {
      const file = path.join(tmp, `${name}.kubeconfig`);
      await writeFile(
        file,
        JSON.stringify({
          apiVersion: 'v1',
          kind: 'Config',
          'current-context': 'gw',
          clusters: [{ name: 'gw', cluster: { server: `https://127.0.0.1:${port}/cluster1`, 'certificate-authority': pki.caPath } }],
          users: [{ name: 'u', user }],
          contexts: [{ name: 'gw', context: { cluster: 'gw', user: 'u' } }],
        }),
        { mode: 0o600 },
      );
      return file;
    };
    const kubectl = async (file: string, args: string[]): Promise<RunResult> =>
      runCommand(await kubectlBinary(), ['--kubeconfig', file, ...args, '--request-timeout', '20s'], {
        env: { PATH: process.env['PATH'], HOME: tmp },
        timeoutMs: 30_000,
      });

    it('kubectl version and get --raw /CLUSTER/version with a client certificate', async () => {
      const file = await kubeconfig('cert', { 'client-certificate': userCert.certPath, 'client-key': userCert.keyPath });
      // Discovery-style requests keep the server URL's path: /cluster1/version.
      const v = await kubectl(file, ['version', '-o', 'json']);
      expect(v.code, v.stderr).toBe(0);
      expect(JSON.parse(v.stdout)).toMatchObject({ serverVersion: { gitVersion: 'v1.33.0-gateway-test' } });
      expect(lastRequest().url).toMatch(/^\/version/);
      expect(lastRequest().headers['impersonate-user']).toEqual(['alice']);
      // `get --raw` replaces the server URL's path (client-go's Request.RequestURI): the path names the cluster itself.
      const raw = await kubectl(file, ['get', '--raw', '/cluster1/version']);
      expect(raw.code, raw.stderr).toBe(0);
      expect(JSON.parse(raw.stdout)).toMatchObject({ gitVersion: 'v1.33.0-gateway-test' });
      const lost = await kubectl(file, ['get', '--raw', '/version']);
      expect(lost.code).not.toBe(0);
      expect(lost.stderr).toMatch(/NotFound/);
    });

    it('kubectl get pods (a path with a query: ?limit=500) and get --raw with a query, with a hub token', async () => {
      const file = await kubeconfig('token', { token });
      const pods = await kubectl(file, ['get', 'pods', '-n', 'kube-system', '-o', 'name']);
      expect(pods.code, pods.stderr).toBe(0);
      expect(pods.stdout.trim()).toBe('pod/demo-pod');
      expect(lastRequest().url).toBe('/api/v1/namespaces/kube-system/pods?limit=500&timeout=20s');
      const r = await kubectl(file, [
        'get',
        '--raw',
        '/cluster1/api/v1/namespaces/kube-system/pods?limit=2&fieldSelector=status.phase%3DRunning',
      ]);
      expect(r.code, r.stderr).toBe(0);
      const seen = lastRequest();
      // kubectl re-encodes the query in key order and adds its timeout; it arrives as kubectl sent it.
      expect(seen.url).toBe('/api/v1/namespaces/kube-system/pods?fieldSelector=status.phase%3DRunning&limit=2&timeout=20s');
      expect(seen.headers['impersonate-user']).toEqual(['cluster-proxy:token:bob']);
      expect(seen.headers['authorization']).toEqual([`Bearer ${SA_TOKEN}`]);
    });

    it('cluster-proxy kubeconfig CLUSTER --via gateway: a kubeconfig with the gateway URL, the hub CA and a token for CLUSTER that kubectl uses as is', async () => {
      const file = path.join(tmp, 'via-gateway.kubeconfig');
      // (This test hub's CA is not under its data dir, as a hub started with --ca-cert's would be.)
      const made = await cli([
        'kubeconfig',
        'cluster1',
        '--via',
        'gateway',
        '--out',
        file,
        '--data-dir',
        hub.dataDir,
        '--hub-ca',
        pki.caPath,
      ]);
      expect(made.code, made.stderr).toBe(0);
      expect(made.stderr).toMatch(/via the hub's HTTP gateway 127\.0\.0\.1:\d+; issued token "kubeconfig-cluster1-[0-9a-f]{6}"/);
      expect(made.stderr).toContain('kubectl --kubeconfig');
      const pods = await kubectl(file, ['get', 'pods', '-n', 'kube-system', '-o', 'name']);
      expect(pods.code, pods.stderr).toBe(0);
      expect(pods.stdout.trim()).toBe('pod/demo-pod');
      expect(lastRequest().headers['impersonate-user']?.[0]).toMatch(/^cluster-proxy:token:kubeconfig-cluster1-[0-9a-f]{6}$/);
      expect(lastRequest().headers['authorization']).toEqual([`Bearer ${SA_TOKEN}`]);
      // What does not apply is refused, one line each; a hub without a gateway port says how to get one.
      const wrong = await cli(['kubeconfig', 'cluster1', '--via', 'gateway', '--apiserver-token', 'x', '--data-dir', hub.dataDir]);
      expect(wrong.code).toBe(2);
      expect(wrong.stderr.trim()).toMatch(/^cluster-proxy: --apiserver-token does not apply to --via gateway/);
      const noGateway = await cli(['kubeconfig', 'cluster1', '--via', 'gateway', '--data-dir', tmp]);
      expect(noGateway.code).toBe(2);
      expect(noGateway.stderr).toMatch(/no gateway port in .*ports\.json: start the hub with --gateway-port, or pass --gateway HOST:PORT/);
    });

    it('--via gateway --exec-command: kubectl runs the credential plugin (an OIDC login, say) and the gateway authenticates what it returns', async () => {
      // A plugin that answers as client-go expects, with a hub token, and notes the arguments it got.
      const plugin = path.join(tmp, 'credential-plugin.sh');
      const argsSeen = path.join(tmp, 'plugin-args');
      await writeFile(
        plugin,
        `#!/bin/sh\necho "$@" > '${argsSeen}'\necho '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"${token}"}}'\n`,
        { mode: 0o755 },
      );
      const file = path.join(tmp, 'via-exec.kubeconfig');
      const made = await cli([
        'kubeconfig',
        'cluster1',
        '--via',
        'gateway',
        '--exec-command',
        plugin,
        '--exec-arg',
        'get-token',
        '--exec-arg=--issuer=https://idp',
        '--out',
        file,
        '--data-dir',
        hub.dataDir,
        '--hub-ca',
        pki.caPath,
        '--no-check',
      ]);
      expect(made.code, made.stderr).toBe(0);
      expect(made.stderr).not.toMatch(/issued token/);
      const text = await readFile(file, 'utf8');
      expect(text).toContain("kubectl -> hub HTTP gateway -> agent -> apiserver, as the plugin's credential's user");
      expect(text).not.toContain('token:');
      const r = await kubectl(file, ['get', '--raw', '/cluster1/version']);
      expect(r.code, r.stderr).toBe(0);
      expect((await readFile(argsSeen, 'utf8')).trim()).toBe('get-token --issuer=https://idp');
      expect(lastRequest().headers['impersonate-user']).toEqual(['cluster-proxy:token:bob']);
      const both = await cli([
        'kubeconfig',
        'cluster1',
        '--via',
        'gateway',
        '--exec-command',
        plugin,
        '--token',
        token,
        '--data-dir',
        hub.dataDir,
        '--hub-ca',
        pki.caPath,
        '--no-check',
      ]);
      expect(both.code).toBe(2);
      expect(both.stderr).toMatch(/--exec-command and --token are two credentials: give one/);
    });

    it('a bad token: kubectl reports Unauthorized', async () => {
      const file = await kubeconfig('bad', { token: 'B'.repeat(43) });
      const r = await kubectl(file, ['get', '--raw', '/cluster1/version']);
      expect(r.code).not.toBe(0);
      expect(r.stderr).toMatch(/You must be logged in to the server/);
    });
  });

  it('join on a hub with the gateway: the install manifests grant the agent impersonation (users, groups, uids, user extras) and nothing more', async () => {
    const dir = path.join(tmp, 'cluster3-bundle');
    const texts = await Promise.all((await readdir(dir)).map((f) => readFile(path.join(dir, f), 'utf8')));
    const manifests = texts.find((t) => t.includes('kind: Deployment'));
    expect(manifests, 'the bundle has the install manifests').toBeDefined();
    expect(manifests).toContain('kind: ClusterRole\n');
    expect(manifests).toContain('kind: ClusterRoleBinding\n');
    expect(manifests).toMatch(/name: cluster-proxy-gateway-impersonator/);
    expect(manifests!.match(/verbs:\n\s+- impersonate/g)?.length).toBe(2);
  });

  it("afterwards the hub's and the agent's connection tables are empty", async () => {
    await expectTablesEmpty(hub, [agent]);
    await waitFor(async () => (await getStatus(hub.ports.health, '/readyz')).status === 200, { timeoutMs: 5000, message: 'hub ready' });
  });
});
