// The agent: keeps one Connect stream per proxy-server replica (reached through one address, usually
// a load balancer), reconnects with backoff, and drains on shutdown.
import { X509Certificate, randomUUID } from 'node:crypto';
import { clusterHostNames, formatIdentifiers, emptyIdentifiers, splitHostPort, DEFAULT_CONNECTION_WINDOW, type AgentIdentifiers } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { Backoff } from './backoff.js';
import { MuxUnsupportedError } from '@cluster-proxy/proto';
import type { AgentTransport, EgressOptions } from './links.js';
import { proxyFromEnvironment, redactProxyUrl } from './no-proxy.js';
import { ServerConnection, type ConnectionSummary } from './server-connection.js';
import { TargetDialer } from './target-dialer.js';

export interface AgentOptions {
  cluster: string;
  /** Install namespace; the agent registers `<cluster>.<namespace>` too (SPEC §4). */
  namespace: string;
  /** host:port of the hub's agent listener. */
  hubAddress: string;
  /** PEM contents. */
  caCert: Buffer;
  cert: Buffer;
  key: Buffer;
  /** TLS server name to verify instead of the address host. */
  serverName?: string;
  /** 'auto' (default): our framed transport, or gRPC when the hub is an ANP server. */
  transport?: AgentTransport | 'auto';
  apiserver: string;
  allow: string[];
  agentID?: string;
  /** Extra identifiers beyond the cluster's own names (the hub must have granted them). */
  extraIdentifiers?: Partial<AgentIdentifiers>;
  dialTimeoutMs?: number;
  window?: number;
  /** How long open connections may finish after SIGTERM before the agent exits. */
  drainGraceMs?: number;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  keepaliveTimeMs?: number;
  keepaliveTimeoutMs?: number;
  /** Where HTTPS_PROXY / NO_PROXY come from (default: process.env). */
  env?: Readonly<Record<string, string | undefined>>;
  /** CA bundle for an https:// egress proxy. */
  proxyCa?: Buffer;
  proxyConnectTimeoutMs?: number;
  log: Logger;
}

export interface AgentStatus {
  agentID: string;
  cluster: string;
  draining: boolean;
  servers: { serverID: string; serverCount: number; transport: AgentTransport | null; credit: boolean; connections: ConnectionSummary[] }[];
}

export class Agent {
  readonly agentID: string;
  private readonly servers = new Map<string, ServerConnection>();
  private readonly dialer: TargetDialer;
  private readonly identifiers: string;
  private readonly backoff: Backoff;
  /** Starts as configured ('auto' means mux first); an ANP server turns it to 'grpc'. */
  private transport: AgentTransport;
  private connectID = 0;
  private draining = false;
  private stopped = false;
  private timer: NodeJS.Timeout | null = null;
  private attempt: ServerConnection | null = null;
  private knownServerCount = 1;
  private egress: EgressOptions | undefined;
  private lastError = '';

  constructor(private readonly opts: AgentOptions) {
    this.agentID = opts.agentID ?? randomUUID();
    const names = clusterHostNames(opts.cluster, opts.namespace);
    this.dialer = new TargetDialer({ clusterNames: names, apiserver: opts.apiserver, allow: opts.allow, dialTimeoutMs: opts.dialTimeoutMs ?? 5000 });
    const ids = { ...emptyIdentifiers(), ...opts.extraIdentifiers };
    ids.host = [...names, ...(opts.extraIdentifiers?.host ?? [])];
    this.identifiers = formatIdentifiers(ids);
    this.backoff = new Backoff({ initialMs: opts.backoffInitialMs ?? 500, maxMs: opts.backoffMaxMs ?? 30_000 });
    this.transport = opts.transport === 'grpc' ? 'grpc' : 'mux';
  }

  start(): void {
    this.decideEgress();
    const problem = certificateProblem(this.opts.cert);
    if (problem) this.opts.log.error(`agent client certificate ${problem}; the hub will refuse it`);
    this.opts.log.info({ agentID: this.agentID, cluster: this.opts.cluster, hub: this.opts.hubAddress, identifiers: this.identifiers }, 'agent starting');
    this.schedule(0);
  }

  status(): AgentStatus {
    return {
      agentID: this.agentID,
      cluster: this.opts.cluster,
      draining: this.draining,
      servers: [...this.servers.values()].map((s) => ({ serverID: s.serverID, serverCount: s.serverCount, transport: s.transport, credit: s.credit, connections: s.summary() })),
    };
  }

  /** Number of replicas we hold a working stream to. */
  get connectedServers(): number {
    return this.servers.size;
  }

  get openConnections(): number {
    let n = 0;
    for (const s of this.servers.values()) n += s.connectionCount;
    return n;
  }

  get lastConnectError(): string {
    return this.lastError;
  }

  /**
   * SIGTERM: send DRAIN to every server, refuse new dials, let open connections finish for at most
   * `drainGraceMs`, then close. Resolves when the agent has stopped.
   */
  async drain(): Promise<void> {
    if (this.draining) return;
    this.draining = true;
    this.clearTimer();
    for (const s of this.servers.values()) s.sendDrain();
    const grace = this.opts.drainGraceMs ?? 30_000;
    this.opts.log.info({ openConnections: this.openConnections, graceMs: grace }, 'draining');
    const deadline = Date.now() + grace;
    while (this.openConnections > 0 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 100));
    }
    if (this.openConnections > 0) this.opts.log.warn({ openConnections: this.openConnections }, 'drain grace period over, closing remaining connections');
    this.stop();
  }

  stop(): void {
    this.stopped = true;
    this.clearTimer();
    this.attempt?.close();
    for (const s of [...this.servers.values()]) s.close();
    this.servers.clear();
  }

  /** HTTPS_PROXY / NO_PROXY with Go's rules, decided once and logged (without the password). */
  private decideEgress(): void {
    const hp = splitHostPort(this.opts.hubAddress);
    if (!hp) return;
    const d = proxyFromEnvironment(this.opts.env ?? process.env, hp.host, hp.port, 'https');
    this.egress = d.proxy ? { proxy: d.proxy, ca: this.opts.proxyCa, connectTimeoutMs: this.opts.proxyConnectTimeoutMs ?? 10_000 } : undefined;
    this.opts.log.info({ hub: this.opts.hubAddress, decision: d.decision, variable: d.variable, noProxyVariable: d.noProxyVariable, entry: d.entry, proxy: d.proxy ? redactProxyUrl(d.proxy) : null }, `egress: ${d.reason}`);
    if (d.proxy && d.proxy.protocol !== 'http:' && d.proxy.protocol !== 'https:') {
      this.opts.log.error({ proxy: redactProxyUrl(d.proxy) }, `egress proxy scheme "${d.proxy.protocol}" is not supported (only http:// and https://); fix ${d.variable}`);
    }
    if (this.opts.proxyCa && d.proxy?.protocol !== 'https:') this.opts.log.warn('--proxy-ca is ignored: no https:// egress proxy is in use');
  }

  private clearTimer(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private schedule(delayMs: number): void {
    if (this.stopped || this.draining) return;
    this.clearTimer();
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.connectOnce();
    }, delayMs);
  }

  /** One attempt to add a server stream; then decides when to try again. */
  private async connectOnce(): Promise<void> {
    if (this.stopped || this.draining || this.attempt) return;
    if (this.servers.size >= this.knownServerCount) return; // full set; a loss reschedules
    const conn = new ServerConnection({
      address: this.opts.hubAddress,
      caCert: this.opts.caCert,
      cert: this.opts.cert,
      key: this.opts.key,
      serverName: this.opts.serverName,
      transport: this.transport,
      egress: this.egress,
      agentID: this.agentID,
      identifiers: this.identifiers,
      window: this.opts.window ?? DEFAULT_CONNECTION_WINDOW,
      dialer: this.dialer,
      log: this.opts.log,
      isDraining: () => this.draining,
      nextConnectID: () => ++this.connectID,
      headerTimeoutMs: 15_000,
      keepaliveTimeMs: this.opts.keepaliveTimeMs ?? 15_000,
      keepaliveTimeoutMs: this.opts.keepaliveTimeoutMs ?? 10_000,
    });
    this.attempt = conn;
    try {
      await conn.ready();
    } catch (err) {
      this.attempt = null;
      if (err instanceof MuxUnsupportedError && this.opts.transport !== 'mux') {
        // An ANP server: remember, and speak gRPC to it from now on.
        this.opts.log.info({ hub: this.opts.hubAddress }, `${err.message}; using gRPC (AgentService.Connect)`);
        this.transport = 'grpc';
        this.schedule(0);
        return;
      }
      const problem = certificateProblem(this.opts.cert);
      const message = `${(err as Error).message}${problem ? ` (our client certificate ${problem})` : ''}`;
      const delay = this.backoff.next();
      // Log each distinct failure at warn, repeats at debug, so a hub outage does not flood logs.
      if (message !== this.lastError) this.opts.log.warn({ hub: this.opts.hubAddress, retryInMs: delay }, `cannot connect to hub: ${message}`);
      else this.opts.log.debug({ retryInMs: delay }, `cannot connect to hub: ${message}`);
      this.lastError = message;
      this.schedule(delay);
      return;
    }
    this.attempt = null;
    if (this.stopped || this.draining) {
      conn.close();
      return;
    }
    this.knownServerCount = conn.serverCount;
    if (this.servers.has(conn.serverID)) {
      // The load balancer sent us to a replica we already hold; ANP closes the duplicate too.
      this.opts.log.debug({ serverID: conn.serverID }, 'duplicate server connection closed');
      conn.close();
      this.schedule(this.backoff.next());
      return;
    }
    this.backoff.reset();
    this.lastError = '';
    this.servers.set(conn.serverID, conn);
    this.opts.log.info({ serverID: conn.serverID, serverCount: conn.serverCount, transport: conn.transport, credit: conn.credit, halfClose: conn.halfClose }, 'connected to proxy server');
    conn.once('closed', (err: Error | null) => {
      this.servers.delete(conn.serverID);
      if (!this.stopped && !this.draining) this.opts.log.warn({ serverID: conn.serverID, err: err?.message }, 'lost connection to proxy server');
      this.schedule(this.backoff.next());
    });
    if (this.servers.size < this.knownServerCount) this.schedule(this.backoff.next());
  }
}

/** "expired on …" / "is not valid before …" / null: the hub's TLS refusal does not say why. */
function certificateProblem(pem: Buffer): string | null {
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(pem);
  } catch {
    return 'cannot be parsed';
  }
  const now = Date.now();
  if (now > Date.parse(cert.validTo)) return `expired on ${new Date(cert.validTo).toISOString()}`;
  if (now < Date.parse(cert.validFrom)) return `is not valid before ${new Date(cert.validFrom).toISOString()}`;
  return null;
}
