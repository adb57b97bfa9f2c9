// Dials that wait for an agent (contract §4). A replica that has just (re)started is ready before the
// agents of the fleet have reconnected to it: for a second or two it has no agent for a cluster that
// every other replica reaches. A dial for such a cluster (the store says another live replica holds a
// tunnel to one of its agents) waits here for one to connect to this replica, bounded in time
// (--agent-wait) and in count (--agent-wait-max-dials), instead of failing at once with "No agent
// available". A cluster no live replica holds a tunnel to fails at once, as before.
import { serviceProxyHost, splitHostPort, throttleReporter } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import type { Frontend } from './frontend.js';
import type { ServerMetrics } from './metrics.js';

/** Long enough for agents to notice a restarted replica and reconnect through the balancer; well under --dial-timeout. */
export const DEFAULT_AGENT_WAIT_MS = 5000;

/** How a wait ended, the label of `cluster_proxy_server_agent_waits_total`. */
export type AgentWaitResult = 'connected' | 'timeout' | 'cancelled' | 'shutdown' | 'full';

export interface AgentWaitOptions {
  /** Longest wait per dial; 0 turns waiting off. */
  waitMs: number;
  /** Dials waiting at once at most; one more is not held (it fails at once, as without waiting). */
  maxWaiting: number;
  /** Whether the routing table has a usable agent for `address` now. */
  routable(address: string): boolean;
  metrics: ServerMetrics;
  log: Logger;
}

/** A dial waiting for an agent; cancel() when its client gives up (no callback follows). */
export interface AgentWait {
  cancel(): void;
}

interface Waiter {
  address: string;
  /** The destination's host, lower case: an agent that registers it may serve the dial. */
  host: string;
  cluster: string;
  frontend: Frontend;
  ready: () => void;
  timer: NodeJS.Timeout;
  since: number;
}

/** `<cluster>.<namespace>`: a namespace is one DNS label (as agent-listener.ts admits such hosts). */
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const NONE: ReadonlySet<string> = new Set();

/** What agentConnected() needs of the agent that connected. */
export interface ConnectedAgent {
  readonly hosts: readonly string[];
  readonly defaultRoute: boolean;
}

/** One "too many waiting" warning per this interval at most (with the count since the last one). */
const FULL_WARNING_INTERVAL_MS = 30_000;

export class AgentWaits {
  /** By destination host: an agent's connect looks only at the dials it may serve. */
  private readonly waiters = new Map<string, Set<Waiter>>();
  private count = 0;
  private readonly warnFull: (cluster: string) => void;
  private elsewhere: () => ReadonlySet<string> = () => NONE;
  /** serviceProxyHost(cluster) → cluster, for the set it was built from. */
  private serviceHosts: { from: ReadonlySet<string>; byHost: Map<string, string> } | null = null;
  private stopped = false;

  constructor(private readonly opts: AgentWaitOptions) {
    this.warnFull = throttleReporter(FULL_WARNING_INTERVAL_MS, (n, cluster) =>
      opts.log.warn(
        { notHeld: n, waiting: this.count, max: opts.maxWaiting },
        `dials not held for an agent (the last for ${cluster}): ${opts.maxWaiting} wait already (--agent-wait-max-dials); they failed at once`,
      ),
    );
  }

  /** Where the clusters with a live agent on another replica come from (the replica registry's last store read). */
  setAgentsElsewhere(source: () => ReadonlySet<string>): void {
    this.elsewhere = source;
  }

  /** Dials waiting now. */
  get size(): number {
    return this.count;
  }

  /**
   * Null: dial now (an agent is here, the store knows of none elsewhere, waiting is off, or the cap is
   * reached); the dial then succeeds or fails as it always did. Otherwise the dial waits: `ready` runs
   * once an agent that serves `address` has connected (the caller dials then, in the same turn), or the
   * frontend hears dialFailed (no agent within the wait, or this server is shutting down).
   */
  wait(address: string, frontend: Frontend, ready: () => void): AgentWait | null {
    if (this.opts.waitMs <= 0 || this.stopped || this.opts.routable(address)) return null;
    const host = splitHostPort(address)?.host.toLowerCase();
    const cluster = host ? this.clusterWithAgentElsewhere(host) : null;
    if (!host || !cluster) return null;
    if (this.count >= this.opts.maxWaiting) {
      this.opts.metrics.agentWaits.inc({ result: 'full' });
      this.warnFull(cluster);
      return null;
    }
    const w: Waiter = {
      address,
      host,
      cluster,
      frontend,
      ready,
      since: Date.now(),
      timer: setTimeout(() => this.expire(w), this.opts.waitMs),
    };
    let set = this.waiters.get(host);
    if (!set) this.waiters.set(host, (set = new Set()));
    set.add(w);
    this.count++;
    this.opts.log.debug({ address, cluster }, 'no agent here yet; waiting for one of the cluster (other replicas hold its tunnels)');
    return { cancel: () => this.end(w, 'cancelled') };
  }

  /** An agent connected: the dials it can serve go on (those for its host names; any, for a default route). */
  agentConnected(agent: ConnectedAgent): void {
    if (this.count === 0) return;
    const candidates = agent.defaultRoute
      ? [...this.waiters.values()].flatMap((set) => [...set])
      : agent.hosts.flatMap((h) => [...(this.waiters.get(h.toLowerCase()) ?? [])]);
    for (const w of candidates) {
      // Still waiting (an earlier dial's frontend may have cancelled it), and served now.
      if (!this.waiters.get(w.host)?.has(w) || !this.opts.routable(w.address)) continue;
      this.end(w, 'connected');
      this.opts.log.debug({ address: w.address, waitedMs: Date.now() - w.since }, 'an agent of the cluster connected; dialing');
      try {
        w.ready();
      } catch (err) {
        // A frontend's bug must cost its dial, not the agent's registration that is running this.
        this.opts.log.error({ address: w.address, err: (err as Error).message }, 'dial after waiting for an agent failed');
        w.frontend.dialFailed('unknown', `dial to ${w.address} failed: ${(err as Error).message}`);
      }
    }
  }

  /** The server is shutting down: every waiting dial fails now, and none waits from here on. */
  stop(): void {
    this.stopped = true;
    for (const w of [...this.waiters.values()].flatMap((set) => [...set])) {
      this.end(w, 'shutdown');
      this.opts.metrics.dialFailure('draining');
      w.frontend.dialFailed('draining', `this proxy server is shutting down; dial ${w.address} through another replica`);
    }
  }

  private expire(w: Waiter): void {
    if (!this.waiters.get(w.host)?.has(w)) return;
    this.end(w, 'timeout');
    const message = `No agent available for ${w.address}: none of cluster ${w.cluster} connected to this proxy server within ${this.opts.waitMs} ms (other replicas had one)`;
    this.opts.log.info({ address: w.address, reason: 'no_agent' }, message);
    this.opts.metrics.dialFailure('no_agent');
    w.frontend.dialFailed('no_agent', message);
  }

  /** Out of the table, timer stopped, counted; idempotent (a cancel after the end is a no-op). */
  private end(w: Waiter, result: Exclude<AgentWaitResult, 'full'>): void {
    const set = this.waiters.get(w.host);
    if (!set?.delete(w)) return;
    if (set.size === 0) this.waiters.delete(w.host);
    this.count--;
    clearTimeout(w.timer);
    this.opts.metrics.agentWaits.inc({ result });
  }

  /** The cluster `host` names (CLUSTER, CLUSTER.NAMESPACE, or its service-proxy host) if another replica holds a tunnel to it. */
  private clusterWithAgentElsewhere(host: string): string | null {
    const clusters = this.elsewhere();
    if (clusters.size === 0) return null;
    if (clusters.has(host)) return host;
    const dot = host.indexOf('.');
    if (dot > 0 && clusters.has(host.slice(0, dot)) && DNS_LABEL.test(host.slice(dot + 1))) return host.slice(0, dot);
    if (this.serviceHosts?.from !== clusters) {
      this.serviceHosts = { from: clusters, byHost: new Map([...clusters].map((c) => [serviceProxyHost(c), c])) };
    }
    return this.serviceHosts.byHost.get(host) ?? null;
  }
}
