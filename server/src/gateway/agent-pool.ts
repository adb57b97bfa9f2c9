// Keep-alive connections from the gateway to the agents' reserved destination: a request reuses an idle
// tunneled connection of its cluster (and caller) instead of dialing the agent again, which saves a
// hub↔agent round trip per request (kubectl's discovery alone is dozens of GETs). Each request still
// carries its own identity assertion, bound to its method and target, so a reused connection grants
// nothing. An idle connection closes after IDLE_MS; the connection tables drain shortly after a burst.
//
// One node:http Agent per (cluster, caller): the caller, because the hub's per-client connection limit
// counts tunneled connections by caller; an Agent with no connection left is dropped.
import { http } from '@cluster-proxy/proto';
import type { Duplex } from 'node:stream';
import type { ProxyCore } from '../dataplane/proxy-core.js';
import { TunnelSocket } from './tunnel-socket.js';
import type * as HttpTypes from 'node:http';

/** How long an idle pooled connection is kept. */
export const IDLE_MS = 4000;
/** Idle connections kept per (cluster, caller). */
const MAX_IDLE = 16;

class TunnelAgent extends http.Agent {
  constructor(
    private readonly core: ProxyCore,
    private readonly cluster: string,
    private readonly client: string,
    private readonly emptied: () => void,
  ) {
    super({ keepAlive: true, maxFreeSockets: MAX_IDLE, timeout: IDLE_MS, scheduling: 'lifo' });
  }

  /** After a response: kept for the next request unless its agent is shutting down (it then gets no new work). */
  override keepSocketAlive(socket: Duplex): boolean {
    if ((socket as TunnelSocket).agentDraining) return false;
    // node's keepSocketAlive returns whether it kept the socket (@types/node says void).
    return (super.keepSocketAlive(socket as never) as unknown as boolean | undefined) !== false;
  }

  override createConnection(_opts: unknown, oncreate: (err: Error | null, socket?: Duplex) => void): undefined {
    const socket = new TunnelSocket(this.core, this.cluster, this.client, (err, s) => (err ? oncreate(err) : oncreate(null, s)));
    socket.once('close', () =>
      setImmediate(() => {
        if (Object.keys(this.sockets).length === 0 && Object.keys(this.freeSockets).length === 0 && Object.keys(this.requests).length === 0)
          this.emptied();
      }),
    );
    return undefined; // the socket comes through oncreate, once the agent accepted the dial
  }
}

export class GatewayPool {
  private readonly agents = new Map<string, TunnelAgent>();

  constructor(private readonly core: ProxyCore) {}

  /** The pool for `cluster`'s apiserver as `client` (the caller's display name). */
  agentFor(cluster: string, client: string): HttpTypes.Agent {
    const key = `${cluster}\0${client}`;
    let agent = this.agents.get(key);
    if (!agent) {
      const made: TunnelAgent = new TunnelAgent(this.core, cluster, client, () => {
        if (this.agents.get(key) === made) this.agents.delete(key);
        made.destroy();
      });
      this.agents.set(key, (agent = made));
    }
    return agent;
  }

  /** Idle connections close now (a hub that stops); busy ones finish. */
  closeIdle(): void {
    for (const a of this.agents.values()) {
      for (const list of Object.values(a.freeSockets)) for (const s of list ?? []) s.destroy();
    }
  }

  close(): void {
    for (const a of this.agents.values()) a.destroy();
    this.agents.clear();
  }

  /** (cluster, caller) pairs with an Agent now (for tests). */
  get size(): number {
    return this.agents.size;
  }
}
