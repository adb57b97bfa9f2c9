import { describe, expect, it } from 'vitest';
import type { Lease } from '../store/objects.js';
import { addonConditions, mergeConditions, type AgentReport, type ClusterHealthInput } from './conditions.js';

const T0 = Date.parse('2026-11-23T10:00:00Z');
const lease = (renewAgoMs: number, durationSeconds = 60): Lease => ({
  apiVersion: 'coordination.k8s.io/v1',
  kind: 'Lease',
  metadata: { name: 'cluster-proxy', namespace: 'c1' },
  spec: { holderIdentity: 'a', leaseDurationSeconds: durationSeconds, renewTime: new Date(T0 - renewAgoMs).toISOString() },
});
const report = (over: Partial<AgentReport> = {}): AgentReport => ({
  agentID: 'a',
  leaseDurationSeconds: 60,
  connectedServers: 3,
  serverCount: 3,
  apiserverReachable: true,
  version: '0.1.0',
  phase: 'Running',
  receivedAt: T0 - 1000,
  ...over,
});
const input = (over: Partial<ClusterHealthInput>): ClusterHealthInput => ({
  lease: null,
  mode: 'lease',
  tunnels: 0,
  tunnelDownSince: null,
  tunnelLossGraceMs: 15_000,
  report: null,
  now: T0,
  ...over,
});
const cond = (i: ClusterHealthInput, type: string) => addonConditions(i).find((c) => c.type === type)!;

describe('Available, lease-only mode (OCM timing: grace = 5 × lease duration)', () => {
  it('no lease: Unknown / ManagedClusterAddOnLeaseNotFound', () => {
    expect(cond(input({}), 'Available')).toMatchObject({ status: 'Unknown', reason: 'ManagedClusterAddOnLeaseNotFound' });
  });
  it('renewed 299 s ago with 60 s duration: True; 300 s ago: False / ManagedClusterAddOnLeaseUpdateStopped', () => {
    expect(cond(input({ lease: lease(299_000) }), 'Available')).toMatchObject({
      status: 'True',
      reason: 'ManagedClusterAddOnLeaseUpdated',
      message: 'cluster-proxy add-on is available.',
    });
    expect(cond(input({ lease: lease(300_000) }), 'Available')).toMatchObject({
      status: 'False',
      reason: 'ManagedClusterAddOnLeaseUpdateStopped',
    });
  });
  it('ignores tunnels entirely: a lost tunnel with a fresh lease stays True', () => {
    expect(cond(input({ lease: lease(1000), tunnels: 0, tunnelDownSince: T0 - 60_000 }), 'Available').status).toBe('True');
  });
});

describe('Available, tunnel mode', () => {
  it('a tunnel down longer than the grace turns False at once, even with a fresh lease', () => {
    const c = cond(input({ mode: 'tunnel', lease: lease(1000), tunnelDownSince: T0 - 15_000 }), 'Available');
    expect(c).toMatchObject({
      status: 'False',
      reason: 'ManagedClusterAddOnLeaseUpdateStopped',
      message: expect.stringMatching(/no agent tunnel to the hub since/),
    });
    expect(c.message).toContain('since 2026-11-23T09:59:45Z');
  });
  it('a tunnel down for less than the grace: the lease decides', () => {
    expect(cond(input({ mode: 'tunnel', lease: lease(1000), tunnelDownSince: T0 - 14_999 }), 'Available').status).toBe('True');
  });
  it("a tunnel up: True at once with OCM's reason; the message says when the tunnel decided", () => {
    expect(cond(input({ mode: 'tunnel', tunnels: 1, lease: lease(1000) }), 'Available')).toMatchObject({
      status: 'True',
      reason: 'ManagedClusterAddOnLeaseUpdated',
    });
    expect(cond(input({ mode: 'tunnel', tunnels: 2, lease: lease(400_000) }), 'Available')).toMatchObject({
      status: 'True',
      reason: 'ManagedClusterAddOnLeaseUpdated',
      message: expect.stringMatching(/2 agent tunnel\(s\) connected/),
    });
    expect(cond(input({ mode: 'tunnel', tunnels: 1 }), 'Available')).toMatchObject({
      status: 'True',
      reason: 'ManagedClusterAddOnLeaseUpdated',
      message: expect.stringMatching(/1 agent tunnel\(s\) connected/),
    });
  });
});

describe('Degraded and Progressing', () => {
  it('Degraded False when all servers are held and the apiserver answers', () => {
    expect(cond(input({ report: report() }), 'Degraded')).toMatchObject({ status: 'False', reason: 'AsExpected' });
  });
  it('Degraded True with the server shortfall, and with the apiserver problem first', () => {
    expect(cond(input({ report: report({ connectedServers: 2 }) }), 'Degraded')).toMatchObject({
      status: 'True',
      reason: 'ProxyServerConnectionsMissing',
      message: 'the agent holds 2 of 3 proxy server connections.',
    });
    const both = cond(
      input({
        report: report({ connectedServers: 1, apiserverReachable: false, apiserverError: 'cannot connect to 10.0.0.1:443: ECONNREFUSED' }),
      }),
      'Degraded',
    );
    expect(both).toMatchObject({ status: 'True', reason: 'ApiserverUnreachable' });
    expect(both.message).toContain('ECONNREFUSED');
    expect(both.message).toContain('1 of 3');
  });
  it('Degraded Unknown while the agent is not available, whatever its last report said', () => {
    const gone = addonConditions(input({ mode: 'tunnel', lease: lease(1000), tunnelDownSince: T0 - 15_000, report: report() }));
    expect(gone.find((c) => c.type === 'Available')!.status).toBe('False');
    expect(gone.find((c) => c.type === 'Degraded')).toMatchObject({ status: 'Unknown', reason: 'AgentNotAvailable' });
  });
  it('Degraded Unknown without a recent report (older than 5 lease durations)', () => {
    expect(cond(input({ report: report({ receivedAt: T0 - 300_000 }) }), 'Degraded').status).toBe('Unknown');
    expect(cond(input({}), 'Degraded').status).toBe('Unknown');
  });
  it("Progressing: Installing before the agent shows up, the agent's phase while not Running, Completed after", () => {
    expect(cond(input({}), 'Progressing')).toMatchObject({ status: 'True', reason: 'Installing' });
    expect(cond(input({ lease: lease(0), report: report({ phase: 'RenewingCredentials' }) }), 'Progressing')).toMatchObject({
      status: 'True',
      reason: 'RenewingCredentials',
    });
    expect(cond(input({ lease: lease(0), report: report() }), 'Progressing')).toMatchObject({ status: 'False', reason: 'Completed' });
  });
});

describe('leaseSlackMs (tunnel mode: unchanged renewals are written only every so often)', () => {
  it("a stored lease and report older than OCM's grace but within the slack still count as renewed", () => {
    const old = {
      mode: 'tunnel' as const,
      tunnels: 1,
      lease: lease(900_000),
      report: report({ receivedAt: T0 - 900_000 }),
      leaseSlackMs: 20 * 60_000,
    };
    expect(cond(input(old), 'Available')).toMatchObject({ status: 'True', message: 'cluster-proxy add-on is available.' });
    expect(cond(input(old), 'Degraded')).toMatchObject({ status: 'False', reason: 'AsExpected' });
    expect(cond(input({ ...old, leaseSlackMs: 0 }), 'Degraded').status).toBe('Unknown');
  });
});

describe('mergeConditions', () => {
  it('moves lastTransitionTime only when the status changes and reports whether anything changed', () => {
    const t1 = new Date('2026-11-23T10:00:00Z');
    const t2 = new Date('2026-11-23T10:05:00Z');
    const first = mergeConditions(undefined, [{ type: 'Available', status: 'True', reason: 'A', message: 'm' }], t1);
    expect(first.changed).toBe(true);
    expect(mergeConditions(first.conditions, [{ type: 'Available', status: 'True', reason: 'A', message: 'm' }], t2).changed).toBe(false);
    const reworded = mergeConditions(first.conditions, [{ type: 'Available', status: 'True', reason: 'B', message: 'n' }], t2);
    expect(reworded.changed).toBe(true);
    expect(reworded.conditions[0]!.lastTransitionTime).toBe('2026-11-23T10:00:00Z');
    const flipped = mergeConditions(first.conditions, [{ type: 'Available', status: 'False', reason: 'B', message: 'n' }], t2);
    expect(flipped.conditions[0]!.lastTransitionTime).toBe('2026-11-23T10:05:00Z');
  });
});
