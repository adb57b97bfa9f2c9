// Moving an OCM hub from OCM's own cluster-proxy to ours and back, typed as docs/ocm.md tells it ("Migrating
// from OCM's cluster-proxy, and back"): the real kubectl and Helm as processes, on OCM's real hub and
// klusterlet (real-ocm.ts) with the real garbage collector. OCM's side: its chart from the Go module cache
// and its addon manager as the process the chart's Deployment runs (ocm-cluster-proxy.ts); its agent image
// is not run (nothing here runs OCM's agent), ours is (kubelet-player.ts). What it shows: the addon
// (ManagedClusterAddOn) and its per-cluster config survive both moves, each manager rewrites the same work,
// and the tunnel comes up through our hub; and, as the reason for the orphaning step, that a plain
// `helm uninstall` of OCM's chart has the garbage collector delete the addon (OCM's addon-manager makes the
// ClusterManagementAddOn its controller owner). Skipped, with the reason, when there is no Go toolchain.
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Tunnel } from '@cluster-proxy/client';
import type { ManagedClusterAddOn, ManifestWork } from '@cluster-proxy/server';
import { AUDIT_WRITE_VERBS, CHART_CRDS_DIR, killAllSpawned, runCommand, waitFor, type ManagedProcess } from '../src/fixtures/index.js';
import { ocmClusterProxy, startOcmClusterProxyManager, type OcmClusterProxy } from '../src/fixtures/ocm-cluster-proxy.js';
import {
  goAvailable,
  ocmPeers,
  startOcmHub,
  startOcmManagedCluster,
  type OcmHub,
  type OcmManagedCluster,
} from '../src/fixtures/real-ocm.js';
import { addonPath, conditionOf, getObject, ocmHubArgs, versionThroughTunnel, workPath } from '../src/fixtures/ocm-hub-api.js';
import { CLI, createPki, startHub, type HubProcess, type TestPki } from '../src/harness.js';
import { kubectlBinary, kubectlUnsupported } from './kubectl-binary.js';

/** Our chart's namespace. */
const OUR_NS = 'open-cluster-management-cluster-proxy';
/** OCM's chart's namespace, as its README installs it. */
const OCM_NS = 'open-cluster-management-addon';
const WORK = 'addon-cluster-proxy-deploy-0';
const DEPLOYMENT = 'cluster-proxy-proxy-agent';
const OUR_CHART = path.dirname(CHART_CRDS_DIR);
const OCM_IMAGE = 'quay.io/open-cluster-management/';
/** The klusterlet's namespace for addons, shared by every addon. */
const SHARED_NS = 'open-cluster-management-agent-addon';
const START_TIMEOUT_MS = 45 * 60_000;
/** The per-cluster config both managers render: a node selector on the agent's pod. */
const NODE_SELECTOR = { 'cluster-proxy.test/pool': 'tunnels' };

/** What docs/ocm.md has the admin apply before installing OCM's chart again. */
const PLACEMENT_YAML = `apiVersion: v1
kind: Namespace
metadata:
  name: ${OCM_NS}
---
apiVersion: cluster.open-cluster-management.io/v1beta2
kind: ManagedClusterSetBinding
metadata:
  name: global
  namespace: ${OCM_NS}
spec:
  clusterSet: global
---
apiVersion: cluster.open-cluster-management.io/v1beta1
kind: Placement
metadata:
  name: cluster-proxy-placement
  namespace: ${OCM_NS}
spec:
  clusterSets:
    - global
`;

const hasGo = await goAvailable();
const noKubectl = kubectlUnsupported();
if (!hasGo) console.warn("real-ocm-migration.test.ts: skipped: no Go toolchain (`go`) to build OCM's programs and Helm with");
if (noKubectl) console.warn(`real-ocm-migration.test.ts: skipped: ${noKubectl}`);

type Owner = { kind: string; name: string; uid: string; controller?: boolean };
type Obj = { metadata: { name: string; uid: string; ownerReferences?: Owner[]; deletionTimestamp?: string } };
type Deployment = {
  metadata: { namespace?: string };
  spec: { template: { spec: { nodeSelector?: Record<string, string>; containers: { image: string }[] } } };
};

describe.skipIf(!hasGo || noKubectl !== null)("migrating from OCM's cluster-proxy to ours and back (real OCM, Helm, kubectl)", () => {
  let pki: TestPki;
  let ocm: OcmHub;
  let ocmCp: OcmClusterProxy;
  let c1: OcmManagedCluster;
  let hub: HubProcess | null = null;
  let ocmManager: ManagedProcess | null = null;
  let helmHome = '';
  let adminKubeconfig = '';
  let helmBin = '';
  let kubectlBin = '';

  const get = <T = Obj>(urlPath: string): Promise<T | null> => getObject<T>(ocm.kube, urlPath);
  const ADDON = addonPath('c1');
  const CMA = '/apis/addon.open-cluster-management.io/v1alpha1/clustermanagementaddons/cluster-proxy';
  const addon = () => get<ManagedClusterAddOn>(ADDON);
  const work = () => get<ManifestWork>(workPath('c1', WORK));
  const cma = () => get(CMA);
  /** The agent Deployment in c1's apiserver, as OCM's work agent applied it: the only one, in whichever namespace. */
  const agentDeployment = async (): Promise<(Deployment & { metadata: { namespace: string } }) | null> => {
    const r = await c1.kube.request<{ items: (Deployment & { metadata: { name: string; namespace: string } })[] }>(
      'GET',
      '/apis/apps/v1/deployments',
    );
    const found = r.body.items.filter((d) => d.metadata.name === DEPLOYMENT);
    return found.length === 1 ? found[0]! : null;
  };
  const cond = conditionOf;
  const controllerOf = (o: Obj | ManagedClusterAddOn | null): Owner | undefined =>
    (o?.metadata.ownerReferences as Owner[] | undefined)?.find((r) => r.controller);
  const why = async (): Promise<string> =>
    [
      `addon: ${JSON.stringify((await addon())?.metadata.ownerReferences)} ${JSON.stringify((await addon())?.status?.conditions)}`,
      `addon configReferences: ${JSON.stringify((await addon())?.status?.configReferences)}`,
      `work: ${JSON.stringify((await work())?.status?.conditions)} ${JSON.stringify(
        (await work())?.spec.workload.manifests
          .filter((m) => m['kind'] === 'Deployment')
          .map((m) => (m as unknown as Deployment).spec.template.spec),
      )}`,
      `c1 Deployments: ${JSON.stringify((await c1.kube.request<{ items: Obj[] }>('GET', '/apis/apps/v1/deployments')).body.items.map((x) => x.metadata))}`,
      `work Deployment metadata: ${JSON.stringify((await work())?.spec.workload.manifests.filter((m) => m['kind'] === 'Deployment').map((m) => m['metadata']))}`,
      `writes to the addon and the ClusterManagementAddOn (audit): ${(await ocm.kube.audit())
        .filter(
          (e) =>
            AUDIT_WRITE_VERBS.includes(e.verb) &&
            !e.objectRef?.subresource &&
            ((e.objectRef?.resource === 'managedclusteraddons' && e.objectRef.namespace === 'c1') ||
              e.objectRef?.resource === 'clustermanagementaddons'),
        )
        .slice(-25)
        .map((e) => `${e.stageTimestamp} ${e.verb} ${e.objectRef?.resource} ${e.user.username} ${e.responseStatus?.code}`)
        .join('\n')}`,
      `kubelet player: ${c1.kubelet.errors.slice(-3).join('; ')}`,
      `OCM crashed: ${ocm.crashed().join('; ')}`,
      `OCM's cluster-proxy manager: ${ocmManager
        ?.lines()
        .filter((l) => /^E|error/i.test(l))
        .slice(-6)
        .join('\n')}`,
      `our hub: ${hub?.proc
        .lines()
        .filter((l) => /"level":(40|50)/.test(l))
        .slice(-4)
        .join('\n')}`,
    ].join('\n');
  const until = <T>(f: () => Promise<T | null | undefined | false>, message: string, timeoutMs = 90_000): Promise<T> =>
    waitFor(f, { timeoutMs, intervalMs: 250, message }).catch(async (err: Error) => {
      throw new Error(`${err.message}\n${await why()}`);
    }) as Promise<T>;

  /** The commands as an admin types them: KUBECONFIG names the hub. */
  const env = (): NodeJS.ProcessEnv => ({
    ...process.env,
    KUBECONFIG: adminKubeconfig,
    HOME: helmHome,
    HELM_CACHE_HOME: path.join(helmHome, 'cache'),
    HELM_CONFIG_HOME: path.join(helmHome, 'config'),
    HELM_DATA_HOME: path.join(helmHome, 'data'),
  });
  const type = async (cmd: 'helm' | 'kubectl', args: string[]): Promise<string> => {
    const r = await runCommand(cmd === 'helm' ? helmBin : kubectlBin, args, { env: env(), timeoutMs: 120_000 });
    if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.code}:\n${r.stdout}\n${r.stderr}`);
    return `${r.stdout}${r.stderr}`;
  };

  const startOcmManager = async (): Promise<ManagedProcess> =>
    startOcmClusterProxyManager(ocm, { namespace: OCM_NS, kubeconfig: path.join(pki.dir, 'ocm-cluster-proxy.kubeconfig') });
  /** Our hub as the pod of our chart's Deployment: the chart's service account, only the chart's RBAC. */
  const startOurHub = async (): Promise<HubProcess> => {
    const kubeconfig = path.join(pki.dir, 'hub.kubeconfig');
    await ocm.kube.writeKubeconfig(
      kubeconfig,
      `system:serviceaccount:${OUR_NS}:cluster-proxy`,
      ['system:serviceaccounts', `system:serviceaccounts:${OUR_NS}`],
      { bindClusterAdmin: false },
    );
    return startHub(pki, ocmHubArgs({ kubeconfig, caKey: path.join(pki.dir, 'ca.key'), serverId: 'hub-a' }));
  };
  /** A chart's Deployment is gone (helm deleted it): the process that stands for its pod stops, as the kubelet stops it. */
  const stopWithDeployment = (namespace: string, name: string, stop: () => Promise<void>): Promise<void> => {
    const done = waitFor(async () => (await get(`/apis/apps/v1/namespaces/${namespace}/deployments/${name}`)) === null, {
      timeoutMs: 120_000,
      intervalMs: 100,
      message: `Deployment ${namespace}/${name} deleted`,
    }).then(stop);
    // Awaited by the case unless the helm command before fails first.
    done.catch(() => undefined);
    return done;
  };

  /** GET /version of c1's apiserver through our hub and the agent's tunnel. */
  async function apiserverThroughHub(): Promise<{ gitVersion: string }> {
    const t: Tunnel = hub!.tunnel();
    try {
      return await versionThroughTunnel(t, 'c1', c1.kube.caPem, 60_000);
    } finally {
      t.close();
    }
  }

  /** The addon, orphaned: same UID, no reference to `owner`, not being deleted (the later steps see it live on). */
  async function orphanedAddon(owner: string): Promise<void> {
    const a = await until(async () => {
      const x = await addon();
      return x && !(x.metadata.ownerReferences ?? []).some((o) => o.uid === owner) ? x : null;
    }, 'the addon without its owner reference');
    expect(a.metadata.uid).toBe(addonUid);
    expect(a.metadata.deletionTimestamp).toBeUndefined();
  }

  let addonUid = '';
  let ocmAgentNs = '';
  const configs = [{ group: 'addon.open-cluster-management.io', resource: 'addondeploymentconfigs', name: 'pool', namespace: 'c1' }];

  beforeAll(async () => {
    pki = await createPki();
    helmHome = await mkdtemp(path.join(os.tmpdir(), 'cp-helm-home-'));
    helmBin = (await ocmPeers()).binaries.helm;
    ocmCp = await ocmClusterProxy();
    kubectlBin = await kubectlBinary();
    ocm = await startOcmHub();
    adminKubeconfig = path.join(pki.dir, 'hub-admin.kubeconfig');
    await ocm.kube.writeKubeconfig(adminKubeconfig);
    c1 = await startOcmManagedCluster(ocm, { name: 'c1', cli: CLI, runsImage: (image) => !image.startsWith(OCM_IMAGE) });
    // The garbage collector watches a CRD's kind only from its next discovery pass (every 30 s) after the CRD
    // appears; until then it cannot orphan an addon (nor delete one), which a long-running hub never sees. An
    // addon owned by an object that does not exist is deleted once it watches addons.
    const probe = await ocm.kube.request(
      'POST',
      '/apis/addon.open-cluster-management.io/v1alpha1/namespaces/default/managedclusteraddons',
      {
        apiVersion: 'addon.open-cluster-management.io/v1alpha1',
        kind: 'ManagedClusterAddOn',
        metadata: {
          name: 'gc-probe',
          namespace: 'default',
          ownerReferences: [{ apiVersion: 'v1', kind: 'ConfigMap', name: 'gone', uid: randomUUID() }],
        },
        spec: {},
      },
    );
    expect(probe.status, probe.text).toBe(201);
    await waitFor(
      async () => (await get('/apis/addon.open-cluster-management.io/v1alpha1/namespaces/default/managedclusteraddons/gc-probe')) === null,
      { timeoutMs: 90_000, intervalMs: 500, message: 'the garbage collector watching ManagedClusterAddOns' },
    );
  }, START_TIMEOUT_MS);

  afterAll(async () => {
    await c1?.stop();
    await hub?.stop();
    await ocmManager?.stop();
    await ocm?.stop();
    await killAllSpawned();
    if (helmHome) await rm(helmHome, { recursive: true, force: true });
    await pki?.cleanup();
  }, 120_000);

  it("OCM's cluster-proxy, installed with its chart: its addon-manager installs the addon on c1 (Placement of the global set) with a per-cluster AddOnDeploymentConfig; the work agent applies OCM's agent", async () => {
    await type('helm', ['install', 'cluster-proxy', ocmCp.chart, '--namespace', OCM_NS, '--create-namespace']);
    ocmManager = await startOcmManager();
    // The chart's Placement selects every cluster of `global`; OCM's addon-manager makes the addon.
    const a = await until(() => addon(), "c1's addon made by OCM's addon-manager (install strategy Placements)");
    addonUid = a.metadata.uid!;
    const made = await ocm.kube.request('POST', '/apis/addon.open-cluster-management.io/v1alpha1/namespaces/c1/addondeploymentconfigs', {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'AddOnDeploymentConfig',
      metadata: { name: 'pool', namespace: 'c1' },
      spec: { nodePlacement: { nodeSelector: NODE_SELECTOR } },
    });
    expect(made.status, made.text).toBe(201);
    const patched = await ocm.kube.request('PATCH', ADDON, { spec: { configs } }, 'application/merge-patch+json');
    expect(patched.status, patched.text).toBe(200);
    const d = await until(async () => {
      const x = await agentDeployment();
      return x?.spec.template.spec.nodeSelector?.['cluster-proxy.test/pool'] ? x : null;
    }, "OCM's agent Deployment in c1 with the config's node selector");
    expect(d.spec.template.spec.containers[0]!.image).toBe(`${OCM_IMAGE}cluster-proxy:v${ocmCp.version.replace(/^v/, '')}`);
    const owner = controllerOf(await addon());
    expect([owner?.kind, owner?.name, owner?.uid]).toEqual(['ClusterManagementAddOn', 'cluster-proxy', (await cma())!.metadata.uid]);
    // OCM's cluster-proxy installs its agent into the AddOnDeploymentConfig's agentInstallNamespace, which OCM's
    // CRD defaults to the klusterlet's shared addon namespace (ours reads it the same); another addon keeps an
    // object there.
    ocmAgentNs = d.metadata.namespace;
    expect(ocmAgentNs).toBe(SHARED_NS);
    const other = await c1.kube.request('POST', `/api/v1/namespaces/${SHARED_NS}/configmaps`, {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: 'other-addon-config', namespace: SHARED_NS },
      data: { a: 'b' },
    });
    expect(other.status, other.text).toBe(201);
    expect(c1.kubelet.agents()).toEqual([]);
  }, 300_000);

  it("to ours, as the docs tell it: the addon (same UID) and its config stay, OCM's addon-manager owns it to our ClusterManagementAddOn, our hub rewrites the work, our agent's tunnel reaches c1's apiserver", async () => {
    const ocmCma = (await cma())!.metadata.uid;
    // 1. Orphan the addons: OCM's addon-manager stops owning them to this ClusterManagementAddOn (lifecycle no
    // longer addon-manager), then the garbage collector takes its owner reference off them as it deletes it.
    await type('kubectl', [
      'annotate',
      'clustermanagementaddon',
      'cluster-proxy',
      'addon.open-cluster-management.io/lifecycle=self',
      '--overwrite',
    ]);
    await type('kubectl', ['delete', 'clustermanagementaddon', 'cluster-proxy', '--cascade=orphan']);
    await orphanedAddon(ocmCma);
    // 2. OCM's chart goes (its ClusterManagementAddOn is gone already); its manager's pod with its Deployment.
    const managerGone = stopWithDeployment(OCM_NS, 'cluster-proxy-addon-manager', async () => {
      await ocmManager?.stop();
      ocmManager = null;
    });
    await type('helm', ['uninstall', 'cluster-proxy', '--namespace', OCM_NS]);
    await managerGone;
    expect(await get('/apis/proxy.open-cluster-management.io/v1alpha1/managedproxyconfigurations/cluster-proxy')).toBeNull();
    // 3. Ours, with its hub (the chart Deployment's pod).
    const t0 = performance.now();
    await type('helm', [
      'install',
      'cluster-proxy',
      OUR_CHART,
      '--namespace',
      OUR_NS,
      '--create-namespace',
      '--set',
      'agentInstall.mode=manifestwork',
    ]);
    hub = await startOurHub();
    const agent = await until(async () => c1.kubelet.agents()[0], 'our agent started in c1');
    expect((await apiserverThroughHub()).gitVersion).toBe(c1.kube.versions.kubernetes);
    const gapMs = performance.now() - t0;
    console.log(`real-ocm-migration: from our helm install to the tunnel reaching c1's apiserver: ${Math.round(gapMs)} ms`);
    const ours = (await cma())!;
    const a = await until(async () => {
      const x = await addon();
      return cond(x, 'Available')?.status === 'True' && controllerOf(x)?.uid === ours.metadata.uid ? x : null;
    }, 'the addon Available and owned by our ClusterManagementAddOn');
    expect(a.metadata.uid).toBe(addonUid);
    expect(a.spec?.configs).toEqual(configs);
    // The same Deployment, updated in place by the work agent (same namespace: the config's), and the shared
    // namespace and the other addon's object in it left alone.
    const d = (await agentDeployment())!;
    expect(d.metadata.namespace).toBe(ocmAgentNs);
    expect(d.spec.template.spec.containers[0]!.image.startsWith(OCM_IMAGE)).toBe(false);
    expect(d.spec.template.spec.nodeSelector).toEqual(NODE_SELECTOR);
    expect(agent.deployment).toBe(`${ocmAgentNs}/${DEPLOYMENT}`);
    const shared = await c1.kube.request<Obj>('GET', `/api/v1/namespaces/${SHARED_NS}`);
    expect(shared.status).toBe(200);
    expect(shared.body.metadata.deletionTimestamp).toBeUndefined();
    expect((await c1.kube.request('GET', `/api/v1/namespaces/${SHARED_NS}/configmaps/other-addon-config`)).status).toBe(200);
    // Had OCM's ManagedProxyConfiguration stayed (its default entry point PortForward), the addon says why nothing
    // is installed, naming the field; one documented fix (an entry point of type Hostname with the address agents
    // dial) clears it. (The other, deleting it, the way back below types.)
    const MPC = '/apis/proxy.open-cluster-management.io/v1alpha1/managedproxyconfigurations/cluster-proxy';
    const mpc = (await get<{ spec: { proxyServer: Record<string, unknown> } }>(MPC))!;
    const portForward = await ocm.kube.request(
      'PATCH',
      MPC,
      { spec: { proxyServer: { ...mpc.spec.proxyServer, entrypoint: { type: 'PortForward', port: 8091 } } } },
      'application/merge-patch+json',
    );
    expect(portForward.status, portForward.text).toBe(200);
    const refused = await until(async () => {
      const x = cond(await addon(), 'ManifestApplied') as { status: string; message?: string } | undefined;
      return x?.status === 'False' ? x : null;
    }, 'ManifestApplied False for a PortForward entry point');
    expect(refused.message).toContain('spec.proxyServer.entrypoint.type');
    const hostname = {
      spec: { proxyServer: { entrypoint: { type: 'Hostname', hostname: { value: '127.0.0.1' }, port: hub!.ports.agent } } },
    };
    await type('kubectl', ['patch', 'managedproxyconfiguration', 'cluster-proxy', '--type=merge', '-p', JSON.stringify(hostname)]);
    await until(async () => cond(await addon(), 'ManifestApplied')?.status === 'True', 'ManifestApplied True with a Hostname entry point');
    expect((await apiserverThroughHub()).gitVersion).toBe(c1.kube.versions.kubernetes);
  }, 300_000);

  it("back to OCM's, as the docs tell it: our uninstall keeps the ClusterManagementAddOn and the agents; orphaned, our ManagedProxyConfiguration deleted and OCM's Placement decided first, OCM's chart installs and its manager rewrites the work; the addon (same UID) and its config stay", async () => {
    const agent = c1.kubelet.agents()[0]!;
    // 1. Ours goes; its ClusterManagementAddOn stays (resource policy keep), so nothing is taken from the clusters.
    const ours = (await cma())!.metadata.uid;
    const hubGone = stopWithDeployment(OUR_NS, 'cluster-proxy', async () => {
      await hub?.stop();
      hub = null;
    });
    await type('helm', ['uninstall', 'cluster-proxy', '--namespace', OUR_NS]);
    await hubGone;
    expect((await cma())?.metadata.uid).toBe(ours);
    expect((await addon())?.metadata.uid).toBe(addonUid);
    expect(await work()).not.toBeNull();
    expect(agent.proc.isRunning()).toBe(true);
    // 2. Orphan the addons; delete the ManagedProxyConfiguration our hub made (OCM's chart makes its own).
    await type('kubectl', [
      'annotate',
      'clustermanagementaddon',
      'cluster-proxy',
      'addon.open-cluster-management.io/lifecycle=self',
      '--overwrite',
    ]);
    await type('kubectl', ['delete', 'clustermanagementaddon', 'cluster-proxy', '--cascade=orphan']);
    // Helm will not install OCM's chart over the ManagedProxyConfiguration our hub made (nothing is created).
    const over = await runCommand(helmBin, ['install', 'cluster-proxy', ocmCp.chart, '--namespace', OCM_NS], {
      env: env(),
      timeoutMs: 120_000,
    });
    expect(over.code).not.toBe(0);
    expect(over.stderr).toMatch(/ManagedProxyConfiguration "cluster-proxy".*exists and cannot be imported into the current release/);
    await type('kubectl', ['delete', 'managedproxyconfiguration', 'cluster-proxy', '--ignore-not-found']);
    await orphanedAddon(ours);
    // 3. The Placement OCM's chart installs by, decided before the chart's ClusterManagementAddOn exists (OCM's
    // addon-manager deletes every addon of a cluster the Placement has not chosen), then OCM's chart naming it,
    // and its manager's pod.
    const placementFile = path.join(pki.dir, 'cluster-proxy-placement.yaml');
    await writeFile(placementFile, PLACEMENT_YAML);
    await type('kubectl', ['apply', '-f', placementFile]);
    await type('kubectl', [
      'wait',
      '--for=condition=PlacementSatisfied',
      'placement/cluster-proxy-placement',
      '--namespace',
      OCM_NS,
      '--timeout=60s',
    ]);
    await type('helm', [
      'install',
      'cluster-proxy',
      ocmCp.chart,
      '--namespace',
      OCM_NS,
      '--set',
      'installByPlacement.placementName=cluster-proxy-placement',
      '--set',
      `installByPlacement.placementNamespace=${OCM_NS}`,
    ]);
    ocmManager = await startOcmManager();
    const back = await until(async () => {
      const x = await agentDeployment();
      return x?.spec.template.spec.containers[0]!.image.startsWith(OCM_IMAGE) ? x : null;
    }, "OCM's agent back in c1, ours removed");
    expect(back.metadata.namespace).toBe(ocmAgentNs);
    await agent.proc.exited;
    expect(c1.kubelet.agents()).toEqual([]);
    const theirs = (await cma())!.metadata.uid;
    const a = await until(async () => {
      const x = await addon();
      return controllerOf(x)?.uid === theirs ? x : null;
    }, "the addon owned by OCM's ClusterManagementAddOn");
    expect(a.metadata.uid).toBe(addonUid);
    expect(a.spec?.configs).toEqual(configs);
    expect((await agentDeployment())!.spec.template.spec.nodeSelector).toEqual(NODE_SELECTOR);
    expect((await c1.kube.request('GET', `/api/v1/namespaces/${SHARED_NS}/configmaps/other-addon-config`)).status).toBe(200);
  }, 300_000);

  it("why the orphaning step is there: a plain `helm uninstall` of OCM's chart has the garbage collector delete the addon, and with it the work", async () => {
    const a = await until(async () => {
      const x = await addon();
      return controllerOf(x)?.uid === (await cma())?.metadata.uid ? x : null;
    }, "the addon owned by OCM's ClusterManagementAddOn");
    expect(a.metadata.uid).toBe(addonUid);
    expect(await work()).not.toBeNull();
    const managerGone = stopWithDeployment(OCM_NS, 'cluster-proxy-addon-manager', async () => {
      await ocmManager?.stop();
      ocmManager = null;
    });
    await type('helm', ['uninstall', 'cluster-proxy', '--namespace', OCM_NS]);
    await managerGone;
    await until(async () => {
      const a = await addon();
      return a === null || a.metadata.uid !== addonUid || a.metadata.deletionTimestamp !== undefined;
    }, 'the addon deleted by the garbage collector');
    await until(async () => (await addon()) === null && (await work()) === null, 'addon and work gone');
  }, 180_000);
});
