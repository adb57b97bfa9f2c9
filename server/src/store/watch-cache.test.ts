import pino from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { MemoryStore } from './memory.js';
import type { Lease } from './objects.js';
import { WatchCache } from './watch-cache.js';

const log = pino({ level: 'silent' });
const lease = (ns: string, holder: string): Lease => ({
  apiVersion: 'coordination.k8s.io/v1',
  kind: 'Lease',
  metadata: { name: 'cluster-proxy', namespace: ns },
  spec: { holderIdentity: holder },
});
const until = async (cond: () => boolean): Promise<void> => {
  for (let i = 0; i < 200 && !cond(); i++) await new Promise((r) => setTimeout(r, 5));
  expect(cond()).toBe(true);
};

describe('WatchCache', () => {
  let cache: WatchCache<'Lease'> | null = null;
  afterEach(() => cache?.stop());

  it('holds the listed objects, then follows creates, updates and deletes', async () => {
    const store = new MemoryStore();
    await store.create('Lease', lease('c1', 'a'));
    const changes: string[] = [];
    cache = new WatchCache({
      store,
      kind: 'Lease',
      log,
      onChange: (l, deleted) => changes.push(`${l.metadata.namespace}:${deleted ? 'gone' : l.spec.holderIdentity}`),
    });
    await cache.start();
    expect(cache.ready).toBe(true);
    expect(cache.get({ namespace: 'c1', name: 'cluster-proxy' })?.spec.holderIdentity).toBe('a');

    await store.create('Lease', lease('c2', 'b'));
    const c1 = (await store.get('Lease', { namespace: 'c1', name: 'cluster-proxy' }))!;
    await store.update('Lease', { ...c1, spec: { holderIdentity: 'a2' } });
    await store.delete('Lease', { namespace: 'c2', name: 'cluster-proxy' });
    await until(() => changes.length === 3);
    expect(changes).toEqual(['c2:b', 'c1:a2', 'c2:gone']);
    expect([...cache.values()].map((l) => l.spec.holderIdentity)).toEqual(['a2']);
    expect(cache.size).toBe(1);
  });

  it('lists again when its watch ends, so changes made meanwhile are not lost', async () => {
    const store = new MemoryStore();
    let fail: ((err: Error) => void) | null = null;
    // A store whose first watch ends with an error (as on GoneError), the second one delegates.
    const flaky = new Proxy(store, {
      get(target, prop, receiver) {
        if (prop !== 'watch') return Reflect.get(target, prop, receiver) as unknown;
        return (...args: Parameters<MemoryStore['watch']>) => {
          const w = target.watch(...args);
          if (!fail)
            fail = (err) => {
              w.stop();
              args[2].onError?.(err);
            };
          return w;
        };
      },
    });
    cache = new WatchCache({ store: flaky, kind: 'Lease', log });
    await cache.start();
    fail!(new Error('too old'));
    await store.create('Lease', lease('c3', 'x'));
    await until(() => cache!.get({ namespace: 'c3', name: 'cluster-proxy' }) !== undefined);
  });

  it('stop() ends delivery, and a start() after it opens no watch', async () => {
    const store = new MemoryStore();
    cache = new WatchCache({ store, kind: 'Lease', log });
    await cache.start();
    cache.stop();
    await cache.start();
    // A second cache, still watching, started after: once it has the object, the first would have too.
    const witness = new WatchCache({ store, kind: 'Lease', log });
    await witness.start();
    try {
      await store.create('Lease', lease('c4', 'y'));
      await until(() => witness.size === 1);
      expect(cache.size).toBe(0);
    } finally {
      witness.stop();
    }
  });
  it('projects a long list a batch at a time, the event loop turning between; readers see the whole list only', async () => {
    const store = new MemoryStore();
    for (let i = 0; i < 1000; i++) await store.create('Lease', lease(`c${i}`, 'a'));
    let projected = 0;
    cache = new WatchCache({
      store,
      kind: 'Lease',
      log,
      project: (l) => (projected++, { ...l, spec: { holderIdentity: `kept-${l.spec.holderIdentity}` } }),
    });
    let seen: { projected: number; size: number } | null = null;
    const turned = new Promise<void>((resolve) =>
      setImmediate(() => {
        seen = { projected, size: cache!.size };
        resolve();
      }),
    );
    const started = cache.start();
    await turned;
    await started;
    expect(seen).not.toBeNull();
    expect(seen!.projected).toBeGreaterThan(0);
    expect(seen!.projected).toBeLessThan(1000);
    expect(seen!.size).toBe(0);
    expect(cache.size).toBe(1000);
    expect(cache.get({ namespace: 'c999', name: 'cluster-proxy' })?.spec.holderIdentity).toBe('kept-a');
  });
});
