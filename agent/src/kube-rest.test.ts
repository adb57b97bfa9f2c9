import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  KubeConfigError,
  TOKEN_FILE_MAX_AGE_MS,
  bearerToken,
  fromKubeconfig,
  kubeRequest,
  loadKubeRestConfig,
  statusMessage,
} from './kube-rest.js';

let dir: string;
let server: https.Server;
let seen: { method?: string; url?: string; auth?: string; body?: string }[] = [];
let port = 0;

beforeAll(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'kube-rest-'));
  // A CA-less self-signed certificate for 127.0.0.1 is its own trust anchor.
  execFileSync(
    'openssl',
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:P-256',
      '-nodes',
      '-days',
      '1',
      '-subj',
      '/CN=apiserver',
      '-addext',
      'subjectAltName=IP:127.0.0.1',
      '-keyout',
      path.join(dir, 'tls.key'),
      '-out',
      path.join(dir, 'tls.crt'),
    ],
    { stdio: 'ignore' },
  );
  server = https.createServer(
    { cert: readFileSync(path.join(dir, 'tls.crt')), key: readFileSync(path.join(dir, 'tls.key')) },
    (req, res) => {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        seen.push({ method: req.method, url: req.url, auth: req.headers.authorization, body });
        if (req.url?.endsWith('/missing')) {
          res.writeHead(404, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ kind: 'Status', message: 'secrets "missing" not found', code: 404 }));
        } else {
          res.writeHead(200, { 'content-type': 'application/json' });
          res.end(JSON.stringify({ ok: true }));
        }
      });
    },
  );
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  port = (server.address() as AddressInfo).port;
});

afterAll(async () => {
  await new Promise((r) => server.close(r));
  rmSync(dir, { recursive: true, force: true });
});

function kubeconfig(name: string, user: Record<string, unknown>, cluster: Record<string, unknown> = {}): string {
  const file = path.join(dir, name);
  const ca = readFileSync(path.join(dir, 'tls.crt')).toString('base64');
  writeFileSync(
    file,
    [
      'apiVersion: v1',
      'kind: Config',
      'current-context: test  # a comment',
      'clusters:',
      '- name: test-cluster',
      '  cluster:',
      `    server: https://127.0.0.1:${port}`,
      `    certificate-authority-data: ${ca}`,
      ...Object.entries(cluster).map(([k, v]) => `    ${k}: ${String(v)}`),
      'contexts:',
      '- name: test',
      '  context: {cluster: test-cluster, user: test-user}',
      'users:',
      '- name: test-user',
      '  user:',
      ...Object.entries(user).map(([k, v]) => `    ${k}: ${typeof v === 'string' ? JSON.stringify(v) : JSON.stringify(v)}`),
      '',
    ].join('\n'),
  );
  return file;
}

describe("kube-rest: the agent's Kubernetes API calls without client-node", () => {
  it('a YAML kubeconfig with a token: verified TLS to the server, the bearer token sent, JSON both ways', async () => {
    const config = await fromKubeconfig(kubeconfig('token.yaml', { token: 'abc123' }));
    seen = [];
    const r = await kubeRequest(config, 'PUT', '/api/v1/namespaces/ns/secrets/s', { data: { a: 'Yg==' } });
    expect(r).toEqual({ status: 200, body: { ok: true } });
    expect(seen).toEqual([{ method: 'PUT', url: '/api/v1/namespaces/ns/secrets/s', auth: 'Bearer abc123', body: '{"data":{"a":"Yg=="}}' }]);
  });

  it('a tokenFile is read again once the token read from it is a minute old (rotated service-account tokens, as client-go)', async () => {
    const tokenFile = path.join(dir, 'token');
    writeFileSync(tokenFile, 'first\n');
    const config = await fromKubeconfig(kubeconfig('tokenfile.yaml', { tokenFile: 'token' }));
    seen = [];
    await kubeRequest(config, 'GET', '/api/v1/namespaces/ns/secrets/s');
    writeFileSync(tokenFile, 'second\n');
    await kubeRequest(config, 'GET', '/api/v1/namespaces/ns/secrets/s');
    expect(seen.map((s) => s.auth)).toEqual(['Bearer first', 'Bearer first']);
    const at = Date.now();
    expect(await bearerToken(config, at + TOKEN_FILE_MAX_AGE_MS)).toBe('second');
    // A file that cannot be read once the minute is over is an error, not the stale token.
    rmSync(tokenFile);
    await expect(bearerToken(config, at + 3 * TOKEN_FILE_MAX_AGE_MS)).rejects.toThrow(/ENOENT/);
  });

  it("an error status comes back with the apiserver's message", async () => {
    const config = await fromKubeconfig(kubeconfig('err.yaml', { token: 't' }));
    const r = await kubeRequest(config, 'GET', '/api/v1/namespaces/ns/secrets/missing');
    expect(r.status).toBe(404);
    expect(statusMessage(r.status, r.body)).toBe('secrets "missing" not found (HTTP 404)');
  });

  it('a server whose certificate the kubeconfig does not trust is refused', async () => {
    const file = path.join(dir, 'untrusted.json');
    writeFileSync(
      file,
      JSON.stringify({
        'current-context': 'c',
        contexts: [{ name: 'c', context: { cluster: 'k', user: 'u' } }],
        clusters: [{ name: 'k', cluster: { server: `https://127.0.0.1:${port}` } }],
        users: [{ name: 'u', user: { token: 't' } }],
      }),
    );
    const config = await fromKubeconfig(file);
    await expect(kubeRequest(config, 'GET', '/x')).rejects.toThrow(/SELF_SIGNED|UNABLE_TO_VERIFY|DEPTH_ZERO/);
  });

  it('bad kubeconfigs get one line naming the file and what is wrong', async () => {
    await expect(fromKubeconfig(path.join(dir, 'nope.yaml'))).rejects.toThrow(/cannot read kubeconfig .*nope\.yaml: ENOENT/);
    await expect(fromKubeconfig(kubeconfig('exec.yaml', { exec: { command: 'aws' } }))).rejects.toThrow(
      'uses exec, which the agent does not run',
    );
    const noContext = path.join(dir, 'noctx.yaml');
    writeFileSync(noContext, 'apiVersion: v1\ncurrent-context: gone\ncontexts: []\n');
    await expect(fromKubeconfig(noContext)).rejects.toThrow('current-context "gone" is not among its contexts');
    const broken = path.join(dir, 'broken.yaml');
    writeFileSync(broken, 'clusters: [\n');
    await expect(fromKubeconfig(broken)).rejects.toBeInstanceOf(KubeConfigError);
  });

  it('without KUBECONFIG, ~/.kube/config or a pod, says so', async () => {
    await expect(loadKubeRestConfig({ HOME: dir })).rejects.toThrow('no Kubernetes API settings');
  });
});
