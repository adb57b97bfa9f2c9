// The Kubernetes store against a local HTTP server speaking the API paths it uses
// (test/src/fixtures/kube-api-server.ts, checked against a real kube-apiserver by kube-differential.test.ts):
// the conformance suite, and watches that resume after their connections are cut.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore, type Kind, type Store, type WatchEvent } from '@cluster-proxy/server';
import { KubernetesStore, LIST_PAGE, THROTTLED_RETRIES } from '@cluster-proxy/server/kubernetes-store';
import {
  snapshotHandles,
  startFakeKubeApiServer,
  startRealKube,
  waitFor,
  waitForHandlesAtMost,
  type FakeKubeApiServer,
  type RealKube,
} from '../src/fixtures/index.js';
import type { FakeKubeApiServerOptions } from '../src/fixtures/kube-api-server.js';
import { ALL_KINDS, sampleObject, storeConformance } from '../src/store-conformance.js';

let handles: Map<string, number>;
let tmp: string;
beforeAll(async () => {
  handles = snapshotHandles();
  tmp = await mkdtemp(join(tmpdir(), 'store-kube-'));
});
afterAll(async () => {
  await rm(tmp, { recursive: true, force: true });
  await waitForHandlesAtMost(handles, 5000);
});

let n = 0;
async function kubeStore(api: FakeKubeApiServer): Promise<KubernetesStore> {
  const kubeconfig = join(tmp, `kubeconfig-${++n}`);
  await api.writeKubeconfig(kubeconfig);
  const store = await openStore({ type: 'kubernetes', kubeconfig, watchBackoffMs: { initial: 20, max: 200 } });
  expect(store).toBeInstanceOf(KubernetesStore);
  return store as KubernetesStore;
}

storeConformance('kubernetes (fake API server)', async (opts) => {
  // The namespaces the suite writes into exist, as on a real cluster (the server refuses others).
  const api = await startFakeKubeApiServer({
    namespaces: ['c1', 'c2', 'c3', 'x'],
    ...(opts?.historySize !== undefined ? { historySize: opts.historySize } : {}),
  });
  const store = await kubeStore(api);
  return {
    store,
    async close() {
      await store.close();
      await api.close();
    },
  };
});

// The same suite on a real kube-apiserver with OCM's CRDs: one control plane for all cases, emptied before each.
describe('on a real kube-apiserver', () => {
  let kube: RealKube;
  let kubeconfig = '';
  beforeAll(async () => {
    kube = await startRealKube({ controllerManager: false });
    await kube.applyOcmCrds();
    for (const ns of ['c1', 'c2', 'c3', 'x']) await kube.store.ensureNamespace(ns);
    kubeconfig = join(tmp, 'real.kubeconfig');
    await kube.writeKubeconfig(kubeconfig);
  }, 45 * 60_000);
  afterAll(async () => {
    await kube?.stop();
  });

  /** Deletes every object of the hub's kinds (finalizers first), so each case starts on an empty store. */
  async function empty(store: Store): Promise<void> {
    for (const kind of ALL_KINDS as Kind[]) {
      for (const o of (await store.list(kind)).items) {
        const key = { name: o.metadata.name, ...(o.metadata.namespace ? { namespace: o.metadata.namespace } : {}) };
        if ((o.metadata.finalizers ?? []).length > 0)
          await store.update(kind, { ...o, metadata: { ...o.metadata, finalizers: [] } } as never).catch(() => undefined);
        await store.delete(kind, key).catch(() => undefined);
      }
      await waitFor(async () => (await store.list(kind)).items.length === 0, {
        timeoutMs: 10_000,
        intervalMs: 50,
        message: `no ${kind} left`,
      });
    }
  }

  storeConformance(
    'kubernetes (real kube-apiserver)',
    async () => {
      await empty(kube.store);
      const store = await openStore({ type: 'kubernetes', kubeconfig, watchBackoffMs: { initial: 20, max: 200 } });
      return { store, close: () => store.close() };
    },
    { smallResumeWindow: 'a real apiserver resumes watches from its own cache, sized by itself' },
  );

  it('lists more than a page (the apiserver pages with limit and continue): every object once', async () => {
    await empty(kube.store);
    const store = await openStore({ type: 'kubernetes', kubeconfig });
    try {
      const names = Array.from({ length: LIST_PAGE + 2 }, (_, i) => `page-${String(i).padStart(4, '0')}`);
      for (const name of names) await store.create('Lease', sampleObject('Lease', name));
      // In its namespace: the apiserver writes Leases of its own in kube-system (its identity) whenever it likes.
      const list = await store.list('Lease', { namespace: 'c1' });
      expect(list.items.map((l) => l.metadata.name).sort()).toEqual(names);
      expect(Number(list.resourceVersion)).toBeGreaterThan(0);
    } finally {
      await store.close();
    }
  });
});

/** A store on a fresh API server and a Lease watch recording its events and errors, for `body` to drive. */
async function watchingLeases(
  opts: FakeKubeApiServerOptions,
  body: (t: { api: FakeKubeApiServer; store: KubernetesStore; events: WatchEvent<'Lease'>[]; errors: Error[] }) => Promise<void>,
): Promise<void> {
  const api = await startFakeKubeApiServer({ namespaces: ['c1'], ...opts });
  const store = await kubeStore(api);
  try {
    const events: WatchEvent<'Lease'>[] = [];
    const errors: Error[] = [];
    const w = store.watch('Lease', {}, { onEvent: (e) => events.push(e), onError: (e) => errors.push(e) });
    await body({ api, store, events, errors });
    expect(errors).toEqual([]);
    w.stop();
    await waitFor(() => api.openWatches() === 0, { timeoutMs: 5000, message: 'watch closed on stop' });
  } finally {
    await store.close();
    await api.close();
  }
}

describe('kubernetes store watches', () => {
  it('resume after every watch connection is cut, with no event lost or repeated', async () => {
    await watchingLeases({}, async ({ api, store, events }) => {
      let lease = await store.create('Lease', sampleObject('Lease', 'l'));
      await waitFor(() => api.openWatches() === 1 && events.length === 1, { timeoutMs: 5000, message: 'watch open, first event' });
      for (let round = 0; round < 5; round++) {
        expect(api.cutWatches()).toBe(1);
        // Writes while the watch is down: delivered after it resumes.
        for (let i = 0; i < 3; i++)
          lease = await store.update('Lease', { ...lease, spec: { ...lease.spec, leaseTransitions: round * 3 + i } });
        await waitFor(() => api.openWatches() === 1, { timeoutMs: 5000, message: `watch reconnected (round ${round})` });
      }
      await store.delete('Lease', { name: 'l', namespace: 'c1' });
      await waitFor(() => events.length >= 17, { timeoutMs: 5000, message: '17 events' });
      expect(events.map((e) => e.type)).toEqual(['ADDED', ...Array<string>(15).fill('MODIFIED'), 'DELETED']);
      expect(events.slice(1, 16).map((e) => e.object.spec.leaseTransitions)).toEqual(Array.from({ length: 15 }, (_, i) => i));
    });
  });

  it('resume after the server ends every watch stream cleanly (as the apiserver does), with no event lost or repeated', async () => {
    await watchingLeases({ watchEndMs: 150, bookmarkMs: 50 }, async ({ store, events }) => {
      let lease = await store.create('Lease', sampleObject('Lease', 'l'));
      for (let i = 0; i < 12; i++) {
        // Spread over several stream lifetimes (150 ms each).
        await new Promise((r) => setTimeout(r, 40));
        lease = await store.update('Lease', { ...lease, spec: { ...lease.spec, leaseTransitions: i } });
      }
      await waitFor(() => events.length >= 13, { timeoutMs: 5000, message: '13 events' });
      expect(events.map((e) => e.type)).toEqual(['ADDED', ...Array<string>(12).fill('MODIFIED')]);
      expect(events.slice(1).map((e) => e.object.spec.leaseTransitions)).toEqual(Array.from({ length: 12 }, (_, i) => i));
    });
  });

  it('a request answered 429 is sent again after its Retry-After (as client-go does), up to THROTTLED_RETRIES times', async () => {
    const api = await startFakeKubeApiServer({ namespaces: ['c1'] });
    const store = await kubeStore(api);
    try {
      api.throttle(3, 0);
      expect((await store.list('Lease')).items).toEqual([]);
      expect(api.throttle(0)).toBe(0);
      api.throttle(THROTTLED_RETRIES + 1, 0);
      await expect(store.create('Lease', sampleObject('Lease', 'l'))).rejects.toMatchObject({ code: 'Unavailable' });
      expect(api.throttle(0)).toBe(0);
      // Retry-After is honoured: one second between the two attempts.
      api.throttle(1, 1);
      const t = performance.now();
      await store.create('Lease', sampleObject('Lease', 'l'));
      expect(performance.now() - t).toBeGreaterThanOrEqual(950);
    } finally {
      await store.close();
      await api.close();
    }
  });

  it("lists in pages of LIST_PAGE (as client-go does), every object once, with the first page's resourceVersion", async () => {
    const api = await startFakeKubeApiServer({ namespaces: ['c1'] });
    const store = await kubeStore(api);
    try {
      const count = 2 * LIST_PAGE + 1;
      for (let i = 0; i < count; i++) await store.create('Lease', sampleObject('Lease', `l-${String(i).padStart(4, '0')}`));
      const before = api.lists().length;
      const rv = (await store.list('Lease', { namespace: 'c1' })).resourceVersion;
      const lastWrite = await store.create('Lease', sampleObject('Lease', 'after'));
      const pages = api.lists().slice(before);
      const list = await store.list('Lease');
      // One request per page, each asking for a page (the old store asked for all at once).
      expect(
        api
          .lists()
          .slice(before + pages.length)
          .map((r) => r.limit),
      ).toEqual([LIST_PAGE, LIST_PAGE, LIST_PAGE]);
      expect(pages).toHaveLength(3);
      const names = list.items.map((l) => l.metadata.name);
      expect(names).toHaveLength(count + 1);
      expect(new Set(names).size).toBe(count + 1);
      expect(Number(list.resourceVersion)).toBeGreaterThan(Number(rv));
      expect(list.resourceVersion).toBe(lastWrite.metadata.resourceVersion);
    } finally {
      await store.close();
      await api.close();
    }
  });

  it('a store whose API server is gone fails ping with UnavailableError', async () => {
    const api = await startFakeKubeApiServer();
    const store = await kubeStore(api);
    await store.ping();
    await api.close();
    await expect(store.ping()).rejects.toMatchObject({ code: 'Unavailable' });
    await store.close();
  });
});
