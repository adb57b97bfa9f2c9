import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import type { HubApi, HubApiHandler, HubApiRequest } from '../fleet/hub-api.js';
import type { ProxyCore } from '../dataplane/proxy-core.js';
import { MemoryStore } from '../store/memory.js';
import { countingStore } from '../store/counting.js';
import { ADDON_NAME, type ManagedCluster } from '../store/objects.js';
import type { Store } from '../store/store.js';
import { HUB_NAMESPACE } from './hub-namespace.js';
import { AddonManager, INSTALLER_RESYNC_MS, LEASE_RENEWAL_BUDGET_PER_SECOND, MANAGER_LEASE, type AddonInstaller } from './manager.js';

const log = pino({ level: 'silent' });

/** The routes the manager registers, callable directly. */
function routes(): { api: HubApi; call: (method: string, path: string, req: Partial<HubApiRequest>) => Promise<unknown> } {
  const handlers = new Map<string, HubApiHandler>();
  const api = {
    route: (method: string, path: string, handler: HubApiHandler) => void handlers.set(`${method} ${path}`, handler),
  } as unknown as HubApi;
  return {
    api,
    call: async (method, path, req) =>
      (
        await handlers.get(`${method} ${path}`)!({
          method,
          path,
          headers: {},
          body: null,
          caller: { authorized: true, agent: null, certificate: null, peer: 'test' },
          ...req,
        })
      ).body,
  };
}

/** A core with `clusters` connected (one backend each). */
const core = (clusters: string[]): ProxyCore =>
  ({
    routes: { size: clusters.length, backends: () => clusters.map((cluster) => ({ cluster })) },
  }) as unknown as ProxyCore;

const cluster = (name: string): ManagedCluster => ({
  apiVersion: 'cluster.open-cluster-management.io/v1',
  kind: 'ManagedCluster',
  metadata: { name },
  spec: { hubAcceptsClient: true },
});
const report = {
  agentID: 'a1',
  leaseDurationSeconds: 60,
  connectedServers: 1,
  serverCount: 1,
  apiserverReachable: true,
  version: '0.1.0',
  phase: 'Running',
};

async function until(cond: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 300; i++) {
    if (await cond()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error('condition not reached in 3 s');
}

/** An installer that counts its passes; `kick` is what the manager gave it to ask for one. */
function stubInstaller(): { installer: AddonInstaller; kick: () => void; syncs: number; behind: boolean } {
  const stub = {
    kick: (): void => {
      throw new Error('the installer was not started');
    },
    syncs: 0,
    behind: false,
    installer: null as unknown as AddonInstaller,
  };
  stub.installer = {
    start: (k) => {
      stub.kick = k;
    },
    stop: () => undefined,
    sync: async () => {
      stub.syncs++;
    },
    behind: () => stub.behind,
    statusOf: () => undefined,
    proxyConfigurationConditions: () => [],
    configReferences: () => async () => null,
  };
  return stub;
}

describe('AddonManager', () => {
  let manager: AddonManager | null = null;
  afterEach(async () => {
    await manager?.stop();
    manager = null;
  });

  it('turns a cluster Available from a lease renewal and its tunnel, reading the store through its watches; answers with the replica list', async () => {
    const store = new MemoryStore();
    await store.create('ManagedCluster', cluster('c1'));
    await store.create('ManagedCluster', cluster('c2'));
    const r = routes();
    const replicas = { serverCount: 1, replicas: [{ serverID: 'hub-0' }], syncIntervalSeconds: 1, reconnectSpreadSeconds: 1 };
    manager = new AddonManager({
      store,
      core: core(['c1']),
      log,
      serverID: 'hub-0',
      tunnelLossWindowMs: 2000,
      replicaList: async () => replicas,
    });
    manager.registerRoutes(r.api, r.api);
    await manager.start();
    // The renewal's write reaches the pass through the lease watch (no explicit pass by the route).
    const answer = await r.call('POST', '/v1/lease', {
      body: report,
      caller: { authorized: true, agent: { cluster: 'c1', agentName: 'proxy-agent' }, certificate: null, peer: 'test' },
    });
    // The answer carries the replica list: the agent needs no request of its own for it.
    expect(answer).toMatchObject({ leaseDurationSeconds: 60, replicas });
    const available = async (c: string): Promise<string | undefined> =>
      (await store.get('ManagedClusterAddOn', { name: ADDON_NAME, namespace: c }))?.status?.conditions?.find((x) => x.type === 'Available')
        ?.status;
    await until(async () => (await available('c1')) === 'True');
    expect(await available('c2')).not.toBe('True');
  });

  it('replicas behind a balancer: a renewal is skipped only when the stored lease already says the same, whichever replica wrote it', async () => {
    const store = new MemoryStore();
    await store.create('ManagedCluster', cluster('c1'));
    const a = routes();
    const b = routes();
    const hubA = new AddonManager({ store, core: core(['c1']), log, serverID: 'hub-a' });
    const hubB = new AddonManager({ store, core: core(['c1']), log, serverID: 'hub-b' });
    hubA.registerRoutes(a.api, a.api);
    hubB.registerRoutes(b.api, b.api);
    await hubA.start();
    await hubB.start();
    try {
      const caller = { authorized: true, agent: { cluster: 'c1', agentName: 'proxy-agent' }, certificate: null, peer: 'test' };
      const stored = async (): Promise<number | undefined> => {
        const lease = await store.get('Lease', { name: ADDON_NAME, namespace: 'c1' });
        const v = Object.entries(lease?.metadata.annotations ?? {}).find(([k]) => k.includes('a1'))?.[1];
        return v ? (JSON.parse(v) as { serverCount: number }).serverCount : undefined;
      };
      const two = { ...report, connectedServers: 2, serverCount: 2 };
      const three = { ...report, connectedServers: 3, serverCount: 3 };
      await b.call('POST', '/v1/lease', { body: two, caller });
      await until(async () => (await stored()) === 2);
      await a.call('POST', '/v1/lease', { body: three, caller });
      await until(async () => (await stored()) === 3);
      // B wrote "two" before; the store says "three" now (A's): B must write, not skip as unchanged.
      await new Promise((r) => setTimeout(r, 50)); // B's mirror sees A's write
      await b.call('POST', '/v1/lease', { body: two, caller });
      await until(async () => (await stored()) === 2);
      // The same again, right after: nothing to write.
      const before = (await store.get('Lease', { name: ADDON_NAME, namespace: 'c1' }))!.metadata.resourceVersion;
      await new Promise((r) => setTimeout(r, 50));
      await a.call('POST', '/v1/lease', { body: two, caller });
      expect((await store.get('Lease', { name: ADDON_NAME, namespace: 'c1' }))!.metadata.resourceVersion).toBe(before);
    } finally {
      await hubA.stop();
      await hubB.stop();
    }
  });

  it('a status pass over thousands of addons lets the event loop turn while it judges them (dials wait behind it)', async () => {
    const store = new MemoryStore();
    const n = 2000;
    for (let i = 0; i < n; i++) await store.create('ManagedCluster', cluster(`c${i}`));
    // Counts addon status writes, and when the pass has its leader lease, notes how many were written by the
    // next turn of the event loop: none if the judging lets the loop turn, all the first batch's if it does not.
    let statusWrites = 0;
    const atTurn: number[] = [];
    const counting = new Proxy(store, {
      get(target, prop, receiver) {
        const v = Reflect.get(target, prop, receiver) as unknown;
        if (typeof v !== 'function') return v;
        return (...args: unknown[]) => {
          if (prop === 'updateStatus' && args[0] === 'ManagedClusterAddOn') statusWrites++;
          const kind = args[0];
          const name = (args[1] as { metadata?: { name?: string } } | undefined)?.metadata?.name;
          if ((prop === 'create' || prop === 'update') && kind === 'Lease' && name === 'cluster-proxy-addon-manager')
            setImmediate(() => atTurn.push(statusWrites));
          return (v as (...a: unknown[]) => unknown).apply(target, args);
        };
      },
    });
    const clusters = Array.from({ length: n }, (_, i) => `c${i}`);
    manager = new AddonManager({ store: counting, core: core(clusters), log, serverID: 'hub-0', tunnelLossWindowMs: 2000 });
    manager.registerRoutes(routes().api, routes().api);
    await manager.start();
    await until(async () => statusWrites >= n);
    expect(atTurn[0]).toBe(0);
  });

  it('asks a big fleet for unchanged renewals less often (tunnel mode), never in lease mode', async () => {
    const store = new MemoryStore();
    const r = routes();
    const clusters = Array.from({ length: 5000 }, (_, i) => `c${i}`);
    manager = new AddonManager({ store, core: core(clusters), log, serverID: 'hub-0' });
    manager.registerRoutes(r.api, r.api);
    expect(manager.fleetSize).toBe(5000);
    expect(manager.renewIntervalSeconds).toBe(5000 / LEASE_RENEWAL_BUDGET_PER_SECOND);
    const lease = new AddonManager({ store, core: core(clusters), log, serverID: 'hub-1', healthMode: 'lease' });
    expect(lease.renewIntervalSeconds).toBe(0);
    const small = new AddonManager({ store, core: core(['c1']), log, serverID: 'hub-2' });
    expect(small.renewIntervalSeconds).toBe(1);
    const huge = new AddonManager({ store, core: core(Array.from({ length: 100_000 }, (_, i) => `c${i}`)), log, serverID: 'hub-3' });
    expect(huge.renewIntervalSeconds).toBe(600);
  });

  /** A manager (status passes every 250 ms) with a stub installer, started, its first installer pass run. */
  async function startWithStub(store: Store): Promise<{ stub: ReturnType<typeof stubInstaller>; clock: { now: number; passes: number } }> {
    const stub = stubInstaller();
    // Each status pass reads the clock once as it begins: `passes` counts them.
    const clock = { now: Date.parse('2026-11-26T00:00:00Z'), passes: 0 };
    manager = new AddonManager({
      store,
      core: core([]),
      log,
      serverID: 'hub-0',
      tunnelLossWindowMs: 1000,
      now: () => (clock.passes++, clock.now),
    });
    manager.setInstaller(stub.installer);
    await manager.start();
    await until(async () => stub.syncs === 1);
    return { stub, clock };
  }

  it("runs the installer's pass when what it watches changed, else every INSTALLER_RESYNC_MS, not every status pass", async () => {
    const store = new MemoryStore();
    const { stub, clock } = await startWithStub(store);
    // Status passes every 250 ms; none of them re-runs the installer while nothing changed (three more
    // begin: passes run one after another, so at least two ran to their end).
    const seen = clock.passes;
    await until(async () => clock.passes >= seen + 3);
    expect(stub.syncs).toBe(1);
    stub.kick();
    await until(async () => stub.syncs === 2);
    clock.now += INSTALLER_RESYNC_MS;
    await until(async () => stub.syncs === 3);
    // A pass that left works unchecked is followed by one at every status pass until none is left.
    stub.behind = true;
    const at = clock.passes;
    await until(async () => stub.syncs >= 6);
    expect(clock.passes - at).toBeLessThanOrEqual(stub.syncs - 3 + 1);
    stub.behind = false;
    const stopped = stub.syncs;
    const then = clock.passes;
    await until(async () => clock.passes >= then + 3);
    expect(stub.syncs).toBeLessThanOrEqual(stopped + 1);
  });
  it("runs no installer pass for a ManagedCluster event (the installer's own mirror asks when what it reads changed), renews the leader lease at most every half period, and reads the ManagedProxyConfiguration from its mirror", async () => {
    const memory = new MemoryStore();
    let mpcGets = 0;
    const store = countingStore(memory, (verb, kind) => {
      if (verb === 'get' && kind === 'ManagedProxyConfiguration') mpcGets++;
    });
    await store.create('ManagedCluster', cluster('c1'));
    const { stub, clock } = await startWithStub(store);
    // Watched after the manager's watch: an event seen here was handed to the manager first.
    const events: string[] = [];
    const watch = store.watch(
      'ManagedCluster',
      { resourceVersion: (await store.list('ManagedCluster')).resourceVersion },
      { onEvent: (e) => events.push(e.object.metadata.resourceVersion!) },
    );
    try {
      const mc = (await store.get('ManagedCluster', { name: 'c1' }))!;
      const at = '2026-11-26T00:00:00Z';
      await store.updateStatus('ManagedCluster', {
        ...mc,
        status: {
          conditions: [
            { type: 'ManagedClusterConditionAvailable', status: 'True', reason: 'Available', message: 'ok', lastTransitionTime: at },
          ],
        },
      });
      await until(async () => events.length === 1);
      // A whole status pass begins and ends after the event.
      const seen = clock.passes;
      await until(async () => clock.passes >= seen + 2);
      expect(stub.syncs).toBe(1);
    } finally {
      watch.stop();
    }

    // Passes the installer asks for, one after another with the clock still: none of them writes the leader lease.
    const leaderLease = async (): Promise<string> =>
      (await store.get('Lease', { name: MANAGER_LEASE, namespace: HUB_NAMESPACE }))!.metadata.resourceVersion!;
    const held = await leaderLease();
    const gets = mpcGets;
    for (let i = 2; i <= 5; i++) {
      stub.kick();
      await until(async () => stub.syncs === i);
    }
    expect(await leaderLease()).toBe(held);
    expect(mpcGets).toBe(gets);
    // Half a period on, the next pass renews it.
    clock.now += manager!.periodMs / 2;
    await until(async () => (await leaderLease()) !== held);
  });
  it("on an OCM hub, leaves Available to OCM while the cluster's klusterlet is gone (ManagedCluster Available Unknown), and takes it back after", async () => {
    const store = new MemoryStore();
    await store.create('ManagedCluster', cluster('c1'));
    await store.ensureNamespace('c1');
    await store.create('ManagedClusterAddOn', {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'ManagedClusterAddOn',
      metadata: { name: ADDON_NAME, namespace: 'c1' },
      spec: {},
    });
    let passes = 0;
    const installer: AddonInstaller = {
      start: () => undefined,
      stop: () => undefined,
      sync: async () => undefined,
      behind: () => false,
      // Asked once per addon in every status pass: the pass counter.
      statusOf: () => {
        passes++;
        return undefined;
      },
      proxyConfigurationConditions: () => [],
      configReferences: () => async () => null,
    };
    manager = new AddonManager({ store, core: core(['c1']), log, serverID: 'hub-0', tunnelLossWindowMs: 1000 });
    manager.setInstaller(installer);
    await manager.start();
    const addon = async () => (await store.get('ManagedClusterAddOn', { name: ADDON_NAME, namespace: 'c1' }))!;
    const available = async (): Promise<string | undefined> =>
      (await addon()).status?.conditions?.find((x) => x.type === 'Available')?.status;
    await until(async () => (await available()) === 'True');
    // The klusterlet stops renewing: OCM's registration hub marks the cluster Unknown, then every addon.
    const setCluster = async (status: 'Unknown' | 'True'): Promise<void> => {
      const mc = (await store.get('ManagedCluster', { name: 'c1' }))!;
      await store.updateStatus('ManagedCluster', {
        ...mc,
        status: {
          conditions: [
            {
              type: 'ManagedClusterConditionAvailable',
              status,
              reason: status === 'Unknown' ? 'ManagedClusterLeaseUpdateStopped' : 'ManagedClusterAvailable',
              message: 'x',
              lastTransitionTime: new Date().toISOString(),
            },
          ],
        },
      });
    };
    await setCluster('Unknown');
    const a = await addon();
    await store.updateStatus('ManagedClusterAddOn', {
      ...a,
      status: {
        ...a.status,
        conditions: (a.status?.conditions ?? []).map((c) =>
          c.type === 'Available' ? { ...c, status: 'Unknown', reason: 'ManagedClusterLeaseUpdateStopped' } : c,
        ),
      },
    });
    const from = passes;
    await until(async () => passes >= from + 4);
    expect(await available()).toBe('Unknown');
    // The klusterlet is back: Available is ours again, from the tunnel.
    await setCluster('True');
    await until(async () => (await available()) === 'True');
  });
});
