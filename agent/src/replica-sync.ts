// Asks the hub for its live replicas (GET /v1/replicas) every interval while the agent holds a
// tunnel, and hands the answer to the agent, which then holds exactly one tunnel per live replica.
// A hub without the endpoint (an ANP server, 404) leaves the agent on ANP's serverCount header.
import type { Logger } from 'pino';
import type { Agent } from './agent.js';
import { HubRequestError, hubRequest, type HubClientOptions } from './hub-client.js';

export interface ReplicaSyncOptions {
  agent: Agent;
  hub: Omit<HubClientOptions, 'cert' | 'key' | 'caCert'>;
  intervalMs: number;
  log: Logger;
}

export class ReplicaSync {
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  private running = false;
  private unsupported = false;
  /** The hub's syncIntervalSeconds (it stretches the interval so a large fleet's syncs stay within its budget). */
  private hintMs = 0;

  constructor(private readonly opts: ReplicaSyncOptions) {}

  start(): void {
    this.schedule();
  }

  /** No sync runs and none is scheduled: stopped, or off for good (a hub without the endpoint). */
  get idle(): boolean {
    return this.timer === null && !this.running;
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private schedule(): void {
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
    const { agent } = this.opts;
    if (agent.connectedServers === 0) return;
    const started = performance.now();
    const seconds = (): number => (performance.now() - started) / 1000;
    try {
      const creds = agent.currentCredentials;
      const answer = (await hubRequest(
        { ...this.opts.hub, caCert: agent.currentTrust, cert: creds.cert, key: creds.key, sessions: agent.hubSessions },
        'GET',
        '/v1/replicas',
      )) as { serverCount?: unknown; replicas?: unknown; syncIntervalSeconds?: unknown; reconnectSpreadSeconds?: unknown };
      const hint = answer?.syncIntervalSeconds;
      // At most an hour, whatever a hub says.
      this.hintMs = typeof hint === 'number' && Number.isFinite(hint) && hint > 0 ? Math.min(hint, 3600) * 1000 : 0;
      const spread = answer?.reconnectSpreadSeconds;
      agent.setReconnectSpread(typeof spread === 'number' ? spread * 1000 : 0);
      const ids = Array.isArray(answer?.replicas)
        ? answer.replicas.map((r) => (r as { serverID?: unknown }).serverID).filter((x): x is string => typeof x === 'string')
        : null;
      agent.metrics.leaseList(seconds(), 200);
      if (!ids || typeof answer.serverCount !== 'number') throw new Error('hub sent a replica list without serverCount/replicas');
      agent.setReplicas(ids, answer.serverCount);
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
}
