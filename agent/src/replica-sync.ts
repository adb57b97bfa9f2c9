// Asks the hub for its live replicas every interval while the agent holds a tunnel, and hands the answer
// to the agent, which then holds exactly one tunnel per live replica. Where the agent renews a lease and
// the hub answers renewals with the list (`replicas`), a renewal is the request: one TLS connection to the
// hub per interval instead of two. Otherwise it asks `GET /v1/replicas`; a hub without the endpoint (an
// ANP server, 404) leaves the agent on ANP's serverCount header.
import type { Logger } from 'pino';
import type { Agent } from './agent.js';
import { HubRequestError, hubRequest, type HubClientOptions } from './hub-client.js';
import type { LeaseRenewer } from './lease.js';

export interface ReplicaSyncOptions {
  agent: Agent;
  hub: Omit<HubClientOptions, 'cert' | 'key' | 'caCert'>;
  intervalMs: number;
  /** The agent's lease renewer, if it has one: its renewals carry the list where the hub sends it with them. */
  lease?: Pick<LeaseRenewer, 'renewNow' | 'onAnswer'>;
  log: Logger;
}

export class ReplicaSync {
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  private running = false;
  private unsupported = false;
  /** The hub's syncIntervalSeconds (it stretches the interval so a large fleet's syncs stay within its budget). */
  private hintMs = 0;
  /** False once the hub answered a renewal without the list (an older hub): ask it directly from then on. */
  private viaLease = true;
  private unsubscribe: (() => void) | null = null;

  constructor(private readonly opts: ReplicaSyncOptions) {}

  start(): void {
    this.unsubscribe = this.opts.lease?.onAnswer((answer) => this.fromRenewal(answer)) ?? null;
    this.schedule();
  }

  /** No sync runs and none is scheduled: stopped, or off for good (a hub without the endpoint). */
  get idle(): boolean {
    return this.timer === null && !this.running;
  }

  stop(): void {
    this.stopped = true;
    this.unsubscribe?.();
    this.unsubscribe = null;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  /** A renewal's answer: a list in it counts as this interval's sync (the next one is a whole interval later). */
  private fromRenewal(answer: Record<string, unknown>): void {
    if (this.stopped || answer['replicas'] === undefined || !this.apply(answer['replicas'])) return;
    if (!this.running) this.schedule();
  }

  private schedule(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (this.stopped || this.unsupported) return;
    // Stretched by the hub's hint, with ±10 % jitter so a fleet that started together drifts apart.
    const ms = Math.max(this.opts.intervalMs, this.hintMs) * (0.9 + Math.random() * 0.2);
    this.timer = setTimeout(() => {
      this.timer = null;
      this.running = true;
      void this.sync().finally(() => {
        this.running = false;
        this.schedule();
      });
    }, ms);
  }

  private async sync(): Promise<void> {
    const { agent, lease } = this.opts;
    if (agent.connectedServers === 0) return;
    if (lease && this.viaLease) {
      const answer = await lease.renewNow();
      // Failed: the next interval tries again. With the list: fromRenewal took it.
      if (answer === null || (answer !== undefined && answer['replicas'] !== undefined)) return;
      if (answer !== undefined) {
        this.viaLease = false;
        this.opts.log.debug('the hub answers renewals without the replica list; asking for it directly');
      }
    }
    const started = performance.now();
    const seconds = (): number => (performance.now() - started) / 1000;
    try {
      const creds = agent.currentCredentials;
      const answer = await hubRequest(
        { ...this.opts.hub, caCert: agent.currentTrust, cert: creds.cert, key: creds.key, sessions: agent.hubSessions },
        'GET',
        '/v1/replicas',
      );
      agent.metrics.leaseList(seconds(), 200);
      if (!this.apply(answer)) throw new Error('hub sent a replica list without serverCount/replicas');
    } catch (err) {
      // As ANP's lease lists: a failure counts with the status it came with (a network error has none).
      if (err instanceof HubRequestError) agent.metrics.leaseList(seconds(), err.status);
      if (err instanceof HubRequestError && err.status === 404) {
        this.unsupported = true;
        this.opts.log.info('hub publishes no replica list (an ANP server?); following its serverCount header only');
        return;
      }
      this.opts.log.debug({ err: (err as Error).message }, 'replica sync failed; retrying next interval');
    }
  }

  /** Takes a replica answer (`GET /v1/replicas`'s body, or a renewal's `replicas`); false if it is not one. */
  private apply(raw: unknown): boolean {
    const answer = (raw ?? {}) as {
      serverCount?: unknown;
      replicas?: unknown;
      syncIntervalSeconds?: unknown;
      reconnectSpreadSeconds?: unknown;
    };
    const ids = Array.isArray(answer.replicas)
      ? answer.replicas.map((r) => (r as { serverID?: unknown } | null)?.serverID).filter((x): x is string => typeof x === 'string')
      : null;
    if (!ids || typeof answer.serverCount !== 'number') return false;
    const hint = answer.syncIntervalSeconds;
    // At most an hour, whatever a hub says.
    this.hintMs = typeof hint === 'number' && Number.isFinite(hint) && hint > 0 ? Math.min(hint, 3600) * 1000 : 0;
    const spread = answer.reconnectSpreadSeconds;
    this.opts.agent.setReconnectSpread(typeof spread === 'number' ? spread * 1000 : 0);
    this.opts.agent.setReplicas(ids, answer.serverCount);
    return true;
  }
}
