// The agent: keeps one Connect stream per proxy-server replica (reached through one address, usually
// a load balancer), reconnects with backoff, and drains on shutdown.
import { X509Certificate, randomUUID, type KeyObject } from 'node:crypto';
import {
  clusterHostNames,
  formatIdentifiers,
  emptyIdentifiers,
  splitHostPort,
  AGENT_MEMORY_BUDGET,
  INITIAL_CONNECTION_WINDOW,
  MAX_CONNECTION_WINDOW,
  MemoryBudget,
  throttleReporter,
  type AgentIdentifiers,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { Backoff, spreadRetryDelay } from './backoff.js';
import { GrpcCallError, GrpcStatus, MuxRefusedError, MuxUnsupportedError } from '@cluster-proxy/proto';
import type { AgentTransport, EgressOptions } from './links.js';
import { proxyFromEnvironment, redactProxyUrl } from './no-proxy.js';
import { ServerConnection, type ConnectionSummary } from './server-connection.js';
import { TargetDialer } from './target-dialer.js';
import { ImpersonatingProxy } from './gateway/impersonating-proxy.js';
import { fromKubeconfig, loadKubeRestConfig } from './kube-rest.js';
import { AgentMetrics } from './metrics.js';
import { HubSessionCache } from './hub-client.js';

/** After a duplicate (the balancer sent us to a replica we already hold), dial again after 100–600 ms. */
const DUPLICATE_RETRY_MIN_MS = 100;
const DUPLICATE_RETRY_JITTER_MS = 500;
/** A tunnel this young is kept even when the replica list lacks its server (the list may predate it). */
const NEW_TUNNEL_GRACE_MS = 5000;

export interface AgentOptions {
  cluster: string;
  /** Install namespace; the agent registers `<cluster>.<namespace>` too (contract §4). */
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
  /** Window granted to the hub per connection at first (default INITIAL_CONNECTION_WINDOW). */
  window?: number;
  /** Bytes the agent may hold on behalf of the hub, all connections together (default 64 MiB). */
  memoryBudget?: number;
  /** Connections the agent holds at most, all links together (default: the budget / the initial window). */
  maxConnections?: number;
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
  /**
   * The hub's HTTP gateway: where the apiserver and the agent's own credentials for it come from
   * (`kubeconfig`; default as kube-rest.ts finds them: $KUBECONFIG, ~/.kube/config, the service
   * account), or false to refuse the gateway's reserved destination. Default: on. `allowReserved`:
   * `system:` users and groups it impersonates all the same, by exact name (none by default).
   * `signedOnly`: believe signed identities only, announcing no CAP_GATEWAY_HMAC (as agents before it did).
   */
  gateway?: { kubeconfig?: string; allowReserved?: readonly string[]; signedOnly?: boolean } | false;
  /** Export the process metrics too (CPU, memory, fds; the CLI sets it). */
  processMetrics?: boolean;
  log: Logger;
}

/** running: links are kept to every replica; draining: DRAIN sent, no new links or dials, open
 * connections finish; stopped: every link closed. Changed only by enter(). */
export type AgentState = 'running' | 'draining' | 'stopped';

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
  /** The in-process handler behind the hub gateway's reserved destination (null: refused). */
  private readonly gateway: ImpersonatingProxy | null;
  private readonly identifiers: string;
  private readonly backoff: Backoff;
  /** Starts as configured ('auto' means mux first); an ANP server turns it to 'grpc'. */
  private transport: AgentTransport;
  private connectID = 0;
  private state: AgentState = 'running';
  private timer: NodeJS.Timeout | null = null;
  private attempt: ServerConnection | null = null;
  private knownServerCount = 1;
  private egress: EgressOptions | undefined;
  private lastError = '';
  /** The client certificate new links present; replaced on renewal (open links keep theirs). */
  private credentials: { cert: Buffer; key: Buffer };
  /** The CA bundle new links verify the hub with; the hub extends it during a CA rollover. */
  private trust: Buffer;
  /** This agent's Prometheus registry and counters (served on /metrics of the health port). */
  readonly metrics: AgentMetrics;
  /** What the agent holds on behalf of the hub, every link's connections together. */
  readonly budget: MemoryBudget;
  readonly maxConnections: number;
  /** TLS session for the hub API (lease renewals, replica syncs), resumed while the identity stays the same. */
  readonly hubSessions = new HubSessionCache();
  /** The hub's reconnect spread (its reconnectSpreadSeconds, 0 until told): see retryDelay(). */
  private reconnectSpreadMs = 0;
  /** When the last tunnel went (performance.now()): the spread of the retries that follow counts from it. */
  private lostAllAt = 0;
  /** Retries since the last tunnel went, while none is back (-1: not in that state). */
  private retriesWithoutTunnel = -1;

  constructor(private readonly opts: AgentOptions) {
    this.agentID = opts.agentID ?? randomUUID();
    this.credentials = { cert: opts.cert, key: opts.key };
    this.trust = opts.caCert;
    this.metrics = new AgentMetrics({ processMetrics: opts.processMetrics });
    const window = opts.window ?? INITIAL_CONNECTION_WINDOW;
    const limit = opts.memoryBudget ?? AGENT_MEMORY_BUDGET;
    const logThrottle = throttleReporter(30_000, (count) =>
      opts.log.warn(
        { throttled: count, budget: limit, committed: this.budget.committed },
        'memory budget is short: connection windows are not growing (destinations slower than the hub, or many connections)',
      ),
    );
    this.budget = new MemoryBudget(limit, {
      maxWindow: MAX_CONNECTION_WINDOW,
      onThrottle: (direction) => {
        this.metrics.memoryThrottled.inc();
        logThrottle(direction);
      },
    });
    this.maxConnections = opts.maxConnections ?? Math.max(1, Math.floor(limit / window));
    this.metrics.bind({
      openServerConnections: () => this.servers.size,
      knownServerCount: () => this.knownServerCount,
      openEndpointConnections: () => this.openConnections,
      memory: () => ({ limit, committed: this.budget.committed, held: this.budget.usageByDirection().reduce((n, u) => n + u.buffered, 0) }),
    });
    const names = clusterHostNames(opts.cluster, opts.namespace);
    const gw = opts.gateway ?? {};
    this.gateway =
      gw === false
        ? null
        : new ImpersonatingProxy({
            cluster: opts.cluster,
            log: opts.log,
            trust: () => this.trust,
            kube: () => (gw.kubeconfig ? fromKubeconfig(gw.kubeconfig) : loadKubeRestConfig()),
            ...(gw.allowReserved?.length ? { allowReserved: new Set(gw.allowReserved) } : {}),
          });
    const gateway = this.gateway;
    this.dialer = new TargetDialer({
      clusterNames: names,
      apiserver: opts.apiserver,
      allow: opts.allow,
      dialTimeoutMs: opts.dialTimeoutMs ?? 5000,
      ...(gateway ? { gateway: (linkKey: KeyObject | null) => gateway.connect(linkKey) } : {}),
    });
    const ids = { ...emptyIdentifiers(), ...opts.extraIdentifiers };
    ids.host = [...names, ...(opts.extraIdentifiers?.host ?? [])];
    this.identifiers = formatIdentifiers(ids);
    this.backoff = new Backoff({ initialMs: opts.backoffInitialMs ?? 500, maxMs: opts.backoffMaxMs ?? 30_000 });
    this.transport = opts.transport === 'grpc' ? 'grpc' : 'mux';
  }

  /** A renewed certificate: used by every link opened from now on. */
  setCredentials(cert: Buffer, key: Buffer): void {
    this.credentials = { cert, key };
  }

  /** A CA bundle from the hub (CA rollover): verifies the hub on links opened from now on. */
  setTrust(caCert: Buffer): void {
    this.trust = caCert;
  }

  get currentTrust(): Buffer {
    return this.trust;
  }

  /** The certificate and key the agent presents now (for the hub API: leases, renewal). */
  get currentCredentials(): { cert: Buffer; key: Buffer } {
    return this.credentials;
  }

  start(): void {
    this.decideEgress();
    const problem = certificateProblem(this.credentials.cert);
    if (problem) this.opts.log.error(`agent client certificate ${problem}; the hub will refuse it`);
    this.opts.log.info(
      { agentID: this.agentID, cluster: this.opts.cluster, hub: this.opts.hubAddress, identifiers: this.identifiers },
      'agent starting',
    );
    this.schedule(0);
  }

  status(): AgentStatus {
    return {
      agentID: this.agentID,
      cluster: this.opts.cluster,
      draining: this.state !== 'running',
      servers: [...this.servers.values()].map((s) => ({
        serverID: s.serverID,
        serverCount: s.serverCount,
        transport: s.transport,
        credit: s.credit,
        connections: s.summary(),
      })),
    };
  }

  /** Replicas the hub says there are (serverCount); the lease report compares it with connectedServers. */
  get serverCount(): number {
    return this.knownServerCount;
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
    if (this.state !== 'running') return;
    const grace = this.opts.drainGraceMs ?? 30_000;
    this.enter('draining', { openConnections: this.openConnections, graceMs: grace });
    for (const s of this.servers.values()) s.sendDrain();
    const deadline = Date.now() + grace;
    while (this.openConnections > 0 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 100));
    }
    if (this.openConnections > 0)
      this.opts.log.warn({ openConnections: this.openConnections }, 'drain grace period over, closing remaining connections');
    this.stop();
  }

  stop(): void {
    this.enter('stopped');
    this.attempt?.close();
    for (const s of [...this.servers.values()]) s.close();
    this.servers.clear();
    this.gateway?.close();
  }

  /** HTTPS_PROXY / NO_PROXY with Go's rules, decided once and logged (without the password). */
  private decideEgress(): void {
    const hp = splitHostPort(this.opts.hubAddress);
    if (!hp) return;
    const d = proxyFromEnvironment(this.opts.env ?? process.env, hp.host, hp.port, 'https');
    this.egress = d.proxy
      ? { proxy: d.proxy, ca: this.opts.proxyCa, connectTimeoutMs: this.opts.proxyConnectTimeoutMs ?? 10_000 }
      : undefined;
    this.opts.log.info(
      {
        hub: this.opts.hubAddress,
        decision: d.decision,
        variable: d.variable,
        noProxyVariable: d.noProxyVariable,
        entry: d.entry,
        proxy: d.proxy ? redactProxyUrl(d.proxy) : null,
      },
      `egress: ${d.reason}`,
    );
    if (d.proxy && d.proxy.protocol !== 'http:' && d.proxy.protocol !== 'https:') {
      this.opts.log.error(
        { proxy: redactProxyUrl(d.proxy) },
        `egress proxy scheme "${d.proxy.protocol}" is not supported (only http:// and https://); fix ${d.variable}`,
      );
    }
    if (this.opts.proxyCa && d.proxy?.protocol !== 'https:')
      this.opts.log.warn('--proxy-ca is ignored: no https:// egress proxy is in use');
  }

  /** Every change of state: the reconnect timer stops once the agent stops adding links. */
  private enter(state: AgentState, fields?: Record<string, unknown>): void {
    if (this.state === state) return;
    this.state = state;
    this.clearTimer();
    if (state === 'draining') this.opts.log.info(fields ?? {}, 'draining');
    else this.opts.log.debug('agent stopped');
  }

  /** New links and dials are made only while running. */
  private get running(): boolean {
    return this.state === 'running';
  }

  private clearTimer(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  /** When the armed timer fires (ms since the epoch). */
  private timerDue = 0;

  /** Dial again after `delayMs`, unless an attempt is already armed to start sooner. */
  private schedule(delayMs: number): void {
    if (!this.running) return;
    const due = Date.now() + delayMs;
    if (this.timer && this.timerDue <= due) return;
    this.clearTimer();
    this.timerDue = due;
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.connectOnce();
    }, delayMs);
  }

  /** One attempt to add a server stream; then decides when to try again. */
  private async connectOnce(): Promise<void> {
    if (!this.running || this.attempt) return;
    if (this.activeServers() >= this.knownServerCount) return; // full set; a loss reschedules
    const conn = new ServerConnection({
      address: this.opts.hubAddress,
      caCert: this.trust,
      cert: this.credentials.cert,
      key: this.credentials.key,
      serverName: this.opts.serverName,
      transport: this.transport,
      egress: this.egress,
      agentID: this.agentID,
      identifiers: this.identifiers,
      window: this.opts.window ?? INITIAL_CONNECTION_WINDOW,
      budget: this.budget,
      dialer: this.dialer,
      gatewayHmac: !(this.opts.gateway && this.opts.gateway.signedOnly),
      log: this.opts.log,
      isDraining: () => this.state !== 'running',
      atCapacity: () =>
        this.openConnections >= this.maxConnections
          ? `agent holds ${this.maxConnections} connections, its limit (--max-connections)`
          : null,
      heldServers: [...this.servers.values()].filter((x) => !x.serverDraining).map((x) => x.serverID),
      nextConnectID: () => ++this.connectID,
      headerTimeoutMs: 15_000,
      keepaliveTimeMs: this.opts.keepaliveTimeMs ?? 15_000,
      keepaliveTimeoutMs: this.opts.keepaliveTimeoutMs ?? 10_000,
      metrics: this.metrics,
    });
    this.attempt = conn;
    try {
      await conn.ready();
    } catch (err) {
      this.attempt = null;
      if (
        (err instanceof MuxRefusedError && err.code === 'ALREADY_EXISTS') ||
        (err instanceof GrpcCallError && err.code === GrpcStatus.ALREADY_EXISTS)
      ) {
        // Our server recognised a replica we hold (before registering it): same as a duplicate.
        this.metrics.tunnelConnects.inc({ result: 'duplicate' });
        this.schedule(DUPLICATE_RETRY_MIN_MS + Math.random() * DUPLICATE_RETRY_JITTER_MS);
        return;
      }
      this.metrics.tunnelConnects.inc({ result: 'error' });
      if (err instanceof MuxUnsupportedError && this.opts.transport !== 'mux') {
        // An ANP server: remember, and speak gRPC to it from now on.
        this.opts.log.info({ hub: this.opts.hubAddress }, `${err.message}; using gRPC (AgentService.Connect)`);
        this.transport = 'grpc';
        this.schedule(0);
        return;
      }
      const problem = certificateProblem(this.credentials.cert);
      const message = `${(err as Error).message}${problem ? ` (our client certificate ${problem})` : ''}`;
      const delay = this.retryDelay();
      // Log each distinct failure at warn, repeats at debug, so a hub outage does not flood logs.
      if (message !== this.lastError)
        this.opts.log.warn({ hub: this.opts.hubAddress, retryInMs: delay }, `cannot connect to hub: ${message}`);
      else this.opts.log.debug({ retryInMs: delay }, `cannot connect to hub: ${message}`);
      this.lastError = message;
      this.schedule(delay);
      return;
    }
    this.attempt = null;
    if (!this.running) {
      conn.close();
      return;
    }
    this.knownServerCount = conn.serverCount;
    if (this.servers.has(conn.serverID)) {
      // The load balancer sent us to a replica we already hold; ANP closes the duplicate too.
      this.opts.log.debug({ serverID: conn.serverID }, 'duplicate server connection closed');
      this.metrics.tunnelConnects.inc({ result: 'duplicate' });
      conn.close();
      // The hub is fine, the balancer just picked a replica we hold: try again soon rather than
      // backing off as after a failure (ANP's exponential backoff here can leave agents short for minutes).
      this.schedule(DUPLICATE_RETRY_MIN_MS + Math.random() * DUPLICATE_RETRY_JITTER_MS);
      return;
    }
    this.backoff.reset();
    this.retriesWithoutTunnel = -1;
    this.metrics.tunnelConnects.inc({ result: 'ok' });
    this.lastError = '';
    this.servers.set(conn.serverID, conn);
    this.opts.log.info(
      { serverID: conn.serverID, serverCount: conn.serverCount, transport: conn.transport, credit: conn.credit, halfClose: conn.halfClose },
      'connected to proxy server',
    );
    conn.once('closed', (err: Error | null) => {
      this.servers.delete(conn.serverID);
      if (this.running) {
        this.metrics.tunnelReconnects.inc();
        this.opts.log.warn({ serverID: conn.serverID, err: err?.message }, 'lost connection to proxy server');
      }
      this.noteLoss();
      this.schedule(this.retryDelay());
    });
    conn.once('serverDraining', () => {
      this.noteLoss();
      this.schedule(this.retryDelay());
    });
    if (this.activeServers() < this.knownServerCount) this.schedule(this.backoff.next());
  }

  /** The hub's reconnect spread (GET /v1/replicas reconnectSpreadSeconds), at most 5 min whatever it says. */
  setReconnectSpread(ms: number): void {
    this.reconnectSpreadMs = Number.isFinite(ms) && ms > 0 ? Math.min(ms, 300_000) : 0;
  }

  /** A tunnel closed or its server is draining: with none left, the retries that follow are spread. */
  private noteLoss(): void {
    if (this.activeServers() === 0 && this.retriesWithoutTunnel < 0) {
      this.retriesWithoutTunnel = 0;
      this.lostAllAt = performance.now();
    }
  }

  /**
   * How long until the next dial after a loss or a failed dial. An agent left with no tunnel at all waits
   * a random part of the hub's reconnect spread (spreadRetryDelay), so a restarted hub's agents do not all
   * come back in its first second. One that still holds a tunnel to another replica (one replica restarted)
   * retries after the backoff alone, as before: dials on the restarted replica wait for it (--agent-wait).
   */
  private retryDelay(): number {
    if (this.retriesWithoutTunnel < 0 || this.reconnectSpreadMs <= 0) return this.backoff.next();
    const remainingMs = this.lostAllAt + this.reconnectSpreadMs - performance.now();
    return spreadRetryDelay(this.retriesWithoutTunnel++, this.reconnectSpreadMs, this.backoff, Math.random, remainingMs);
  }

  /** Links that count toward the full set: open and not announced as shutting down by their server. */
  private activeServers(): number {
    let n = 0;
    for (const s of this.servers.values()) if (!s.serverDraining) n++;
    return n;
  }

  /** serverIDs seen missing from the hub's replica list, and in how many syncs in a row. */
  private readonly missing = new Map<string, number>();

  /**
   * The hub's list of live replicas (GET /v1/replicas): hold one tunnel per replica, and drop a
   * tunnel whose replica has been missing from the list twice in a row (once could be a race with
   * its lease renewal).
   */
  setReplicas(serverIDs: readonly string[], serverCount: number): void {
    if (!this.running) return;
    const live = new Set(serverIDs);
    this.knownServerCount = Math.max(1, serverCount);
    for (const id of [...this.missing.keys()]) if (live.has(id) || !this.servers.has(id)) this.missing.delete(id);
    for (const [id, conn] of this.servers) {
      // A replica we reached moments ago may not be in a list read before it started; one that is
      // shutting down (DRAIN) deleted its lease but closes its tunnels itself once its grace is over.
      if (live.has(id) || conn.serverDraining || Date.now() - conn.openedAt < NEW_TUNNEL_GRACE_MS) continue;
      const n = (this.missing.get(id) ?? 0) + 1;
      this.missing.set(id, n);
      if (n >= 2) {
        this.opts.log.info({ serverID: id }, "server replica is gone from the hub's replica list; closing its tunnel");
        this.missing.delete(id);
        conn.close();
      }
    }
    // Short of the set: dial now rather than waiting out a backoff armed while the count was lower.
    if (this.activeServers() < this.knownServerCount && !this.attempt) this.schedule(0);
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
