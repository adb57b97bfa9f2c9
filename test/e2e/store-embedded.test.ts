// The embedded store: the conformance suite on temp data directories, plus what only it has
// (persistence across reopen, file modes). Crash safety: store-crash.test.ts.
import { mkdtemp, readdir, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { embeddedStoreDir, openEmbeddedStore, openStore } from '@cluster-proxy/server';
import { snapshotHandles, waitForHandlesAtMost } from '../src/fixtures/index.js';
import { sampleObject, storeConformance } from '../src/store-conformance.js';

let handles: Map<string, number>;
beforeAll(() => {
  handles = snapshotHandles();
});
afterAll(async () => {
  await waitForHandlesAtMost(handles, 5000);
});

storeConformance('embedded', async (opts) => {
  const dir = await mkdtemp(join(tmpdir(), 'store-embedded-'));
  const store = await openEmbeddedStore(dir, {
    ...(opts?.historySize !== undefined ? { historySize: opts.historySize } : {}),
    compactBytes: 16 << 10,
  });
  return {
    store,
    async close() {
      await store.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
});

describe('embedded store on disk', () => {
  it('keeps objects and versions across close/reopen and compaction; files 0600, directory 0700', async () => {
    const dataDir = await mkdtemp(join(tmpdir(), 'store-reopen-'));
    try {
      const s1 = await openStore({ type: 'embedded', dataDir, compactBytes: 4096 });
      let lease = await s1.create('Lease', sampleObject('Lease', 'l'));
      for (let i = 0; i < 40; i++) lease = await s1.update('Lease', { ...lease, spec: { ...lease.spec, leaseTransitions: i } });
      await s1.create('ManagedCluster', sampleObject('ManagedCluster', 'c1'));
      await s1.create('ManagedCluster', sampleObject('ManagedCluster', 'c2'));
      await s1.delete('ManagedCluster', { name: 'c1' });
      const before = await s1.list('ManagedCluster');
      await s1.close();
      const dir = embeddedStoreDir(dataDir);
      expect((await stat(dir)).mode & 0o777).toBe(0o700);
      for (const f of await readdir(dir)) expect(((await stat(join(dir, f))).mode & 0o777).toString(8)).toBe('600');
      expect(await readdir(dir)).not.toContain('store.lock');
      const s2 = await openStore({ type: 'embedded', dataDir });
      expect(await s2.list('ManagedCluster')).toEqual(before);
      expect((await s2.get('Lease', { name: 'l', namespace: 'c1' }))?.spec.leaseTransitions).toBe(39);
      const next = await s2.create('ManagedCluster', sampleObject('ManagedCluster', 'c3'));
      expect(Number(next.metadata.resourceVersion)).toBeGreaterThan(Number(before.resourceVersion));
      await s2.close();
    } finally {
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});
