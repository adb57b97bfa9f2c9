// @kubernetes/client-node reaches a managed cluster's apiserver through the tunnel unchanged: only
// the kubeconfig's server (https://CLUSTER) and the agent hook differ from a direct connection.
import https from 'node:https';
import type net from 'node:net';
import * as k8s from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { routeKubeConfigThroughTunnel, type Tunnel } from '@cluster-proxy/client';
import { issueServerCert } from '@cluster-proxy/server';
import { killAllSpawned, snapshotHandles, waitForHandlesAtMost } from '../src/fixtures/index.js';
import { createPki, expectTablesEmpty, startAgent, startHub, type AgentProcess, type HubProcess, type TestPki } from '../src/harness.js';

let pki: TestPki;
let hub: HubProcess;
let agent: AgentProcess;
let api: https.Server;
let tunnel: Tunnel;
const seen: { path: string; auth: string | undefined }[] = [];

beforeAll(async () => {
  pki = await createPki();
  const tls = issueServerCert(pki.ca, { commonName: 'kube-apiserver', dnsNames: ['kc', 'kubernetes.default.svc'] });
  api = https.createServer({ cert: tls.certPem, key: tls.keyPem }, (req, res) => {
    seen.push({ path: req.url ?? '', auth: req.headers.authorization });
    if (req.url === '/version') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          major: '1',
          minor: '33',
          gitVersion: 'v1.33.0-test',
          gitCommit: 'abc',
          gitTreeState: 'clean',
          buildDate: '2026-01-01T00:00:00Z',
          goVersion: 'go1.24',
          compiler: 'gc',
          platform: 'linux/amd64',
        }),
      );
      return;
    }
    res.writeHead(404).end();
  });
  await new Promise<void>((r) => api.listen(0, '127.0.0.1', r));
  hub = await startHub(pki);
  agent = await startAgent(pki, hub, { cluster: 'kc', apiserver: `127.0.0.1:${(api.address() as net.AddressInfo).port}` });
});

afterAll(async () => {
  await Promise.all([hub?.stop(), agent?.stop()]);
  await killAllSpawned();
  api?.closeAllConnections();
  await new Promise((r) => api?.close(r));
  await pki?.cleanup();
});

describe('@kubernetes/client-node through the tunnel', () => {
  it('gets /version from the managed apiserver, verifying its certificate and sending the token', async () => {
    const handles = snapshotHandles();
    tunnel = hub.tunnel();
    const kc = new k8s.KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: 'kc', server: 'https://kc', caData: Buffer.from(pki.ca.certPem).toString('base64'), skipTLSVerify: false }],
      users: [{ name: 'admin', token: 'secret-token' }],
      contexts: [{ name: 'kc', cluster: 'kc', user: 'admin' }],
      currentContext: 'kc',
    });
    routeKubeConfigThroughTunnel(kc, tunnel);
    const version = await kc.makeApiClient(k8s.VersionApi).getCode();
    expect(version.gitVersion).toBe('v1.33.0-test');
    expect(seen).toContainEqual({ path: '/version', auth: 'Bearer secret-token' });
    tunnel.close();
    await expectTablesEmpty(hub, [agent]);
    await waitForHandlesAtMost(handles, 5000);
  });
});
