// The hub's routing core, independent of how clients arrive: registered agent streams, the routing
// table, and dialing a destination for a frontend.
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
}

export class ProxyCore {
  readonly routes = new RoutingTable<AgentBackend>();
  private readonly log: Logger;
  readonly metrics: ServerMetrics;
  /** Set when the server shuts down: open connections finish, new dials are refused. */
  stopping = false;

  constructor(private readonly opts: ProxyCoreOptions) {
    this.log = opts.log;
    this.metrics = opts.metrics ?? new ServerMetrics();
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
    const r = this.routes.route(address);
    if (!('backend' in r)) {
      this.log.info({ address, reason: r.reason }, r.message);
      this.metrics.routeFailure(r.reason);
      frontend.dialFailed(r.reason, r.message);
      return null;
    }
    const conn = new ProxiedConnection(r.backend, frontend, r.backend.newDialID(), address, r.backend.logger);
    conn.startDial(this.opts.dialTimeoutMs);
    return conn;
  }

  /** Connection tables for /debug/connections and tests. */
  snapshot(): { agents: { agentID: string; cluster: string; draining: boolean; hosts: string[]; pending: number; established: ReturnType<AgentBackend['summary']>['established'] }[] } {
    return {
      agents: this.routes.backends().map((b) => ({ agentID: b.agentID, cluster: b.cluster, draining: b.draining, hosts: b.hosts, ...b.summary() })),
    };
  }
}
