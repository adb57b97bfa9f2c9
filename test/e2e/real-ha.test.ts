// High availability on a real control plane (test/src/fixtures/real-kube.ts: etcd, kube-apiserver,
// kube-controller-manager): three hub replicas on `--store kubernetes` behind a real haproxy, running as the
// chart's service account with only the chart's RBAC, two agents of cluster c1 (test/src/ha-fleet.ts with
// `apiserver: 'real'`; ha.test.ts runs the same fleet on our stand-in with more cases). What the real store
// holds once they converge (one replica Lease per replica naming c1, one status leader, the cluster's Lease with
// both agents' reports, the addon Available); no write but the heartbeats and no conflict over several status
// passes, counted by the leader's Lease renewals in the apiserver's audit log; the status leader killed hard:
// dials through the other two keep working, another replica takes the lead and writes Degraded; restarted,
// three tunnels again, not Degraded, and quiet again over several passes.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Tunnel } from '@cluster-proxy/client';
import type { Lease, ManagedClusterAddOn } from '@cluster-proxy/server';
import { AUDIT_WRITE_VERBS, waitFor, type AuditEvent, type RealKube } from '../src/fixtures/index.js';
import { HUB_NAMESPACE } from '../src/fixtures/real-install.js';
import { startHaFleet, type HaFleet } from '../src/ha-fleet.js';
import { echoRoundTripForTest } from '../src/join-helpers.js';
import { getJson, type HubProcess } from '../src/harness.js';
import { MANAGER_LEASE, statusPasses } from '../src/fixtures/hub-writes.js';

/** The first start may build the binaries (the script prints its progress); later starts take seconds. */
const START_TIMEOUT_MS = 45 * 60_000;
/** Every replica's identity towards the apiserver: the chart's service account. */
const HUB_USER = `system:serviceaccount:${HUB_NAMESPACE}:cluster-proxy`;
const REPLICA_LABEL = 'proxy.open-cluster-management.io/server-replica';
const PASSES = 6;
const ALL = ['hub-0', 'hub-1', 'hub-2'];

/** Status passes: the leader's renewals of its Lease (only the leader writes it; one per pass). */
const passes = (events: AuditEvent[]): number => statusPasses(events, HUB_USER);

/** The heartbeats: the leader's Lease and each replica's own Lease (renewed on a timer). */
const heartbeat = (e: AuditEvent): boolean =>
  e.objectRef?.resource === 'leases' &&
  e.objectRef.namespace === HUB_NAMESPACE &&
  (e.objectRef.name === MANAGER_LEASE || (e.objectRef.name ?? '').startsWith('cluster-proxy-server-'));

const line = (e: AuditEvent): string =>
  `${e.verb} ${e.objectRef?.resource}${e.objectRef?.subresource ? `/${e.objectRef.subresource}` : ''} ${e.objectRef?.namespace ?? ''}/${e.objectRef?.name ?? ''} → ${e.responseStatus?.code}`;

describe('three hub replicas on a real apiserver', () => {
  let fleet: HaFleet<RealKube>;
  let kube: RealKube;
  let hubs: (HubProcess | null)[] = [];

  const addon = (): Promise<ManagedClusterAddOn | null> =>
    kube.store.get('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: 'c1' });
  const cond = async (type: string) => (await addon())?.status?.conditions?.find((c) => c.type === type);
  const leaderOf = async (): Promise<string | undefined> =>
    (await kube.store.get('Lease', { name: MANAGER_LEASE, namespace: HUB_NAMESPACE }))?.spec.holderIdentity;
  const dialThrough = async (t: Tunnel): Promise<void> => {
    const s = await t.dial('c1:443');
    try {
      expect((await echoRoundTripForTest(s, Buffer.from('hi'))).toString()).toBe('hi');
    } finally {
      s.destroy();
    }
  };

  /**
   * Until every live replica's watch-fed copy of c1's Lease is the store's (its admin API shows the renewTime
   * it holds): a replica that has not yet seen the latest report would take the next renewal for a change and
   * write it again.
   */
  const mirrorsInSync = () =>
    waitFor(
      async () => {
        const stored = (await kube.store.get('Lease', { name: 'cluster-proxy', namespace: 'c1' }))?.spec.renewTime;
        for (const h of hubs) {
          if (!h) continue;
          const body = (await getJson(h.ports.admin, '/v1/managedclusteraddons')) as {
            wide: Record<string, { leaseRenewTime: string | null }>;
          };
          if (body.wide['c1/cluster-proxy']?.leaseRenewTime !== stored) return false;
        }
        return stored !== undefined;
      },
      { timeoutMs: 15_000, intervalMs: 100, message: "every replica's copy of c1's Lease is the store's" },
    );

  /**
   * Waits for `n` more status passes (the replicas' copies of c1's Lease in sync first); returns what the
   * replicas wrote besides their heartbeats, and every answer of 409 (Conflict) to any of their requests, over
   * those passes.
   */
  async function quietOver(n: number): Promise<{ writes: string[]; conflicts: string[]; lease: string }> {
    await mirrorsInSync();
    const lease = () => kube.store.get('Lease', { name: 'cluster-proxy', namespace: 'c1' });
    const leaseBefore = await lease();
    const before = await kube.audit();
    const from = passes(before);
    const after = await waitFor(
      async () => {
        const a = await kube.audit();
        return passes(a) >= from + n ? a : null;
      },
      { timeoutMs: 60_000, intervalMs: 250, message: `${n} status passes` },
    );
    const during = after!.slice(before.length).filter((e) => e.user.username === HUB_USER);
    return {
      writes: during.filter((e) => AUDIT_WRITE_VERBS.includes(e.verb) && !heartbeat(e)).map(line),
      conflicts: during.filter((e) => e.responseStatus?.code === 409).map(line),
      // On a failure: c1's Lease before and after (which report changed).
      lease: JSON.stringify({ before: leaseBefore?.metadata.annotations, after: (await lease())?.metadata.annotations }),
    };
  }

  /** Until the addon is Available and (not) Degraded, as the real store has it. */
  const addonSettles = (degraded: 'True' | 'False', timeoutMs = 30_000) =>
    waitFor(async () => (await cond('Available'))?.status === 'True' && (await cond('Degraded'))?.status === degraded, {
      timeoutMs,
      intervalMs: 200,
      message: `addon Available, Degraded ${degraded}`,
    }).catch(async (err: Error) => {
      throw new Error(`${err.message}: ${JSON.stringify((await addon())?.status?.conditions)}`);
    });

  beforeAll(async () => {
    fleet = await startHaFleet({
      apiserver: 'real',
      replicas: 3,
      hubArgs: ['--tunnel-loss-window', '4s'],
      join: 'c1',
      agentIDs: ['agent-a', 'agent-b'],
      agentArgs: ['--replica-sync-interval', '500ms', '--lease-duration', '1s', '--keepalive-time', '2s', '--keepalive-timeout', '2s'],
    });
    ({ api: kube, hubs } = fleet);
  }, START_TIMEOUT_MS);

  afterAll(async () => {
    await fleet?.stop();
  });

  it('converge on the real store: a replica Lease each naming c1, one status leader, both reports on the cluster Lease, the addon Available', async () => {
    await fleet.allAgentsAt(ALL);
    for (const h of hubs) await dialThrough(h!.tunnel());
    await waitFor(
      async () => {
        const { items } = await kube.store.list('Lease', { labels: { [REPLICA_LABEL]: 'true' } });
        return (
          items.length === 3 &&
          items.every(
            (l) =>
              l.metadata.namespace === HUB_NAMESPACE &&
              l.metadata.annotations?.['proxy.open-cluster-management.io/tunnel-clusters'] === 'c1',
          )
        );
      },
      { timeoutMs: 15_000, intervalMs: 250, message: 'three replica Leases in the hub namespace, each naming c1' },
    );
    const { items } = await kube.store.list('Lease', { labels: { [REPLICA_LABEL]: 'true' } });
    expect(items.map((l) => [l.metadata.name, l.spec.holderIdentity]).sort()).toEqual(ALL.map((id) => [`cluster-proxy-server-${id}`, id]));
    expect(ALL).toContain(await leaderOf());
    await addonSettles('False');
    const clusterLease = (await kube.store.get('Lease', { name: 'cluster-proxy', namespace: 'c1' })) as Lease;
    expect(
      Object.keys(clusterLease.metadata.annotations ?? {})
        .filter((k) => k.startsWith('agents.'))
        .sort(),
    ).toEqual(['agents.proxy.open-cluster-management.io/agent-a', 'agents.proxy.open-cluster-management.io/agent-b']);
    // Every write the replicas made was the chart's service account's, and the apiserver took it (or said Conflict).
    const writes = (await kube.audit()).filter((e) => e.user.username === HUB_USER && AUDIT_WRITE_VERBS.includes(e.verb));
    expect(writes.length).toBeGreaterThan(0);
    expect(writes.filter((e) => ![200, 201, 409].includes(e.responseStatus?.code ?? 0)).map(line)).toEqual([]);
  });

  it('after convergence: no write but the heartbeats, and no conflict, over several status passes', async () => {
    const q = await quietOver(PASSES);
    console.log(`converged, ${PASSES} status passes: ${q.writes.length} writes, ${q.conflicts.length} conflicts`);
    expect(q.writes, q.lease).toEqual([]);
    expect(q.conflicts).toEqual([]);
  });

  it('the status leader killed hard: dials via the others work, another leads and writes Degraded; restarted → three tunnels, quiet again', async () => {
    const leader = (await leaderOf())!;
    const i = ALL.indexOf(leader);
    const others = ALL.filter((id) => id !== leader);
    hubs[i]!.proc.kill('SIGKILL');
    await hubs[i]!.proc.exited;
    hubs[i] = null;
    for (const h of hubs) if (h) await dialThrough(h.tunnel());
    await fleet.allAgentsAt(others);
    // The lead moves once the dead leader's Lease runs out; the new leader sees the agents short of a replica.
    await addonSettles('True');
    expect(others).toContain(await leaderOf());
    expect((await cond('Degraded'))?.reason).toBe('ProxyServerConnectionsMissing');
    for (const h of hubs) if (h) await dialThrough(h.tunnel());

    hubs[i] = await fleet.startReplica(i);
    await fleet.allAgentsAt(ALL);
    for (const h of hubs) await dialThrough(h!.tunnel());
    await addonSettles('False');
    const q = await quietOver(PASSES);
    console.log(`after the restart, ${PASSES} status passes: ${q.writes.length} writes, ${q.conflicts.length} conflicts`);
    expect(q.writes, q.lease).toEqual([]);
    expect(q.conflicts).toEqual([]);
  }, 120_000);
});
