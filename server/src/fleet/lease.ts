// Leases, one way: whether a Lease is still held, and the read-modify-write that renews or takes one. Used
// by the addon manager (the agents' Leases, and leader election among hub replicas) and by the replica
// registry (one Lease per hub replica).
import type { Lease, ObjectMeta } from '../store/objects.js';
import { AlreadyExistsError, ConflictError, type Store } from '../store/store.js';

/** Kubernetes MicroTime: RFC 3339 with microseconds. */
export function microTime(ms: number): string {
  return new Date(ms).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}

/**
 * Whether the lease was renewed within `graceFactor` × its duration before `now`. A lease whose renewTime
 * cannot be read (missing, edited by hand) is not held: it must never block a take-over forever.
 */
export function leaseHeld(lease: Lease, now: number, opts: { defaultDurationS: number; graceFactor?: number }): boolean {
  const renew = Date.parse(lease.spec.renewTime ?? '');
  const durationMs = (lease.spec.leaseDurationSeconds ?? opts.defaultDurationS) * 1000;
  return Number.isFinite(renew) && now < renew + (opts.graceFactor ?? 1) * durationMs;
}

/** What a renewal writes: the new spec, and metadata to merge (annotations, labels). */
export interface LeaseWrite {
  spec: Lease['spec'];
  annotations?: Record<string, string>;
  labels?: Record<string, string>;
}

/**
 * Creates or updates the Lease `key` with what `next` makes of the current one (null: there is none).
 * `next` returning null means "leave it" (e.g. someone else holds it). A write that loses a race (another
 * writer got there first) is read and tried again, `attempts` times in all; then `false`.
 * Returns true when written, false when `next` declined or every attempt lost.
 */
export async function writeLease(
  store: Store,
  key: { name: string; namespace: string },
  next: (current: Lease | null) => LeaseWrite | null,
  attempts = 1,
): Promise<boolean> {
  for (let attempt = 0; attempt < attempts; attempt++) {
    const current = await store.get('Lease', key);
    const want = next(current);
    if (!want) return false;
    try {
      if (!current) {
        const metadata: ObjectMeta = {
          ...key,
          ...(want.labels ? { labels: want.labels } : {}),
          ...(want.annotations ? { annotations: want.annotations } : {}),
        };
        await store.create('Lease', { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata, spec: want.spec });
      } else {
        const metadata: ObjectMeta = {
          ...current.metadata,
          ...(want.labels ? { labels: { ...current.metadata.labels, ...want.labels } } : {}),
          ...(want.annotations ? { annotations: want.annotations } : {}),
        };
        await store.update('Lease', { ...current, metadata, spec: want.spec });
      }
      return true;
    } catch (err) {
      if (!(err instanceof ConflictError) && !(err instanceof AlreadyExistsError)) throw err;
    }
  }
  return false;
}
