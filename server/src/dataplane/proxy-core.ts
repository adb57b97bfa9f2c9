// The hub's routing core, independent of how clients arrive: registered agent streams, the routing
// table, and dialing a destination for a frontend.
import {
  GATEWAY_DESTINATION,
  HUB_MEMORY_BUDGET,
  MAX_CONNECTION_WINDOW,
  MemoryBudget,
  isGatewayHost,
  splitHostPort,
  type DirectionUsage,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { AgentWaits, DEFAULT_AGENT_WAIT_MS, type AgentWait } from './agent-wait.js';
import type { AgentBackend } from './backend.js';
import { ServerMetrics } from './metrics.js';
import type { Frontend } from './frontend.js';
import { ProxiedConnection } from './proxied-connection.js';
import { RoutingTable } from './routing.js';

export interface ProxyCoreOptions {
  /** Server-side deadline for every pending dial. */
  dialTimeoutMs: number;
  log: Logger;
  /** Where the core's counters go (default: a registry of its own). */
  metrics?: ServerMetrics;
  /** What the hub holds on behalf of peers (default: HUB_MEMORY_BUDGET). */
  budget?: MemoryBudget;
  /** Connections (pending or open) the hub holds at most; more dials are refused with `limit`. */
  maxConnections?: number;
  /** The same per client identity (certificate or token name). */
  maxConnectionsPerClient?: number;
  /** How long a dial waits for an agent of its cluster that another replica has (agent-wait.ts); 0: never. */
  agentWaitMs?: number;
  /** Dials waiting so at once at most (default: maxConnections). */
  maxWaitingDials?: number;
  /** Close a connection whose bytes could not move one way for this long (ProxiedConnection.stall); 0: never. */
  stallTimeoutMs?: number;
}

/** How often connections are checked against the stall timeout: a quarter of it, within these bounds. */
const STALL_SWEEP_MIN_MS = 100;
const STALL_SWEEP_MAX_MS = 5000;

export class ProxyCore {
  readonly routes = new RoutingTable<AgentBackend>();
  private readonly log: Logger;
  readonly metrics: ServerMetrics;
  /** Set by stop(): open connections finish, new dials are refused. */
  private stopping_ = false;
  /** Dials waiting for an agent to connect to this replica. */
  readonly agentWaits: AgentWaits;
  readonly budget: MemoryBudget;
  readonly maxConnections: number;
  readonly maxConnectionsPerClient: number;
  /** Connections pending or open, in all and per client. */
  private connections = 0;
  private readonly perClient = new Map<string, number>();
  /** Checks for stalled connections; runs only while the stall policy is on and connections exist. */
  private stallSweep: NodeJS.Timeout | null = null;

  constructor(private readonly opts: ProxyCoreOptions) {
    this.log = opts.log;
    this.metrics = opts.metrics ?? new ServerMetrics();
    this.budget = opts.budget ?? new MemoryBudget(HUB_MEMORY_BUDGET, { maxWindow: MAX_CONNECTION_WINDOW });
    this.maxConnections = opts.maxConnections ?? Number.MAX_SAFE_INTEGER;
    this.maxConnectionsPerClient = opts.maxConnectionsPerClient ?? Number.MAX_SAFE_INTEGER;
    this.agentWaits = new AgentWaits({
      waitMs: opts.agentWaitMs ?? DEFAULT_AGENT_WAIT_MS,
      maxWaiting: opts.maxWaitingDials ?? this.maxConnections,
      routable: (address) => 'backend' in this.routes.route(address),
      metrics: this.metrics,
      log: this.log,
    });
  }

  get stopping(): boolean {
    return this.stopping_;
  }

  /** The server shuts down: new dials are refused, dials waiting for an agent fail now. */
  stop(): void {
    this.stopping_ = true;
    this.agentWaits.stop();
    this.stopStallSweep();
  }

  addBackend(b: AgentBackend): void {
    this.routes.add(b);
    this.metrics.tunnelConnects.inc({ transport: b.transport });
    this.agentWaits.agentConnected(b);
    b.whenClosed(() => {
      this.routes.remove(b);
      this.metrics.tunnelDisconnects.inc({ transport: b.transport });
    });
  }

  /**
   * Before dial(): null means dial now. Otherwise no agent here serves `address` yet but another replica
   * holds a tunnel to its cluster: `ready` runs when one connects here (then dial() in the same turn),
   * or the frontend hears dialFailed when none does in time or the server stops. A frontend whose
   * client goes away cancels the wait.
   */
  awaitAgent(address: string, protocol: string, frontend: Frontend, ready: () => void): AgentWait | null {
    // What dial() refuses at once is refused at once: no wait for a dial that cannot succeed.
    if (protocol !== 'tcp' || this.stopping_ || this.admission(frontend.client)) return null;
    return this.agentWaits.wait(address, frontend, ready);
  }

  /** Starts a dial; the frontend hears the outcome through dialSucceeded/dialFailed. */
  dial(address: string, protocol: string, frontend: Frontend): ProxiedConnection | null {
    // The agents' in-process gateway handler believes only signed identities, but no client but the
    // hub's own gateway (dialGateway) may even reach it (docs/gateway.md).
    const hp = splitHostPort(address);
    if (hp && isGatewayHost(hp.host)) {
      this.metrics.dialFailure('bad_request');
      frontend.dialFailed('forbidden', `${address} is reserved for the hub's HTTP gateway`);
      return null;
    }
    return this.dialChecked(address, protocol, frontend, null);
  }

  /**
   * The HTTP gateway's dial: the reserved destination (or, for the proxy-service form, a Service's
   * `name.ns.svc:port`, which the agent's own allowlist still checks) on an agent of `cluster`, picked
   * as a dial to the cluster's apiserver name would pick it. Only the gateway calls this.
   */
  dialGateway(cluster: string, frontend: Frontend, address: string = GATEWAY_DESTINATION): ProxiedConnection | null {
    return this.dialChecked(address, 'tcp', frontend, cluster);
  }

  /** Whether an agent of `cluster` is registered (draining or not). */
  hasCluster(cluster: string): boolean {
    return this.routes.backends().some((b) => b.cluster === cluster);
  }

  private dialChecked(address: string, protocol: string, frontend: Frontend, gatewayCluster: string | null): ProxiedConnection | null {
    if (protocol !== 'tcp') {
      this.metrics.dialFailure('bad_request');
      frontend.dialFailed('endpoint', `protocol "${protocol}" is not supported, only tcp`);
      return null;
    }
    if (this.stopping_) {
      this.metrics.routeFailure('draining');
      frontend.dialFailed('draining', `this proxy server is shutting down; dial ${address} through another replica`);
      return null;
    }
    const full = this.admission(frontend.client);
    if (full) {
      this.metrics.admissionRefusals.inc({ limit: full.limit });
      frontend.dialFailed('limit', full.message);
      return null;
    }
    // The gateway routes by the cluster's own name (every agent registers it) and checks the result.
    const r = this.routes.route(gatewayCluster === null ? address : `${gatewayCluster}:443`);
    if ('backend' in r && gatewayCluster !== null && r.backend.cluster !== gatewayCluster) {
      this.metrics.routeFailure('no_agent');
      frontend.dialFailed('no_agent', `no agent of cluster ${gatewayCluster} is connected`);
      return null;
    }
    if (!('backend' in r)) {
      this.log.info({ address, reason: r.reason }, r.message);
      this.metrics.routeFailure(r.reason);
      frontend.dialFailed(r.reason, r.message);
      return null;
    }
    const client = frontend.client;
    this.connections++;
    this.perClient.set(client, (this.perClient.get(client) ?? 0) + 1);
    const conn = new ProxiedConnection(r.backend, frontend, r.backend.newDialID(), address, r.backend.logger, () => {
      this.connections--;
      const n = (this.perClient.get(client) ?? 1) - 1;
      if (n > 0) this.perClient.set(client, n);
      else this.perClient.delete(client);
      if (this.connections === 0) this.stopStallSweep();
    });
    conn.startDial(this.opts.dialTimeoutMs);
    this.startStallSweep();
    return conn;
  }

  private startStallSweep(): void {
    const timeout = this.opts.stallTimeoutMs ?? 0;
    if (timeout <= 0 || this.stallSweep || this.stopping_) return;
    const every = Math.min(STALL_SWEEP_MAX_MS, Math.max(STALL_SWEEP_MIN_MS, Math.floor(timeout / 4)));
    this.stallSweep = setInterval(() => {
      const now = Date.now();
      for (const conn of this.establishedConnections()) {
        const stall = conn.stall(now);
        if (stall && stall.ms >= timeout) conn.closeStalled(stall.direction, stall.ms);
      }
    }, every);
    this.stallSweep.unref();
  }

  /** Every established connection, over all agent streams. */
  private *establishedConnections(): Generator<ProxiedConnection> {
    for (const backend of this.routes.backends()) yield* backend.establishedConnections();
  }

  private stopStallSweep(): void {
    if (this.stallSweep) clearInterval(this.stallSweep);
    this.stallSweep = null;
  }

  /** Null when a new connection of `client` fits the limits, else which limit and what to say. */
  private admission(client: string): { limit: 'hub' | 'client'; message: string } | null {
    if (this.connections >= this.maxConnections)
      return {
        limit: 'hub',
        message: `this proxy server holds ${this.maxConnections} connections, its limit (--max-connections); try again later or another replica`,
      };
    if ((this.perClient.get(client) ?? 0) >= this.maxConnectionsPerClient)
      return {
        limit: 'client',
        message: `${client} holds ${this.maxConnectionsPerClient} connections through this proxy server, its limit per client (--max-connections-per-client)`,
      };
    return null;
  }

  /**
   * The budget's figures per direction, to_agent's held including the client bytes frontends hold for
   * their connections (Node's buffers of paused sockets and HTTP/2 streams, which the budget does not see).
   */
  memoryByDirection(): DirectionUsage[] {
    let inFrontends = 0;
    for (const conn of this.establishedConnections()) inFrontends += conn.frontend.heldBytes?.() ?? 0;
    const usage = this.budget.usageByDirection();
    if (inFrontends === 0) return usage;
    const toAgent = usage.find((u) => u.direction === 'to_agent');
    if (toAgent) toAgent.buffered += inFrontends;
    else usage.push({ direction: 'to_agent', committed: 0, buffered: inFrontends });
    return usage;
  }

  /** Connection tables for /debug/connections and tests. */
  snapshot(): {
    agents: {
      agentID: string;
      cluster: string;
      draining: boolean;
      hosts: string[];
      pending: number;
      established: ReturnType<AgentBackend['summary']>['established'];
    }[];
  } {
    return {
      agents: this.routes
        .backends()
        .map((b) => ({ agentID: b.agentID, cluster: b.cluster, draining: b.draining, hosts: b.hosts, ...b.summary() })),
    };
  }
}
