// `--agent-install manifestwork`: the hub as OCM's addon manager, with real processes: the hub (and a
// second replica) on the Kubernetes store over the local API server fixture, and one klusterlet
// stand-in per managed cluster (test/src/fixtures/klusterlet.ts) that turns the hub's ManifestWork and
// CSR answers into running `cluster-proxy agent` processes. Nothing is run against a managed cluster by
// hand: enabling the addon is creating a ManagedClusterAddOn (what `clusteradm addon enable` does) or
// selecting the cluster in a Placement.
import { readFile, writeFile } from 'node:fs/promises';
import { X509Certificate } from 'node:crypto';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createCA, issueServerCert, type CertificateSigningRequest, type ManagedCluster, type ManagedClusterAddOn, type ManifestWork, type PemPair,
} from '@cluster-proxy/server';
import { Tunnel } from '@cluster-proxy/client';
import { killAllSpawned, snapshotHandles, startEchoServer, startFakeKubeApiServer, waitFor, waitForHandlesAtMost, type FakeKubeApiServer, type TcpTarget } from '../src/fixtures/index.js';
import { KlusterletStandIn } from '../src/fixtures/klusterlet.js';
import { CLI, createPki, startHub, type HubProcess, type TestPki } from '../src/harness.js';
import { echoRoundTripForTest } from '../src/join-helpers.js';

const WORK = 'addon-cluster-proxy-deploy-0';
const SIGNER = 'open-cluster-management.io/proxy-agent-signer';

describe('OCM install mode (ManifestWork + CSR flow)', () => {
  let pki: TestPki;
  let api: FakeKubeApiServer;
  let hub: HubProcess;
  let hub2: HubProcess | null = null;
  let target: TcpTarget;
  let caKeyPath = '';
  let kubeconfig = '';
  const klusterlets = new Map<string, KlusterletStandIn>();
  let baseline: Map<string, number>;

  const store = () => api.store;
  const cond = (a: ManagedClusterAddOn | null, type: string) => a?.status?.conditions?.find((c) => c.type === type);
  const addon = (cluster: string) => store().get('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: cluster });
  const work = (cluster: string) => store().get('ManifestWork', { name: WORK, namespace: cluster });
  const deploymentOf = (w: ManifestWork) => w.spec.workload.manifests.find((m) => m['kind'] === 'Deployment') as unknown as {
    metadata: { annotations: Record<string, string>; labels: Record<string, string> };
    spec: { template: { metadata: { annotations: Record<string, string> }; spec: { containers: { args: string[]; env: { name: string; value: string }[] }[] } } };
  };

  async function managedCluster(name: string): Promise<void> {
    const mc: ManagedCluster = { apiVersion: 'cluster.open-cluster-management.io/v1', kind: 'ManagedCluster', metadata: { name }, spec: { hubAcceptsClient: true, leaseDurationSeconds: 60 } };
    await store().create('ManagedCluster', mc);
    const k = new KlusterletStandIn({ cluster: name, hub: store(), cli: CLI, apiserver: `127.0.0.1:${target.port}` });
    await k.start();
    klusterlets.set(name, k);
  }

  async function enable(cluster: string, spec: ManagedClusterAddOn['spec'] = {}): Promise<void> {
    await store().create('ManagedClusterAddOn', { apiVersion: 'addon.open-cluster-management.io/v1alpha1', kind: 'ManagedClusterAddOn', metadata: { name: 'cluster-proxy', namespace: cluster }, spec });
  }

  async function availableAndCompleted(cluster: string, timeoutMs = 30_000): Promise<ManagedClusterAddOn> {
    return waitFor(async () => {
      const a = await addon(cluster);
      return cond(a, 'Available')?.status === 'True' && cond(a, 'ManifestApplied')?.status === 'True' && cond(a, 'Progressing')?.reason === 'Completed' ? a : null;
    }, { timeoutMs, intervalMs: 100, message: `addon of ${cluster} did not become Available/Completed` }).catch(async (err: Error) => {
      throw new Error(`${err.message}: ${JSON.stringify((await addon(cluster))?.status)} klusterlet errors: ${klusterlets.get(cluster)?.errors.join('; ')}`);
    });
  }

  /** Bytes through the hub to the cluster's apiserver address (CLUSTER:443 → the ExternalName → our target). */
  async function roundTrip(cluster: string, tunnel?: Tunnel): Promise<void> {
    const t = tunnel ?? hub.tunnel();
    const payload = Buffer.from(`hello ${cluster} ${Math.random()}`);
    const s = await t.dial(`${cluster}:443`);
    const back = await echoRoundTripForTest(s, payload);
    expect(back.equals(payload)).toBe(true);
    s.destroy();
    if (!tunnel) t.close();
  }

  beforeAll(async () => {
    baseline = snapshotHandles();
    pki = await createPki();
    caKeyPath = path.join(pki.dir, 'ca.key');
    target = await startEchoServer();
    api = await startFakeKubeApiServer();
    kubeconfig = path.join(pki.dir, 'kubeconfig');
    await api.writeKubeconfig(kubeconfig);
    hub = await startHub(pki, ['--store', 'kubernetes', '--kubeconfig', kubeconfig, '--agent-install', 'manifestwork', '--ca-key', caKeyPath,
      '--tunnel-loss-window', '2s', '--tls-reload-interval', '500ms', '--server-id', 'hub-a']);
    for (const c of ['c1', 'c2', 'c3']) await managedCluster(c);
  }, 60_000);

  afterAll(async () => {
    for (const k of klusterlets.values()) await k.stop();
    await hub2?.stop();
    await hub?.stop();
    await api?.close();
    await target?.close();
    await killAllSpawned();
    await pki?.cleanup();
    await waitForHandlesAtMost(baseline, 5000);
  }, 60_000);

  it('enabling the addon installs the agent: ManifestWork, CSR approved and signed, agent tunnelling, Available True', async () => {
    await enable('c1');
    const a = await availableAndCompleted('c1');
    expect(cond(a, 'RegistrationApplied')?.status).toBe('True');
    expect(a.status?.registrations?.map((r) => r.signerName)).toEqual(['kubernetes.io/kube-apiserver-client', SIGNER]);
    const reg = a.status!.registrations!.find((r) => r.signerName === SIGNER)!;
    expect(reg.subject.user).toBe('system:open-cluster-management:cluster:c1:addon:cluster-proxy:agent:proxy-agent');
    expect(reg.subject.organizationUnit?.[0]).toMatch(/^signer-[0-9a-f]+$/);
    // The ClusterManagementAddOn OCM's tooling reads.
    const cma = await store().get('ClusterManagementAddOn', { name: 'cluster-proxy' });
    expect(cma?.metadata.annotations?.['addon.open-cluster-management.io/lifecycle']).toBe('addon-manager');
    expect(cma?.spec.installStrategy?.type).toBe('Manual');
    // The work: owned by the addon, OCM's names, no bootstrap token, the client-cert Secret mounted.
    const w = (await work('c1'))!;
    expect(w.metadata.ownerReferences?.[0]).toMatchObject({ kind: 'ManagedClusterAddOn', name: 'cluster-proxy', uid: a.metadata.uid });
    const kinds = w.spec.workload.manifests.map((m) => `${String(m['kind'])}/${(m['metadata'] as { name: string }).name}`);
    expect(kinds).toContain('Secret/cluster-proxy-ca');
    expect(kinds).toContain('Deployment/cluster-proxy-proxy-agent');
    expect(kinds).toContain('Service/c1');
    expect(kinds.some((k) => k.includes('bootstrap'))).toBe(false);
    const dep = deploymentOf(w);
    expect(dep.metadata.labels['open-cluster-management.io/addon']).toBe('cluster-proxy');
    expect(dep.spec.template.metadata.annotations['proxy.open-cluster-management.io/config-hash']).toMatch(/^[0-9a-f]{16}$/);
    expect(dep.spec.template.spec.containers[0]!.args).toContain('--cert=/etc/cluster-proxy/client-cert/tls.crt');
    // The CSR: the stand-in's ECDSA request, approved and signed by the hub CA, 180 days at most.
    const csrs = (await store().list('CertificateSigningRequest')).items.filter((c) => c.metadata.labels?.['open-cluster-management.io/cluster-name'] === 'c1');
    expect(csrs.length).toBe(1);
    expect(csrs[0]!.status?.conditions?.map((c) => [c.type, c.status])).toEqual([['Approved', 'True']]);
    const cert = new X509Certificate(Buffer.from(csrs[0]!.status!.certificate!, 'base64'));
    expect(cert.checkIssued(new X509Certificate(pki.ca.certPem))).toBe(true);
    expect(cert.subject).toContain('CN=system:open-cluster-management:cluster:c1:addon:cluster-proxy:agent:proxy-agent');
    expect(Date.parse(cert.validTo) - Date.now()).toBeLessThanOrEqual(180 * 86_400_000);
    expect(cert.publicKey.asymmetricKeyType).toBe('ec');
    await roundTrip('c1');
    // Hub-side names existing clients read: proxy-server-ca and a working proxy-client pair.
    const ns = 'open-cluster-management-cluster-proxy';
    const caSecret = await waitFor(() => store().get('Secret', { name: 'proxy-server-ca', namespace: ns }), { timeoutMs: 10_000, message: 'proxy-server-ca' });
    expect(Buffer.from(caSecret.data!['ca.crt']!, 'base64').toString()).toBe(pki.ca.certPem);
    const client = (await store().get('Secret', { name: 'proxy-client', namespace: ns }))!;
    const d = (k: string) => Buffer.from(client.data![k]!, 'base64');
    const t = new Tunnel({ address: `127.0.0.1:${hub.ports.frontend}`, serverName: 'localhost', caCert: d('ca.crt'), cert: d('tls.crt'), key: d('tls.key') });
    await roundTrip('c1', t);
    t.close();
  }, 60_000);
});
