// The hub's routing core, independent of how clients arrive: registered agent streams, the routing
// table, and dialing a destination for a frontend.
import { GATEWAY_DESTINATION, HUB_MEMORY_BUDGET, MAX_CONNECTION_WINDOW, MemoryBudget, isGatewayHost, splitHostPort } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { AgentBackend } from './backend.js';
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
}

export class ProxyCore {
  readonly routes = new RoutingTable<AgentBackend>();
  private readonly log: Logger;
  readonly metrics: ServerMetrics;
  /** Set when the server shuts down: open connections finish, new dials are refused. */
  stopping = false;
  readonly budget: MemoryBudget;
  readonly maxConnections: number;
  readonly maxConnectionsPerClient: number;
  /** Connections pending or open, in all and per client. */
  private connections = 0;
  private readonly perClient = new Map<string, number>();

  constructor(private readonly opts: ProxyCoreOptions) {
    this.log = opts.log;
    this.metrics = opts.metrics ?? new ServerMetrics();
    this.budget = opts.budget ?? new MemoryBudget(HUB_MEMORY_BUDGET, { maxWindow: MAX_CONNECTION_WINDOW });
    this.maxConnections = opts.maxConnections ?? Number.MAX_SAFE_INTEGER;
    this.maxConnectionsPerClient = opts.maxConnectionsPerClient ?? Number.MAX_SAFE_INTEGER;
  }

  addBackend(b: AgentBackend): void {
    this.routes.add(b);
    this.metrics.tunnelConnects.inc({ transport: b.transport });
    b.whenClosed(() => {
      this.routes.remove(b);
      this.metrics.tunnelDisconnects.inc({ transport: b.transport });
    });
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
   * The HTTP gateway's dial: the reserved destination on an agent of `cluster` (picked as a dial to
   * the cluster's apiserver name would pick it). Only the gateway calls this.
   */
  dialGateway(cluster: string, frontend: Frontend): ProxiedConnection | null {
    return this.dialChecked(GATEWAY_DESTINATION, 'tcp', frontend, cluster);
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
    if (this.stopping) {
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
    });
    conn.startDial(this.opts.dialTimeoutMs);
    return conn;
  }

  /** Null when a new connection of `client` fits the limits, else which limit and what to say. */
  private admission(client: string): { limit: 'hub' | 'client'; message: string } | null {
    if (this.connections >= this.maxConnections) return { limit: 'hub', message: `this proxy server holds ${this.maxConnections} connections, its limit (--max-connections); try again later or another replica` };
    if ((this.perClient.get(client) ?? 0) >= this.maxConnectionsPerClient) return { limit: 'client', message: `${client} holds ${this.maxConnectionsPerClient} connections through this proxy server, its limit per client (--max-connections-per-client)` };
    return null;
  }

  /** Connection tables for /debug/connections and tests. */
  snapshot(): { agents: { agentID: string; cluster: string; draining: boolean; hosts: string[]; pending: number; established: ReturnType<AgentBackend['summary']>['established'] }[] } {
    return {
      agents: this.routes.backends().map((b) => ({ agentID: b.agentID, cluster: b.cluster, draining: b.draining, hosts: b.hosts, ...b.summary() })),
    };
  }
}
