// The one lease client: who holds a Lease (an unreadable renewTime holds nothing), and the read-modify-write
// that creates, renews or takes one, retrying a lost race.
import { describe, expect, it } from 'vitest';
import { MemoryStore } from '../store/memory.js';
import type { Lease } from '../store/objects.js';
import { leaseHeld, microTime, writeLease } from './lease.js';

const lease = (renewTime: string | undefined, leaseDurationSeconds?: number): Lease => ({
  apiVersion: 'coordination.k8s.io/v1',
  kind: 'Lease',
  metadata: { name: 'l', namespace: 'ns' },
  spec: {
    holderIdentity: 'a',
    ...(renewTime !== undefined ? { renewTime } : {}),
    ...(leaseDurationSeconds !== undefined ? { leaseDurationSeconds } : {}),
  },
});

describe('leaseHeld', () => {
  const t0 = Date.parse('2026-01-01T00:00:00Z');
  it('held until renewTime + duration (× grace), then not', () => {
    const l = lease(microTime(t0), 10);
    expect(leaseHeld(l, t0 + 9_999, { defaultDurationS: 60 })).toBe(true);
    expect(leaseHeld(l, t0 + 10_000, { defaultDurationS: 60 })).toBe(false);
    expect(leaseHeld(l, t0 + 49_999, { defaultDurationS: 60, graceFactor: 5 })).toBe(true);
    expect(leaseHeld(lease(microTime(t0)), t0 + 59_999, { defaultDurationS: 60 })).toBe(true);
  });
  it('an unreadable or missing renewTime holds nothing (a take-over is never blocked by it)', () => {
    for (const bad of [undefined, '', 'yesterday', '2026-13-45T99:00:00Z'])
      expect(leaseHeld(lease(bad, 3600), Date.now(), { defaultDurationS: 60 })).toBe(false);
  });
  it('microTime is RFC 3339 with microseconds', () => {
    expect(microTime(t0 + 123)).toBe('2026-01-01T00:00:00.123000Z');
  });
});

describe('writeLease', () => {
  const key = { name: 'l', namespace: 'ns' };
  it('creates, renews with merged labels and the annotations given, and declines when asked to', async () => {
    const store = new MemoryStore({ kind: 'memory' });
    expect(
      await writeLease(store, key, (cur) =>
        cur ? null : { spec: { holderIdentity: 'a', renewTime: microTime(1) }, labels: { x: '1' }, annotations: { a: '1' } },
      ),
    ).toBe(true);
    expect(
      await writeLease(store, key, (cur) => ({
        spec: { ...cur!.spec, renewTime: microTime(2) },
        labels: { y: '2' },
        annotations: { b: '2' },
      })),
    ).toBe(true);
    const l = (await store.get('Lease', key))!;
    expect(l.spec.renewTime).toBe(microTime(2));
    expect(l.metadata.labels).toEqual({ x: '1', y: '2' });
    expect(l.metadata.annotations).toEqual({ b: '2' });
    expect(await writeLease(store, key, () => null)).toBe(false);
    await store.close();
  });

  it('a lost race is read again and retried; with one attempt it is reported as not written', async () => {
    const store = new MemoryStore({ kind: 'memory' });
    await store.create('Lease', { ...lease(microTime(0)), metadata: key });
    let calls = 0;
    const racing = async (attempts: number): Promise<boolean> =>
      writeLease(
        store,
        key,
        (cur) => {
          calls++;
          // Another writer updates the lease between our read and our write, the first time only.
          if (calls === 1) void store.update('Lease', { ...cur!, spec: { ...cur!.spec, holderIdentity: 'other' } });
          return { spec: { ...cur!.spec, leaseTransitions: (cur!.spec.leaseTransitions ?? 0) + 1 } };
        },
        attempts,
      );
    expect(await racing(1)).toBe(false);
    calls = 0;
    expect(await racing(3)).toBe(true);
    expect(calls).toBe(2);
    const l = (await store.get('Lease', key))!;
    expect([l.spec.holderIdentity, l.spec.leaseTransitions]).toEqual(['other', 1]);
    await store.close();
  });
});
