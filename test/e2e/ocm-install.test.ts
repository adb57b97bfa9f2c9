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
    const t = tunnel ?? (await proxyClientTunnel());
    const payload = Buffer.from(`hello ${cluster} ${Math.random()}`);
    const s = await t.dial(`${cluster}:443`);
    const back = await echoRoundTripForTest(s, payload);
    expect(back.equals(payload)).toBe(true);
    s.destroy();
    if (!tunnel) t.close();
  }

  /** A hub client as OCM's Go components make one: the CA and the pair from Secrets proxy-server-ca / proxy-client. */
  async function proxyClientTunnel(): Promise<Tunnel> {
    const ns = 'open-cluster-management-cluster-proxy';
    const client = await waitFor(() => store().get('Secret', { name: 'proxy-client', namespace: ns }), { timeoutMs: 10_000, message: 'no proxy-client Secret' });
    const ca = (await store().get('Secret', { name: 'proxy-server-ca', namespace: ns }))!;
    const d = (data: Record<string, string> | undefined, k: string) => Buffer.from(data![k]!, 'base64');
    return new Tunnel({ address: `127.0.0.1:${hub.ports.frontend}`, serverName: 'localhost', caCert: d(ca.data, 'ca.crt'), cert: d(client.data, 'tls.crt'), key: d(client.data, 'tls.key') });
  }

  beforeAll(async () => {
    baseline = snapshotHandles();
    pki = await createPki();
    caKeyPath = path.join(pki.dir, 'ca.key');
    target = await startEchoServer();
    api = await startFakeKubeApiServer();
    kubeconfig = path.join(pki.dir, 'kubeconfig');
    await api.writeKubeconfig(kubeconfig);
    // --require-registration, as the chart runs it: only clusters OCM registered get in.
    hub = await startHub(pki, ['--store', 'kubernetes', '--kubeconfig', kubeconfig, '--agent-install', 'manifestwork', '--ca-key', caKeyPath, '--require-registration',
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
    // Bound to this incarnation of the cluster, as join's certificates are.
    const mc = (await store().get('ManagedCluster', { name: 'c1' }))!;
    expect(cert.subjectAltName).toBe(`URI:urn:cluster-proxy:cluster-uid:${mc.metadata.uid}`);
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

  it('an AddOnDeploymentConfig change updates the work; the new agent runs with the new env and namespace', async () => {
    const before = (await work('c1'))!;
    const firstAgent = klusterlets.get('c1')!.agents()[0]!;
    await store().create('AddOnDeploymentConfig', { apiVersion: 'addon.open-cluster-management.io/v1alpha1', kind: 'AddOnDeploymentConfig', metadata: { name: 'proxy', namespace: 'c1' },
      spec: { agentInstallNamespace: 'cp-agents', proxyConfig: { httpsProxy: 'http://proxy.corp.example:3128', noProxy: '.corp.example' },
        resourceRequirements: [{ containerID: 'deployments:*:proxy-agent', resources: { limits: { memory: '200Mi' } } }] } });
    const a = (await addon('c1'))!;
    await store().update('ManagedClusterAddOn', { ...a, spec: { ...a.spec, configs: [{ group: 'addon.open-cluster-management.io', resource: 'addondeploymentconfigs', name: 'proxy', namespace: 'c1' }] } });
    const updated = await waitFor(async () => {
      const w = await work('c1');
      return w && w.metadata.generation! > before.metadata.generation! ? w : null;
    }, { timeoutMs: 15_000, message: 'work not updated after the ADC change' });
    const dep = deploymentOf(updated);
    const env = Object.fromEntries(dep.spec.template.spec.containers[0]!.env.map((e) => [e.name, e.value]));
    expect(env['HTTPS_PROXY']).toBe('http://proxy.corp.example:3128');
    expect(env['NO_PROXY']).toContain('.corp.example');
    expect(updated.spec.workload.manifests.find((m) => m['kind'] === 'Namespace')).toMatchObject({ metadata: { name: 'cp-agents' } });
    expect(dep.spec.template.metadata.annotations['proxy.open-cluster-management.io/config-hash']).not.toBe(deploymentOf(before).spec.template.metadata.annotations['proxy.open-cluster-management.io/config-hash']);
    // The stand-in restarted the agent: the old process exited, the new one has the env in its process.
    await firstAgent.proc.exited;
    const next = await waitFor(() => klusterlets.get('c1')!.agents()[0], { timeoutMs: 15_000, message: 'no new agent' });
    const environ = (await readFile(`/proc/${next.proc.pid}/environ`, 'utf8')).split('\0');
    expect(environ).toContain('HTTPS_PROXY=http://proxy.corp.example:3128');
    expect(next.args).toContain('--namespace=cp-agents');
    // The hub at 127.0.0.1 is on NO_PROXY (loopback always is), so the new agent connects directly.
    const after = await availableAndCompleted('c1');
    expect(after.status?.namespace).toBe('cp-agents');
    expect(after.status?.healthCheck?.mode).toBe('Customized');
    await waitFor(async () => (await hub.tables()).agents.some((x) => x.cluster === 'c1'), { timeoutMs: 15_000, message: 'new agent not connected' });
    await roundTrip('c1');
  }, 60_000);

  it('a configuration that cannot be rendered keeps the last good work and says why on the addon', async () => {
    const before = (await work('c1'))!;
    const adc = (await store().get('AddOnDeploymentConfig', { name: 'proxy', namespace: 'c1' }))!;
    await store().update('AddOnDeploymentConfig', { ...adc, spec: { ...adc.spec, proxyConfig: { httpsProxy: 'ftp://proxy.corp.example:21' } } });
    const a = await waitFor(async () => {
      const cur = await addon('c1');
      return cond(cur, 'Progressing')?.reason === 'ConfigurationUnsupported' ? cur : null;
    }, { timeoutMs: 15_000, message: 'no ConfigurationUnsupported' });
    expect(cond(a, 'Progressing')?.message).toMatch(/proxyConfig\.httpsProxy/);
    expect((await work('c1'))!.metadata.generation).toBe(before.metadata.generation);
    expect(klusterlets.get('c1')!.agents().length).toBe(1);
    const cur = (await store().get('AddOnDeploymentConfig', { name: 'proxy', namespace: 'c1' }))!;
    await store().update('AddOnDeploymentConfig', { ...cur, spec: adc.spec });
    await availableAndCompleted('c1');
    expect((await work('c1'))!.metadata.generation).toBe(before.metadata.generation);
  }, 60_000);

  it('a work edited by someone else is put back on the next sync', async () => {
    const w = (await work('c1'))!;
    const edited = structuredClone(w);
    deploymentOf(edited).spec.template.spec.containers[0]!.args.push('--allow=*');
    await store().update('ManifestWork', edited);
    const restored = await waitFor(async () => {
      const cur = (await work('c1'))!;
      return cur.metadata.generation! > edited.metadata.generation! + 0 && !deploymentOf(cur).spec.template.spec.containers[0]!.args.includes('--allow=*') ? cur : null;
    }, { timeoutMs: 15_000, message: 'edited work not restored' });
    expect(deploymentOf(restored).spec.template.spec.containers[0]!.args).toEqual(deploymentOf(w).spec.template.spec.containers[0]!.args);
    await availableAndCompleted('c1');
  }, 60_000);

  it('forged or stray CSRs are refused with a reason; CSRs of other addons are left alone', async () => {
    const { Pkcs10CertificateRequestGenerator } = await import('@peculiar/x509');
    const { webcrypto } = await import('node:crypto');
    const alg = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' };
    const reg = (await addon('c1'))!.status!.registrations!.find((r) => r.signerName === SIGNER)!;
    const request = async (cn: string): Promise<string> => {
      const keys = await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify']) as webcrypto.CryptoKeyPair;
      const csr = await Pkcs10CertificateRequestGenerator.create({ name: `O=system:open-cluster-management:cluster:c1:addon:cluster-proxy, OU=${reg.subject.organizationUnit![0]!}, CN=${cn}`, keys: keys as never, signingAlgorithm: alg });
      return Buffer.from(csr.toString('pem')).toString('base64');
    };
    const mk = async (name: string, cluster: string, spec: Partial<CertificateSigningRequest['spec']>, addonName = 'cluster-proxy'): Promise<void> => {
      await store().create('CertificateSigningRequest', { apiVersion: 'certificates.k8s.io/v1', kind: 'CertificateSigningRequest',
        metadata: { name, labels: { 'open-cluster-management.io/cluster-name': cluster, 'open-cluster-management.io/addon-name': addonName } },
        spec: { request: await request(reg.subject.user), signerName: SIGNER, usages: ['client auth'], username: `system:open-cluster-management:${cluster}:agent`, ...spec } });
    };
    // c1's klusterlet asking for c2's identity.
    await mk('forged-other-cluster', 'c1', { request: await request('system:open-cluster-management:cluster:c2:addon:cluster-proxy:agent:proxy-agent') });
    await mk('forged-signer', 'c1', { signerName: 'example.com/not-ours' });
    await mk('gone-cluster', 'gone', { username: 'system:open-cluster-management:gone:agent' });
    await mk('not-enabled', 'c3', { username: 'system:open-cluster-management:c3:agent' });
    await mk('wrong-requester', 'c1', { username: 'system:open-cluster-management:c2:agent' });
    await mk('other-addon', 'c1', {}, 'some-other-addon');
    const want: Record<string, string> = { 'forged-other-cluster': 'SubjectMismatch', 'forged-signer': 'UnknownSigner', 'gone-cluster': 'ClusterNotFound', 'not-enabled': 'AddonNotEnabled', 'wrong-requester': 'RequesterMismatch' };
    for (const [name, reason] of Object.entries(want)) {
      const c = await waitFor(async () => (await store().get('CertificateSigningRequest', { name }))?.status?.conditions?.[0], { timeoutMs: 15_000, message: `${name} not answered` });
      expect([name, c.type, c.status, c.reason]).toEqual([name, 'Denied', 'True', reason]);
      expect(c.message).toBeTruthy();
      expect((await store().get('CertificateSigningRequest', { name }))?.status?.certificate).toBeUndefined();
    }
    // Several passes later, the other addon's CSR is still untouched.
    const passes = hub.proc.lineCount();
    await waitFor(() => hub.proc.lineCount() > passes || null, { timeoutMs: 3000, intervalMs: 100, message: 'no hub activity' }).catch(() => null);
    await new Promise((r) => setTimeout(r, 1500));
    expect((await store().get('CertificateSigningRequest', { name: 'other-addon' }))?.status).toBeUndefined();
  }, 60_000);

  it('installStrategy Placements: a selected cluster gets the addon and an agent; leaving the decision removes both', async () => {
    const cma = (await store().get('ClusterManagementAddOn', { name: 'cluster-proxy' }))!;
    await store().update('ClusterManagementAddOn', { ...cma, spec: { ...cma.spec, installStrategy: { type: 'Placements', placements: [{ name: 'cp-placement', namespace: 'default' }] } } });
    await store().create('Placement', { apiVersion: 'cluster.open-cluster-management.io/v1beta1', kind: 'Placement', metadata: { name: 'cp-placement', namespace: 'default' }, spec: { clusterSets: ['global'] } });
    const pd = await store().create('PlacementDecision', { apiVersion: 'cluster.open-cluster-management.io/v1beta1', kind: 'PlacementDecision',
      metadata: { name: 'cp-placement-decision-1', namespace: 'default', labels: { 'cluster.open-cluster-management.io/placement': 'cp-placement' } } });
    const decided = await store().updateStatus('PlacementDecision', { ...pd, status: { decisions: [{ clusterName: 'c2', reason: '' }] } });
    const a = await availableAndCompleted('c2');
    expect(a.metadata.ownerReferences?.[0]).toMatchObject({ kind: 'ClusterManagementAddOn', name: 'cluster-proxy', uid: cma.metadata.uid });
    await roundTrip('c2');
    const agent = klusterlets.get('c2')!.agents()[0]!;
    // c2 leaves the Placement: addon, work and agent go; c1's addon (enabled by hand) stays.
    await store().updateStatus('PlacementDecision', { ...decided, status: { decisions: [] } });
    await waitFor(async () => !(await addon('c2')) && !(await work('c2')), { timeoutMs: 15_000, message: 'c2 addon/work not removed' });
    await agent.proc.exited;
    expect(klusterlets.get('c2')!.agents()).toEqual([]);
    await waitFor(async () => !(await hub.tables()).agents.some((x) => x.cluster === 'c2'), { timeoutMs: 15_000, message: 'c2 tunnel still on the hub' });
    expect(await addon('c1')).not.toBeNull();
    expect(await work('c1')).not.toBeNull();
  }, 60_000);

  it('two hub replicas on the same addons: one work per cluster, no flapping', async () => {
    hub2 = await startHub(pki, ['--store', 'kubernetes', '--kubeconfig', kubeconfig, '--agent-install', 'manifestwork', '--ca-key', caKeyPath,
      '--tunnel-loss-window', '2s', '--tls-reload-interval', '500ms', '--server-id', 'hub-b', '--agent-entrypoint', `127.0.0.1:${hub.ports.agent}`]);
    // Back to Manual, so an admin-made addon is what installs c3.
    const cma = (await store().get('ClusterManagementAddOn', { name: 'cluster-proxy' }))!;
    await store().update('ClusterManagementAddOn', { ...cma, spec: { ...cma.spec, installStrategy: { type: 'Manual' } } });
    await enable('c3');
    await availableAndCompleted('c3');
    await availableAndCompleted('c1');
    const writes: string[] = [];
    const w = store().watch('ManifestWork', { resourceVersion: (await store().list('ManifestWork')).resourceVersion }, { onEvent: (e) => writes.push(`${e.type} ${e.object.metadata.namespace}`) });
    // Degraded may still move while agents find the new replica; what the install decides must not.
    const installConditions = async (c: string) => JSON.stringify((await addon(c))!.status!.conditions!.filter((x) => x.type !== 'Degraded').map((x) => [x.type, x.status, x.lastTransitionTime]));
    const before = new Map<string, string>();
    for (const c of ['c1', 'c3']) before.set(c, await installConditions(c));
    // Several passes of both replicas (status period 500 ms).
    await new Promise((r) => setTimeout(r, 4000));
    w.stop();
    expect((await store().list('ManifestWork')).items.map((x) => `${x.metadata.namespace}/${x.metadata.name}`).sort()).toEqual(['c1/' + WORK, 'c3/' + WORK]);
    expect((await store().list('ClusterManagementAddOn')).items.length).toBe(1);
    // Status-only writes of the stand-in are allowed; the hubs must not rewrite the works.
    const hubWrites = writes.filter((x) => !x.startsWith('MODIFIED'));
    expect(hubWrites).toEqual([]);
    for (const c of ['c1', 'c3']) {
      expect((await work(c))!.metadata.generation).toBe((await work(c))!.status?.conditions?.[0]?.observedGeneration);
      expect(await installConditions(c)).toBe(before.get(c));
    }
    // Take-over: freeze the leader (SIGSTOP); the other replica takes the manager lease and rewrites nothing.
    const leaseKey = { name: 'cluster-proxy-addon-manager', namespace: 'open-cluster-management-cluster-proxy' };
    const leader = (await store().get('Lease', leaseKey))!.spec.holderIdentity;
    const [frozen, other] = leader === 'hub-a' ? [hub, hub2] : [hub2, hub];
    const generations = async () => JSON.stringify(await Promise.all(['c1', 'c3'].map(async (c) => (await work(c))!.metadata.generation)));
    const gensBefore = await generations();
    frozen.proc.kill('SIGSTOP');
    try {
      await waitFor(async () => (await store().get('Lease', leaseKey))?.spec.holderIdentity === (other === hub ? 'hub-a' : 'hub-b'), { timeoutMs: 15_000, message: 'the other replica did not take over' });
      await new Promise((r) => setTimeout(r, 2000));
      expect(await generations()).toBe(gensBefore);
      for (const c of ['c1', 'c3']) expect(await installConditions(c)).toBe(before.get(c));
    } finally {
      frozen.proc.kill('SIGCONT');
    }
    await roundTrip('c3');
    await hub2.stop();
    hub2 = null;
  }, 90_000);

  it('CA rollover: the new signer changes the registration, the klusterlet asks again, the agent moves to a certificate of the new CA', async () => {
    const ca2: PemPair = createCA({ commonName: 'e2e-ca-2' });
    const oldOu = (await addon('c1'))!.status!.registrations!.find((r) => r.signerName === SIGNER)!.subject.organizationUnit![0];
    const csrsBefore = klusterlets.get('c1')!.csrs.size;
    // Stage 1+2 (add and promote): trust both, sign with the new CA, serve a certificate of the new CA.
    const server2 = issueServerCert(ca2, { commonName: 'hub', dnsNames: ['localhost'], ipAddresses: ['127.0.0.1', '::1'] });
    await writeFile(pki.server.certPath, server2.certPem);
    await writeFile(pki.server.keyPath, server2.keyPem);
    await writeFile(caKeyPath, ca2.keyPem);
    await writeFile(pki.caPath, ca2.certPem + pki.ca.certPem);
    const reg = await waitFor(async () => {
      const r = (await addon('c1'))?.status?.registrations?.find((x) => x.signerName === SIGNER);
      return r && r.subject.organizationUnit![0] !== oldOu ? r : null;
    }, { timeoutMs: 15_000, message: 'registration OU did not change with the signer' });
    expect(reg.subject.organizationUnit![0]).toMatch(/^signer-/);
    const signedByNew = async (): Promise<boolean> => {
      const k = klusterlets.get('c1')!;
      const agent = k.agents()[0];
      if (!agent) return false;
      const certArg = agent.args.find((x) => x.startsWith('--cert='))!.slice('--cert='.length);
      const pemText = await readFile(certArg, 'utf8').catch(() => '');
      return pemText !== '' && new X509Certificate(pemText).checkIssued(new X509Certificate(ca2.certPem));
    };
    await waitFor(signedByNew, { timeoutMs: 20_000, message: 'agent certificate not re-issued by the new CA' });
    expect(klusterlets.get('c1')!.csrs.size).toBeGreaterThan(csrsBefore);
    await availableAndCompleted('c1');
    // proxy-client follows the signer too.
    await waitFor(async () => {
      const s2 = await store().get('Secret', { name: 'proxy-client', namespace: 'open-cluster-management-cluster-proxy' });
      return new X509Certificate(Buffer.from(s2!.data!['tls.crt']!, 'base64')).checkIssued(new X509Certificate(ca2.certPem));
    }, { timeoutMs: 15_000, message: 'proxy-client not re-issued by the new CA' });
    // Stage 3 (finish): only the new CA; the work carries the new bundle and the agent still tunnels.
    const k = klusterlets.get('c1')!;
    const started = k.history.length;
    await writeFile(pki.caPath, ca2.certPem);
    await waitFor(async () => {
      const w = await work('c1');
      const ca = w?.spec.workload.manifests.find((m) => m['kind'] === 'Secret' && (m['metadata'] as { name: string }).name === 'cluster-proxy-ca') as { data: Record<string, string> } | undefined;
      return ca && Buffer.from(ca.data['ca.crt']!, 'base64').toString() === ca2.certPem;
    }, { timeoutMs: 15_000, message: 'work does not carry the new CA bundle' });
    // The new bundle rolled the agent (config hash); the new one connects with the new CA's certificate.
    await waitFor(() => k.history.length > started || null, { timeoutMs: 15_000, message: 'agent not restarted with the new bundle' });
    await k.history[k.history.length - 1]!.proc.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 20_000);
    expect(await signedByNew()).toBe(true);
    await availableAndCompleted('c1');
    await roundTrip('c1');
  }, 90_000);

  it('disabling the addon deletes the work and stops the agent; tables drain', async () => {
    const agents = ['c1', 'c3'].map((c) => klusterlets.get(c)!.agents()[0]!);
    await store().delete('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: 'c1' });
    // Deleting the cluster removes its addon and work as well.
    await store().delete('ManagedCluster', { name: 'c3' });
    await waitFor(async () => !(await work('c1')) && !(await work('c3')), { timeoutMs: 15_000, message: 'works not deleted' });
    for (const a of agents) await a.proc.exited;
    await waitFor(async () => (await hub.tables()).agents.length === 0, { timeoutMs: 15_000, message: 'hub still has agents' });
  }, 60_000);
});
