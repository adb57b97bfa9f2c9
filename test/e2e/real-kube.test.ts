// The real control plane fixture itself (test/src/fixtures/real-kube.ts): two instances side by side, each
// with its own ports, PKI and data; the controller manager's garbage collector and namespace controller at
// work; the request counts from /metrics and the audit log; and nothing left behind by stop().
import { existsSync } from 'node:fs';
import { afterAll, describe, expect, it } from 'vitest';
import { WRITE_VERBS, apiRequests, startRealKube, waitFor, type RealKube } from '../src/fixtures/index.js';

/** The first start may build the binaries (the script prints its progress); later starts take seconds. */
const START_TIMEOUT_MS = 45 * 60_000;

describe('real control plane fixture', () => {
  const started: RealKube[] = [];
  afterAll(async () => {
    for (const k of started) await k.stop();
  });

  it(
    'two instances at once: their own apiserver, etcd and CA; GC and namespace deletion work; writes are counted; stop() leaves nothing',
    async () => {
      const [a, b] = await Promise.all([startRealKube(), startRealKube()]);
      started.push(a!, b!);
      expect(a!.url).not.toBe(b!.url);
      expect(a!.caPem).not.toBe(b!.caPem);
      const version = await a!.request<{ gitVersion: string }>('GET', '/version');
      expect(version.body.gitVersion).toBe(a!.versions.kubernetes);

      // An object in one is not in the other.
      const cm = (name: string, extra: Record<string, unknown> = {}) => ({
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name, ...extra },
        data: { k: 'v' },
      });
      const owner = await a!.request<{ metadata: { uid: string } }>('POST', '/api/v1/namespaces/default/configmaps', cm('owner'));
      expect(owner.status).toBe(201);
      expect((await b!.request('GET', '/api/v1/namespaces/default/configmaps/owner')).status).toBe(404);

      // Garbage collector: a dependent goes with its owner.
      const dependent = await a!.request(
        'POST',
        '/api/v1/namespaces/default/configmaps',
        cm('dependent', { ownerReferences: [{ apiVersion: 'v1', kind: 'ConfigMap', name: 'owner', uid: owner.body.metadata.uid }] }),
      );
      expect(dependent.status).toBe(201);
      expect((await a!.request('DELETE', '/api/v1/namespaces/default/configmaps/owner')).status).toBe(200);
      await waitFor(async () => (await a!.request('GET', '/api/v1/namespaces/default/configmaps/dependent')).status === 404, {
        timeoutMs: 60_000,
        intervalMs: 200,
        message: 'the garbage collector deleted the dependent',
      });

      // Namespace controller: a deleted namespace empties and goes.
      expect(
        (await a!.request('POST', '/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'gone' } })).status,
      ).toBe(201);
      expect((await a!.request('POST', '/api/v1/namespaces/gone/configmaps', cm('inside'))).status).toBe(201);
      expect((await a!.request('DELETE', '/api/v1/namespaces/gone')).status).toBe(200);
      await waitFor(async () => (await a!.request('GET', '/api/v1/namespaces/gone')).status === 404, {
        timeoutMs: 60_000,
        intervalMs: 200,
        message: 'the namespace controller removed namespace gone',
      });

      // Counted: our three creates and the deletes of ConfigMaps in a.
      expect(apiRequests(await a!.metrics(), { resource: 'configmaps', verbs: ['POST'] })).toBeGreaterThanOrEqual(3);
      expect(apiRequests(await a!.metrics(), { resource: 'configmaps', verbs: WRITE_VERBS })).toBeGreaterThanOrEqual(5);
      const audit = await a!.audit();
      expect(
        audit
          .filter((e) => e.verb === 'create' && e.objectRef?.resource === 'configmaps' && e.user.username === 'real-kube-admin')
          .map((e) => e.objectRef?.name),
      ).toEqual(expect.arrayContaining(['owner', 'dependent', 'inside']));
      // The garbage collector's delete is the controller manager's, not ours.
      expect(
        audit.find((e) => e.verb === 'delete' && e.objectRef?.resource === 'configmaps' && e.objectRef.name === 'dependent')?.user.username,
      ).toBe('system:kube-controller-manager');

      for (const k of [a!, b!]) {
        await k.stop();
        expect(existsSync(k.dir)).toBe(false);
        for (const p of [k.processes.etcd, k.processes.apiserver, k.processes.controllerManager])
          expect(p?.isRunning() ?? false).toBe(false);
      }
      started.length = 0;
    },
    START_TIMEOUT_MS,
  );
});
