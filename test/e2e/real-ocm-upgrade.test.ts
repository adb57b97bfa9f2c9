// An upgrade of the hub in place, on OCM itself: the release we shipped (test/previous-release.json, built from
// git history by scripts/build-release.sh) runs as the hub on OCM's own hub controllers and klusterlets
// (test/src/fixtures/real-ocm.ts) with its own chart installed by the real Helm; then `helm upgrade` to this
// checkout's chart (a new agent image, the new RBAC) and this build's hub in place of the old one: the same PKI,
// the same agent port (the chart's Service), the same store, a new replica name (a new pod). OCM's work agent
// applies what the new hub writes over the works the old one wrote; the kubelet player runs each agent
// Deployment with the CLI of its image (the release's for the release's image, this build's for the new one).
// Three clusters at once: c1 keeps its install namespace (the agent rolls in place), c2's AddOnDeploymentConfig
// names another namespace while the hub is down (the agent moves; the old namespace stays), c3's mirrors the
// new image to the release's (the hub goes first, the agent stays: it reconnects by itself). Each case logs how
// long after the new hub's start the tunnel was back (and back through this build's agent).
// Skipped, with the reason, when there is no Go toolchain to build OCM's programs with.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ManagedClusterAddOn, ManifestWork } from '@cluster-proxy/server';
import { configSpecHash } from '@cluster-proxy/server/ocm';
import { CHART_CRDS_DIR, freeLoopbackPort, killAllSpawned, runCommand, waitFor } from '../src/fixtures/index.js';
import type { PlayedAgent } from '../src/fixtures/kubelet-player.js';
import {
  goAvailable,
  ocmPeers,
  startOcmHub,
  startOcmManagedCluster,
  type OcmHub,
  type OcmManagedCluster,
} from '../src/fixtures/real-ocm.js';
import { addonPath, conditionOf, enableAddon, getObject, ocmHubArgs, versionThroughTunnel, workPath } from '../src/fixtures/ocm-hub-api.js';
import { CLI, createPki, startHub, type HubProcess, type TestPki } from '../src/harness.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const previous = JSON.parse(readFileSync(path.join(ROOT, 'test/previous-release.json'), 'utf8')) as { version: string; commit: string };
const AGENT_NS = 'open-cluster-management-cluster-proxy';
const HUB_USER = `system:serviceaccount:${AGENT_NS}:cluster-proxy`;
const WORK = 'addon-cluster-proxy-deploy-0';
const DEPLOYMENT = 'cluster-proxy-proxy-agent';
const CHART = path.dirname(CHART_CRDS_DIR);
/**
 * The image the upgraded chart names. This build's version is the release's until the next one is cut, so
 * the chart is given a tag of its own here: the upgrade changes the agent's image, as a release does.
 */
const NEW_TAG = 'upgraded';
/** c2's install namespace under the release, and the one its AddOnDeploymentConfig names during the upgrade. */
const OLD_NS = 'cp-before';
const NEW_NS = 'cp-after';
/** The first run may build OCM's programs and the release (many minutes; the scripts print their progress). */
const START_TIMEOUT_MS = 45 * 60_000;

const hasGo = await goAvailable();
if (!hasGo)
  console.warn("real-ocm-upgrade.test.ts: skipped: no Go toolchain (`go`) to build OCM's programs and Helm from their Go modules with");

type Deployment = {
  metadata: { uid: string; namespace: string; deletionTimestamp?: string };
  spec: { selector: unknown; template: { spec: { containers: { image: string; args?: string[] }[] } } };
};

describe.skipIf(!hasGo)(`upgrading the hub from ${previous.version} in place, on OCM's own hub and klusterlets (real Helm)`, () => {
  let pki: TestPki;
  let ocm: OcmHub;
  let hub: HubProcess | null = null;
  let helmHome = '';
  let helmBin = '';
  let kubeconfig = '';
  let adminKubeconfig = '';
  let oldCli = '';
  let oldChart = '';
  let oldImage = '';
  let agentPort = 0;
  const clusters = new Map<string, OcmManagedCluster>();
  /** Recorded under the release: what the upgrade must keep. */
  const before = new Map<string, { deployment: Deployment; work: ManifestWork; agent: PlayedAgent }>();
  /** When the new hub started (performance.now()), and per cluster how long until its tunnel was back. */
  let upgradedAt = 0;
  const back = new Map<string, Promise<{ firstMs: number; newAgentMs: number }>>();
  let c3Back: Promise<number> | null = null;

  const get = <T>(urlPath: string): Promise<T | null> => getObject<T>(ocm.kube, urlPath);
  const adcPath = (c: string): string => `/apis/addon.open-cluster-management.io/v1alpha1/namespaces/${c}/addondeploymentconfigs/proxy`;
  const addon = (c: string) => get<ManagedClusterAddOn>(addonPath(c));
  const work = (c: string) => get<ManifestWork>(workPath(c, WORK));
  const cond = conditionOf;
  const inCluster = async <T = { metadata: { deletionTimestamp?: string } }>(c: string, urlPath: string): Promise<T | null> => {
    const r = await clusters.get(c)!.kube.request<T>('GET', urlPath);
    return r.status === 200 ? r.body : null;
  };
  const deploymentIn = (c: string, ns: string) => inCluster<Deployment>(c, `/apis/apps/v1/namespaces/${ns}/deployments/${DEPLOYMENT}`);
  const workImage = (w: ManifestWork | null): string | undefined =>
    (w?.spec.workload.manifests.find((m) => m['kind'] === 'Deployment') as Deployment | undefined)?.spec.template.spec.containers[0]?.image;
  const why = async (c: string): Promise<string> => {
    const k = clusters.get(c);
    const errors = (lines: string[] | undefined, re: RegExp) =>
      (lines ?? [])
        .filter((l) => re.test(l))
        .slice(-4)
        .join('\n');
    return [
      `addon: ${JSON.stringify((await addon(c))?.status)}`,
      `work: ${JSON.stringify((await work(c))?.status?.conditions)}`,
      `agents: ${JSON.stringify(k?.kubelet.agents().map((a) => [a.deployment, a.image]))}; kubelet player: ${k?.kubelet.errors.slice(-3).join('; ')}`,
      `OCM crashed: ${ocm.crashed().join('; ')}`,
      `work agent: ${errors(k?.work.lines(), /^[EF]/)}`,
      `addon manager: ${errors(ocm.processes.addon.lines(), /^E/)}`,
      `hub: ${errors(hub?.proc.lines(), /"level":(40|50)/)}`,
    ].join('\n');
  };
  const explained = (c: string) => async (err: Error) => {
    throw new Error(`${err.message}\n${await why(c)}`);
  };

  /** GET /version of the cluster's own apiserver through the hub and the agent's tunnel (TLS end to end), once. */
  async function versionThroughHub(c: string): Promise<string> {
    const t = hub!.tunnel();
    try {
      return (await versionThroughTunnel(t, c, clusters.get(c)!.kube.caPem, 0)).gitVersion;
    } finally {
      t.close();
    }
  }
  const apiserverThroughHub = (c: string, timeoutMs = 30_000): Promise<string> =>
    waitFor(() => versionThroughHub(c), { timeoutMs, intervalMs: 100, message: `GET /version of ${c} through the hub` });

  const helm = async (args: string[]) =>
    runCommand(helmBin, [...args, '--kubeconfig', adminKubeconfig], {
      env: {
        ...process.env,
        HOME: helmHome,
        HELM_CACHE_HOME: path.join(helmHome, 'cache'),
        HELM_CONFIG_HOME: path.join(helmHome, 'config'),
        HELM_DATA_HOME: path.join(helmHome, 'data'),
      },
      timeoutMs: 120_000,
    });

  /** The agent image the chart's hub Deployment passes the hub (what its pod would run with). */
  async function chartAgentImage(): Promise<string> {
    const d = (await get<Deployment>(`/apis/apps/v1/namespaces/${AGENT_NS}/deployments/cluster-proxy`))!;
    const arg = d.spec.template.spec.containers[0]!.args!.find((a) => a.startsWith('--agent-image='));
    return arg!.slice('--agent-image='.length);
  }

  /** The hub as real-ocm.test.ts runs it, with the chart's agent image, on the agent port the chart's Service keeps. */
  async function startOurHub(cli: string, serverId: string): Promise<HubProcess> {
    const h = await startHub(
      pki,
      [
        ...ocmHubArgs({ kubeconfig, caKey: path.join(pki.dir, 'ca.key'), serverId }),
        '--agent-port',
        String(agentPort),
        '--agent-image',
        await chartAgentImage(),
      ],
      { cli },
    );
    expect(h.ports.agent).toBe(agentPort);
    return h;
  }

  const enable = (c: string, spec: Record<string, unknown> = {}): Promise<void> => enableAddon(ocm.kube, c, spec);

  async function available(c: string, timeoutMs = 90_000): Promise<ManagedClusterAddOn> {
    return waitFor(
      async () => {
        const a = await addon(c);
        return cond(a, 'Available')?.status === 'True' && cond(a, 'ManifestApplied')?.status === 'True' ? a : null;
      },
      { timeoutMs, intervalMs: 250, message: `addon of ${c} Available and ManifestApplied` },
    ).catch(explained(c));
  }

  /** The work as OCM's work agent applied it: Applied True at the work's own generation (no apply error). */
  const appliedAtGeneration = (w: ManifestWork | null): boolean => {
    const applied = cond(w, 'Applied');
    return applied?.status === 'True' && applied.observedGeneration === w?.metadata.generation;
  };

  async function completed(c: string): Promise<ManagedClusterAddOn> {
    return waitFor(
      async () => {
        const a = await addon(c);
        return cond(a, 'Progressing')?.reason === 'Completed' ? a : null;
      },
      { timeoutMs: 60_000, intervalMs: 250, message: `the rollout of ${c}'s addon Progressing Completed` },
    ).catch(async (err: Error) => {
      const a = await addon(c);
      throw new Error(
        `${err.message}: ${JSON.stringify(cond(a, 'Progressing'))} configReferences ${JSON.stringify(a?.status?.configReferences)}\n${await why(c)}`,
      );
    });
  }

  beforeAll(async () => {
    const releaseDir = execFileSync('bash', [path.join(ROOT, 'scripts/build-release.sh'), previous.commit], {
      cwd: ROOT,
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'inherit'],
      timeout: 600_000,
    })
      .trim()
      .split('\n')
      .at(-1)!;
    oldCli = path.join(releaseDir, 'cli/dist/main.js');
    oldChart = path.join(releaseDir, 'deploy/charts/cluster-proxy');
    pki = await createPki();
    helmHome = await mkdtemp(path.join(os.tmpdir(), 'cp-helm-home-'));
    helmBin = (await ocmPeers()).binaries.helm;
    ocm = await startOcmHub();
    adminKubeconfig = path.join(pki.dir, 'hub-admin.kubeconfig');
    await ocm.kube.writeKubeconfig(adminKubeconfig);
    // The release's chart, as it was installed: nothing runs its hub Deployment (no kubelet on the hub), the hub
    // process stands for its pod.
    const installed = await helm([
      'install',
      'cluster-proxy',
      oldChart,
      '--namespace',
      AGENT_NS,
      '--create-namespace',
      '--set',
      'agentInstall.mode=manifestwork',
    ]);
    expect(installed.code, `${installed.stdout}\n${installed.stderr}`).toBe(0);
    oldImage = await chartAgentImage();
    kubeconfig = path.join(pki.dir, 'hub.kubeconfig');
    await ocm.kube.writeKubeconfig(kubeconfig, HUB_USER, ['system:serviceaccounts', `system:serviceaccounts:${AGENT_NS}`], {
      bindClusterAdmin: false,
    });
    agentPort = await freeLoopbackPort();
    hub = await startOurHub(oldCli, `cluster-proxy-${previous.version.replaceAll('.', '-')}`);
    const runsOurs = (image: string): boolean => !image.startsWith('quay.io/open-cluster-management/');
    for (const c of await Promise.all(
      ['c1', 'c2', 'c3'].map((name) =>
        startOcmManagedCluster(ocm, { name, cli: CLI, cliByImage: { [oldImage]: oldCli }, runsImage: runsOurs }),
      ),
    ))
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

  it(`${previous.version} installs the addon: c1 in OCM's namespace, c2 in the one its AddOnDeploymentConfig names, c3 with its mirror; all Available, each tunnel reaches its cluster's apiserver, the agents run ${previous.version}`, async () => {
    expect(oldImage).toBe(`quay.io/cluster-proxy-ts/cluster-proxy:${previous.version}`);
    const configs = (c: string) => ({
      configs: [{ group: 'addon.open-cluster-management.io', resource: 'addondeploymentconfigs', name: 'proxy', namespace: c }],
    });
    for (const [c, spec] of [
      ['c2', { agentInstallNamespace: OLD_NS }],
      // OCM's rule: the first mirror whose source prefixes the image. The release's image is left as it is.
      // (An AddOnDeploymentConfig's agentInstallNamespace defaults to OCM's shared namespace: named here.)
      [
        'c3',
        {
          agentInstallNamespace: AGENT_NS,
          registries: [{ source: `quay.io/cluster-proxy-ts/cluster-proxy:${NEW_TAG}`, mirror: oldImage }],
        },
      ],
    ] as const) {
      const made = await ocm.kube.request(
        'POST',
        `/apis/addon.open-cluster-management.io/v1alpha1/namespaces/${c}/addondeploymentconfigs`,
        {
          apiVersion: 'addon.open-cluster-management.io/v1alpha1',
          kind: 'AddOnDeploymentConfig',
          metadata: { name: 'proxy', namespace: c },
          spec,
        },
      );
      expect(made.status, made.text).toBe(201);
    }
    await enable('c1');
    await enable('c2', configs('c2'));
    await enable('c3', configs('c3'));
    for (const [c, ns] of [
      ['c1', AGENT_NS],
      ['c2', OLD_NS],
      ['c3', AGENT_NS],
    ] as const) {
      const a = await available(c);
      expect(a.status?.namespace).toBe(ns);
      // The release builds the work before OCM's addon-manager has resolved the addon's configs (this build
      // waits for Configured), so c2's agent may run in the default namespace first and then move: the agent
      // asserted on is the one left running, alone.
      const agent = await waitFor(
        () => {
          const running = clusters.get(c)!.kubelet.agents();
          return running.length === 1 && running[0]!.deployment === `${ns}/${DEPLOYMENT}` ? running[0] : null;
        },
        { timeoutMs: 60_000, message: `the agent of ${c}, alone, in ${ns}` },
      );
      expect([agent.deployment, agent.image, agent.cli]).toEqual([`${ns}/${DEPLOYMENT}`, oldImage, oldCli]);
      expect(await apiserverThroughHub(c)).toBe(clusters.get(c)!.kube.versions.kubernetes);
      const w = await waitFor(async () => ((x) => (appliedAtGeneration(x) ? x : null))(await work(c)), {
        timeoutMs: 30_000,
        intervalMs: 250,
        message: `the work of ${c} applied`,
      });
      // The rollout as the release leaves it: with no config spec hash written (the release wrote none), OCM's
      // addon-manager holds it Progressing, never Completed.
      const progressing = await waitFor(async () => cond(await addon(c), 'Progressing'), {
        timeoutMs: 30_000,
        intervalMs: 250,
        message: `OCM's Progressing on ${c}'s addon`,
      });
      const unhashed = ((await addon(c))?.status?.configReferences ?? []).every((r) => !r.desiredConfig?.specHash);
      if (unhashed) expect([progressing.status, progressing.reason]).toEqual(['True', 'Progressing']);
      before.set(c, { deployment: (await deploymentIn(c, ns))!, work: w, agent });
    }
  }, 180_000);

  it(`in place: helm upgrade to this chart and this build's hub for ${previous.version}'s; OCM's work agent applies the work it rewrites over the release's (the same Deployment, its selector kept), the agent rolls to this build, the tunnel is back, Available, the rollout Completed (the release never wrote config spec hashes)`, async () => {
    const upgraded = await helm([
      'upgrade',
      'cluster-proxy',
      CHART,
      '--namespace',
      AGENT_NS,
      '--set',
      'agentInstall.mode=manifestwork',
      '--set',
      `image.tag=${NEW_TAG}`,
    ]);
    expect(upgraded.code, `${upgraded.stdout}\n${upgraded.stderr}`).toBe(0);
    const newImage = await chartAgentImage();
    expect(newImage).toBe(`quay.io/cluster-proxy-ts/cluster-proxy:${NEW_TAG}`);
    // The chart's Deployment changed: its old pod goes, a new one starts (a new name, so a new replica).
    await hub!.stop();
    hub = null;
    // While no hub runs, c2's AddOnDeploymentConfig names another namespace (the next case).
    const adc = (await get<{ metadata: { resourceVersion: string }; spec: Record<string, unknown> }>(adcPath('c2')))!;
    const moved = await ocm.kube.request('PUT', adcPath('c2'), {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'AddOnDeploymentConfig',
      metadata: { name: 'proxy', namespace: 'c2', resourceVersion: adc.metadata.resourceVersion },
      spec: { ...adc.spec, agentInstallNamespace: NEW_NS },
    });
    expect(moved.status, moved.text).toBe(200);
    upgradedAt = performance.now();
    hub = await startOurHub(CLI, 'cluster-proxy-upgraded');
    // Per cluster, from the new hub's start: the tunnel back (any agent), and back through this build's agent
    // (the release's agent gone).
    for (const c of ['c1', 'c2']) {
      const old = before.get(c)!.agent;
      const timing = (async () => {
        await apiserverThroughHub(c, 90_000);
        const firstMs = performance.now() - upgradedAt;
        await old.proc.exited;
        await waitFor(
          () =>
            clusters
              .get(c)!
              .kubelet.agents()
              .some((a) => a.cli === CLI),
          {
            timeoutMs: 90_000,
            intervalMs: 100,
            message: `this build's agent running in ${c}`,
          },
        );
        await apiserverThroughHub(c, 60_000);
        return { firstMs, newAgentMs: performance.now() - upgradedAt };
      })();
      timing.catch(() => undefined);
      back.set(c, timing);
    }
    c3Back = apiserverThroughHub('c3', 90_000).then(() => performance.now() - upgradedAt);
    c3Back.catch(() => undefined);

    const { deployment, work: oldWork } = before.get('c1')!;
    const w = await waitFor(async () => ((x) => (workImage(x) === newImage && appliedAtGeneration(x) ? x : null))(await work('c1')), {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: "c1's work rewritten with the new image and applied at its generation",
    }).catch(explained('c1'));
    expect(w.metadata.generation).toBeGreaterThan(oldWork.metadata.generation!);
    expect(cond(w, 'Available')?.status).toBe('True');
    // The same Deployment, updated in place: its uid and its (immutable) selector unchanged, the new image.
    const d = await waitFor(
      async () => ((x) => (x?.spec.template.spec.containers[0]?.image === newImage ? x : null))(await deploymentIn('c1', AGENT_NS)),
      {
        timeoutMs: 30_000,
        intervalMs: 250,
        message: "c1's Deployment on the new image",
      },
    );
    expect(d.metadata.uid).toBe(deployment.metadata.uid);
    expect(d.spec.selector).toEqual(deployment.spec.selector);
    const { firstMs, newAgentMs } = await back.get('c1')!;
    const agents = clusters.get('c1')!.kubelet.agents();
    expect(agents.map((a) => [a.deployment, a.image, a.cli])).toEqual([[`${AGENT_NS}/${DEPLOYMENT}`, newImage, CLI]]);
    expect(await apiserverThroughHub('c1')).toBe(clusters.get('c1')!.kube.versions.kubernetes);
    const a = await available('c1');
    expect(a.status?.namespace).toBe(AGENT_NS);
    const done = await completed('c1');
    const mpc = (await get<Record<string, unknown>>(
      '/apis/proxy.open-cluster-management.io/v1alpha1/managedproxyconfigurations/cluster-proxy',
    ))!;
    const ref = done.status?.configReferences?.find((r) => r.resource === 'managedproxyconfigurations');
    expect(ref?.lastAppliedConfig?.specHash).toBe(configSpecHash(mpc));
    console.log(
      `real-ocm-upgrade: c1 (in place): tunnel back ${Math.round(firstMs)} ms after the new hub's start, through this build's agent ${Math.round(newAgentMs)} ms`,
    );
  }, 240_000);

  it(`with a namespace move: c2's agent leaves ${previous.version}'s namespace for the one its AddOnDeploymentConfig names now; OCM's work agent removes the old Deployment and leaves the old namespace, the tunnel is back through this build's agent, Available, the rollout Completed`, async () => {
    const newImage = `quay.io/cluster-proxy-ts/cluster-proxy:${NEW_TAG}`;
    const d = await waitFor(() => deploymentIn('c2', NEW_NS), {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: `c2's Deployment in ${NEW_NS}`,
    }).catch(explained('c2'));
    expect(d.spec.template.spec.containers[0]?.image).toBe(newImage);
    await waitFor(async () => (await deploymentIn('c2', OLD_NS)) === null, {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: `the Deployment in ${OLD_NS} removed`,
    }).catch(explained('c2'));
    const w = await waitFor(async () => ((x) => (appliedAtGeneration(x) ? x : null))(await work('c2')), {
      timeoutMs: 30_000,
      intervalMs: 250,
      message: "c2's work applied at its generation",
    }).catch(explained('c2'));
    expect(w.metadata.generation).toBeGreaterThan(before.get('c2')!.work.metadata.generation!);
    const { firstMs, newAgentMs } = await back.get('c2')!;
    const agents = clusters.get('c2')!.kubelet.agents();
    expect(agents.map((a) => [a.deployment, a.image, a.cli])).toEqual([[`${NEW_NS}/${DEPLOYMENT}`, newImage, CLI]]);
    expect(await apiserverThroughHub('c2')).toBe(clusters.get('c2')!.kube.versions.kubernetes);
    const a = await available('c2');
    expect(a.status?.namespace).toBe(NEW_NS);
    // The work agent's decision on the old namespace is made once its AppliedManifestWork no longer lists it:
    // deleted if the work owned it, left if the work orphaned it.
    await waitFor(
      async () => {
        const r = await clusters
          .get('c2')!
          .kube.request<{ items: { status?: { appliedResources?: { resource: string; name: string }[] } }[] }>(
            'GET',
            '/apis/work.open-cluster-management.io/v1/appliedmanifestworks',
          );
        return (
          r.body.items.length > 0 &&
          r.body.items.every((x) => !(x.status?.appliedResources ?? []).some((ar) => ar.resource === 'namespaces' && ar.name === OLD_NS))
        );
      },
      { timeoutMs: 60_000, intervalMs: 250, message: `${OLD_NS} out of the AppliedManifestWork` },
    ).catch(explained('c2'));
    const ns = await inCluster('c2', `/api/v1/namespaces/${OLD_NS}`);
    expect(ns).not.toBeNull();
    expect(ns?.metadata.deletionTimestamp).toBeUndefined();
    const done = await completed('c2');
    const adc = (await get<Record<string, unknown>>(adcPath('c2')))!;
    const ref = done.status?.configReferences?.find((r) => r.resource === 'addondeploymentconfigs');
    expect(ref?.lastAppliedConfig?.specHash).toBe(configSpecHash(adc));
    console.log(
      `real-ocm-upgrade: c2 (namespace move): tunnel back ${Math.round(firstMs)} ms after the new hub's start, through this build's agent ${Math.round(newAgentMs)} ms`,
    );
  }, 180_000);
  it(`the hub first, the agent later: c3's mirror keeps the release's image; its ${previous.version} agent keeps running (no rollout) and reconnects to this build's hub by itself, Available, the rollout Completed`, async () => {
    const { agent, deployment } = before.get('c3')!;
    const ms = await c3Back!;
    const w = await waitFor(async () => ((x) => (appliedAtGeneration(x) ? x : null))(await work('c3')), {
      timeoutMs: 30_000,
      intervalMs: 250,
      message: "c3's work applied at its generation",
    }).catch(explained('c3'));
    expect(workImage(w)).toBe(oldImage);
    const d = (await deploymentIn('c3', AGENT_NS))!;
    expect([d.metadata.uid, d.spec.template]).toEqual([deployment.metadata.uid, deployment.spec.template]);
    // The same process throughout: the release's agent, its tunnel now to this build's hub.
    const agents = clusters.get('c3')!.kubelet.agents();
    expect(agents).toHaveLength(1);
    expect(agents[0]).toBe(agent);
    expect(agent.cli).toBe(oldCli);
    expect(await apiserverThroughHub('c3')).toBe(clusters.get('c3')!.kube.versions.kubernetes);
    expect((await hub!.tables()).agents.filter((a) => a.cluster === 'c3')).toHaveLength(1);
    await available('c3');
    const done = await completed('c3');
    const adc = (await get<Record<string, unknown>>(adcPath('c3')))!;
    expect(done.status?.configReferences?.find((r) => r.resource === 'addondeploymentconfigs')?.lastAppliedConfig?.specHash).toBe(
      configSpecHash(adc),
    );
    console.log(
      `real-ocm-upgrade: c3 (agent image kept): tunnel back ${Math.round(ms)} ms after the new hub's start (the agent's own reconnect)`,
    );
  }, 120_000);
});
