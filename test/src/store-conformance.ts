// One conformance suite for every Store implementation (contract §6): registers vitest blocks for a
// factory. Run from test/e2e/store-embedded.test.ts and test/e2e/store-kubernetes.test.ts.
import { afterEach, describe, expect, it } from 'vitest';
import {
  AlreadyExistsError,
  ConflictError,
  GoneError,
  InvalidError,
  KINDS_WITHOUT_GENERATION,
  NotFoundError,
  StoreError,
  createCA,
  type Kind,
  type ObjectOfKind,
  type Store,
  type Watch,
  type WatchEvent,
} from '@cluster-proxy/server';
import { waitFor } from './fixtures/poll.js';

export interface StoreUnderTest {
  store: Store;
  /** Releases the store and whatever backs it (directories, servers). */
  close(): Promise<void>;
}

export interface StoreFactoryOptions {
  /** Watch resume window, small for the GoneError test. */
  historySize?: number;
}

export type StoreFactory = (opts?: StoreFactoryOptions) => Promise<StoreUnderTest>;

/** What a backend cannot be made to do, each with the reason the case is skipped. */
export interface ConformanceLimits {
  /** The watch resume window cannot be made small (a real apiserver's follows its own cache and etcd's compaction). */
  smallResumeWindow?: string;
}

/** A real PKCS#10 request (its key thrown away), for CSR objects in tests. */
export const SAMPLE_CSR = `-----BEGIN CERTIFICATE REQUEST-----
MIHXMH8CAQAwHTEbMBkGA1UEAwwSY29uZm9ybWFuY2Utc2FtcGxlMFkwEwYHKoZI
zj0CAQYIKoZIzj0DAQcDQgAEQHQID4D/7bgFuRweIKkN8cswOHUi+iVwxKhksaV9
4EblKiRlq+5FbZinHxFWaf5EBiGfFzFznHlmx/mc+gWdVKAAMAoGCCqGSM49BAMC
A0gAMEUCIQDkxaSiyqi02T9hm6LQUJ6uNZkQNohXdAK5SuhnYnyLfAIgfsgVwNUA
aS06oqsuzEcr/8wjgzS3U0HnDkyehzdmajs=
-----END CERTIFICATE REQUEST-----
`;

/** A valid object of each kind (name/namespace given). */
export function sampleObject<K extends Kind>(kind: K, name: string, namespace = 'c1'): ObjectOfKind<K> {
  const ns = { name, namespace };
  const objects: { [P in Kind]: ObjectOfKind<P> } = {
    ManagedCluster: {
      apiVersion: 'cluster.open-cluster-management.io/v1',
      kind: 'ManagedCluster',
      metadata: { name },
      spec: { hubAcceptsClient: true, leaseDurationSeconds: 60 },
    },
    ManagedClusterAddOn: {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'ManagedClusterAddOn',
      metadata: ns,
      spec: { installNamespace: 'open-cluster-management-agent-addon' },
    },
    // Valid against OCM's CRD: both images and authentication are required.
    ManagedProxyConfiguration: {
      apiVersion: 'proxy.open-cluster-management.io/v1alpha1',
      kind: 'ManagedProxyConfiguration',
      metadata: { name },
      spec: {
        authentication: { signer: { type: 'SelfSigned' } },
        proxyServer: { image: 'example.com/cp:1', replicas: 1 },
        proxyAgent: { image: 'example.com/cp:1', replicas: 1 },
      },
    },
    AddOnDeploymentConfig: {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'AddOnDeploymentConfig',
      metadata: ns,
      spec: { proxyConfig: { httpProxy: 'http://proxy:3128', noProxy: 'localhost' } },
    },
    Lease: {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: ns,
      spec: { holderIdentity: 'agent-1', leaseDurationSeconds: 60, renewTime: '2025-01-02T03:04:05.123456Z' },
    },
    Secret: {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: ns,
      type: 'Opaque',
      data: { token: Buffer.from('not-a-real-token').toString('base64') },
    },
    ClusterManagementAddOn: {
      apiVersion: 'addon.open-cluster-management.io/v1alpha1',
      kind: 'ClusterManagementAddOn',
      metadata: { name },
      spec: { installStrategy: { type: 'Manual' } },
    },
    ManifestWork: {
      apiVersion: 'work.open-cluster-management.io/v1',
      kind: 'ManifestWork',
      metadata: ns,
      spec: { workload: { manifests: [{ apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'x' } }] } },
    },
    Placement: {
      apiVersion: 'cluster.open-cluster-management.io/v1beta1',
      kind: 'Placement',
      metadata: ns,
      spec: { clusterSets: ['global'] },
    },
    PlacementDecision: {
      apiVersion: 'cluster.open-cluster-management.io/v1beta1',
      kind: 'PlacementDecision',
      metadata: { ...ns, labels: { 'cluster.open-cluster-management.io/placement': 'p' } },
    },
    // A real PKCS#10 request (its key was thrown away): the API server refuses anything else.
    CertificateSigningRequest: {
      apiVersion: 'certificates.k8s.io/v1',
      kind: 'CertificateSigningRequest',
      metadata: { name },
      spec: { request: Buffer.from(SAMPLE_CSR).toString('base64'), signerName: 'example.com/signer', usages: ['client auth'] },
    },
    ClusterProfile: {
      apiVersion: 'multicluster.x-k8s.io/v1alpha1',
      kind: 'ClusterProfile',
      metadata: ns,
      spec: { clusterManager: { name: 'open-cluster-management' } },
    },
  };
  return structuredClone(objects[kind]) as ObjectOfKind<K>;
}

/** Changes the kind-specific body so an update is visible. */
function mutateBody<K extends Kind>(obj: ObjectOfKind<K>, n: number): ObjectOfKind<K> {
  const o = structuredClone(obj) as ObjectOfKind<Kind>;
  switch (o.kind) {
    case 'ManagedCluster':
      o.spec.leaseDurationSeconds = n;
      break;
    case 'ManagedClusterAddOn':
      o.spec.installNamespace = `ns-${n}`;
      break;
    case 'ManagedProxyConfiguration':
      o.spec.proxyServer.replicas = n;
      break;
    case 'AddOnDeploymentConfig':
      o.spec.agentInstallNamespace = `ns-${n}`;
      break;
    case 'Lease':
      o.spec.leaseTransitions = n;
      break;
    case 'Secret':
      o.data = { n: Buffer.from(String(n)).toString('base64') };
      break;
    case 'ClusterManagementAddOn':
      o.spec.addOnMeta = { displayName: `n-${n}` };
      break;
    case 'ManifestWork':
      o.spec.workload.manifests = [{ apiVersion: 'v1', kind: 'Namespace', metadata: { name: `ns-${n}` } }];
      break;
    case 'Placement':
      o.spec = { numberOfClusters: n };
      break;
    // A CSR's spec is immutable: only its metadata can change (and that does not bump the generation).
    case 'CertificateSigningRequest':
      o.metadata.labels = { n: String(n) };
      break;
    case 'ClusterProfile':
      o.spec.displayName = `n-${n}`;
      break;
  }
  return o as ObjectOfKind<K>;
}

const ALL_KINDS: Kind[] = [
  'ManagedCluster',
  'ManagedClusterAddOn',
  'ManagedProxyConfiguration',
  'AddOnDeploymentConfig',
  'Lease',
  'Secret',
  'ClusterManagementAddOn',
  'ManifestWork',
  'Placement',
  'CertificateSigningRequest',
  'ClusterProfile',
];
// PlacementDecision is left out: it has no spec (status only), so an update never bumps its generation.

async function rejects(p: Promise<unknown>, cls: new (...a: never[]) => StoreError): Promise<StoreError> {
  try {
    await p;
  } catch (err) {
    expect(err).toBeInstanceOf(cls);
    expect(err).toBeInstanceOf(StoreError);
    expect((err as Error).message).not.toContain('\n');
    return err as StoreError;
  }
  throw new Error(`expected a ${cls.name}, the call succeeded`);
}

/** Collects a watch's events and errors. */
function collect<K extends Kind>(
  store: Store,
  kind: K,
  opts: Parameters<Store['watch']>[1],
): { events: WatchEvent<K>[]; errors: Error[]; watch: Watch } {
  const events: WatchEvent<K>[] = [];
  const errors: Error[] = [];
  const watch = store.watch(kind, opts, { onEvent: (e) => events.push(e), onError: (e) => errors.push(e) });
  return { events, errors, watch };
}

export { ALL_KINDS };

export function storeConformance(name: string, factory: StoreFactory, limits: ConformanceLimits = {}): void {
  describe(`store conformance: ${name}`, () => {
    const open: StoreUnderTest[] = [];
    const watches: Watch[] = [];
    async function make(opts?: StoreFactoryOptions): Promise<Store> {
      const s = await factory(opts);
      open.push(s);
      return s.store;
    }
    afterEach(async () => {
      for (const w of watches.splice(0)) w.stop();
      for (const s of open.splice(0)) await s.close();
    });
    function track<T extends { watch: Watch }>(c: T): T {
      watches.push(c.watch);
      return c;
    }

    it.each(ALL_KINDS)('CRUD: %s', async (kind) => {
      const store = await make();
      const created = await store.create(kind, sampleObject(kind, 'obj-1'));
      expect(created.kind).toBe(kind);
      expect(created.metadata.uid).toMatch(/^[0-9a-f-]{36}$/);
      expect(created.metadata.creationTimestamp).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
      expect(created.metadata.resourceVersion).toMatch(/^\d+$/);
      const key = { name: 'obj-1', ...(created.metadata.namespace ? { namespace: created.metadata.namespace } : {}) };
      expect(await store.get(kind, key)).toEqual(created);
      const updated = await store.update(kind, mutateBody(created, 7));
      // Kubernetes keeps no generation for Lease, Secret and CSR (and a CSR's spec cannot change anyway).
      const generation = KINDS_WITHOUT_GENERATION.has(kind) ? undefined : 2;
      const mutated = mutateBody(created, 7);
      expect(updated).toEqual({
        ...mutated,
        metadata: { ...mutated.metadata, resourceVersion: updated.metadata.resourceVersion, generation },
      });
      let latest: ObjectOfKind<Kind> = updated;
      if (kind === 'CertificateSigningRequest') {
        // A CSR's spec cannot change: the apiserver keeps the old one and takes the rest of the update.
        const csr = updated as ObjectOfKind<'CertificateSigningRequest'>;
        latest = await store.update('CertificateSigningRequest', { ...csr, spec: { ...csr.spec, usages: ['server auth'] } });
        expect((latest as ObjectOfKind<'CertificateSigningRequest'>).spec).toEqual(csr.spec);
      }
      expect(Number(updated.metadata.resourceVersion)).toBeGreaterThan(Number(created.metadata.resourceVersion));
      const list = await store.list(kind);
      expect(list.items).toEqual([latest]);
      expect(Number(list.resourceVersion)).toBeGreaterThanOrEqual(Number(updated.metadata.resourceVersion));
      await store.delete(kind, key);
      expect(await store.get(kind, key)).toBeNull();
      expect((await store.list(kind)).items).toEqual([]);
    });

    it('keeps Lease MicroTime and Secret data exactly', async () => {
      const store = await make();
      const lease = await store.create('Lease', sampleObject('Lease', 'l'));
      expect(lease.spec.renewTime).toBe('2025-01-02T03:04:05.123456Z');
      const secret = await store.create('Secret', sampleObject('Secret', 's'));
      expect(secret.type).toBe('Opaque');
      expect(Buffer.from(secret.data?.token ?? '', 'base64').toString()).toBe('not-a-real-token');
    });

    it('cluster-scoped vs namespaced: namespaces required, refused, and filtered; names validated', async () => {
      const store = await make();
      await rejects(
        store.create('ManagedCluster', { ...sampleObject('ManagedCluster', 'c1'), metadata: { name: 'c1', namespace: 'x' } }),
        InvalidError,
      );
      await rejects(
        store.create('ManagedClusterAddOn', {
          ...sampleObject('ManagedClusterAddOn', 'cluster-proxy'),
          metadata: { name: 'cluster-proxy' },
        }),
        InvalidError,
      );
      await rejects(store.create('ManagedCluster', sampleObject('ManagedCluster', 'Bad_Name')), InvalidError);
      await rejects(store.create('Lease', sampleObject('Lease', 'ok', 'Bad.NS')), InvalidError);
      await rejects(store.get('Lease', { name: 'cluster-proxy' }), InvalidError);
      await store.create('ManagedClusterAddOn', sampleObject('ManagedClusterAddOn', 'cluster-proxy', 'c1'));
      await store.create('ManagedClusterAddOn', sampleObject('ManagedClusterAddOn', 'cluster-proxy', 'c2'));
      await store.create('ManagedCluster', sampleObject('ManagedCluster', 'c1'));
      expect((await store.list('ManagedClusterAddOn')).items.map((o) => o.metadata.namespace)).toEqual(['c1', 'c2']);
      expect((await store.list('ManagedClusterAddOn', { namespace: 'c2' })).items.map((o) => o.metadata.namespace)).toEqual(['c2']);
      expect((await store.get('ManagedCluster', { name: 'c1' }))?.metadata.namespace).toBeUndefined();
      // Same name in two namespaces are two objects.
      expect(await store.get('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: 'c3' })).toBeNull();
    });

    it('errors: AlreadyExists, NotFound, stale resourceVersion is a Conflict (update, status, delete)', async () => {
      const store = await make();
      const c = await store.create('ManagedCluster', sampleObject('ManagedCluster', 'c1'));
      await rejects(store.create('ManagedCluster', sampleObject('ManagedCluster', 'c1')), AlreadyExistsError);
      await rejects(store.update('ManagedCluster', sampleObject('ManagedCluster', 'missing')), NotFoundError);
      await rejects(store.delete('ManagedCluster', { name: 'missing' }), NotFoundError);
      const c2 = await store.update('ManagedCluster', mutateBody(c, 1));
      const conflict = await rejects(store.update('ManagedCluster', mutateBody(c, 2)), ConflictError);
      expect(conflict.code).toBe('Conflict');
      await rejects(store.updateStatus('ManagedCluster', { ...c, status: { conditions: [] } }), ConflictError);
      await rejects(store.delete('ManagedCluster', { name: 'c1' }, { resourceVersion: c.metadata.resourceVersion ?? '' }), ConflictError);
      // Without a resourceVersion, the last write wins (as Kubernetes' update does).
      const { resourceVersion: _rv, ...meta } = c.metadata;
      const c3 = await store.update('ManagedCluster', { ...mutateBody(c, 3), metadata: meta });
      expect(c3.spec.leaseDurationSeconds).toBe(3);
      expect(Number(c3.metadata.resourceVersion)).toBeGreaterThan(Number(c2.metadata.resourceVersion));
      await store.delete('ManagedCluster', { name: 'c1' }, { resourceVersion: c3.metadata.resourceVersion ?? '' });
      expect(await store.get('ManagedCluster', { name: 'c1' })).toBeNull();
    });

    it('20 concurrent read-modify-write loops with retries apply every increment exactly once', async () => {
      const store = await make();
      await store.create('Lease', { ...sampleObject('Lease', 'counter'), spec: { leaseTransitions: 0 } });
      const written: number[] = [];
      let conflicts = 0;
      const loop = async (): Promise<void> => {
        for (let i = 0; i < 5; i++) {
          for (;;) {
            const cur = await store.get('Lease', { name: 'counter', namespace: 'c1' });
            if (!cur) throw new Error('counter vanished');
            const next = (cur.spec.leaseTransitions ?? 0) + 1;
            try {
              await store.update('Lease', { ...cur, spec: { ...cur.spec, leaseTransitions: next } });
              written.push(next);
              break;
            } catch (err) {
              if (!(err instanceof ConflictError)) throw err;
              conflicts++;
            }
          }
        }
      };
      await Promise.all(Array.from({ length: 20 }, loop));
      const final = await store.get('Lease', { name: 'counter', namespace: 'c1' });
      expect(final?.spec.leaseTransitions).toBe(100);
      expect([...written].sort((a, b) => a - b)).toEqual(Array.from({ length: 100 }, (_, i) => i + 1));
      expect(conflicts).toBeGreaterThan(0);
    });

    it('status is separate: create and update keep it out, updateStatus writes only it', async () => {
      const store = await make();
      const c = await store.create('ManagedCluster', {
        ...sampleObject('ManagedCluster', 'c1'),
        status: { version: { kubernetes: 'ignored' } },
      });
      expect(c.status).toBeUndefined();
      const cond = {
        type: 'ManagedClusterConditionAvailable',
        status: 'True' as const,
        reason: 'Ok',
        message: 'up',
        lastTransitionTime: '2025-01-01T00:00:00Z',
      };
      const s1 = await store.updateStatus('ManagedCluster', {
        ...c,
        spec: { hubAcceptsClient: false },
        metadata: { ...c.metadata, labels: { x: 'y' } },
        status: { conditions: [cond] },
      });
      expect(s1.status?.conditions).toEqual([cond]);
      expect(s1.spec.hubAcceptsClient).toBe(true);
      expect(s1.metadata.labels).toBeUndefined();
      const u = await store.update('ManagedCluster', { ...s1, spec: { hubAcceptsClient: false }, status: { conditions: [] } });
      expect(u.spec.hubAcceptsClient).toBe(false);
      expect(u.status?.conditions).toEqual([cond]);
      await rejects(store.updateStatus('Lease', sampleObject('Lease', 'l')), InvalidError);
    });

    it('CSR: approval writes only Approved/Denied; status writes the certificate and cannot touch approval', async () => {
      const store = await make();
      const csr = await store.create('CertificateSigningRequest', sampleObject('CertificateSigningRequest', 'csr-1'));
      const approved = {
        type: 'Approved' as const,
        status: 'True' as const,
        reason: 'AutoApproved',
        message: 'ok',
        lastUpdateTime: '2025-01-01T00:00:00Z',
      };
      const a = await store.updateStatus(
        'CertificateSigningRequest',
        { ...csr, status: { conditions: [approved], certificate: Buffer.from('ignored').toString('base64') } },
        { subresource: 'approval' },
      );
      // The apiserver stamps a condition's lastTransitionTime when the writer leaves it out.
      expect(a.status).toEqual({
        conditions: [
          {
            ...approved,
            ...(a.status?.conditions?.[0]?.lastTransitionTime !== undefined
              ? { lastTransitionTime: expect.stringMatching(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/) }
              : {}),
          },
        ],
      });
      const stored = a.status!.conditions![0]!;
      // The apiserver takes only PEM CERTIFICATE blocks.
      const cert = Buffer.from(createCA({ commonName: 'conformance' }).certPem).toString('base64');
      const denied = { type: 'Denied' as const, status: 'True' as const, reason: 'X', message: 'x' };
      // /status cannot add or remove an approval condition.
      await rejects(
        store.updateStatus('CertificateSigningRequest', { ...a, status: { conditions: [denied], certificate: cert } }),
        InvalidError,
      );
      await rejects(store.updateStatus('CertificateSigningRequest', { ...a, status: { conditions: [], certificate: cert } }), InvalidError);
      const s = await store.updateStatus('CertificateSigningRequest', { ...a, status: { ...a.status, certificate: cert } });
      expect(s.status).toEqual({ conditions: [stored], certificate: cert });
      await rejects(
        store.updateStatus('CertificateSigningRequest', { ...s, status: { conditions: [] } }, { subresource: 'approval' }),
        InvalidError,
      );
      await rejects(store.updateStatus('ManagedCluster', sampleObject('ManagedCluster', 'c1'), { subresource: 'approval' }), InvalidError);
      expect((await store.get('CertificateSigningRequest', { name: 'csr-1' }))?.status).toEqual({
        conditions: [stored],
        certificate: cert,
      });
    });

    it('list, then a watch from its resourceVersion sees every later change in order', async () => {
      const store = await make();
      await store.create('ManagedClusterAddOn', sampleObject('ManagedClusterAddOn', 'before', 'c1'));
      const list = await store.list('ManagedClusterAddOn');
      const w = track(collect(store, 'ManagedClusterAddOn', { resourceVersion: list.resourceVersion }));
      const a = await store.create('ManagedClusterAddOn', sampleObject('ManagedClusterAddOn', 'a', 'c1'));
      const b = await store.create('ManagedClusterAddOn', sampleObject('ManagedClusterAddOn', 'b', 'c2'));
      const a2 = await store.update('ManagedClusterAddOn', mutateBody(a, 1));
      const a3 = await store.updateStatus('ManagedClusterAddOn', { ...a2, status: { namespace: 'x' } });
      await store.delete('ManagedClusterAddOn', { name: 'b', namespace: 'c2' });
      await store.delete('ManagedClusterAddOn', { name: 'before', namespace: 'c1' });
      await waitFor(() => w.events.length >= 6, { timeoutMs: 5000, message: 'six watch events' });
      expect(w.events.map((e) => `${e.type} ${e.object.metadata.name}`)).toEqual([
        'ADDED a',
        'ADDED b',
        'MODIFIED a',
        'MODIFIED a',
        'DELETED b',
        'DELETED before',
      ]);
      expect(w.events[0]?.object).toEqual(a);
      expect(w.events[1]?.object).toEqual(b);
      expect(w.events[3]?.object).toEqual(a3);
      const rvs = w.events.map((e) => Number(e.object.metadata.resourceVersion));
      expect(rvs).toEqual([...rvs].sort((x, y) => x - y));
      expect(new Set(rvs).size).toBe(rvs.length);
      expect(w.errors).toEqual([]);
    });

    it('a watch without resourceVersion starts with ADDED for current objects, filtered by namespace and labels', async () => {
      const store = await make();
      await store.create('Lease', {
        ...sampleObject('Lease', 'l1', 'c1'),
        metadata: { name: 'l1', namespace: 'c1', labels: { app: 'x' } },
      });
      await store.create('Lease', {
        ...sampleObject('Lease', 'l2', 'c1'),
        metadata: { name: 'l2', namespace: 'c1', labels: { app: 'y' } },
      });
      await store.create('Lease', {
        ...sampleObject('Lease', 'l3', 'c2'),
        metadata: { name: 'l3', namespace: 'c2', labels: { app: 'x' } },
      });
      const all = track(collect(store, 'Lease', {}));
      const sel = track(collect(store, 'Lease', { labels: { app: 'x' } }));
      const ns = track(collect(store, 'Lease', { namespace: 'c1', labels: { app: 'x' } }));
      await waitFor(() => all.events.length >= 3 && sel.events.length >= 2 && ns.events.length >= 1, {
        timeoutMs: 5000,
        message: 'initial ADDED events',
      });
      expect(all.events.map((e) => `${e.type} ${e.object.metadata.name}`).sort()).toEqual(['ADDED l1', 'ADDED l2', 'ADDED l3']);
      expect(sel.events.map((e) => e.object.metadata.name).sort()).toEqual(['l1', 'l3']);
      expect(ns.events.map((e) => e.object.metadata.name)).toEqual(['l1']);
      expect((await store.list('Lease', { labels: { app: 'x' } })).items.map((o) => o.metadata.name)).toEqual(['l1', 'l3']);
      expect((await store.list('Lease', { labels: { app: 'x', other: 'z' } })).items).toEqual([]);
      // Later changes follow, selector applied.
      await store.create('Lease', {
        ...sampleObject('Lease', 'l4', 'c1'),
        metadata: { name: 'l4', namespace: 'c1', labels: { app: 'x' } },
      });
      await store.create('Lease', {
        ...sampleObject('Lease', 'l5', 'c1'),
        metadata: { name: 'l5', namespace: 'c1', labels: { app: 'y' } },
      });
      await waitFor(() => all.events.length >= 5 && ns.events.length >= 2, { timeoutMs: 5000, message: 'later events' });
      expect(ns.events.map((e) => `${e.type} ${e.object.metadata.name}`)).toEqual(['ADDED l1', 'ADDED l4']);
    });

    it('stop(): no event is delivered after it returns', async () => {
      const store = await make();
      const w = track(collect(store, 'ManagedCluster', { resourceVersion: (await store.list('ManagedCluster')).resourceVersion }));
      await store.create('ManagedCluster', sampleObject('ManagedCluster', 'c1'));
      await waitFor(() => w.events.length >= 1, { timeoutMs: 5000, message: 'first event' });
      const p = store.create('ManagedCluster', sampleObject('ManagedCluster', 'c2'));
      w.watch.stop();
      w.watch.stop();
      const seen = w.events.length;
      await p;
      await store.create('ManagedCluster', sampleObject('ManagedCluster', 'c3'));
      // A second watch proves the events went out; the stopped one got none of them.
      const probe = track(collect(store, 'ManagedCluster', {}));
      await waitFor(() => probe.events.length >= 3, { timeoutMs: 5000, message: 'probe sees three clusters' });
      expect(w.events.length).toBe(seen);
      expect(w.errors).toEqual([]);
    });

    it.skipIf(limits.smallResumeWindow !== undefined)(
      `a watch from a version older than the resume window fails with GoneError${limits.smallResumeWindow ? ` (skipped: ${limits.smallResumeWindow})` : ''}`,
      async () => {
        const store = await make({ historySize: 5 });
        const first = await store.create('Lease', sampleObject('Lease', 'l'));
        let cur = first;
        for (let i = 0; i < 12; i++) cur = await store.update('Lease', mutateBody(cur, i));
        const w = track(collect(store, 'Lease', { resourceVersion: first.metadata.resourceVersion ?? '' }));
        await waitFor(() => w.errors.length >= 1, { timeoutMs: 5000, message: 'GoneError' });
        expect(w.errors[0]).toBeInstanceOf(GoneError);
        expect(w.events).toEqual([]);
        // Within the window it resumes.
        const recent = track(collect(store, 'Lease', { resourceVersion: String(Number(cur.metadata.resourceVersion) - 2) }));
        await waitFor(() => recent.events.length >= 2, { timeoutMs: 5000, message: 'recent events' });
        expect(recent.errors).toEqual([]);
      },
    );

    it('label selector transitions in a watch: leaving the selection is DELETED, entering is ADDED', async () => {
      const store = await make();
      const w = track(
        collect(store, 'ManagedCluster', {
          resourceVersion: (await store.list('ManagedCluster')).resourceVersion,
          labels: { tier: 'gold' },
        }),
      );
      const c = await store.create('ManagedCluster', {
        ...sampleObject('ManagedCluster', 'c1'),
        metadata: { name: 'c1', labels: { tier: 'gold' } },
      });
      const c2 = await store.update('ManagedCluster', { ...c, metadata: { ...c.metadata, labels: { tier: 'silver' } } });
      await store.update('ManagedCluster', mutateBody(c2, 5));
      const c4 = await store.get('ManagedCluster', { name: 'c1' });
      await store.update('ManagedCluster', {
        ...(c4 as ObjectOfKind<'ManagedCluster'>),
        metadata: { ...(c4 as ObjectOfKind<'ManagedCluster'>).metadata, labels: { tier: 'gold' } },
      });
      await waitFor(() => w.events.length >= 3, { timeoutMs: 5000, message: 'three events' });
      expect(w.events.map((e) => e.type)).toEqual(['ADDED', 'DELETED', 'ADDED']);
    });

    it('objects are copies: mutating what went in or came out changes nothing stored', async () => {
      const store = await make();
      const input = sampleObject('ManagedCluster', 'c1');
      const created = await store.create('ManagedCluster', input);
      input.spec.hubAcceptsClient = false;
      created.spec.hubAcceptsClient = false;
      const got = await store.get('ManagedCluster', { name: 'c1' });
      expect(got?.spec.hubAcceptsClient).toBe(true);
      (got as ObjectOfKind<'ManagedCluster'>).metadata.labels = { changed: 'yes' };
      const w1 = track(collect(store, 'ManagedCluster', {}));
      const w2 = track(collect(store, 'ManagedCluster', {}));
      await waitFor(() => w1.events.length >= 1 && w2.events.length >= 1, { timeoutMs: 5000, message: 'ADDED events' });
      (w1.events[0] as WatchEvent<'ManagedCluster'>).object.spec.hubAcceptsClient = false;
      expect(w2.events[0]?.object.spec.hubAcceptsClient).toBe(true);
      const again = await store.get('ManagedCluster', { name: 'c1' });
      expect(again?.spec.hubAcceptsClient).toBe(true);
      expect(again?.metadata.labels).toBeUndefined();
    });

    it('finalizers: delete marks deletionTimestamp, removing the last finalizer deletes', async () => {
      const store = await make();
      await store.create('ManagedCluster', {
        ...sampleObject('ManagedCluster', 'c1'),
        metadata: { name: 'c1', finalizers: ['cluster-proxy/cleanup'] },
      });
      await store.delete('ManagedCluster', { name: 'c1' });
      const marked = await store.get('ManagedCluster', { name: 'c1' });
      expect(marked?.metadata.deletionTimestamp).toMatch(/Z$/);
      const m = marked as ObjectOfKind<'ManagedCluster'>;
      await store.update('ManagedCluster', { ...m, metadata: { ...m.metadata, finalizers: [] } });
      expect(await store.get('ManagedCluster', { name: 'c1' })).toBeNull();
    });

    it('ping answers; close is idempotent', async () => {
      const s = await factory();
      await s.store.ping();
      await s.close();
      await s.close();
    });
  });
}
