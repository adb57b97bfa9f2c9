// `--agent-install manifestwork` on OCM itself, not on our stand-ins: OCM's hub controllers (registration,
// addon manager, placement, work) and, per managed cluster, OCM's registration and work agents, all the
// programs of open-cluster-management.io/ocm at the release pinned in test/real-ocm/go.mod, each control
// plane a real kube-apiserver (test/src/fixtures/real-ocm.ts, real-kube.ts). Our chart is installed with the
// real Helm (helm.sh/helm/v3, same go.mod); our hub runs as the process the chart's Deployment would run.
// The only stand-in left is the kubelet, for our agent alone (kubelet-player.ts): it runs the Deployment OCM's
// work agent applied in the managed cluster's apiserver. What a case shows is what OCM's code does with
// what our hub writes: the addon-manager's config resolution and rollout status, the registration agent's
// CSRs and Secrets (as the cluster's own hub identity, under the RBAC OCM's registration controller makes),
// the work agent's apply, ownership and deletion, and the garbage collector of the real controller manager.
// Skipped, with the reason, when there is no Go toolchain to build OCM's programs with.
import { readFile } from 'node:fs/promises';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Tunnel } from '@cluster-proxy/client';
import { DEFAULT_AGENT_IMAGE, type ManagedCluster, type ManagedClusterAddOn, type ManifestWork } from '@cluster-proxy/server';
import { configSpecHash, renderAgentWork } from '@cluster-proxy/server/ocm';
import { CHART_CRDS_DIR, killAllSpawned, runCommand, waitFor } from '../src/fixtures/index.js';
import {
  goAvailable,
  ocmPeers,
  startOcmHub,
  startOcmManagedCluster,
  type OcmHub,
  type OcmManagedCluster,
} from '../src/fixtures/real-ocm.js';
import { writesOver } from '../src/fixtures/hub-writes.js';
import { addonPath, conditionOf, enableAddon, getObject, ocmHubArgs, versionThroughTunnel, workPath } from '../src/fixtures/ocm-hub-api.js';
import { CLI, createPki, startHub, type HubProcess, type TestPki } from '../src/harness.js';

const AGENT_NS = 'open-cluster-management-cluster-proxy';
const HUB_USER = `system:serviceaccount:${AGENT_NS}:cluster-proxy`;
const WORK = 'addon-cluster-proxy-deploy-0';
const DEPLOYMENT = 'cluster-proxy-proxy-agent';
const CHART = path.join(path.dirname(CHART_CRDS_DIR));
/** The first run may build OCM's programs (many minutes; the script prints its progress). */
const START_TIMEOUT_MS = 45 * 60_000;

const hasGo = await goAvailable();
if (!hasGo) console.warn("real-ocm.test.ts: skipped: no Go toolchain (`go`) to build OCM's programs and Helm from their Go modules with");

type Obj = {
  metadata: {
    name: string;
    namespace?: string;
    uid?: string;
    ownerReferences?: { kind: string; name: string }[];
    deletionTimestamp?: string;
  };
  status?: { conditions?: { type: string; status: string; reason?: string; message?: string }[] };
};

describe.skipIf(!hasGo)("our hub on OCM's own hub and klusterlets (real OCM programs, real Helm)", () => {
  let pki: TestPki;
  let ocm: OcmHub;
  let hub: HubProcess | null = null;
  let helmHome = '';
  const clusters = new Map<string, OcmManagedCluster>();
  let kubeconfig = '';
  let adminKubeconfig = '';

  const get = <T = Obj>(urlPath: string): Promise<T | null> => getObject<T>(ocm.kube, urlPath);
  const addon = (c: string) => get<ManagedClusterAddOn>(addonPath(c));
  const work = (c: string) => get<ManifestWork>(workPath(c, WORK));
  const cond = conditionOf;
  const inCluster = async (c: string, urlPath: string): Promise<Obj | null> => {
    const r = await clusters.get(c)!.kube.request<Obj>('GET', urlPath);
    return r.status === 200 ? r.body : null;
  };
  const why = async (c: string): Promise<string> => {
    const k = clusters.get(c);
    return [
      `addon: ${JSON.stringify((await addon(c))?.status)}`,
      await work(c).then((w) =>
        w
          ? `work: generation ${String(w.metadata.generation)}, Namespaces ${JSON.stringify(
              w.spec.workload.manifests.filter((m) => m['kind'] === 'Namespace').map((m) => (m['metadata'] as { name: string }).name),
            )}, deleteOption ${JSON.stringify(w.spec.deleteOption ?? null)}, conditions ${JSON.stringify(w.status?.conditions)}`
          : 'work: none',
      ),
      `kubelet player: ${k?.kubelet.errors.slice(-3).join('; ')}`,
      `OCM crashed: ${ocm.crashed().join('; ')}`,
      `registration agent: ${k?.registration
        .lines()
        .filter((l) => /^E/.test(l))
        .slice(-4)
        .join('\n')}`,
      `work agent${k?.work.isRunning() ? '' : ' (exited)'}: ${k?.work
        .lines()
        .filter((l) => /^[EF]/.test(l))
        .slice(-4)
        .join('\n')}`,
      `addon manager: ${ocm.processes.addon
        .lines()
        .filter((l) => /^E/.test(l))
        .slice(-4)
        .join('\n')}`,
      `hub: ${hub?.proc
        .lines()
        .filter((l) => /"level":(40|50)/.test(l))
        .slice(-4)
        .join('\n')}`,
    ].join('\n');
  };

  const enable = (c: string, spec: Record<string, unknown> = {}): Promise<void> => enableAddon(ocm.kube, c, spec);

  /**
   * Available (our hub, from the agent's tunnel) and ManifestApplied (our hub, from the work OCM's work agent
   * reported). Progressing Completed is its own case below.
   */
  async function available(c: string, timeoutMs = 90_000): Promise<ManagedClusterAddOn> {
    return waitFor(
      async () => {
        const a = await addon(c);
        return cond(a, 'Available')?.status === 'True' && cond(a, 'ManifestApplied')?.status === 'True' ? a : null;
      },
      { timeoutMs, intervalMs: 250, message: `addon of ${c} Available and ManifestApplied` },
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await why(c)}`);
    });
  }

  /** GET /version of the cluster's own apiserver, through our hub and the agent's tunnel (TLS end to end). */
  async function apiserverThroughHub(c: string): Promise<{ gitVersion: string }> {
    const t: Tunnel = hub!.tunnel();
    try {
      return await versionThroughTunnel(t, c, clusters.get(c)!.kube.caPem);
    } finally {
      t.close();
    }
  }

  const helm = async (args: string[]) =>
    runCommand(ocmPeersBinaries.helm, [...args, '--kubeconfig', adminKubeconfig], {
      env: {
        ...process.env,
        HOME: helmHome,
        HELM_CACHE_HOME: path.join(helmHome, 'cache'),
        HELM_CONFIG_HOME: path.join(helmHome, 'config'),
        HELM_DATA_HOME: path.join(helmHome, 'data'),
      },
      timeoutMs: 120_000,
    });
  let ocmPeersBinaries: { helm: string };

  const startOurHub = (): Promise<HubProcess> =>
    startHub(pki, ocmHubArgs({ kubeconfig, caKey: path.join(pki.dir, 'ca.key'), serverId: 'hub-a' }));

  beforeAll(async () => {
    pki = await createPki();
    helmHome = await mkdtemp(path.join(os.tmpdir(), 'cp-helm-home-'));
    ocmPeersBinaries = (await ocmPeers()).binaries;
    ocm = await startOcmHub();
    adminKubeconfig = path.join(pki.dir, 'hub-admin.kubeconfig');
    await ocm.kube.writeKubeconfig(adminKubeconfig);
    // Our chart, with the real Helm, as on an OCM hub: its CRDs OCM already has are left as they are (Helm
    // skips existing CRDs); the ClusterManagementAddOn is the chart's. Nothing runs its hub Deployment (no
    // kubelet on the hub): the hub process below stands for its pod.
    const installed = await helm([
      'install',
      'cluster-proxy',
      CHART,
      '--namespace',
      AGENT_NS,
      '--create-namespace',
      '--set',
      'agentInstall.mode=manifestwork',
    ]);
    expect(installed.code, `${installed.stdout}\n${installed.stderr}`).toBe(0);
    kubeconfig = path.join(pki.dir, 'hub.kubeconfig');
    // The hub as the chart's service account, with only the rights the chart's RBAC gives it.
    await ocm.kube.writeKubeconfig(kubeconfig, HUB_USER, ['system:serviceaccounts', `system:serviceaccounts:${AGENT_NS}`], {
      bindClusterAdmin: false,
    });
    hub = await startOurHub();
    const runsOurs = (image: string): boolean => !image.startsWith('quay.io/open-cluster-management/');
    for (const c of await Promise.all(['c1', 'c2'].map((name) => startOcmManagedCluster(ocm, { name, cli: CLI, runsImage: runsOurs }))))
      clusters.set(c.name, c);
  }, START_TIMEOUT_MS);

  afterAll(async () => {
    for (const c of clusters.values()) await c.stop();
    await hub?.stop();
    await ocm?.stop();
    await killAllSpawned();
    if (helmHome) await rm(helmHome, { recursive: true, force: true });
    await pki?.cleanup();
  }, 120_000);

  it("enabling the addon: OCM's work agent applies our agent, the registration agent gets its certificate, the tunnel reaches the cluster's apiserver, the addon is Available", async () => {
    await enable('c1');
    const a = await available('c1');
    // OCM's addon-manager owns the addon to the chart's ClusterManagementAddOn and resolved the default config.
    expect(a.metadata.ownerReferences?.map((o) => [o.kind, o.name])).toEqual([['ClusterManagementAddOn', 'cluster-proxy']]);
    expect(a.status?.configReferences?.map((r) => [r.resource, r.desiredConfig?.name])).toEqual([
      ['managedproxyconfigurations', 'cluster-proxy'],
    ]);
    // The work agent applied the Deployment into c1's apiserver and reported it.
    expect(await inCluster('c1', `/apis/apps/v1/namespaces/${AGENT_NS}/deployments/${DEPLOYMENT}`)).not.toBeNull();
    const w = (await work('c1'))!;
    expect(cond(w, 'Applied')?.status).toBe('True');
    expect(cond(w, 'Available')?.status).toBe('True');
    // The registration agent's CSRs, made as c1's own hub identity (from its cluster CSR), all approved and signed by
    // our hub. Usually one; OCM's agent asks again when it lost an issued certificate (its CSR driver forgets the
    // request before the addon status update that goes with saving the certificate, and that update can fail while
    // the hub writes the same addon's status), so a second is OCM's retry, not a fault.
    const csrs = (
      await ocm.kube.request<{ items: { spec: { username: string; signerName: string }; status?: { certificate?: string } }[] }>(
        'GET',
        `/apis/certificates.k8s.io/v1/certificatesigningrequests?labelSelector=${encodeURIComponent('open-cluster-management.io/addon-name=cluster-proxy,open-cluster-management.io/cluster-name=c1')}`,
      )
    ).body.items;
    expect(csrs.length).toBeGreaterThan(0);
    for (const csr of csrs) {
      expect(csr.spec.signerName).toBe('open-cluster-management.io/proxy-agent-signer');
      expect(csr.spec.username).toMatch(/^system:open-cluster-management:c1:/);
      expect(csr.status?.certificate).toBeTruthy();
    }
    // The Secret it wrote in c1, which the agent's pod mounts.
    expect(
      await inCluster(
        'c1',
        `/api/v1/namespaces/${AGENT_NS}/secrets/cluster-proxy-open-cluster-management.io-proxy-agent-signer-client-cert`,
      ),
    ).not.toBeNull();
    expect(clusters.get('c1')!.kubelet.agents().length).toBe(1);
    expect((await apiserverThroughHub('c1')).gitVersion).toBe(clusters.get('c1')!.kube.versions.kubernetes);
  }, 180_000);

  // OCM's addon-manager reports the rollout Completed only when every configReference's desiredConfig.specHash is
  // non-empty and equal to the work's config-spec-hash annotation (ocm addonprogressing/controller.go). It copies
  // the hashes from where addon-framework's cmaconfig and addonconfig controllers (the addon's half, so our hub's)
  // wrote them: the ClusterManagementAddOn's status.defaultconfigReferences, and the addon's own status for its
  // spec.configs. The hub computes them as addon-framework's GetSpecHash does (server/src/ocm/config-hashes.ts).
  it("the addon's rollout reaches Progressing Completed: the hub writes the config spec hashes OCM's addon-manager copies", async () => {
    const cmaPath = '/apis/addon.open-cluster-management.io/v1alpha1/clustermanagementaddons/cluster-proxy';
    const a = await waitFor(
      async () => {
        const x = await addon('c1');
        return cond(x, 'Progressing')?.reason === 'Completed' ? x : null;
      },
      { timeoutMs: 60_000, intervalMs: 250, message: 'Progressing Completed' },
    ).catch(async (err: Error) => {
      const x = await addon('c1');
      throw new Error(
        `${err.message}: ${JSON.stringify(cond(x, 'Progressing'))} configReferences ${JSON.stringify(x?.status?.configReferences)} CMA status ${JSON.stringify((await get<{ status?: unknown }>(cmaPath))?.status)}\n${await why('c1')}`,
      );
    });
    expect(cond(a, 'Progressing')?.status).toBe('False');
    const mpc = (await get<Record<string, unknown>>(
      '/apis/proxy.open-cluster-management.io/v1alpha1/managedproxyconfigurations/cluster-proxy',
    ))!;
    const ref = a.status?.configReferences?.find((r) => r.resource === 'managedproxyconfigurations');
    // The hash of the MPC as the API server holds it, the way Go's GetSpecHash computes it.
    expect(ref?.desiredConfig?.specHash).toBe(configSpecHash(mpc));
    expect(ref?.lastAppliedConfig?.specHash).toBe(ref?.desiredConfig?.specHash);
    const cma = (await get<{ status?: { defaultconfigReferences?: { desiredConfig?: { specHash?: string } }[] } }>(cmaPath))!;
    expect(cma.status?.defaultconfigReferences?.map((r) => r.desiredConfig?.specHash)).toEqual([configSpecHash(mpc)]);
    expect(JSON.parse((await work('c1'))!.metadata.annotations!['open-cluster-management.io/config-spec-hash']!)).toEqual({
      'managedproxyconfigurations.proxy.open-cluster-management.io//cluster-proxy': configSpecHash(mpc),
    });
  }, 90_000);

  it("an AddOnDeploymentConfig (resolved by OCM's addon-manager) moves the agent to another namespace with a proxy env; the old Deployment goes, the tunnel comes back; a change in place restarts the agent", async () => {
    const k = clusters.get('c1')!.kubelet;
    const first = k.agents()[0]!;
    const adcs = `/apis/addon.open-cluster-management.io/v1alpha1/namespaces/c1/addondeploymentconfigs`;
    const made = await ocm.kube.request('POST', adcs, {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'AddOnDeploymentConfig',
      metadata: { name: 'proxy', namespace: 'c1' },
      spec: { agentInstallNamespace: 'cp-agents', proxyConfig: { httpsProxy: 'http://proxy.corp.example:3128', noProxy: '.corp.example' } },
    });
    expect(made.status, made.text).toBe(201);
    const patched = await ocm.kube.request(
      'PATCH',
      addonPath('c1'),
      {
        spec: {
          configs: [{ group: 'addon.open-cluster-management.io', resource: 'addondeploymentconfigs', name: 'proxy', namespace: 'c1' }],
        },
      },
      'application/merge-patch+json',
    );
    expect(patched.status, patched.text).toBe(200);
    await waitFor(async () => (await inCluster('c1', `/apis/apps/v1/namespaces/cp-agents/deployments/${DEPLOYMENT}`)) !== null, {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: 'the Deployment in cp-agents',
    }).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await why('c1')}`);
    });
    await first.proc.exited;
    const next = await waitFor(() => k.agents()[0], {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: 'the agent in cp-agents started',
    }).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await why('c1')}`);
    });
    expect(next.deployment).toBe(`cp-agents/${DEPLOYMENT}`);
    const environ = (await readFile(`/proc/${next.proc.pid}/environ`, 'utf8')).split('\0');
    expect(environ).toContain('HTTPS_PROXY=http://proxy.corp.example:3128');
    const a = await available('c1');
    expect(a.status?.namespace).toBe('cp-agents');
    // The work agent deleted the old Deployment (owned by the work) and left the old namespace (orphaned).
    await waitFor(async () => (await inCluster('c1', `/apis/apps/v1/namespaces/${AGENT_NS}/deployments/${DEPLOYMENT}`)) === null, {
      timeoutMs: 30_000,
      intervalMs: 250,
      message: 'the old Deployment deleted',
    });
    expect(await inCluster('c1', `/api/v1/namespaces/${AGENT_NS}`)).not.toBeNull();
    expect((await apiserverThroughHub('c1')).gitVersion).toBe(clusters.get('c1')!.kube.versions.kubernetes);
    // A change in place (same namespace): the work agent updates the Deployment, the kubelet player restarts the agent.
    const adc = (await get<{ metadata: { resourceVersion: string }; spec: Record<string, unknown> }>(`${adcs}/proxy`))!;
    const updated = await ocm.kube.request('PUT', `${adcs}/proxy`, {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'AddOnDeploymentConfig',
      metadata: { name: 'proxy', namespace: 'c1', resourceVersion: adc.metadata.resourceVersion },
      spec: { ...adc.spec, proxyConfig: { httpsProxy: 'http://proxy.corp.example:3128', noProxy: '.corp.example,.example.org' } },
    });
    expect(updated.status, updated.text).toBe(200);
    await next.proc.exited;
    const third = await waitFor(() => k.agents()[0], {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: 'the agent restarted with the new env',
    });
    expect(third.deployment).toBe(`cp-agents/${DEPLOYMENT}`);
    expect(third.env['NO_PROXY']).toContain('.example.org');
    await available('c1');
    expect((await apiserverThroughHub('c1')).gitVersion).toBe(clusters.get('c1')!.kube.versions.kubernetes);
    // The rollout of the changed config completes: the hub hashed the addon's own config (addon-framework's
    // addonconfig), the work carries that hash, OCM's addon-manager recorded it as applied.
    const adcNow = (await get<Record<string, unknown>>(`${adcs}/proxy`))!;
    await waitFor(
      async () => {
        const x = await addon('c1');
        const ref = x?.status?.configReferences?.find((r) => r.resource === 'addondeploymentconfigs');
        return cond(x, 'Progressing')?.reason === 'Completed' && ref?.lastAppliedConfig?.specHash === configSpecHash(adcNow);
      },
      { timeoutMs: 60_000, intervalMs: 250, message: 'Progressing Completed with the changed config applied' },
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}: ${JSON.stringify((await addon('c1'))?.status?.configReferences)}\n${await why('c1')}`);
    });
  }, 180_000);

  // One writer per field: while a cluster's klusterlet is gone, OCM's registration hub sets every addon's Available
  // to the ManagedCluster's Unknown (ocm pkg/registration/hub/addon/healthcheck_controller.go), whatever the health
  // mode. The hub steps back then, though the agent's tunnel is still up, and writes Available again once OCM says
  // the cluster is back.
  it("the cluster's klusterlet gone (its registration agent stopped): OCM sets the cluster and the addon Available Unknown; the hub writes no Available meanwhile, tunnel or not; back, the hub's Available again", async () => {
    // The addon goes again however the case ends: the cluster-removal case enables it anew.
    const cleanup = async (): Promise<void> => {
      await ocm.kube.request('DELETE', addonPath('c2'));
      await waitFor(async () => (await addon('c2')) === null && (await work('c2')) === null, {
        timeoutMs: 60_000,
        intervalMs: 250,
        message: "c2's addon and work gone",
      });
    };
    try {
      await klusterletGone();
    } finally {
      await cleanup();
    }
  }, 240_000);

  async function klusterletGone(): Promise<void> {
    await enable('c2');
    await available('c2');
    const mcPath = '/apis/cluster.open-cluster-management.io/v1/managedclusters/c2';
    const mcAvailable = async (): Promise<string | undefined> =>
      (await get<{ status?: { conditions?: { type: string; status: string }[] } }>(mcPath))?.status?.conditions?.find(
        (c) => c.type === 'ManagedClusterConditionAvailable',
      )?.status;
    // A short lease, so OCM's hub gives the klusterlet up within 5 × 2 s instead of five minutes.
    const patched = await ocm.kube.request('PATCH', mcPath, { spec: { leaseDurationSeconds: 2 } }, 'application/merge-patch+json');
    expect(patched.status, patched.text).toBe(200);
    const registration = clusters.get('c2')!.registration;
    const pid = registration.pid!;
    process.kill(pid, 'SIGSTOP');
    try {
      await waitFor(async () => (await mcAvailable()) === 'Unknown', {
        timeoutMs: 60_000,
        intervalMs: 250,
        message: 'c2 Available Unknown',
      });
      await waitFor(async () => cond(await addon('c2'), 'Available')?.status === 'Unknown', {
        timeoutMs: 30_000,
        intervalMs: 250,
        message: "c2's addon Available Unknown (OCM's registration hub)",
      });
      // Several status passes of the hub, with the tunnel up all along: Available stays OCM's, the very condition
      // OCM wrote (a True of ours would show, or OCM's Unknown written again at a new transition time).
      const ocmsAvailable = cond(await addon('c2'), 'Available');
      const w = await writesOver(ocm.kube, HUB_USER, 4, { during: async () => void (await apiserverThroughHub('c2')) });
      expect(cond(await addon('c2'), 'Available'), `the hub's writes then: ${w.hub.join('; ')}`).toEqual(ocmsAvailable);
      expect((await apiserverThroughHub('c2')).gitVersion).toBe(clusters.get('c2')!.kube.versions.kubernetes);
    } finally {
      process.kill(pid, 'SIGCONT');
    }
    await waitFor(async () => (await mcAvailable()) === 'True', { timeoutMs: 90_000, intervalMs: 250, message: 'c2 Available again' });
    // Ours again, from the tunnel (OCM's registration hub only ever writes Unknown in Customized mode).
    await available('c2');
    const restore = await ocm.kube.request('PATCH', mcPath, { spec: { leaseDurationSeconds: 60 } }, 'application/merge-patch+json');
    expect(restore.status, restore.text).toBe(200);
  }

  it('disabling the addon: the garbage collector takes the work, the work agent removes the agent and leaves the namespace, the agent stops', async () => {
    const k = clusters.get('c1')!.kubelet;
    const agent = k.agents()[0]!;
    const ns = (await addon('c1'))!.status!.namespace!;
    const r = await ocm.kube.request('DELETE', addonPath('c1'));
    expect(r.status, r.text).toBe(200);
    await waitFor(async () => (await work('c1')) === null && (await addon('c1')) === null, {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: 'addon and work of c1 gone',
    });
    await waitFor(async () => (await inCluster('c1', `/apis/apps/v1/namespaces/${ns}/deployments/${DEPLOYMENT}`)) === null, {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: 'the Deployment removed from c1',
    });
    await agent.proc.exited;
    expect(await inCluster('c1', `/api/v1/namespaces/${ns}`)).not.toBeNull();
    await waitFor(async () => !(await hub!.tables()).agents.some((x) => x.cluster === 'c1'), {
      timeoutMs: 30_000,
      intervalMs: 250,
      message: 'c1 off the hub',
    });
  }, 180_000);

  it("upgrade: a work an earlier version of ours wrote (shared namespace, no deleteOption) moves to OCM's namespace; OCM's work agent leaves the shared namespace and another addon's object in it", async () => {
    const shared = 'open-cluster-management-agent-addon';
    await hub!.stop();
    const agentPort = hub!.ports.agent;
    hub = null;
    await enable('c1');
    const a = await waitFor(() => addon('c1'), { timeoutMs: 10_000, message: 'addon of c1' });
    const mc = (await get<ManagedCluster>('/apis/cluster.open-cluster-management.io/v1/managedclusters/c1'))!;
    const earlier = renderAgentWork({
      addon: a,
      cluster: mc,
      mpc: null,
      adc: null,
      caBundle: await readFile(pki.caPath, 'utf8'),
      agentEntrypoint: `127.0.0.1:${agentPort}`,
      image: DEFAULT_AGENT_IMAGE,
      defaultInstallNamespace: shared,
    });
    // As that version wrote it: no deleteOption, so OCM's work agent owns the namespace it applies.
    const made = await ocm.kube.request('POST', '/apis/work.open-cluster-management.io/v1/namespaces/c1/manifestworks', {
      ...earlier,
      metadata: { ...earlier.metadata, annotations: {} },
      spec: { workload: earlier.spec.workload },
    });
    expect(made.status, made.text).toBe(201);
    await waitFor(async () => (await inCluster('c1', `/apis/apps/v1/namespaces/${shared}/deployments/${DEPLOYMENT}`)) !== null, {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: 'the earlier work applied in c1',
    });
    const other = await clusters.get('c1')!.kube.request('POST', `/api/v1/namespaces/${shared}/configmaps`, {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'other-addon-config', namespace: shared },
      data: { a: 'b' },
    });
    expect(other.status, other.text).toBe(201);
    hub = await startOurHub();
    await waitFor(
      async () => {
        const w = await work('c1');
        const names = w?.spec.workload.manifests
          .filter((m) => m['kind'] === 'Namespace')
          .map((m) => (m['metadata'] as { name: string }).name);
        return JSON.stringify(names) === JSON.stringify([AGENT_NS]);
      },
      { timeoutMs: 60_000, intervalMs: 250, message: "the work moved to OCM's namespace" },
    ).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await why('c1')}`);
    });
    await available('c1');
    await waitFor(async () => (await inCluster('c1', `/apis/apps/v1/namespaces/${shared}/deployments/${DEPLOYMENT}`)) === null, {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: 'the earlier Deployment removed',
    });
    // The work agent's decision is made once its AppliedManifestWork no longer lists the shared namespace: deleted
    // if it owned it, left if it was released.
    await waitFor(
      async () => {
        const r = await clusters
          .get('c1')!
          .kube.request<{ items: { status?: { appliedResources?: { resource: string; name: string }[] } }[] }>(
            'GET',
            '/apis/work.open-cluster-management.io/v1/appliedmanifestworks',
          );
        return (
          r.body.items.length > 0 &&
          r.body.items.every((x) => !(x.status?.appliedResources ?? []).some((ar) => ar.resource === 'namespaces' && ar.name === shared))
        );
      },
      { timeoutMs: 60_000, intervalMs: 250, message: 'the shared namespace out of the AppliedManifestWork' },
    );
    const ns = await inCluster('c1', `/api/v1/namespaces/${shared}`);
    expect(ns?.metadata.deletionTimestamp).toBeUndefined();
    expect(await inCluster('c1', `/api/v1/namespaces/${shared}/configmaps/other-addon-config`)).not.toBeNull();
    expect(await inCluster('c1', `/apis/apps/v1/namespaces/${AGENT_NS}/deployments/${DEPLOYMENT}`)).not.toBeNull();
    expect((await apiserverThroughHub('c1')).gitVersion).toBe(clusters.get('c1')!.kube.versions.kubernetes);
    const r = await ocm.kube.request('DELETE', addonPath('c1'));
    expect(r.status, r.text).toBe(200);
    await waitFor(async () => (await work('c1')) === null && (await addon('c1')) === null, {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: 'addon and work of c1 gone',
    });
  }, 240_000);

  it('removing a cluster (its ManagedCluster deleted): OCM cleans up its work and addon, the work agent removes our agent, the hub lets the cluster go', async () => {
    await enable('c2');
    await available('c2');
    const agent = clusters.get('c2')!.kubelet.agents()[0]!;
    const r = await ocm.kube.request('DELETE', '/apis/cluster.open-cluster-management.io/v1/managedclusters/c2');
    expect(r.status, r.text).toBe(200);
    await waitFor(async () => (await work('c2')) === null && (await addon('c2')) === null, {
      timeoutMs: 90_000,
      intervalMs: 250,
      message: 'addon and work of c2 gone',
    }).catch(async (err: Error) => {
      throw new Error(`${err.message}
${await why('c2')}`);
    });
    await waitFor(async () => (await inCluster('c2', `/apis/apps/v1/namespaces/${AGENT_NS}/deployments/${DEPLOYMENT}`)) === null, {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: 'the Deployment removed from c2',
    });
    await agent.proc.exited;
    await waitFor(async () => (await get('/apis/cluster.open-cluster-management.io/v1/managedclusters/c2')) === null, {
      timeoutMs: 90_000,
      intervalMs: 250,
      message: 'ManagedCluster c2 gone (its finalizers done)',
    });
    await waitFor(async () => !(await hub!.tables()).agents.some((x) => x.cluster === 'c2'), {
      timeoutMs: 30_000,
      intervalMs: 250,
      message: 'c2 off the hub',
    });
  }, 240_000);

  it('uninstalling the chart with Helm keeps its ClusterManagementAddOn (resource policy keep): the addon, its work and the agent stay; deleting the ClusterManagementAddOn then has the garbage collector take the addon it owns and its work, and the agent stops', async () => {
    await enable('c1');
    await available('c1');
    const agents = [clusters.get('c1')!.kubelet.agents()[0]!];
    const cmaPath = '/apis/addon.open-cluster-management.io/v1alpha1/clustermanagementaddons/cluster-proxy';
    const cma = (await get(cmaPath))!;
    const addonUid = (await addon('c1'))!.metadata.uid;
    // The hub's pod goes with the chart's Deployment: stopped as the kubelet stops it once helm deleted it.
    const deploymentGone = waitFor(async () => (await get(`/apis/apps/v1/namespaces/${AGENT_NS}/deployments/cluster-proxy`)) === null, {
      timeoutMs: 120_000,
      intervalMs: 100,
      message: "the chart's Deployment deleted",
    }).then(async () => {
      await hub!.stop();
      hub = null;
    });
    const r = await helm(['uninstall', 'cluster-proxy', '--namespace', AGENT_NS]);
    await deploymentGone;
    expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(0);
    // Helm is done and says it kept the ClusterManagementAddOn: the same object, so the addon it owns has an owner
    // and the garbage collector leaves it, its work and the agent.
    expect(r.stdout).toMatch(
      /kept due to the resource policy[\s\S]*ClusterManagementAddOn|ClusterManagementAddOn[\s\S]*kept due to the resource policy/,
    );
    expect((await get(cmaPath))?.metadata.uid).toBe(cma.metadata.uid);
    expect((await addon('c1'))?.metadata.deletionTimestamp).toBeUndefined();
    expect((await addon('c1'))?.metadata.uid).toBe(addonUid);
    expect(await work('c1')).not.toBeNull();
    expect(agents[0]!.proc.isRunning()).toBe(true);
    // Removing the addon everywhere: delete the ClusterManagementAddOn (docs/ocm.md).
    const d = await ocm.kube.request('DELETE', cmaPath);
    expect(d.status, d.text).toBe(200);
    for (const c of ['c1']) {
      await waitFor(async () => (await addon(c)) === null && (await work(c)) === null, {
        timeoutMs: 60_000,
        intervalMs: 250,
        message: `addon and work of ${c} garbage-collected`,
      });
      await waitFor(async () => (await inCluster(c, `/apis/apps/v1/namespaces/${AGENT_NS}/deployments/${DEPLOYMENT}`)) === null, {
        timeoutMs: 60_000,
        intervalMs: 250,
        message: `the Deployment removed from ${c}`,
      });
    }
    for (const a of agents) await a.proc.exited;
    expect(await get(cmaPath)).toBeNull();
  }, 240_000);
});
