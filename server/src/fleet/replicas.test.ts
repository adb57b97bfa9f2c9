import { describe, expect, it } from 'vitest';
import { pino } from 'pino';
import {
  MAX_CLUSTERS_ANNOTATION_BYTES,
  MAX_RECONNECT_SPREAD_SECONDS,
  REPLICA_CLUSTERS_ANNOTATION,
  REPLICA_CLUSTERS_GZIP_ANNOTATION,
  REPLICA_LABEL,
  ReplicaRegistry,
  decodeTunnelClusters,
  encodeTunnelClusters,
  pacingHints,
  tunnelsOnOtherReplicas,
} from './replicas.js';
import type { Lease } from '../store/objects.js';
import { MemoryStore } from '../store/memory.js';
import { countingStore } from '../store/counting.js';
import { UnavailableError } from '../store/store.js';

const NOW = Date.parse('2026-11-24T10:00:00Z');
const lease = (holder: string, renewAgoMs: number, clusters: string, replica = true): Lease => ({
  apiVersion: 'coordination.k8s.io/v1',
  kind: 'Lease',
  metadata: {
    name: `cluster-proxy-server-${holder}`,
    namespace: 'hub',
    labels: replica ? { [REPLICA_LABEL]: 'true' } : {},
    annotations: { [REPLICA_CLUSTERS_ANNOTATION]: clusters },
  },
  spec: { holderIdentity: holder, leaseDurationSeconds: 30, renewTime: new Date(NOW - renewAgoMs).toISOString() },
});

describe('tunnelsOnOtherReplicas', () => {
  it('counts the clusters other live replicas hold tunnels for; skips itself, expired replicas and other leases', () => {
    const counts = tunnelsOnOtherReplicas(
      [
        lease('self', 0, 'c9'),
        lease('hub-1', 1000, 'c1,c2'),
        lease('hub-2', 29_000, 'c1'),
        lease('gone', 30_000, 'c3'),
        lease('agent-lease', 0, 'c4', false),
        lease('hub-3', 0, ''),
      ],
      'self',
      NOW,
    );
    expect(Object.fromEntries(counts)).toEqual({ c1: 2, c2: 1 });
  });
});

describe('pacingHints', () => {
  it('stretches the replica-sync interval and the reconnect spread with the agent count', () => {
    expect(pacingHints(0)).toEqual({ syncIntervalSeconds: 0, reconnectSpreadSeconds: 0 });
    expect(pacingHints(10)).toEqual({ syncIntervalSeconds: 1, reconnectSpreadSeconds: 1 });
    expect(pacingHints(5000)).toEqual({ syncIntervalSeconds: 200, reconnectSpreadSeconds: 34 });
  });

  it('caps the reconnect spread, so a fleet of any size is back within a minute', () => {
    expect(pacingHints(1_000_000).reconnectSpreadSeconds).toBe(MAX_RECONNECT_SPREAD_SECONDS);
    expect(MAX_RECONNECT_SPREAD_SECONDS).toBeLessThanOrEqual(45);
  });
});

const names = (n: number, prefix = 'cluster-'): string[] => Array.from({ length: n }, (_, i) => `${prefix}${String(i).padStart(5, '0')}`);

describe('encodeTunnelClusters / decodeTunnelClusters', () => {
  it('publishes a small list as plain text, sorted and without duplicates', () => {
    const { annotations, omitted } = encodeTunnelClusters(['b', 'a', 'b']);
    expect(annotations).toEqual({ [REPLICA_CLUSTERS_ANNOTATION]: 'a,b', [REPLICA_CLUSTERS_GZIP_ANNOTATION]: '' });
    expect(omitted).toBe(0);
    expect(decodeTunnelClusters(annotations)).toEqual(['a', 'b']);
    expect(decodeTunnelClusters({})).toEqual([]);
  });

  it('gzips a large one: 5,000 clusters in well under the bound', () => {
    const { annotations, omitted } = encodeTunnelClusters(names(5000));
    expect(annotations[REPLICA_CLUSTERS_ANNOTATION]).toBe('');
    expect(annotations[REPLICA_CLUSTERS_GZIP_ANNOTATION]!.length).toBeLessThan(20_000);
    expect(omitted).toBe(0);
    expect(decodeTunnelClusters(annotations)).toEqual(names(5000));
  });

  it('stays within the bound however many clusters, saying how many it left out', () => {
    const random = Array.from(
      { length: 20_000 },
      (_, i) => `${i}-${Math.random().toString(36).slice(2)}${Math.random().toString(36).slice(2)}`,
    );
    const { annotations, omitted } = encodeTunnelClusters(random);
    expect(annotations[REPLICA_CLUSTERS_GZIP_ANNOTATION]!.length).toBeLessThanOrEqual(MAX_CLUSTERS_ANNOTATION_BYTES);
    expect(omitted).toBeGreaterThan(0);
    expect(decodeTunnelClusters(annotations).length).toBe(20_000 - omitted);
  });

  it('other replicas read the gzipped list too', () => {
    const l = lease('hub-1', 0, '');
    l.metadata.annotations = encodeTunnelClusters(names(3000)).annotations;
    expect(tunnelsOnOtherReplicas([l], 'self', NOW).size).toBe(3000);
  });
});

describe("ReplicaRegistry lease lists (ANP's lease_list metrics)", () => {
  it('reports each list of the replica leases: 200 when it worked, the status of a store error when not', async () => {
    const lists: [number, string][] = [];
    const store = new MemoryStore();
    let down = false;
    const list = store.list.bind(store);
    store.list = ((...args: Parameters<typeof list>) =>
      down ? Promise.reject(new UnavailableError('store unreachable')) : list(...args)) as typeof store.list;
    const registry = (serverID: string): ReplicaRegistry =>
      new ReplicaRegistry({
        store,
        namespace: 'hub',
        serverID,
        log: pino({ level: 'silent' }),
        onLeaseList: (seconds, code, reason) => {
          expect(seconds).toBeGreaterThanOrEqual(0);
          lists.push([code, reason]);
        },
      });
    // start() renews its lease and lists the replicas once.
    const up = registry('hub-a');
    await up.start();
    await up.stop();
    down = true;
    const failing = registry('hub-b');
    await failing.start();
    await failing.stop();
    expect(lists).toEqual([
      [200, ''],
      [503, 'ServiceUnavailable'],
    ]);
  });
});

describe('ReplicaRegistry renewals', () => {
  it('publishes the tunnelled clusters as they are at each renewal, the gzipped form included', async () => {
    const store = new MemoryStore();
    let clusters = names(3000);
    const registry = new ReplicaRegistry({
      store,
      namespace: 'hub',
      serverID: 'hub-a',
      leaseDurationMs: 600,
      log: pino({ level: 'silent' }),
      tunnelClusters: () => clusters,
    });
    const published = async (): Promise<string[]> => {
      const { items } = await store.list('Lease', { namespace: 'hub' });
      return decodeTunnelClusters(items[0]?.metadata.annotations);
    };
    await registry.start();
    try {
      expect(await published()).toEqual(clusters);
      // Renewals every 200 ms: the same list stays, a changed one replaces it.
      clusters = [...names(3000), 'zz-new'];
      for (let i = 0; i < 100 && (await published()).length !== clusters.length; i++) await new Promise((r) => setTimeout(r, 20));
      expect(await published()).toEqual(clusters);
      clusters = ['only-one'];
      for (let i = 0; i < 100 && (await published()).length !== 1; i++) await new Promise((r) => setTimeout(r, 20));
      expect(await published()).toEqual(['only-one']);
    } finally {
      await registry.stop();
    }
  });
});

describe('ReplicaRegistry answers', () => {
  it("answers agents' replica-list requests from a watch of the replica leases: one list, however many answers; a replica that starts is in the next one", async () => {
    const memory = new MemoryStore();
    let leaseLists = 0;
    const store = countingStore(memory, (verb, kind) => {
      if (verb === 'list' && kind === 'Lease') leaseLists++;
    });
    let now = NOW;
    const registry = (serverID: string): ReplicaRegistry =>
      new ReplicaRegistry({ store, namespace: 'hub', serverID, log: pino({ level: 'silent' }), now: () => now });
    const a = registry('hub-a');
    await a.start();
    try {
      for (let i = 0; i < 20; i++) {
        now += 1500;
        expect((await a.answer()).replicas).toEqual([{ serverID: 'hub-a' }]);
      }
      expect(leaseLists).toBe(1);
      const b = registry('hub-b');
      await b.start();
      try {
        let answer = await a.answer();
        for (let i = 0; i < 200 && answer.serverCount < 2; i++) {
          await new Promise((r) => setTimeout(r, 5));
          now += 1500;
          answer = await a.answer();
        }
        expect(answer.replicas).toEqual([{ serverID: 'hub-a' }, { serverID: 'hub-b' }]);
        // hub-b's own first list, none of hub-a's.
        expect(leaseLists).toBe(2);
      } finally {
        await b.stop();
      }
    } finally {
      await a.stop();
    }
  });
});
