// The ManagedClusterAddOn conditions, as a pure function of what the hub knows about one cluster:
// its lease (OCM's rule: available while now < renewTime + 5 × leaseDurationSeconds), the tunnels
// this hub sees (in 'tunnel' mode a loss or a recovery shows within the configured window instead of
// OCM's ~5 minutes), and the agent's latest health report (Degraded, Progressing).
import type { AgentHealthReport } from '@cluster-proxy/proto';
import type { Condition, Lease } from '../store/objects.js';
import { leaseHeld } from '../fleet/lease.js';

/** OCM's grace: a lease counts as renewed for 5 lease durations. */
export const LEASE_GRACE_FACTOR = 5;

export interface AgentReport extends AgentHealthReport {
  /** When the hub received it (ms since epoch). */
  receivedAt: number;
}

export interface ClusterHealthInput {
  lease: Lease | null;
  /** 'tunnel': also the hub's own view of the tunnels; 'lease': OCM's timing only. */
  mode: 'tunnel' | 'lease';
  /** Agents of this cluster connected to this hub now. */
  tunnels: number;
  /** Since when there has been no tunnel (ms since epoch), null while one is up or none was ever seen. */
  tunnelDownSince: number | null;
  /** A tunnel loss shows after this long without one (half the promised window). */
  tunnelLossGraceMs: number;
  report: AgentReport | null;
  now: number;
  /**
   * How much older than OCM's rule a stored lease and its report may be and still count as renewed
   * (default 0): in 'tunnel' mode the hub writes a renewal that changes nothing only every so often.
   */
  leaseSlackMs?: number;
}

export type ConditionSpec = Omit<Condition, 'lastTransitionTime'>;

/** Our reason for Available Unknown (no lease yet), as OCM's Lease mode says it. */
export const LEASE_NOT_FOUND_REASON = 'ManagedClusterAddOnLeaseNotFound';

export function addonConditions(input: ClusterHealthInput): ConditionSpec[] {
  const a = available(input);
  // An agent that is gone cannot be degraded or fine: its last report describes the past.
  const d: ConditionSpec =
    a.status === 'False'
      ? {
          type: 'Degraded',
          status: 'Unknown',
          reason: 'AgentNotAvailable',
          message: 'the agent is not available; see the Available condition.',
        }
      : degraded(input);
  return [a, d, progressing(input)];
}

function leaseFresh(lease: Lease, now: number, slackMs = 0): boolean {
  return leaseHeld(lease, now - slackMs, { defaultDurationS: 60, graceFactor: LEASE_GRACE_FACTOR });
}

function available(i: ClusterHealthInput): ConditionSpec {
  const ok = {
    type: 'Available',
    status: 'True',
    reason: 'ManagedClusterAddOnLeaseUpdated',
    message: 'cluster-proxy add-on is available.',
  } as const;
  if (i.mode === 'tunnel') {
    if (i.tunnels > 0) {
      if (i.lease && leaseFresh(i.lease, i.now, i.leaseSlackMs)) return ok;
      // OCM's reasons only (contract §6: tools key on them); the message says it is the tunnel that decided.
      return {
        type: 'Available',
        status: 'True',
        reason: 'ManagedClusterAddOnLeaseUpdated',
        message: `cluster-proxy add-on is available: ${i.tunnels} agent tunnel(s) connected to the hub; the lease is ${i.lease ? 'not renewed yet' : 'not created yet'}.`,
      };
    }
    if (i.tunnelDownSince !== null && i.now - i.tunnelDownSince >= i.tunnelLossGraceMs) {
      // A stable message (no running counter), so the status is written once per transition.
      const since = new Date(i.tunnelDownSince).toISOString().replace(/\.\d{3}Z$/, 'Z');
      return {
        type: 'Available',
        status: 'False',
        reason: 'ManagedClusterAddOnLeaseUpdateStopped',
        message: `cluster-proxy add-on is not available: no agent tunnel to the hub since ${since}.`,
      };
    }
  }
  if (!i.lease)
    return {
      type: 'Available',
      status: 'Unknown',
      reason: LEASE_NOT_FOUND_REASON,
      message: 'The status of cluster-proxy add-on is unknown.',
    };
  if (leaseFresh(i.lease, i.now, i.leaseSlackMs)) return ok;
  return {
    type: 'Available',
    status: 'False',
    reason: 'ManagedClusterAddOnLeaseUpdateStopped',
    message: 'cluster-proxy add-on is not available.',
  };
}

function reportFresh(i: ClusterHealthInput): AgentReport | null {
  const r = i.report;
  if (!r) return null;
  return i.now - r.receivedAt < LEASE_GRACE_FACTOR * r.leaseDurationSeconds * 1000 + (i.leaseSlackMs ?? 0) ? r : null;
}

function degraded(i: ClusterHealthInput): ConditionSpec {
  const r = reportFresh(i);
  if (!r) return { type: 'Degraded', status: 'Unknown', reason: 'NoRecentAgentReport', message: 'no recent health report from the agent.' };
  const problems: string[] = [];
  let reason = 'AsExpected';
  if (!r.apiserverReachable) {
    reason = 'ApiserverUnreachable';
    problems.push(`the agent cannot reach its apiserver${r.apiserverError ? ` (${r.apiserverError})` : ''}`);
  }
  if (r.connectedServers < r.serverCount) {
    if (reason === 'AsExpected') reason = 'ProxyServerConnectionsMissing';
    problems.push(`the agent holds ${r.connectedServers} of ${r.serverCount} proxy server connections`);
  }
  if (problems.length === 0)
    return {
      type: 'Degraded',
      status: 'False',
      reason,
      message: `the agent holds all ${r.serverCount} proxy server connection(s) and reaches its apiserver.`,
    };
  return { type: 'Degraded', status: 'True', reason, message: `${problems.join('; ')}.` };
}

function progressing(i: ClusterHealthInput): ConditionSpec {
  const r = reportFresh(i);
  if (r && r.phase !== 'Running')
    return {
      type: 'Progressing',
      status: 'True',
      reason: r.phase,
      message: `the agent is ${r.phase === 'Bootstrapping' ? 'bootstrapping its credentials' : 'renewing its credentials'}.`,
    };
  if (!i.lease && i.tunnels === 0)
    return { type: 'Progressing', status: 'True', reason: 'Installing', message: 'waiting for the agent to connect and renew its lease.' };
  return { type: 'Progressing', status: 'False', reason: 'Completed', message: 'the agent is installed and running.' };
}

/** Applies specs to existing conditions; lastTransitionTime moves only when the status changes. Returns whether anything changed. */
export function mergeConditions(
  current: Condition[] | undefined,
  specs: ConditionSpec[],
  now: Date,
): { conditions: Condition[]; changed: boolean } {
  const out: Condition[] = [...(current ?? [])];
  let changed = false;
  for (const spec of specs) {
    const idx = out.findIndex((c) => c.type === spec.type);
    const old = idx >= 0 ? out[idx] : undefined;
    if (old && old.status === spec.status && old.reason === spec.reason && old.message === spec.message) continue;
    changed = true;
    const next: Condition = {
      ...spec,
      lastTransitionTime: old && old.status === spec.status ? old.lastTransitionTime : now.toISOString().replace(/\.\d{3}Z$/, 'Z'),
    };
    if (idx >= 0) out[idx] = next;
    else out.push(next);
  }
  return { conditions: out, changed };
}
