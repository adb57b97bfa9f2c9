// The agent's lease on the hub (`Lease cluster-proxy` in the cluster's namespace, OCM's addon lease),
// renewed through the hub API every lease duration — only while the agent holds at least one working
// tunnel, so a lease that stops moving means "no tunnel", as in OCM. Each renewal carries a short
// health report the hub turns into the addon's Degraded/Progressing conditions; the hub's answer may carry
// its replica list, and the replica sync then asks for that list with a renewal (renewNow).
import net from 'node:net';
import { splitHostPort, type AgentHealthReport } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import type { Agent } from './agent.js';
import { hubRequest, type HubClientOptions } from './hub-client.js';

export const AGENT_VERSION = '0.1.0';

/** What each renewal reports (the hub's Degraded/Progressing come from it). */
export type LeaseReport = AgentHealthReport;

/** The hub's answer to a renewal (a JSON object). */
export type RenewalAnswer = Record<string, unknown>;

export interface LeaseRenewerOptions {
  agent: Agent;
  hub: Omit<HubClientOptions, 'cert' | 'key'>;
  /** host:port the agent maps its cluster names to; its reachability goes into the report. */
  apiserver: string;
  leaseDurationMs: number;
  /** The hub sent a CA bundle that differs from the one in use (a CA rollover): persist it if you like (awaited before the change is logged). */
  onTrust?: (bundle: Buffer) => Promise<void> | void;
  /** The hub asks for a new certificate now (its CA changed). */
  onRenewRequested?: () => void;
  /** What the agent is doing besides running (default Running): a certificate renewal shows as Progressing on the hub. */
  phase?: () => LeaseReport['phase'];
  log: Logger;
}

export class LeaseRenewer {
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  private renewedOnce = false;
  private lastError = '';
  /** The last report the hub took, when, and how often it wants one that changes nothing (its renewIntervalSeconds). */
  private lastSent = '';
  private lastSentAt = 0;
  private unchangedEveryMs = 0;
  private sending: Promise<RenewalAnswer | null> | null = null;
  private readonly listeners = new Set<(answer: RenewalAnswer) => void>();

  constructor(private readonly opts: LeaseRenewerOptions) {}

  /** Calls `listener` with every renewal's answer (ReplicaSync reads the replica list in it); returns the unsubscribe. */
  onAnswer(listener: (answer: RenewalAnswer) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /**
   * A renewal now, whatever changed, for its answer (ReplicaSync asks for the replica list so): the answer, null if
   * it failed, undefined where it is not worth a request: before the first renewal, with no tunnel up, or when the
   * hub writes every renewal to its store (it answered renewIntervalSeconds 0, `--health-mode lease`).
   */
  async renewNow(): Promise<RenewalAnswer | null | undefined> {
    if (this.stopped || !this.renewedOnce || this.unchangedEveryMs === 0 || this.opts.agent.connectedServers === 0) return undefined;
    return this.send(await this.report());
  }

  start(): void {
    this.schedule(0);
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private schedule(ms: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.tick();
    }, ms);
  }

  private async tick(): Promise<void> {
    const { agent } = this.opts;
    // Until the first renewal, look often, so the addon turns Available soon after the tunnel is up.
    const period = this.renewedOnce ? this.opts.leaseDurationMs : Math.min(500, this.opts.leaseDurationMs);
    if (agent.connectedServers === 0) return this.schedule(period);
    const report = await this.report();
    // A big fleet's hub wants unchanged reports less often than every lease duration (it sees the agent
    // through its tunnels); a change goes out at the next tick, as before.
    const unchanged = JSON.stringify(report) === this.lastSent;
    if (this.renewedOnce && unchanged && Date.now() - this.lastSentAt < this.unchangedEveryMs) return this.schedule(period);
    await this.send(report);
    this.schedule(this.renewedOnce ? this.opts.leaseDurationMs : period);
  }

  private async report(): Promise<LeaseReport> {
    const { agent } = this.opts;
    const reach = await apiserverReachable(this.opts.apiserver);
    return {
      agentID: agent.agentID,
      leaseDurationSeconds: Math.max(1, Math.round(this.opts.leaseDurationMs / 1000)),
      connectedServers: agent.connectedServers,
      serverCount: agent.serverCount,
      apiserverReachable: reach === null,
      ...(reach ? { apiserverError: reach } : {}),
      version: AGENT_VERSION,
      phase: this.opts.phase?.() ?? 'Running',
    };
  }

  /** One renewal at a time: a second caller while one is under way gets that one's answer. */
  private send(report: LeaseReport): Promise<RenewalAnswer | null> {
    this.sending ??= this.renew(report).finally(() => {
      this.sending = null;
    });
    return this.sending;
  }

  private async renew(report: LeaseReport): Promise<RenewalAnswer | null> {
    const { agent } = this.opts;
    try {
      const creds = agent.currentCredentials;
      const raw = await hubRequest(
        { ...this.opts.hub, caCert: agent.currentTrust, cert: creds.cert, key: creds.key, sessions: agent.hubSessions },
        'POST',
        '/v1/lease',
        report,
      );
      const answer: RenewalAnswer = raw !== null && typeof raw === 'object' && !Array.isArray(raw) ? (raw as RenewalAnswer) : {};
      const bundle = answer['caBundle'];
      if (typeof bundle === 'string' && bundle.includes('BEGIN CERTIFICATE') && !Buffer.from(bundle).equals(agent.currentTrust)) {
        // Came over TLS verified with the current bundle, so it is the hub speaking.
        agent.setTrust(Buffer.from(bundle));
        await this.opts.onTrust?.(Buffer.from(bundle));
        this.opts.log.info('the hub sent a new CA bundle (CA rollover); new links verify the hub with it');
      }
      if (answer['renewCertificate'] === true) this.opts.onRenewRequested?.();
      this.renewedOnce = true;
      this.lastSent = JSON.stringify(report);
      this.lastSentAt = Date.now();
      this.unchangedEveryMs = renewIntervalMs(answer);
      if (this.lastError) this.opts.log.info('lease renewed again');
      this.lastError = '';
      for (const listener of this.listeners) listener(answer);
      return answer;
    } catch (err) {
      const msg = (err as Error).message;
      if (msg !== this.lastError) this.opts.log.warn(`cannot renew the lease on the hub: ${msg}`);
      this.lastError = msg;
      return null;
    }
  }
}

/** The hub's renewIntervalSeconds in ms (0 when absent: every lease duration), at most 10 minutes whatever it says. */
export function renewIntervalMs(answer: unknown): number {
  const v = (answer as { renewIntervalSeconds?: unknown } | null)?.renewIntervalSeconds;
  return typeof v === 'number' && Number.isFinite(v) && v > 0 ? Math.min(v, 600) * 1000 : 0;
}

/** null when a TCP connection to the apiserver opens within 3 s, else why not. */
export function apiserverReachable(address: string, timeoutMs = 3000): Promise<string | null> {
  const hp = splitHostPort(address);
  if (!hp) return Promise.resolve(`apiserver address "${address}" is not HOST:PORT`);
  return new Promise((resolve) => {
    const s = net.connect({ host: hp.host, port: hp.port });
    const done = (why: string | null): void => {
      clearTimeout(timer);
      s.destroy();
      resolve(why);
    };
    const timer = setTimeout(() => done(`no connection to ${address} within ${timeoutMs} ms`), timeoutMs);
    s.once('connect', () => done(null));
    s.once('error', (err: NodeJS.ErrnoException) => done(`cannot connect to ${address}: ${err.code ?? err.message}`));
  });
}
