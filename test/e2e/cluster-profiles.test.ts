// ClusterProfiles (SIG-Multicluster's Cluster Inventory API) on an OCM hub, as OCM's cluster-proxy writes
// them with its ClusterProfile feature on (pkg/proxyserver/controllers/clusterprofile_controller.go @
// 8165e8e): a real hub process in manifestwork mode with the gateway and --cluster-profiles-gateway-url, on
// the Kubernetes store over the local API server fixture, which validates ClusterProfiles against the CRD
// OCM's repository ships (hack/crd/cluster-inventory/, in fixtures/schemas). The profiles are created the
// way OCM's registration creates them (labels x-k8s.io/cluster-manager and open-cluster-management.io/cluster-name).
import { X509Certificate } from 'node:crypto';
import https from 'node:https';
import type tls from 'node:tls';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { issueServerCert, type ClusterProfile, type Store } from '@cluster-proxy/server';
import {
  killAllSpawned,
  runCommand,
  writeAgentKubeconfig,
  startFakeKubeApiServer,
  startRecordingApiserver,
  waitFor,
  type FakeKubeApiServer,
  type RecordingApiserver,
} from '../src/fixtures/index.js';
import { CLI, createPki, startAgent, startHub, type AgentProcess, type HubProcess, type TestPki } from '../src/harness.js';

const HUB_USER = 'system:serviceaccount:open-cluster-management-cluster-proxy:cluster-proxy';
const NS = 'clusterset-a';
const GATEWAY_URL = 'https://cluster-proxy.open-cluster-management-cluster-proxy.svc:9092';

describe('ClusterProfile access provider (OCM hub, gateway on)', () => {
  let pki: TestPki;
  let api: FakeKubeApiServer;
  let hub: HubProcess;
  let agent: AgentProcess;
  let apiserver: RecordingApiserver;
  const store = (): Store => api.store;

  function profile(name: string, labels: Record<string, string>, status?: ClusterProfile['status']): ClusterProfile {
    return {
      apiVersion: 'multicluster.x-k8s.io/v1alpha1',
      kind: 'ClusterProfile',
      metadata: { name, namespace: NS, labels },
      spec: { clusterManager: { name: 'open-cluster-management' } },
      ...(status ? { status } : {}),
    };
  }
  const ocmLabels = (cluster: string): Record<string, string> => ({
    'x-k8s.io/cluster-manager': 'open-cluster-management',
    'open-cluster-management.io/cluster-name': cluster,
  });
  const get = (name: string) => store().get('ClusterProfile', { name, namespace: NS });
  const ours = (p: ClusterProfile | null) => p?.status?.accessProviders?.find((a) => a.name === 'open-cluster-management');
  const hubWrites = (name: string) =>
    api.writes().filter((w) => w.user === HUB_USER && w.kind === 'ClusterProfile' && w.name === name).length;

  beforeAll(async () => {
    pki = await createPki();
    api = await startFakeKubeApiServer({ namespaces: [NS] });
    const kubeconfig = path.join(pki.dir, 'kubeconfig');
    await api.writeKubeconfig(kubeconfig, HUB_USER);
    hub = await startHub(pki, [
      '--store',
      'kubernetes',
      '--kubeconfig',
      kubeconfig,
      '--agent-install',
      'manifestwork',
      '--ca-key',
      path.join(pki.dir, 'ca.key'),
      '--gateway-port',
      '0',
      '--cluster-profiles-gateway-url',
      `${GATEWAY_URL}/`,
    ]);
    apiserver = await startRecordingApiserver(issueServerCert(pki.ca, { commonName: 'c1-apiserver', ipAddresses: ['127.0.0.1'] }));
  }, 60_000);

  afterAll(async () => {
    await agent?.stop();
    await hub?.stop();
    await api?.close();
    await apiserver?.close();
    await killAllSpawned();
    await pki?.cleanup();
  });

  it('an OCM-managed profile gets the gateway: server URL/NAME, the hub CA, the exec extension with the cluster name; valid against the CRD', async () => {
    await store().create('ClusterProfile', profile('c1', ocmLabels('c1')));
    const p = await waitFor(async () => (ours(await get('c1')) ? get('c1') : null), {
      timeoutMs: 20_000,
      intervalMs: 100,
      message: 'no access provider on c1',
    });
    const provider = ours(p)!;
    expect(provider.cluster?.server).toBe(`${GATEWAY_URL}/c1`);
    expect(provider.cluster?.extensions).toEqual([{ name: 'client.authentication.k8s.io/exec', extension: { clusterName: 'c1' } }]);
    expect(p!.status?.conditions).toEqual([]);
    // The CA data is what the gateway's serving certificate chains to.
    const ca = new X509Certificate(Buffer.from(provider.cluster!['certificate-authority-data']!, 'base64'));
    const served = await new Promise<X509Certificate>((resolve, reject) => {
      const req = https.request(
        { host: '127.0.0.1', port: hub.ports.gateway!, path: '/c1/version', servername: 'localhost', ca: ca.toString(), agent: false },
        (res) => {
          resolve(new X509Certificate((res.socket as tls.TLSSocket).getPeerCertificate().raw));
          res.resume();
        },
      );
      req.on('error', reject);
      req.end();
    });
    expect(served.checkIssued(ca)).toBe(true);
    expect(api.pruned()).toEqual([]);
  });

  it("other providers' entries stay as they are; ours is appended, then put back if someone edits it", async () => {
    const theirs = { name: 'kubeconfig-secret', cluster: { server: 'https://c2.example.com:6443' } };
    const created = await store().create('ClusterProfile', profile('c2', ocmLabels('c2')));
    await store().updateStatus('ClusterProfile', { ...created, status: { accessProviders: [theirs] } });
    let p = await waitFor(async () => (ours(await get('c2')) ? get('c2') : null), {
      timeoutMs: 20_000,
      intervalMs: 100,
      message: 'no access provider on c2',
    });
    expect(p!.status!.accessProviders!.map((a) => a.name)).toEqual(['kubeconfig-secret', 'open-cluster-management']);
    expect(p!.status!.accessProviders![0]).toEqual(theirs);
    await store().updateStatus('ClusterProfile', {
      ...p!,
      status: {
        ...p!.status,
        accessProviders: [theirs, { name: 'open-cluster-management', cluster: { server: 'https://elsewhere:1/c2' } }],
      },
    });
    p = await waitFor(async () => (ours(await get('c2'))?.cluster?.server === `${GATEWAY_URL}/c2` ? get('c2') : null), {
      timeoutMs: 20_000,
      intervalMs: 100,
      message: 'our entry on c2 was not put back',
    });
    expect(p!.status!.accessProviders![0]).toEqual(theirs);
  });

  it('profiles of another cluster manager, or without a cluster name, are left alone; nothing is rewritten when nothing changed', async () => {
    await store().create(
      'ClusterProfile',
      profile('other', { 'x-k8s.io/cluster-manager': 'someone-else', 'open-cluster-management.io/cluster-name': 'other' }),
    );
    await store().create('ClusterProfile', profile('nameless', { 'x-k8s.io/cluster-manager': 'open-cluster-management' }));
    const c1Writes = hubWrites('c1');
    // A later profile shows that passes ran meanwhile.
    await store().create('ClusterProfile', profile('c3', ocmLabels('c3')));
    await waitFor(async () => ours(await get('c3')) ?? null, { timeoutMs: 20_000, intervalMs: 100, message: 'no access provider on c3' });
    expect((await get('other'))?.status).toBeUndefined();
    expect((await get('nameless'))?.status).toBeUndefined();
    expect(hubWrites('other') + hubWrites('nameless')).toBe(0);
    expect(hubWrites('c1')).toBe(c1Writes);
  });

  it('a consumer builds its client from the provider (path and CA) and its own credential, and reaches the cluster as itself', async () => {
    const agentKubeconfig = await writeAgentKubeconfig(path.join(pki.dir, 'agent.kubeconfig'), {
      server: `https://${apiserver.address}`,
      caPath: pki.caPath,
      token: 'agent-sa-token',
    });
    agent = await startAgent(pki, hub, { cluster: 'c1', apiserver: apiserver.address, args: ['--gateway-kubeconfig', agentKubeconfig] });
    const provider = ours(await get('c1'))!;
    const issued = await runCommand(
      process.execPath,
      [CLI, 'token', 'issue', '--name', 'inventory-consumer', '--cluster', 'c1', '--data-dir', hub.dataDir],
      { timeoutMs: 20_000 },
    );
    expect(issued.code, issued.stderr).toBe(0);
    // Here the gateway listens on a test port of 127.0.0.1, not the advertised Service name: only host and port
    // change; the path (the cluster) and the CA are the provider's.
    const url = new URL(provider.cluster!.server);
    const r = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = https.request(
        {
          host: '127.0.0.1',
          port: hub.ports.gateway!,
          path: `${url.pathname}/version`,
          servername: 'localhost',
          agent: false,
          ca: Buffer.from(provider.cluster!['certificate-authority-data']!, 'base64'),
          headers: { authorization: `Bearer ${issued.stdout.trim()}` },
        },
        (res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        },
      );
      req.on('error', reject);
      req.end();
    });
    expect(r.status, r.body).toBe(200);
    expect(JSON.parse(r.body)).toMatchObject({ gitVersion: expect.stringContaining('v1.33') });
    expect(apiserver.requests.at(-1)!.headers['impersonate-user']).toEqual(['cluster-proxy:token:inventory-consumer']);
  });
});
