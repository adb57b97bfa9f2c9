// `--agent-install manifestwork`: the hub as the addon's half of OCM's addon-framework contract, with real
// processes: the hub (and a second replica) on the Kubernetes store over the local API server fixture
// (test/src/fixtures/kube-api-server.ts: OCM's CRD schemas, the apiserver's own semantics, the caller's
// identity on CSRs), beside stand-ins built from OCM's code: OCM's hub addon-manager
// (fixtures/ocm-addon-manager.ts: install strategy, config references with spec hashes, Progressing) and
// one klusterlet per managed cluster (fixtures/klusterlet.ts: registration and work agents, through the
// API only) that turns the hub's ManifestWork and CSR answers into running `cluster-proxy agent`
// processes. Nothing is run against a managed cluster by hand: enabling the addon is creating a
// ManagedClusterAddOn (what `clusteradm addon enable` does) or selecting the cluster in a Placement.
import { readFile, writeFile } from 'node:fs/promises';
import { X509Certificate } from 'node:crypto';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  createCA,
  DEFAULT_AGENT_IMAGE,
  issueServerCert,
  type CertificateSigningRequest,
  type ManagedCluster,
  type ManagedClusterAddOn,
  type ManifestWork,
  type PemPair,
  type Store,
} from '@cluster-proxy/server';
import { Tunnel, TunnelError } from '@cluster-proxy/client';
import { renderAgentWork } from '@cluster-proxy/server/ocm';
import {
  killAllSpawned,
  snapshotHandles,
  startEchoServer,
  startFakeKubeApiServer,
  waitFor,
  waitForHandlesAtMost,
  type FakeKubeApiServer,
  type TcpTarget,
} from '../src/fixtures/index.js';
import { KlusterletStandIn, type ManagedObject } from '../src/fixtures/klusterlet.js';
import { OCM_ADDON_MANAGER_USER, OcmAddonManagerStandIn } from '../src/fixtures/ocm-addon-manager.js';
import { CLI, createPki, startHub, type HubProcess, type TestPki } from '../src/harness.js';
import { echoRoundTripForTest } from '../src/join-helpers.js';
import { ocmHubArgs } from '../src/fixtures/ocm-hub-api.js';

const WORK = 'addon-cluster-proxy-deploy-0';
const SIGNER = 'open-cluster-management.io/proxy-agent-signer';
const AGENT_NS = 'open-cluster-management-cluster-proxy';
/** The hub's identity towards the API server (as the chart's service account). */
const HUB_USER = 'system:serviceaccount:open-cluster-management-cluster-proxy:cluster-proxy';
const OCM_IMAGE = 'quay.io/open-cluster-management/cluster-proxy:v0.7.0';

describe("OCM install mode (ManifestWork + CSR flow) beside OCM's addon-manager and klusterlet stand-ins", () => {
  let pki: TestPki;
  let api: FakeKubeApiServer;
  let hub: HubProcess;
  let hub2: HubProcess | null = null;
  let target: TcpTarget;
  let ocm: OcmAddonManagerStandIn;
  let caKeyPath = '';
  let kubeconfig = '';
  const klusterlets = new Map<string, KlusterletStandIn>();
  let baseline: Map<string, number>;

  const store = (): Store => api.store;
  const cond = (a: ManagedClusterAddOn | null, type: string) => a?.status?.conditions?.find((c) => c.type === type);
  const addon = (cluster: string) => store().get('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: cluster });
  const work = (cluster: string) => store().get('ManifestWork', { name: WORK, namespace: cluster });
  const deploymentOf = (w: ManifestWork) =>
    w.spec.workload.manifests.find((m) => m['kind'] === 'Deployment') as unknown as {
      metadata: { annotations: Record<string, string>; labels: Record<string, string> };
      spec: {
        selector: { matchLabels: Record<string, string> };
        template: {
          metadata: { annotations: Record<string, string> };
          spec: {
            securityContext: Record<string, unknown>;
            containers: { image: string; args: string[]; env: { name: string; value: string }[] }[];
          };
        };
      };
    };

  async function managedCluster(name: string, driver: 'csr' | 'grpc' = 'csr'): Promise<void> {
    // OCM's registration makes the cluster namespace on the hub when it accepts the cluster.
    await store().ensureNamespace(name);
    const mc: ManagedCluster = {
      apiVersion: 'cluster.open-cluster-management.io/v1',
      kind: 'ManagedCluster',
      metadata: { name },
      spec: { hubAcceptsClient: true, leaseDurationSeconds: 60 },
    };
    await store().create('ManagedCluster', mc);
    const k = new KlusterletStandIn({
      cluster: name,
      api,
      cli: CLI,
      apiserver: `127.0.0.1:${target.port}`,
      driver,
      runsImage: (image) => !image.startsWith('quay.io/open-cluster-management/'),
    });
    await k.start();
    klusterlets.set(name, k);
  }

  async function enable(cluster: string, spec: ManagedClusterAddOn['spec'] = {}): Promise<void> {
    await store().create('ManagedClusterAddOn', {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'ManagedClusterAddOn',
      metadata: { name: 'cluster-proxy', namespace: cluster },
      spec,
    });
  }

  async function availableAndCompleted(cluster: string, timeoutMs = 30_000): Promise<ManagedClusterAddOn> {
    return waitFor(
      async () => {
        const a = await addon(cluster);
        return cond(a, 'Available')?.status === 'True' &&
          cond(a, 'ManifestApplied')?.status === 'True' &&
          cond(a, 'Progressing')?.reason === 'Completed'
          ? a
          : null;
      },
      { timeoutMs, intervalMs: 100, message: `addon of ${cluster} did not become Available/Completed` },
    ).catch(async (err: Error) => {
      throw new Error(
        `${err.message}: ${JSON.stringify((await addon(cluster))?.status)} klusterlet errors: ${klusterlets.get(cluster)?.errors.join('; ')} stuck: ${klusterlets.get(cluster)?.stuck().join('; ')}`,
      );
    });
  }

  /** Bytes through the hub to the cluster's apiserver address (CLUSTER:443 → the ExternalName → our target). */
  async function roundTrip(cluster: string, tunnel?: Tunnel): Promise<void> {
    const t = tunnel ?? (await proxyClientTunnel());
    const payload = Buffer.from(`hello ${cluster} ${Math.random()}`);
    // A changed work restarts the agent (the klusterlet stand-in stops the old process before it starts
    // the new one; a Deployment's rolling update would overlap them), and its addon stays Available
    // through a restart that short: until it is back, a dial finds no agent.
    const s = await waitFor(
      () =>
        t.dial(`${cluster}:443`).catch((err: unknown) => {
          if (err instanceof TunnelError && err.reason === 'no_agent') return null;
          throw err;
        }),
      { timeoutMs: 15_000, intervalMs: 200, message: `no agent of ${cluster} at the hub` },
    );
    const back = await echoRoundTripForTest(s, payload);
    expect(back.equals(payload)).toBe(true);
    s.destroy();
    if (!tunnel) t.close();
  }

  /** A hub client as OCM's Go components make one: the CA and the pair from Secrets proxy-server-ca / proxy-client. */
  async function proxyClientTunnel(): Promise<Tunnel> {
    const client = await waitFor(() => store().get('Secret', { name: 'proxy-client', namespace: AGENT_NS }), {
      timeoutMs: 10_000,
      message: 'no proxy-client Secret',
    });
    const ca = (await store().get('Secret', { name: 'proxy-server-ca', namespace: AGENT_NS }))!;
    const d = (data: Record<string, string> | undefined, k: string) => Buffer.from(data![k]!, 'base64');
    return new Tunnel({
      address: `127.0.0.1:${hub.ports.frontend}`,
      serverName: 'localhost',
      caCert: d(ca.data, 'ca.crt'),
      cert: d(client.data, 'tls.crt'),
      key: d(client.data, 'tls.key'),
    });
  }

  /** Hub passes, counted by the leader's renewals of the addon-manager Lease (one per pass). */
  async function hubPasses(n: number): Promise<void> {
    const count = () =>
      api.writes().filter((w) => w.user === HUB_USER && w.kind === 'Lease' && w.name === 'cluster-proxy-addon-manager').length;
    const from = count();
    await waitFor(() => count() >= from + n || null, { timeoutMs: 20_000, intervalMs: 50, message: `${n} hub passes` });
  }

  /**
   * The two-writer rule: no status field (or condition type) of an object is changed by two of the
   * hub, OCM's addon-manager and the klusterlet. Returns the fields written by more than one.
   */
  function sharedFields(): string[] {
    const writers = new Map<string, Set<string>>();
    for (const w of api.writes()) {
      if (!w.subresource) continue;
      for (const f of w.changed) {
        const k = `${w.kind} ${w.namespace ?? ''}/${w.name} ${f}`;
        if (!writers.has(k)) writers.set(k, new Set());
        writers.get(k)!.add(w.user);
      }
    }
    return [...writers].filter(([, users]) => users.size > 1).map(([k, users]) => `${k}: ${[...users].join(' + ')}`);
  }

  beforeAll(async () => {
    baseline = snapshotHandles();
    pki = await createPki();
    caKeyPath = path.join(pki.dir, 'ca.key');
    target = await startEchoServer();
    api = await startFakeKubeApiServer();
    kubeconfig = path.join(pki.dir, 'kubeconfig');
    await api.writeKubeconfig(kubeconfig, HUB_USER);
    ocm = new OcmAddonManagerStandIn(api);
    await ocm.start();
    // --require-registration, as the chart runs it: only clusters OCM registered get in.
    hub = await startHub(pki, ocmHubArgs({ kubeconfig, caKey: caKeyPath, serverId: 'hub-a' }));
    for (const c of ['c1', 'c2', 'c3']) await managedCluster(c, c === 'c2' ? 'grpc' : 'csr');
  }, 60_000);

  afterAll(async () => {
    for (const k of klusterlets.values()) await k.stop();
    await ocm?.stop();
    await hub2?.stop();
    await hub?.stop();
    await api?.close();
    await target?.close();
    await killAllSpawned();
    await pki?.cleanup();
    await waitForHandlesAtMost(baseline, 5000);
  }, 60_000);

  it("enabling the addon installs the agent: valid objects, work with OCM's annotations and deleteOption, CSR approved and signed, agent tunnelling", async () => {
    await enable('c1');
    const a = await availableAndCompleted('c1');
    expect(cond(a, 'RegistrationApplied')?.status).toBe('True');
    // The addon's half: supportedConfigs, one registration, the install namespace.
    expect(a.status?.supportedConfigs).toEqual([
      { group: 'proxy.open-cluster-management.io', resource: 'managedproxyconfigurations' },
      { group: 'addon.open-cluster-management.io', resource: 'addondeploymentconfigs' },
    ]);
    expect(a.status?.registrations?.map((r) => r.signerName)).toEqual([SIGNER]);
    const reg = a.status!.registrations![0]!;
    expect(reg.subject.user).toBe('system:open-cluster-management:cluster:c1:addon:cluster-proxy:agent:proxy-agent');
    expect(reg.subject.groups).toContain('open-cluster-management:cluster-proxy');
    expect(reg.subject.organizationUnit?.[0]).toMatch(/^signer-[0-9a-f]+$/);
    expect(a.status?.namespace).toBe(AGENT_NS);
    // OCM's half came from OCM's addon-manager stand-in: the resolved MPC with its spec hash.
    const refs = a.status?.configReferences ?? [];
    expect(refs.map((r) => [r.resource, r.desiredConfig?.name])).toEqual([['managedproxyconfigurations', 'cluster-proxy']]);
    // The ClusterManagementAddOn and ManagedProxyConfiguration the hub made exist: the API server validated them.
    const cma = await store().get('ClusterManagementAddOn', { name: 'cluster-proxy' });
    expect(cma?.metadata.annotations?.['addon.open-cluster-management.io/lifecycle']).toBe('addon-manager');
    const mpc = await store().get('ManagedProxyConfiguration', { name: 'cluster-proxy' });
    expect(mpc?.spec.proxyAgent.image).toBe(DEFAULT_AGENT_IMAGE);
    // The work: controller-owned by the addon, the config-spec-hash OCM's rollout compares, the namespace orphaned.
    const w = (await work('c1'))!;
    expect(w.metadata.ownerReferences?.[0]).toMatchObject({
      kind: 'ManagedClusterAddOn',
      name: 'cluster-proxy',
      uid: a.metadata.uid,
      controller: true,
    });
    expect(JSON.parse(w.metadata.annotations!['open-cluster-management.io/config-spec-hash']!)).toEqual({
      'managedproxyconfigurations.proxy.open-cluster-management.io//cluster-proxy': refs[0]!.desiredConfig!.specHash,
    });
    expect(w.spec.deleteOption).toEqual({
      propagationPolicy: 'SelectivelyOrphan',
      selectivelyOrphans: { orphaningRules: [{ group: '', resource: 'namespaces', name: AGENT_NS }] },
    });
    const kinds = w.spec.workload.manifests.map((m) => `${String(m['kind'])}/${(m['metadata'] as { name: string }).name}`);
    expect(kinds).toEqual(expect.arrayContaining(['Secret/cluster-proxy-ca', 'Deployment/cluster-proxy-proxy-agent', 'Service/c1']));
    expect(kinds.some((k) => k.includes('bootstrap'))).toBe(false);
    const dep = deploymentOf(w);
    expect(dep.spec.selector.matchLabels).toEqual({
      'open-cluster-management.io/addon': 'cluster-proxy',
      'proxy.open-cluster-management.io/component-name': 'proxy-agent',
    });
    expect(dep.spec.template.spec.securityContext['runAsUser']).toBeUndefined();
    expect(dep.spec.template.spec.containers[0]!.args).toContain('--cert=/etc/cluster-proxy/client-cert/tls.crt');
    // The CSR: the stand-in's ECDSA request; its requester set by the API server from the klusterlet's token.
    const csrs = (await store().list('CertificateSigningRequest', { labels: { 'open-cluster-management.io/cluster-name': 'c1' } })).items;
    expect(csrs.length).toBe(1);
    expect(csrs[0]!.spec.username).toBe('system:open-cluster-management:c1:klusterlet-agent');
    expect(csrs[0]!.status?.conditions?.map((c) => [c.type, c.status])).toEqual([['Approved', 'True']]);
    const cert = new X509Certificate(Buffer.from(csrs[0]!.status!.certificate!, 'base64'));
    expect(cert.checkIssued(new X509Certificate(pki.ca.certPem))).toBe(true);
    expect(cert.subject).toContain('CN=system:open-cluster-management:cluster:c1:addon:cluster-proxy:agent:proxy-agent');
    expect(Date.parse(cert.validTo) - Date.now()).toBeLessThanOrEqual(180 * 86_400_000);
    expect(cert.publicKey.asymmetricKeyType).toBe('ec');
    const mc = (await store().get('ManagedCluster', { name: 'c1' }))!;
    expect(cert.subjectAltName).toBe(`URI:urn:cluster-proxy:cluster-uid:${mc.metadata.uid}`);
    await roundTrip('c1');
    const caSecret = await waitFor(() => store().get('Secret', { name: 'proxy-server-ca', namespace: AGENT_NS }), {
      timeoutMs: 10_000,
      message: 'proxy-server-ca',
    });
    expect(Buffer.from(caSecret.data!['ca.crt']!, 'base64').toString()).toBe(pki.ca.certPem);
    // Nothing any writer sent was pruned by the schemas, and no status field has two writers.
    expect(api.pruned()).toEqual([]);
    expect(sharedFields()).toEqual([]);
  }, 60_000);

  it("OCM's gRPC registration driver: the CSR made by the hub's gRPC service account for c2's klusterlet is approved", async () => {
    await enable('c2');
    await availableAndCompleted('c2');
    const csr = (await store().list('CertificateSigningRequest', { labels: { 'open-cluster-management.io/cluster-name': 'c2' } }))
      .items[0]!;
    expect(csr.spec.username).toBe('system:serviceaccount:open-cluster-management-hub:grpc-server-sa');
    expect(csr.metadata.annotations?.['open-cluster-management.io/csr-user']).toBe('system:open-cluster-management:c2:klusterlet-agent');
    await roundTrip('c2');
    await store().delete('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: 'c2' });
    await waitFor(async () => !(await work('c2')) || null, { timeoutMs: 15_000, message: 'c2 work not removed' });
  }, 60_000);

  it("an AddOnDeploymentConfig, resolved by OCM's addon-manager, updates the work; the new agent runs with the new env and namespace", async () => {
    const before = (await work('c1'))!;
    const firstAgent = klusterlets.get('c1')!.agents()[0]!;
    await store().create('AddOnDeploymentConfig', {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'AddOnDeploymentConfig',
      metadata: { name: 'proxy', namespace: 'c1' },
      spec: {
        agentInstallNamespace: 'cp-agents',
        proxyConfig: { httpsProxy: 'http://proxy.corp.example:3128', noProxy: '.corp.example' },
        resourceRequirements: [{ containerID: 'deployments:*:proxy-agent', resources: { limits: { memory: '200Mi' } } }],
      },
    });
    const a = (await addon('c1'))!;
    await store().update('ManagedClusterAddOn', {
      ...a,
      spec: {
        ...a.spec,
        configs: [{ group: 'addon.open-cluster-management.io', resource: 'addondeploymentconfigs', name: 'proxy', namespace: 'c1' }],
      },
    });
    const updated = await waitFor(
      async () => {
        const w = await work('c1');
        return w && w.metadata.generation! > before.metadata.generation! ? w : null;
      },
      { timeoutMs: 15_000, message: 'work not updated after the ADC change' },
    );
    const dep = deploymentOf(updated);
    const env = Object.fromEntries(dep.spec.template.spec.containers[0]!.env.map((e) => [e.name, e.value]));
    expect(env['HTTPS_PROXY']).toBe('http://proxy.corp.example:3128');
    expect(env['NO_PROXY']).toContain('.corp.example');
    expect(updated.spec.workload.manifests.find((m) => m['kind'] === 'Namespace')).toMatchObject({ metadata: { name: 'cp-agents' } });
    expect(Object.keys(JSON.parse(updated.metadata.annotations!['open-cluster-management.io/config-spec-hash']!) as object)).toContain(
      'addondeploymentconfigs.addon.open-cluster-management.io/c1/proxy',
    );
    await firstAgent.proc.exited;
    const next = await waitFor(() => klusterlets.get('c1')!.agents()[0], { timeoutMs: 20_000, message: 'no new agent' });
    const environ = (await readFile(`/proc/${next.proc.pid}/environ`, 'utf8')).split('\0');
    expect(environ).toContain('HTTPS_PROXY=http://proxy.corp.example:3128');
    expect(next.args).toContain('--namespace=cp-agents');
    const after = await availableAndCompleted('c1');
    expect(after.status?.namespace).toBe('cp-agents');
    expect(after.status?.healthCheck?.mode).toBe('Customized');
    await waitFor(async () => (await hub.tables()).agents.some((x) => x.cluster === 'c1'), {
      timeoutMs: 15_000,
      message: 'new agent not connected',
    });
    await roundTrip('c1');
  }, 60_000);

  it("a configuration that cannot be rendered keeps the last good work; ManifestApplied says why, OCM's rollout waits", async () => {
    const before = (await work('c1'))!;
    const adc = (await store().get('AddOnDeploymentConfig', { name: 'proxy', namespace: 'c1' }))!;
    await store().update('AddOnDeploymentConfig', {
      ...adc,
      spec: { ...adc.spec, proxyConfig: { httpsProxy: 'ftp://proxy.corp.example:21' } },
    });
    const a = await waitFor(
      async () => {
        const cur = await addon('c1');
        return cond(cur, 'ManifestApplied')?.reason === 'ManifestWorkApplyFailed' && cond(cur, 'Progressing')?.status === 'True'
          ? cur
          : null;
      },
      { timeoutMs: 15_000, message: 'no ManifestWorkApplyFailed' },
    );
    expect(cond(a, 'ManifestApplied')?.message).toMatch(/proxyConfig\.httpsProxy/);
    expect(cond(a, 'Progressing')?.message).toMatch(/configs mismatch/);
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
    const restored = await waitFor(
      async () => {
        const cur = (await work('c1'))!;
        return cur.metadata.generation! > edited.metadata.generation! &&
          !deploymentOf(cur).spec.template.spec.containers[0]!.args.includes('--allow=*')
          ? cur
          : null;
      },
      { timeoutMs: 15_000, message: 'edited work not restored' },
    );
    expect(deploymentOf(restored).spec.template.spec.containers[0]!.args).toEqual(deploymentOf(w).spec.template.spec.containers[0]!.args);
    await availableAndCompleted('c1');
  }, 60_000);

  it('the ManagedProxyConfiguration: another image is never run with our arguments; PortForward and LoadBalancerService entrypoints are refused on the addon', async () => {
    const before = (await work('c1'))!;
    const mpc = (await store().get('ManagedProxyConfiguration', { name: 'cluster-proxy' }))!;
    // What OCM's chart would have there: OCM's own image.
    await store().update('ManagedProxyConfiguration', {
      ...mpc,
      spec: { ...mpc.spec, proxyAgent: { ...mpc.spec.proxyAgent, image: OCM_IMAGE } },
    });
    const flagged = await waitFor(
      async () => {
        const m = await store().get('ManagedProxyConfiguration', { name: 'cluster-proxy' });
        return m?.status?.conditions?.find((c) => c.type === 'AgentImageAccepted' && c.status === 'False') ?? null;
      },
      { timeoutMs: 15_000, message: 'no AgentImageAccepted False on the MPC' },
    );
    expect(flagged.message).toContain(OCM_IMAGE);
    await availableAndCompleted('c1');
    expect(deploymentOf((await work('c1'))!).spec.template.spec.containers[0]!.image).toBe(DEFAULT_AGENT_IMAGE);
    for (const type of ['PortForward', 'LoadBalancerService'] as const) {
      const m = (await store().get('ManagedProxyConfiguration', { name: 'cluster-proxy' }))!;
      const gen = (await work('c1'))!.metadata.generation;
      await store().update('ManagedProxyConfiguration', {
        ...m,
        spec: { ...m.spec, proxyServer: { ...m.spec.proxyServer, entrypoint: { type } } },
      });
      const a = await waitFor(
        async () => {
          const cur = await addon('c1');
          return cond(cur, 'ManifestApplied')?.message.includes(`"${type}" is not supported`) ? cur : null;
        },
        { timeoutMs: 15_000, message: `${type} not refused on the addon` },
      );
      expect(cond(a, 'ManifestApplied')?.status).toBe('False');
      expect((await work('c1'))!.metadata.generation).toBe(gen);
    }
    const m = (await store().get('ManagedProxyConfiguration', { name: 'cluster-proxy' }))!;
    const { entrypoint: _e, ...server } = m.spec.proxyServer;
    await store().update('ManagedProxyConfiguration', {
      ...m,
      spec: { ...m.spec, proxyServer: server, proxyAgent: { ...m.spec.proxyAgent, image: DEFAULT_AGENT_IMAGE } },
    });
    await availableAndCompleted('c1');
    expect(deploymentOf((await work('c1'))!).spec.template.spec.containers[0]!.image).toBe(
      deploymentOf(before).spec.template.spec.containers[0]!.image,
    );
    await roundTrip('c1');
  }, 90_000);

  it('CSRs not approvable are left pending (never denied), whoever asks; CSRs of other addons are left alone', async () => {
    const { Pkcs10CertificateRequestGenerator } = await import('@peculiar/x509');
    const { webcrypto } = await import('node:crypto');
    const alg = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' };
    const reg = (await addon('c1'))!.status!.registrations!.find((r) => r.signerName === SIGNER)!;
    const request = async (cn: string, cluster = 'c1'): Promise<string> => {
      const keys = (await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
      const csr = await Pkcs10CertificateRequestGenerator.create({
        name: `O=system:open-cluster-management:cluster:${cluster}:addon:cluster-proxy, O=open-cluster-management:cluster-proxy, OU=${reg.subject.organizationUnit![0]!}, CN=${cn}`,
        keys: keys as never,
        signingAlgorithm: alg,
      });
      return Buffer.from(csr.toString('pem')).toString('base64');
    };
    // Each request is made by a real API user: the API server, not the body, says who asked.
    const as = async (user: string): Promise<Store> => api.client(user);
    const mk = async (
      who: Store,
      name: string,
      cluster: string,
      spec: Partial<CertificateSigningRequest['spec']>,
      addonName = 'cluster-proxy',
    ): Promise<void> => {
      await who.create('CertificateSigningRequest', {
        apiVersion: 'certificates.k8s.io/v1',
        kind: 'CertificateSigningRequest',
        metadata: {
          name,
          labels: { 'open-cluster-management.io/cluster-name': cluster, 'open-cluster-management.io/addon-name': addonName },
        },
        spec: {
          request: await request(reg.subject.user),
          signerName: SIGNER,
          usages: ['client auth'],
          username: 'system:open-cluster-management:c1:klusterlet-agent',
          ...spec,
        },
      });
    };
    const c1 = await as('system:open-cluster-management:c1:klusterlet-agent');
    await mk(c1, 'other-addon', 'c1', {}, 'some-other-addon');
    await mk(c1, 'forged-other-cluster', 'c1', {
      request: await request('system:open-cluster-management:cluster:c2:addon:cluster-proxy:agent:proxy-agent', 'c2'),
    });
    await mk(c1, 'forged-signer', 'c1', { signerName: 'example.com/not-ours' });
    // The body claims c1's klusterlet; the API server records the real requester.
    await mk(await as('system:open-cluster-management:c2:klusterlet-agent'), 'wrong-requester', 'c1', {});
    await mk(await as('system:serviceaccount:default:someone'), 'anyone', 'c1', {});
    await mk(await as('system:open-cluster-management:gone:klusterlet-agent'), 'gone-cluster', 'gone', {});
    await mk(await as('system:open-cluster-management:c3:klusterlet-agent'), 'not-enabled', 'c3', {});
    const want: Record<string, string> = {
      'forged-other-cluster': 'SubjectMismatch',
      'forged-signer': 'UnknownSigner',
      'gone-cluster': 'ClusterNotFound',
      'not-enabled': 'AddonNotEnabled',
      'wrong-requester': 'RequesterMismatch',
      anyone: 'RequesterMismatch',
    };
    // The hub logs each once when it leaves it pending: that is the event waited on.
    for (const [name, reason] of Object.entries(want)) {
      await hub.proc.waitForJsonLine(
        (o) => o['msg'] === 'CSR left pending (not approvable)' && o['csr'] === name && o['reason'] === reason,
        15_000,
      );
    }
    await hubPasses(2);
    for (const name of [...Object.keys(want), 'other-addon']) {
      const csr = (await store().get('CertificateSigningRequest', { name }))!;
      expect([name, csr.status]).toEqual([name, undefined]);
    }
  }, 60_000);

  it("installStrategy Placements (OCM's addon-manager creates the addons): a selected cluster gets an agent; leaving the decision removes it", async () => {
    const cma = (await store().get('ClusterManagementAddOn', { name: 'cluster-proxy' }))!;
    await store().update('ClusterManagementAddOn', {
      ...cma,
      spec: { ...cma.spec, installStrategy: { type: 'Placements', placements: [{ name: 'cp-placement', namespace: 'default' }] } },
    });
    try {
      await store().create('Placement', {
        apiVersion: 'cluster.open-cluster-management.io/v1beta1',
        kind: 'Placement',
        metadata: { name: 'cp-placement', namespace: 'default' },
        spec: { clusterSets: ['global'] },
      });
      const pd = await store().create('PlacementDecision', {
        apiVersion: 'cluster.open-cluster-management.io/v1beta1',
        kind: 'PlacementDecision',
        metadata: {
          name: 'cp-placement-decision-1',
          namespace: 'default',
          labels: { 'cluster.open-cluster-management.io/placement': 'cp-placement' },
        },
      });
      const decided = await store().updateStatus('PlacementDecision', {
        ...pd,
        status: {
          decisions: [
            { clusterName: 'c1', reason: '' },
            { clusterName: 'c2', reason: '' },
          ],
        },
      });
      const a = await availableAndCompleted('c2');
      expect(a.metadata.ownerReferences?.[0]).toMatchObject({
        kind: 'ClusterManagementAddOn',
        name: 'cluster-proxy',
        uid: cma.metadata.uid,
      });
      // Created by OCM's addon-manager, not by the hub.
      expect(
        api
          .writes()
          .filter((w) => w.kind === 'ManagedClusterAddOn' && w.verb === 'create' && w.namespace === 'c2')
          .map((w) => w.user),
      ).toEqual(expect.arrayContaining([OCM_ADDON_MANAGER_USER]));
      expect(api.writes().some((w) => w.kind === 'ManagedClusterAddOn' && w.verb === 'create' && w.user === HUB_USER)).toBe(false);
      // c2's Lease from its earlier agent is still fresh; it must not make the new addon Available before its agent is.
      expect((await hub.tables()).agents.some((x) => x.cluster === 'c2')).toBe(true);
      await roundTrip('c2');
      const agent = klusterlets.get('c2')!.agents()[0]!;
      await store().updateStatus('PlacementDecision', { ...decided, status: { decisions: [{ clusterName: 'c1', reason: '' }] } });
      await waitFor(async () => !(await addon('c2')) && !(await work('c2')), { timeoutMs: 15_000, message: 'c2 addon/work not removed' });
      await agent.proc.exited;
      expect(klusterlets.get('c2')!.agents()).toEqual([]);
      await waitFor(async () => !(await hub.tables()).agents.some((x) => x.cluster === 'c2'), {
        timeoutMs: 15_000,
        message: 'c2 tunnel still on the hub',
      });
      expect(await work('c1')).not.toBeNull();
      // Selected again while c2's klusterlet is down: the Lease the earlier agent renewed is still fresh, but it
      // belongs to the earlier addon, so the new one is not Available until an agent of its own renews.
      await klusterlets.get('c2')!.pause();
      const again = (await store().get('PlacementDecision', { name: 'cp-placement-decision-1', namespace: 'default' }))!;
      await store().updateStatus('PlacementDecision', {
        ...again,
        status: {
          decisions: [
            { clusterName: 'c1', reason: '' },
            { clusterName: 'c2', reason: '' },
          ],
        },
      });
      await waitFor(() => addon('c2'), { timeoutMs: 15_000, message: 'c2 addon not created again' });
      await hubPasses(3);
      expect(cond(await addon('c2'), 'Available')?.status).not.toBe('True');
      klusterlets.get('c2')!.resume();
      await availableAndCompleted('c2');
      const latest = (await store().get('PlacementDecision', { name: 'cp-placement-decision-1', namespace: 'default' }))!;
      await store().updateStatus('PlacementDecision', { ...latest, status: { decisions: [{ clusterName: 'c1', reason: '' }] } });
      await waitFor(async () => !(await addon('c2')) && !(await work('c2')), {
        timeoutMs: 15_000,
        message: 'c2 addon/work not removed again',
      });
    } finally {
      // Back to Manual whatever happened above, and c2 without the addon, so the tests after this one start clean.
      klusterlets.get('c2')!.resume();
      const back = (await store().get('ClusterManagementAddOn', { name: 'cluster-proxy' }))!;
      await store().update('ClusterManagementAddOn', { ...back, spec: { ...back.spec, installStrategy: { type: 'Manual' } } });
      await store()
        .delete('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: 'c2' })
        .catch(() => undefined);
      await waitFor(async () => !(await work('c2')), { timeoutMs: 15_000, message: 'c2 work not removed' });
    }
  }, 90_000);

  it("two hub replicas beside OCM's addon-manager: one work per cluster, no rewrite, no field with two writers", async () => {
    hub2 = await startHub(pki, [
      '--store',
      'kubernetes',
      '--kubeconfig',
      kubeconfig,
      '--agent-install',
      'manifestwork',
      '--ca-key',
      caKeyPath,
      '--tunnel-loss-window',
      '2s',
      '--tls-reload-interval',
      '500ms',
      '--server-id',
      'hub-b',
      '--agent-entrypoint',
      `127.0.0.1:${hub.ports.agent}`,
    ]);
    await enable('c3');
    await availableAndCompleted('c3');
    await availableAndCompleted('c1');
    // Converged: two hub passes in a row without a write to an addon or a work (health settles as the
    // agents' reports name the second replica).
    const addonOrWorkWrites = (from: number) =>
      api
        .writes()
        .slice(from)
        .filter((w) => w.kind === 'ManagedClusterAddOn' || w.kind === 'ManifestWork');
    await waitFor(
      async () => {
        const mark = api.writes().length;
        await hubPasses(2);
        return addonOrWorkWrites(mark).length === 0 || null;
      },
      { timeoutMs: 30_000, intervalMs: 10, message: 'addons and works never settled' },
    );
    // After convergence: several passes of the hubs and of OCM's stand-ins, and no write to the addons or works but the leader's lease.
    const from = api.writes().length;
    await hubPasses(4);
    await ocm.passesFrom(4);
    await klusterlets.get('c3')!.passesFrom(4);
    const after = api
      .writes()
      .slice(from)
      .filter((w) => w.kind === 'ManagedClusterAddOn' || w.kind === 'ManifestWork');
    expect(after.map((w) => `${w.user} ${w.verb} ${w.kind} ${w.namespace}/${w.name} ${w.changed.join(',')}`)).toEqual([]);
    expect((await store().list('ManifestWork')).items.map((x) => `${x.metadata.namespace}/${x.metadata.name}`).sort()).toEqual([
      'c1/' + WORK,
      'c3/' + WORK,
    ]);
    // Take-over: freeze the leader (SIGSTOP); the other replica takes the manager lease and rewrites nothing.
    const leaseKey = { name: 'cluster-proxy-addon-manager', namespace: AGENT_NS };
    const leader = (await store().get('Lease', leaseKey))!.spec.holderIdentity;
    const [frozen, other] = leader === 'hub-a' ? [hub, hub2] : [hub2, hub];
    frozen.proc.kill('SIGSTOP');
    try {
      await waitFor(async () => (await store().get('Lease', leaseKey))?.spec.holderIdentity === (other === hub ? 'hub-a' : 'hub-b'), {
        timeoutMs: 15_000,
        message: 'the other replica did not take over',
      });
      const mark = api.writes().length;
      await hubPasses(3);
      // Health may change meanwhile, and rightly: the agents lose their tunnels to the frozen replica
      // (--tunnel-loss-window 2s) as its lease expires. Anything else written would be a rewrite.
      const health = new Set(['conditions[Available]', 'conditions[Degraded]']);
      const rewrites = api
        .writes()
        .slice(mark)
        .filter((w) => w.kind === 'ManifestWork' || (w.kind === 'ManagedClusterAddOn' && !w.changed.every((f) => health.has(f))));
      expect(rewrites.map((w) => `${w.user} ${w.verb} ${w.kind} ${w.namespace} ${w.changed.join(',')}`)).toEqual([]);
    } finally {
      frozen.proc.kill('SIGCONT');
    }
    await roundTrip('c3');
    await hub2.stop();
    hub2 = null;
    expect(sharedFields()).toEqual([]);
  }, 90_000);

  it('CA rollover: the new signer changes the registration, the klusterlet asks again, the agent moves to a certificate of the new CA', async () => {
    const ca2: PemPair = createCA({ commonName: 'e2e-ca-2' });
    const oldOu = (await addon('c1'))!.status!.registrations!.find((r) => r.signerName === SIGNER)!.subject.organizationUnit![0];
    const csrsBefore = klusterlets.get('c1')!.csrs.size;
    const server2 = issueServerCert(ca2, { commonName: 'hub', dnsNames: ['localhost'], ipAddresses: ['127.0.0.1', '::1'] });
    await writeFile(pki.server.certPath, server2.certPem);
    await writeFile(pki.server.keyPath, server2.keyPem);
    await writeFile(caKeyPath, ca2.keyPem);
    await writeFile(pki.caPath, ca2.certPem + pki.ca.certPem);
    await waitFor(
      async () => {
        const r = (await addon('c1'))?.status?.registrations?.find((x) => x.signerName === SIGNER);
        return r && r.subject.organizationUnit![0] !== oldOu ? r : null;
      },
      { timeoutMs: 15_000, message: 'registration OU did not change with the signer' },
    );
    const signedByNew = async (): Promise<boolean> => {
      const agent = klusterlets.get('c1')!.agents()[0];
      if (!agent) return false;
      const certArg = agent.args.find((x) => x.startsWith('--cert='))!.slice('--cert='.length);
      const pemText = await readFile(certArg, 'utf8').catch(() => '');
      return pemText !== '' && new X509Certificate(pemText).checkIssued(new X509Certificate(ca2.certPem));
    };
    await waitFor(signedByNew, { timeoutMs: 20_000, message: 'agent certificate not re-issued by the new CA' });
    expect(klusterlets.get('c1')!.csrs.size).toBeGreaterThan(csrsBefore);
    await availableAndCompleted('c1');
    await waitFor(
      async () => {
        const s2 = await store().get('Secret', { name: 'proxy-client', namespace: AGENT_NS });
        return new X509Certificate(Buffer.from(s2!.data!['tls.crt']!, 'base64')).checkIssued(new X509Certificate(ca2.certPem));
      },
      { timeoutMs: 15_000, message: 'proxy-client not re-issued by the new CA' },
    );
    const k = klusterlets.get('c1')!;
    const started = k.history.length;
    await writeFile(pki.caPath, ca2.certPem);
    await waitFor(
      async () => {
        const w = await work('c1');
        const ca = w?.spec.workload.manifests.find(
          (m) => m['kind'] === 'Secret' && (m['metadata'] as { name: string }).name === 'cluster-proxy-ca',
        ) as { data: Record<string, string> } | undefined;
        return ca && Buffer.from(ca.data['ca.crt']!, 'base64').toString() === ca2.certPem;
      },
      { timeoutMs: 15_000, message: 'work does not carry the new CA bundle' },
    );
    await waitFor(() => k.history.length > started || null, { timeoutMs: 15_000, message: 'agent not restarted with the new bundle' });
    await k.history[k.history.length - 1]!.proc.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 20_000);
    expect(await signedByNew()).toBe(true);
    await availableAndCompleted('c1');
    await roundTrip('c1');
  }, 90_000);

  it("disabling the addon deletes the work and stops the agent, leaving the namespace and other addons' objects in it", async () => {
    const k = klusterlets.get('c1')!;
    const ns = (await addon('c1'))!.status!.namespace!;
    // Another addon's agent in the same namespace of the managed cluster.
    const other: ManagedObject = {
      apiVersion: 'apps/v1',
      kind: 'Deployment',
      metadata: { name: 'other-addon-agent', namespace: ns },
      spec: {},
    };
    k.objects.set(`Deployment/${ns}/other-addon-agent`, other);
    const agents = ['c1', 'c3'].map((c) => klusterlets.get(c)!.agents()[0]!);
    await store().delete('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: 'c1' });
    await store().delete('ManagedCluster', { name: 'c3' });
    await waitFor(async () => !(await work('c1')) && !(await work('c3')), { timeoutMs: 15_000, message: 'works not deleted' });
    for (const a of agents) await a.proc.exited;
    await k.passesFrom(2);
    expect(k.objects.has(`Namespace//${ns}`)).toBe(true);
    expect(k.objects.get(`Deployment/${ns}/other-addon-agent`)).toEqual(other);
    expect([...k.objects.keys()].filter((x) => x.includes('cluster-proxy-proxy-agent'))).toEqual([]);
    await waitFor(async () => (await hub.tables()).agents.length === 0, { timeoutMs: 15_000, message: 'hub still has agents' });
  }, 60_000);

  it("upgrade: a work an earlier version of ours wrote (shared namespace, no deleteOption) moves to OCM's namespace and leaves the shared one and its other addons alone", async () => {
    const shared = 'open-cluster-management-agent-addon';
    await hub.stop();
    await managedCluster('c4');
    const k = klusterlets.get('c4')!;
    const a = await store().create('ManagedClusterAddOn', {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'ManagedClusterAddOn',
      metadata: { name: 'cluster-proxy', namespace: 'c4' },
      spec: {},
    });
    const mc = (await store().get('ManagedCluster', { name: 'c4' }))!;
    const earlier = renderAgentWork({
      addon: a,
      cluster: mc,
      mpc: null,
      adc: null,
      caBundle: await readFile(pki.caPath, 'utf8'),
      agentEntrypoint: `127.0.0.1:${hub.ports.agent}`,
      image: DEFAULT_AGENT_IMAGE,
      defaultInstallNamespace: shared,
    });
    // As that version wrote it: no deleteOption, so OCM's work agent owns the namespace it applies.
    await store().create('ManifestWork', {
      ...earlier,
      metadata: { ...earlier.metadata, annotations: {} },
      spec: { workload: earlier.spec.workload },
    });
    await waitFor(() => k.objects.has(`Namespace//${shared}`) || null, { timeoutMs: 15_000, message: 'the earlier work not applied' });
    const other: ManagedObject = {
      apiVersion: 'apps/v1',
      kind: 'Deployment',
      metadata: { name: 'other-addon-agent', namespace: shared },
      spec: {},
    };
    k.objects.set(`Deployment/${shared}/other-addon-agent`, other);
    hub = await startHub(pki, ocmHubArgs({ kubeconfig, caKey: caKeyPath, serverId: 'hub-a' }));
    // Released first (kept with an orphaning rule until applied), then dropped: the agent ends up in OCM's namespace.
    await waitFor(
      async () => {
        const w = await work('c4');
        const names = w?.spec.workload.manifests
          .filter((m) => m['kind'] === 'Namespace')
          .map((m) => (m['metadata'] as { name: string }).name);
        return JSON.stringify(names) === JSON.stringify([AGENT_NS]) || null;
      },
      { timeoutMs: 20_000, message: "the work did not move to OCM's namespace" },
    );
    await availableAndCompleted('c4');
    await k.passesFrom(2);
    expect(k.objects.has(`Namespace//${shared}`)).toBe(true);
    expect(k.objects.get(`Deployment/${shared}/other-addon-agent`)).toEqual(other);
    expect([...k.objects.keys()].filter((x) => x.startsWith(`Deployment/${shared}/cluster-proxy`))).toEqual([]);
    expect(k.objects.has(`Deployment/${AGENT_NS}/cluster-proxy-proxy-agent`)).toBe(true);
    await store().delete('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: 'c4' });
    await waitFor(async () => !(await work('c4')) || null, { timeoutMs: 15_000, message: 'c4 work not removed' });
  }, 90_000);

  it("migration: a cluster running OCM's cluster-proxy switches to ours and back, then uninstalls; the namespace and other addons' objects stay", async () => {
    const k = klusterlets.get('c2')!;
    const hubArgs = [
      '--store',
      'kubernetes',
      '--kubeconfig',
      kubeconfig,
      '--agent-install',
      'manifestwork',
      '--ca-key',
      caKeyPath,
      '--require-registration',
      '--tunnel-loss-window',
      '2s',
      '--tls-reload-interval',
      '500ms',
      '--server-id',
      'hub-a',
    ];
    // Before: OCM's cluster-proxy runs c2 (our hub is not installed): its work, as its addon manager renders
    // it (pkg/proxyagent/agent/manifests/charts/addon-agent/templates), owned by the addon.
    await hub.stop();
    const ocmObjects = ocmAgentObjects('c2');
    const a = await store().create('ManagedClusterAddOn', {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'ManagedClusterAddOn',
      metadata: { name: 'cluster-proxy', namespace: 'c2' },
      spec: {},
    });
    const ocmWork = {
      metadata: {
        name: WORK,
        namespace: 'c2',
        labels: { 'open-cluster-management.io/addon-name': 'cluster-proxy' },
        ownerReferences: [
          {
            apiVersion: 'addon.open-cluster-management.io/v1alpha1',
            kind: 'ManagedClusterAddOn',
            name: 'cluster-proxy',
            uid: a.metadata.uid!,
            controller: true,
            blockOwnerDeletion: true,
          },
        ],
      },
      spec: {
        workload: { manifests: ocmObjects as unknown as Record<string, unknown>[] },
        deleteOption: {
          propagationPolicy: 'SelectivelyOrphan' as const,
          selectivelyOrphans: { orphaningRules: [{ group: '', resource: 'namespaces', name: AGENT_NS }] },
        },
      },
    };
    const putOcm = async (): Promise<void> => {
      const cur = await work('c2');
      if (cur)
        await store().update('ManifestWork', {
          ...cur,
          metadata: { ...cur.metadata, ...ocmWork.metadata, resourceVersion: cur.metadata.resourceVersion! },
          spec: ocmWork.spec,
        });
      else await store().create('ManifestWork', { apiVersion: 'work.open-cluster-management.io/v1', kind: 'ManifestWork', ...ocmWork });
    };
    await putOcm();
    const ocmKeys = ocmObjects.map((m) => `${m.kind}/${m.metadata.namespace ?? ''}/${m.metadata.name}`);
    await waitFor(() => ocmKeys.every((x) => k.objects.has(x)) || null, { timeoutMs: 15_000, message: "OCM's objects not applied" }).catch(
      async (err: Error) => {
        throw new Error(
          `${err.message}: have ${[...k.objects.keys()].join(' ')}; work status ${JSON.stringify((await work('c2'))?.status)}; errors ${k.errors.join('; ')}`,
        );
      },
    );
    const other: ManagedObject = { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'other-addon-config', namespace: AGENT_NS } };
    k.objects.set(`ConfigMap/${AGENT_NS}/other-addon-config`, other);
    // Switch to ours: the hub takes the work over in place (same Deployment, same selector), a working tunnel.
    hub = await startHub(pki, hubArgs);
    await waitFor(
      async () => {
        const w = await work('c2');
        return w && deploymentOf(w).spec.template.spec.containers[0]!.image === DEFAULT_AGENT_IMAGE ? w : null;
      },
      { timeoutMs: 20_000, message: "the hub did not take over OCM's work" },
    );
    await availableAndCompleted('c2');
    expect((await hub.tables()).agents.some((x) => x.cluster === 'c2')).toBe(true);
    await roundTrip('c2');
    const ours = new Set(
      ((await work('c2'))!.spec.workload.manifests as unknown as ManagedObject[]).map(
        (m) => `${m.kind}/${m.metadata.namespace ?? ''}/${m.metadata.name}`,
      ),
    );
    await k.passesFrom(2);
    // Nothing of OCM's left behind but what ours reuses (namespace, Deployment, Secret and Service names).
    expect(
      [...k.objects.keys()].filter((x) => !ours.has(x) && !x.includes('client-cert') && x !== `ConfigMap/${AGENT_NS}/other-addon-config`),
    ).toEqual([]);
    // Back to OCM's: our hub is uninstalled, OCM's manager writes its work again.
    await hub.stop();
    await putOcm();
    await waitFor(() => k.agents().length === 0 || null, { timeoutMs: 15_000, message: 'our agent still running after switching back' });
    await k.passesFrom(2);
    for (const key of ocmKeys) expect(k.objects.has(key)).toBe(true);
    expect([...k.objects.keys()].filter((x) => ours.has(x) && !ocmKeys.includes(x))).toEqual([]);
    // Uninstall: the addon goes, the garbage collector takes the work; the namespace and the other addon's object stay.
    await store().delete('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: 'c2' });
    await waitFor(async () => !(await work('c2')) || null, { timeoutMs: 15_000, message: 'work not garbage-collected' });
    await k.passesFrom(2);
    expect(k.objects.has(`Namespace//${AGENT_NS}`)).toBe(true);
    expect(k.objects.get(`ConfigMap/${AGENT_NS}/other-addon-config`)).toEqual(other);
    expect([...k.objects.keys()].filter((x) => ocmKeys.includes(x) && !x.startsWith('Namespace/'))).toEqual([]);
    // Over the whole suite: nothing anyone wrote was pruned by a schema, and no status field had two writers.
    expect(api.pruned()).toEqual([]);
    expect(sharedFields()).toEqual([]);
  }, 120_000);
});

/** OCM cluster-proxy's agent objects for one cluster, by name and shape (its addon-agent chart), in its namespace. */
function ocmAgentObjects(cluster: string): ManagedObject[] {
  const ns = AGENT_NS;
  const labels = { 'open-cluster-management.io/addon': 'cluster-proxy', 'proxy.open-cluster-management.io/component-name': 'proxy-agent' };
  return [
    {
      apiVersion: 'v1',
      kind: 'Namespace',
      metadata: { name: ns, annotations: { 'addon.open-cluster-management.io/deletion-orphan': '' } },
    },
    { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'cluster-proxy', namespace: ns } },
    { apiVersion: 'rbac.authorization.k8s.io/v1', kind: 'Role', metadata: { name: 'cluster-proxy-addon-agent', namespace: ns }, rules: [] },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: { name: 'cluster-proxy-addon-agent', namespace: ns },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'cluster-proxy-addon-agent' },
      subjects: [],
    },
    {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: 'cluster-proxy-ca', namespace: ns },
      data: { 'ca.crt': Buffer.from('ocm-ca').toString('base64') },
    },
    {
      apiVersion: 'apps/v1',
      kind: 'Deployment',
      metadata: { name: 'cluster-proxy-proxy-agent', namespace: ns },
      spec: {
        replicas: 1,
        selector: { matchLabels: labels },
        template: {
          metadata: { labels },
          spec: {
            serviceAccount: 'cluster-proxy',
            securityContext: { runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } },
            containers: [
              {
                name: 'proxy-agent',
                image: OCM_IMAGE,
                args: [
                  '--proxy-server-host=proxy.hub.example',
                  '--proxy-server-port=8091',
                  `--agent-identifiers=host=${cluster}`,
                  '--ca-cert=/etc/ca/ca.crt',
                ],
              },
            ],
            volumes: [{ name: 'ca', secret: { secretName: 'cluster-proxy-ca' } }],
          },
        },
      },
    },
    {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: cluster, namespace: ns },
      spec: { type: 'ExternalName', externalName: 'kubernetes.default.svc.cluster.local' },
    },
  ];
}
