// The installer's passes over a store: when it builds, keeps and rewrites an addon's work.
import 'reflect-metadata';
import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { createCA } from '../pki/certificates.js';
import { MemoryStore } from '../store/memory.js';
import { ConflictError } from '../store/store.js';
import { WatchCache } from '../store/watch-cache.js';
import type { AddOnDeploymentConfig, Condition, ManagedClusterAddOn } from '../store/objects.js';
import { CLUSTER_FACT_ANNOTATIONS } from '../addon/join.js';
import type { AddonMirrors } from '../addon/manager.js';
import { OcmInstaller } from './installer.js';
import { AGENT_WORK_NAME } from './names.js';

const ca = createCA({ commonName: 'installer-test-ca' });
const CONFIGURED: Condition = {
  type: 'Configured',
  status: 'True',
  reason: 'ConfigurationsConfigured',
  message: 'Configurations configured',
  lastTransitionTime: '2026-01-01T00:00:00Z',
};
const NOT_CONFIGURED: Condition = {
  ...CONFIGURED,
  status: 'False',
  reason: 'ConfigurationsNotConfigured',
  message: 'Configurations updated and not configured yet',
};

const log = pino({ level: 'silent' });
const installers: OcmInstaller[] = [];
const caches: { stop(): void }[] = [];
afterEach(() => {
  for (const i of installers.splice(0)) i.stop();
  for (const c of caches.splice(0)) c.stop();
});

/** The addon manager's mirrors an installer reads (the addons, listed now; the ManagedProxyConfigurations). */
async function managerMirrors(store: MemoryStore): Promise<AddonMirrors> {
  const addons = new WatchCache({ store, kind: 'ManagedClusterAddOn', log });
  const mpcs = new WatchCache({ store, kind: 'ManagedProxyConfiguration', log });
  caches.push(addons, mpcs);
  await addons.start();
  return { addons, mpcs };
}

/** A pass once the mirrors show what the store holds now of `clusters`' addons and works (they are fed by watches). */
async function syncWhenMirrored(
  store: MemoryStore,
  installer: OcmInstaller,
  addons: WatchCache<'ManagedClusterAddOn'>,
  clusters: readonly string[] = ['c1'],
): Promise<void> {
  const works = (installer as unknown as { mirrors: { works: WatchCache<'ManifestWork'> } }).mirrors.works;
  for (const namespace of clusters) {
    const want = (await store.get('ManagedClusterAddOn', { name: 'cluster-proxy', namespace }))!.metadata.resourceVersion;
    for (let i = 0; i < 200 && addons.get({ name: 'cluster-proxy', namespace })?.metadata.resourceVersion !== want; i++)
      await new Promise((r) => setTimeout(r, 5));
    const work = await store.get('ManifestWork', { name: AGENT_WORK_NAME, namespace });
    for (let i = 0; i < 200 && work && works.get(work.metadata)?.metadata.resourceVersion !== work.metadata.resourceVersion; i++)
      await new Promise((r) => setTimeout(r, 5));
  }
  await installer.sync();
}

/** An installer on `store` as the tests' hub runs it (this CA, entrypoint and namespace). */
function installerOn(store: MemoryStore, opts: { agentImage?: string; firstRendersPerPass?: number } = {}): OcmInstaller {
  return new OcmInstaller({
    store,
    log,
    signer: () => ca,
    caBundle: () => ca.certPem,
    agentEntrypoint: () => 'hub.example:8091',
    agentImage: opts.agentImage ?? 'example/cluster-proxy:1',
    defaultInstallNamespace: 'open-cluster-management-cluster-proxy',
    ...(opts.firstRendersPerPass !== undefined ? { firstRendersPerPass: opts.firstRendersPerPass } : {}),
  });
}

async function setup(kick: () => void = () => {}): Promise<{
  store: MemoryStore;
  installer: OcmInstaller;
  addon: () => Promise<ManagedClusterAddOn>;
  sync: () => Promise<void>;
}> {
  const store = new MemoryStore();
  await store.create('ManagedCluster', {
    apiVersion: 'cluster.open-cluster-management.io/v1',
    kind: 'ManagedCluster',
    metadata: { name: 'c1' },
    spec: { hubAcceptsClient: true },
  });
  await store.ensureNamespace('c1');
  await store.create('ManagedClusterAddOn', {
    apiVersion: 'addon.open-cluster-management.io/v1alpha1',
    kind: 'ManagedClusterAddOn',
    metadata: { name: 'cluster-proxy', namespace: 'c1' },
    spec: {},
  });
  const installer = installerOn(store);
  installers.push(installer);
  const mirrors = await managerMirrors(store);
  const { addons } = mirrors;
  installer.start(kick, mirrors);
  return {
    store,
    installer,
    addon: async () => (await store.get('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: 'c1' }))!,
    sync: () => syncWhenMirrored(store, installer, addons),
  };
}

async function setStatus(store: MemoryStore, addon: ManagedClusterAddOn, status: ManagedClusterAddOn['status']): Promise<void> {
  await store.updateStatus('ManagedClusterAddOn', { ...addon, status: { ...addon.status, ...status } });
}

const work = (store: MemoryStore) => store.get('ManifestWork', { name: AGENT_WORK_NAME, namespace: 'c1' });

/** An AddOnDeploymentConfig that moves c1's agent to namespace `elsewhere`, and the reference OCM resolves to it. */
async function movingInstallNamespace(store: MemoryStore): Promise<NonNullable<ManagedClusterAddOn['status']>['configReferences']> {
  const adc: AddOnDeploymentConfig = {
    apiVersion: 'addon.open-cluster-management.io/v1alpha1',
    kind: 'AddOnDeploymentConfig',
    metadata: { name: 'moved', namespace: 'c1' },
    spec: { agentInstallNamespace: 'elsewhere' },
  };
  await store.create('AddOnDeploymentConfig', adc);
  return [
    {
      group: 'addon.open-cluster-management.io',
      resource: 'addondeploymentconfigs',
      name: 'moved',
      namespace: 'c1',
      desiredConfig: { name: 'moved', namespace: 'c1', specHash: 'x' },
    },
  ];
}

describe("the installer and OCM's Configured condition (addon-framework config check)", () => {
  it("builds no work until OCM's addon-manager has resolved the configs; then builds it", async () => {
    const { store, installer, addon, sync } = await setup();
    await sync();
    expect(await work(store)).toBeNull();
    expect(installer.statusOf('c1')?.conditions.map((c) => c.type)).toEqual(['RegistrationApplied']);
    // Registration does not wait: the namespace the agent will get, so the klusterlet asks for its certificate once.
    expect(installer.statusOf('c1')?.namespace).toBe('open-cluster-management-cluster-proxy');
    await setStatus(store, await addon(), { conditions: [NOT_CONFIGURED] });
    await sync();
    expect(await work(store)).toBeNull();
    await setStatus(store, await addon(), { conditions: [CONFIGURED] });
    await sync();
    expect(await work(store)).not.toBeNull();
  });

  it("an addon outside the rollout's batch keeps the work it has, whatever its configs say now", async () => {
    const { store, addon, sync } = await setup();
    await setStatus(store, await addon(), { conditions: [CONFIGURED] });
    await sync();
    const before = (await work(store))!;
    // A new AddOnDeploymentConfig resolved for the addon, but OCM has not put it in a batch yet (Configured False).
    const ref = await movingInstallNamespace(store);
    await setStatus(store, await addon(), { conditions: [NOT_CONFIGURED], configReferences: ref });
    await sync();
    const kept = (await work(store))!;
    expect(kept.metadata.resourceVersion).toBe(before.metadata.resourceVersion);
    // Its turn comes: the work moves to the new namespace.
    await setStatus(store, await addon(), { conditions: [CONFIGURED] });
    await sync();
    const moved = (await work(store))!;
    expect(moved.metadata.resourceVersion).not.toBe(before.metadata.resourceVersion);
    expect(JSON.stringify(moved.spec)).toContain('"namespace":"elsewhere"');
  });
});

describe('the installer between passes', () => {
  const nsNames = (w: { spec: { workload: { manifests: Record<string, unknown>[] } } }): string[] =>
    w.spec.workload.manifests.filter((m) => m['kind'] === 'Namespace').map((m) => (m['metadata'] as { name: string }).name);
  /** What OCM's work agent writes once it applied the work's generation. */
  const applied = async (store: MemoryStore): Promise<void> => {
    const w = (await work(store))!;
    const at = '2026-01-01T00:00:00Z';
    const c = { status: 'True', reason: 'AppliedManifestWorkComplete', message: 'applied', lastTransitionTime: at };
    await store.updateStatus('ManifestWork', {
      ...w,
      status: { conditions: [{ type: 'Applied', observedGeneration: w.metadata.generation, ...c }] },
    });
  };

  it('writes nothing over a work that is as rendered; lets a moved-from namespace go once the work agent applied the move', async () => {
    const { store, installer, addon, sync } = await setup();
    await setStatus(store, await addon(), { conditions: [CONFIGURED] });
    await sync();
    const first = (await work(store))!;
    expect(nsNames(first)).toEqual(['open-cluster-management-cluster-proxy']);
    await applied(store);
    await sync();
    await sync();
    const unchanged = (await work(store))!;
    expect(unchanged.metadata.generation).toBe(first.metadata.generation);

    // A work an earlier release wrote (no orphaning rule for its namespace), applied; then the install namespace
    // moves (an AddOnDeploymentConfig OCM resolved and configured).
    const legacy = (await work(store))!;
    delete legacy.spec.deleteOption;
    await store.update('ManifestWork', legacy);
    await applied(store);
    const ref = await movingInstallNamespace(store);
    await setStatus(store, await addon(), { conditions: [CONFIGURED], configReferences: ref });
    await sync();
    // The old namespace is kept (orphaned) until the work agent applied that; passes before then keep it, and each
    // asks for the next status pass (the work agent's status write may be the only event to come).
    expect(nsNames((await work(store))!)).toEqual(['open-cluster-management-cluster-proxy', 'elsewhere']);
    expect(installer.behind()).toBe(true);
    await sync();
    expect(nsNames((await work(store))!)).toEqual(['open-cluster-management-cluster-proxy', 'elsewhere']);
    await applied(store);
    await sync();
    expect(nsNames((await work(store))!)).toEqual(['elsewhere']);
    expect(installer.behind()).toBe(false);
  });

  it('lets a moved-from namespace go once the store says the work agent applied the move, whatever its mirror says', async () => {
    const { store, installer, addon, sync } = await setup();
    await setStatus(store, await addon(), { conditions: [CONFIGURED] });
    await sync();
    const legacy = (await work(store))!;
    delete legacy.spec.deleteOption;
    await store.update('ManifestWork', legacy);
    await applied(store);
    await setStatus(store, await addon(), { conditions: [CONFIGURED], configReferences: await movingInstallNamespace(store) });
    await sync();
    expect(nsNames((await work(store))!)).toEqual(['open-cluster-management-cluster-proxy', 'elsewhere']);
    // The works' mirror stops following the store (a watch that lags): the work agent's status write is not in it.
    (installer as unknown as { mirrors: { works: WatchCache<'ManifestWork'> } }).mirrors.works.stop();
    await applied(store);
    await installer.sync();
    expect(nsNames((await work(store))!)).toEqual(['elsewhere']);
  });
});

describe('the installer after a failed write', () => {
  for (const [what, refusal] of [
    ['a conflict', new ConflictError('injected: written meanwhile')],
    ['an error', new Error('injected: the store refused the write')],
  ] as const)
    it(`asks for the next status pass when a cluster's work could not be written (${what}), and writes it then`, async () => {
      const { store, installer, addon, sync } = await setup();
      await setStatus(store, await addon(), { conditions: [CONFIGURED] });
      const create = store.create.bind(store);
      let refuse = 1;
      store.create = ((...args: Parameters<typeof create>) =>
        args[0] === 'ManifestWork' && refuse-- > 0 ? Promise.reject(refusal) : create(...args)) as typeof store.create;
      await sync();
      expect(await work(store)).toBeNull();
      expect(installer.behind()).toBe(true);
      await sync();
      expect(await work(store)).not.toBeNull();
      expect(installer.behind()).toBe(false);
    });
});

describe('what asks the installer for a pass', () => {
  it("a change to what it reads of a ManagedCluster does; OCM's status writes and other annotations do not", async () => {
    let kicks = 0;
    const { store, installer, addon, sync } = await setup(() => kicks++);
    await setStatus(store, await addon(), { conditions: [CONFIGURED] });
    await sync();
    const mirror = (installer as unknown as { mirrors: { clusters: WatchCache<'ManagedCluster'> } }).mirrors.clusters;
    const mirrored = async (): Promise<void> => {
      const want = (await store.get('ManagedCluster', { name: 'c1' }))!.metadata.resourceVersion;
      for (let i = 0; i < 200 && mirror.get({ name: 'c1' })?.metadata.resourceVersion !== want; i++)
        await new Promise((r) => setTimeout(r, 5));
      expect(mirror.get({ name: 'c1' })?.metadata.resourceVersion).toBe(want);
    };
    await mirrored();
    const before = kicks;
    // What OCM's registration controllers write again and again: conditions, and an annotation the pass does not read.
    for (let i = 0; i < 3; i++) {
      const mc = (await store.get('ManagedCluster', { name: 'c1' }))!;
      const at = new Date(Date.UTC(2026, 0, 1, 0, i)).toISOString().replace('.000', '');
      await store.updateStatus('ManagedCluster', {
        ...mc,
        status: {
          conditions: [
            {
              type: 'ManagedClusterConditionAvailable',
              status: 'True',
              reason: 'ManagedClusterAvailable',
              message: 'ok',
              lastTransitionTime: at,
            },
          ],
        },
      });
    }
    const mc = (await store.get('ManagedCluster', { name: 'c1' }))!;
    await store.update('ManagedCluster', { ...mc, metadata: { ...mc.metadata, annotations: { 'example.com/owner': 'team-a' } } });
    await mirrored();
    expect(kicks).toBe(before);
    // A fact `join` records (rendered into the agent's work) asks for one.
    const again = (await store.get('ManagedCluster', { name: 'c1' }))!;
    const annotations = { ...again.metadata.annotations, [CLUSTER_FACT_ANNOTATIONS.clusterDomain]: 'corp.example' };
    await store.update('ManagedCluster', { ...again, metadata: { ...again.metadata, annotations } });
    await mirrored();
    expect(kicks).toBe(before + 1);
    await sync();
    expect(JSON.stringify((await work(store))!.spec)).toContain('corp.example');
  });
});

describe('the installer after a restart', () => {
  it('checks FIRST_RENDERS_PER_PASS existing works per pass against a render, reports the rest as stored, and checks them in the passes after', async () => {
    const store = new MemoryStore();
    const clusters = ['c1', 'c2', 'c3', 'c4', 'c5'];
    for (const name of clusters) {
      await store.create('ManagedCluster', {
        apiVersion: 'cluster.open-cluster-management.io/v1',
        kind: 'ManagedCluster',
        metadata: { name },
        spec: { hubAcceptsClient: true },
      });
      await store.ensureNamespace(name);
      const addon = await store.create('ManagedClusterAddOn', {
        apiVersion: 'addon.open-cluster-management.io/v1alpha1',
        kind: 'ManagedClusterAddOn',
        metadata: { name: 'cluster-proxy', namespace: name },
        spec: {},
      });
      await setStatus(store, addon, { conditions: [CONFIGURED] });
    }
    const mirrors = await managerMirrors(store);
    const { addons } = mirrors;
    const hub = (image: string): OcmInstaller => {
      const installer = installerOn(store, { agentImage: image, firstRendersPerPass: 2 });
      installers.push(installer);
      installer.start(() => {}, mirrors);
      return installer;
    };
    const images = async (): Promise<string[]> => {
      const out: string[] = [];
      for (const c of clusters) {
        const w = await store.get('ManifestWork', { name: AGENT_WORK_NAME, namespace: c });
        out.push(/"image":"([^"]+)"/.exec(JSON.stringify(w?.spec ?? {}))?.[1] ?? 'none');
      }
      return out;
    };
    const pass = (installer: OcmInstaller): Promise<void> => syncWhenMirrored(store, installer, addons, clusters);

    // New works are never held back: one pass installs all five.
    const first = hub('example/cluster-proxy:1');
    await pass(first);
    expect(await images()).toEqual(Array(5).fill('example/cluster-proxy:1'));
    expect(first.behind()).toBe(false);
    first.stop();

    // A restarted hub with a new agent image: two works checked (and rewritten) per pass, every addon's status
    // reported from its stored work meanwhile.
    const restarted = hub('example/cluster-proxy:2');
    await pass(restarted);
    expect((await images()).filter((i) => i.endsWith(':2'))).toHaveLength(2);
    expect(restarted.behind()).toBe(true);
    for (const c of clusters) expect(restarted.statusOf(c)?.namespace).toBe('open-cluster-management-cluster-proxy');
    await pass(restarted);
    expect((await images()).filter((i) => i.endsWith(':2'))).toHaveLength(4);
    expect(restarted.behind()).toBe(true);
    await pass(restarted);
    expect(await images()).toEqual(Array(5).fill('example/cluster-proxy:2'));
    expect(restarted.behind()).toBe(false);
    // Nothing is written in the passes after: every work is as rendered.
    const versions = async (): Promise<string[]> =>
      Promise.all(
        clusters.map(async (c) => (await store.get('ManifestWork', { name: AGENT_WORK_NAME, namespace: c }))!.metadata.resourceVersion!),
      );
    const before = await versions();
    await pass(restarted);
    expect(await versions()).toEqual(before);
    expect(restarted.behind()).toBe(false);
  });
});
