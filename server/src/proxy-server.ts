// The proxy server process: agent listener (mTLS gRPC, :8091), gRPC frontend (mTLS :8090 and/or a
// plain Unix socket), health (:8092) and loopback admin (:8095) listeners, all wired to one core.
import { randomUUID } from 'node:crypto';
import { mkdir, rm, writeFile, rename } from 'node:fs/promises';
import path from 'node:path';
import {
  FRONTEND_STREAM_WINDOW,
  HUB_MEMORY_BUDGET,
  INITIAL_CONNECTION_WINDOW,
  MAX_CONNECTION_WINDOW,
  MemoryBudget,
  throttleReporter,
  HTTP2_CONNECTION_WINDOW,
  HTTP2_STREAM_WINDOW,
  MAX_MESSAGE_BYTES,
  AGENT_CONNECT_PATH,
  PROXY_PATH,
  type FramedPacketStream,
  type Hello,
  HealthChecks,
  type HealthCheck,
  MuxRefusedError,
  refusalHello,
  http,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { makeAgentConnectHandler, onMuxAgentHello, type AgentListenerOptions, type Grant } from './dataplane/agent-listener.js';
import { TlsPort } from './dataplane/tls-port.js';
import { HubApi } from './fleet/hub-api.js';
import { MuxFrontendSession } from './dataplane/frontend-mux.js';
import { startConnectFrontend, type ConnectFrontend } from './connect/frontend.js';
import { certificatePrincipal, principalName } from './http/principal.js';
import { TokenStore } from './fleet/tokens.js';
import { startGateway, type Gateway } from './gateway/server.js';
import { ServiceAllowlist } from './gateway/service-allowlist.js';
import { buildGatewayAccess, type GatewayAccess, type GatewayAccessConfig } from './gateway/access.js';
import type { HubReviews } from './gateway/kube-reviews.js';
import type { PeerCertificate, TLSSocket } from 'node:tls';
import { GrpcFrontend } from './dataplane/frontend-grpc.js';
import { GrpcServer, GrpcStatus, type GrpcServerCall } from './dataplane/grpc-server.js';
import { clusterFromSubject } from './pki/agent-identity.js';
import { ProxyCore } from './dataplane/proxy-core.js';
import { ServerMetrics } from './dataplane/metrics.js';
import type * as HttpTypes from 'node:http';

/**
 * Ping every gRPC session every 5 s; one unanswered for 10 s (the keepalive timeout ANP uses) is dead. A
 * dead peer is noticed within 15 s at most (at once when its socket reports the close).
 */
const SESSION_WATCHDOG = { intervalMs: 5000, timeoutMs: 10_000 };
/** HTTP/2 streams one session may have open: an agent needs one Connect stream (a few while one ends). */
const AGENT_MAX_STREAMS = 8;
/** A client session (our SDK over gRPC, or a konnectivity-client) opens a Proxy stream per connection. */
const FRONTEND_MAX_STREAMS = 1024;

/** Whether a client certificate is an agent's (read once per connection: the certificate object is kept per connection). */
const agentCertificates = new WeakMap<object, boolean>();
function isAgentCertificate(cert: PeerCertificate): boolean {
  let agent = agentCertificates.get(cert);
  if (agent === undefined) {
    agent = Boolean(clusterFromSubject(cert.subject));
    agentCertificates.set(cert, agent);
  }
  return agent;
}

export interface TlsFiles {
  /** PEM contents. */
  caCert: Buffer;
  cert: Buffer;
  key: Buffer;
}

export interface ProxyServerOptions {
  serverID?: string;
  serverCount?: number;
  bindAddress: string;
  /** Agent listener port (8091); 0 = pick a free one. */
  agentPort: number;
  /** gRPC frontend port (8090); null = no TCP frontend. */
  frontendPort: number | null;
  /** Plain gRPC frontend on a Unix socket. */
  frontendUds?: string;
  healthPort: number | null;
  adminPort: number | null;
  tls: TlsFiles;
  dialTimeoutMs?: number;
  /** Window granted to agents and mux clients per connection at first (default INITIAL_CONNECTION_WINDOW). */
  window?: number;
  /** Bytes the hub may hold on behalf of its peers, all connections together (default HUB_MEMORY_BUDGET). */
  memoryBudget?: number;
  /** Connections the hub holds at most (default: the budget / two initial windows); CONNECT client connections too. */
  maxConnections?: number;
  /** Connections one client (certificate or token) holds at most (default: half of maxConnections). */
  maxConnectionsPerClient?: number;
  /**
   * How long a dial with no agent here waits for one of its cluster to connect, when another replica
   * holds a tunnel to it (default DEFAULT_AGENT_WAIT_MS; 0: fail at once). See agent-wait.ts.
   */
  agentWaitMs?: number;
  /** Dials waiting so at once at most (default: maxConnections). */
  maxWaitingDials?: number;
  /** Close a connection whose bytes could not move one way for this long (default 0: never). */
  stallTimeoutMs?: number;
  grants?: ReadonlyMap<string, Grant>;
  /** Where ports.json goes (chosen ports, for scripts and tests). */
  dataDir?: string;
  /** HTTP CONNECT frontend over TLS (8089); null = off. */
  connectPort?: number | null;
  connectUds?: string;
  /** Plain-TCP CONNECT frontend, loopback only. */
  connectPlain?: { host: string; port: number; allowTokens?: boolean };
  /** CONNECT and gateway bearer tokens (default <dataDir>/tokens.json). */
  tokensFile?: string;
  /** HTTP gateway over TLS (docs/gateway.md); null/undefined = off. */
  gatewayPort?: number | null;
  /** Services the gateway's proxy-service form may reach (service-allowlist.ts); none without it. */
  gatewayServicesFile?: string;
  /** Prepended to the user and groups the gateway impersonates in clusters. */
  gatewayIdentityPrefix?: string;
  /** How long an agent may take to answer a gateway request with its head (504 then); default 90 s. */
  gatewayResponseTimeoutMs?: number;
  /** The gateway's OIDC issuer and authorization mode (docs/gateway.md). */
  gatewayAccess?: GatewayAccessConfig;
  /** Extra /readyz checks besides `listeners` (e.g. `store`); more can be added on `readiness`. */
  readinessChecks?: HealthCheck[];
  /** Extra /healthz checks besides `ping`. */
  livenessChecks?: HealthCheck[];
  /** Export prom-client's process/Node.js metrics too (once per process: the CLI sets it). */
  processMetrics?: boolean;
  log: Logger;
}

export interface BoundPorts {
  serverID: string;
  agent: number;
  frontend: number | null;
  frontendUds: string | null;
  health: number | null;
  admin: number | null;
  connect: number | null;
  connectUds: string | null;
  connectPlain: number | null;
  gateway: number | null;
}

/** Where a ProxyServer is in its life (see the class comment). */
export type ProxyServerState = 'starting' | 'running' | 'unready' | 'draining' | 'stopped';

/**
 * The hub's data plane and its listeners. States:
 *   starting  constructed; start() binds the listeners (readiness: "listeners not bound yet")
 *   running   every listener bound: ready, work accepted
 *   unready   stop() began: readiness is false while --shutdown-delay still accepts work, so load
 *             balancers take the replica out before anything is refused
 *   draining  no new work (dials and agents refused); agents told (DRAIN); open connections get the
 *             grace period, then the listeners and everything left are closed
 *   stopped   stop() finished
 *
 *   starting ──start()──▶ running ──stop()──▶ unready ──delay over──▶ draining ──all closed──▶ stopped
 *   starting ──stop()──▶ unready (start() finishing later leaves it so)
 */
export class ProxyServer {
  readonly serverID: string;
  readonly maxConnections: number;
  readonly core: ProxyCore;
  private readonly agentServer: GrpcServer;
  private readonly frontendServer: GrpcServer;
  private readonly frontends = new Set<GrpcFrontend>();
  private httpServers: HttpTypes.Server[] = [];
  private readonly listenerOptions: AgentListenerOptions;

  /** serverCount announced to agents from now on (the live replica count; see replicas.ts). */
  setServerCount(count: () => number): void {
    this.listenerOptions.serverCount = count;
  }

  /** From now on, agents are admitted only if the hub's registry agrees (see registration.ts). */
  setAgentRegistry(registry: NonNullable<AgentListenerOptions['registry']>): void {
    this.listenerOptions.registry = registry;
  }
  private agentPort: TlsPort | null = null;
  private frontendPort: TlsPort | null = null;
  private readonly muxClients = new Set<MuxFrontendSession>();
  private connect: ConnectFrontend | null = null;
  private gateway: Gateway | null = null;
  private gatewayServices: ServiceAllowlist | null = null;
  /** Whether a cluster is registered (the hub's store); the gateway answers 503 for it rather than 404. */
  clusterKnown: ((cluster: string) => Promise<boolean>) | null = null;
  /** The hub's API server reviews for the gateway (TokenReview, SubjectAccessReview): set by the hub on --store kubernetes. */
  hubReviews: (() => Promise<HubReviews | null>) | null = null;
  private gatewayAccess: GatewayAccess | null = null;
  /** Agent-facing HTTP API on the agent port (bootstrap, renewal, leases); routes added by the addon manager. */
  readonly hubApi: HubApi;
  /** JSON API on the loopback admin port under /v1/ (join, delete, object views); routes added by the addon manager. */
  readonly adminApi: HubApi;
  tokens: TokenStore | null = null;
  /** This server's Prometheus registry and counters (served on /metrics of the health and admin ports). */
  readonly metrics: ServerMetrics;
  /** Named checks behind /readyz and /healthz. */
  readonly readiness: HealthChecks;
  readonly liveness: HealthChecks;
  private lifecycle: ProxyServerState = 'starting';
  ports: BoundPorts | null = null;

  constructor(private opts: ProxyServerOptions) {
    this.serverID = opts.serverID ?? randomUUID();
    this.hubApi = new HubApi(opts.log);
    this.adminApi = new HubApi(opts.log);
    this.metrics = new ServerMetrics({ processMetrics: opts.processMetrics });
    const window = opts.window ?? INITIAL_CONNECTION_WINDOW;
    const limit = opts.memoryBudget ?? HUB_MEMORY_BUDGET;
    const logThrottle = throttleReporter(30_000, (count, direction) =>
      opts.log.warn(
        { throttled: count, direction, budget: limit, committed: this.core.budget.committed },
        'memory budget is short: connection windows are not growing (slow readers, or many connections)',
      ),
    );
    const budget = new MemoryBudget(limit, {
      maxWindow: MAX_CONNECTION_WINDOW,
      onThrottle: (direction) => {
        this.metrics.memoryThrottled.inc({ direction });
        logThrottle(direction);
      },
    });
    // Every connection starts with an initial window each way: the default count fits the budget.
    const maxConnections = opts.maxConnections ?? Math.max(1, Math.floor(limit / (2 * window)));
    this.maxConnections = maxConnections;
    this.core = new ProxyCore({
      dialTimeoutMs: opts.dialTimeoutMs ?? 10_000,
      log: opts.log,
      metrics: this.metrics,
      budget,
      maxConnections,
      maxConnectionsPerClient: opts.maxConnectionsPerClient ?? Math.max(1, Math.floor(maxConnections / 2)),
      agentWaitMs: opts.agentWaitMs,
      maxWaitingDials: opts.maxWaitingDials,
      stallTimeoutMs: opts.stallTimeoutMs,
    });
    this.readiness = new HealthChecks('readyz', [{ name: 'listeners', check: this.checkListeners }, ...(opts.readinessChecks ?? [])]);
    this.liveness = new HealthChecks('healthz', [{ name: 'ping', check: () => undefined }, ...(opts.livenessChecks ?? [])]);
    // gRPC on our HTTP/2 (grpc-server.ts): large receive windows on our side too, and every session
    // pinged so a peer that died ends its calls (session-watchdog.ts).
    // An agent opens one Connect stream per session; a client one Proxy stream per connection. An
    // agent's session carries every upload to its cluster: its socket takes 256 KiB before its stream
    // waits, for fewer and larger writes. A client's session keeps the default 64 KiB: bytes on a
    // socket are outside the budget, and a konnectivity-client opens a session per connection.
    this.agentServer = new GrpcServer({
      streamWindow: HTTP2_STREAM_WINDOW,
      connectionWindow: HTTP2_CONNECTION_WINDOW,
      maxMessageBytes: MAX_MESSAGE_BYTES,
      watchdog: SESSION_WATCHDOG,
      maxConcurrentStreams: AGENT_MAX_STREAMS,
      socketHighWater: 256 * 1024,
    });
    this.frontendServer = new GrpcServer({
      streamWindow: FRONTEND_STREAM_WINDOW,
      connectionWindow: HTTP2_CONNECTION_WINDOW,
      maxMessageBytes: MAX_MESSAGE_BYTES,
      watchdog: SESSION_WATCHDOG,
      sessionWindow: { max: MAX_CONNECTION_WINDOW, budget, direction: 'to_agent', sharedInitial: INITIAL_CONNECTION_WINDOW },
      maxConcurrentStreams: Math.min(maxConnections, FRONTEND_MAX_STREAMS),
    });
    this.listenerOptions = {
      serverID: this.serverID,
      serverCount: () => opts.serverCount ?? 1,
      window: opts.window ?? INITIAL_CONNECTION_WINDOW,
      grants: opts.grants ?? new Map(),
      core: this.core,
      log: opts.log,
      accepting: () => this.accepting,
    };
    this.metrics.bind({
      agentStreams: () => {
        const all = this.core.routes.backends();
        const grpcCount = all.filter((b) => b.transport === 'grpc').length;
        return { total: all.length, grpc: grpcCount, mux: all.length - grpcCount };
      },
      readyBackends: () => {
        const all = this.core.routes.backends();
        return {
          destHost: new Set(all.flatMap((b) => b.hosts)).size,
          cidr: new Set(all.flatMap((b) => b.cidrs)).size,
          defaultRoute: new Set(all.filter((b) => b.defaultRoute).map((b) => b.agentID)).size,
        };
      },
      pendingDials: () => this.core.routes.backends().reduce((n, b) => n + b.pendingCount, 0),
      waitingDials: () => this.core.agentWaits.size,
      established: () => this.core.routes.backends().reduce((n, b) => n + b.establishedCount, 0),
      grpcFrontends: () => this.frontends.size,
      muxFrontends: () => this.muxClients.size,
      httpConnections: () => this.connect?.connections() ?? 0,
      blockedReceivers: () => {
        let proxy = 0;
        for (const f of this.frontends) if (f.paused) proxy++;
        let connect = 0;
        for (const b of this.core.routes.backends()) if (b.sender.readsHeld > 0) connect++;
        return { proxy, connect };
      },
      serverCount: () => this.listenerOptions.serverCount(),
      memory: () => ({ limit: this.core.budget.limit, directions: this.core.memoryByDirection() }),
    });
    this.agentServer.handle(AGENT_CONNECT_PATH, makeAgentConnectHandler(this.listenerOptions));
    this.frontendServer.handle(PROXY_PATH, this.handleProxy);
  }

  get state(): ProxyServerState {
    return this.lifecycle;
  }

  /** Work (dials, agents, clients) is taken: until stop()'s delay is over. */
  private get accepting(): boolean {
    return this.lifecycle === 'starting' || this.lifecycle === 'running' || this.lifecycle === 'unready';
  }

  /** The one place the state changes. */
  private setState(next: ProxyServerState): void {
    if (next === this.lifecycle) return;
    this.opts.log.debug({ from: this.lifecycle, to: next }, 'proxy server state');
    this.lifecycle = next;
  }

  private readonly handleProxy = (call: GrpcServerCall): void => {
    const refuse = (code: number, details: string): void => {
      this.opts.log.warn({ peer: call.getPeer() }, `client refused: ${details}`);
      call.endWithStatus(code, details);
    };
    if (!this.accepting) return refuse(GrpcStatus.UNAVAILABLE, 'server is shutting down');
    // Agents share the CA with hub users; an agent certificate must not open connections into other clusters.
    const cert = call.peerCertificate();
    if (cert && isAgentCertificate(cert)) return refuse(GrpcStatus.PERMISSION_DENIED, 'agent certificates may not use the client frontend');
    const f = new GrpcFrontend(call, this.core, this.opts.log, (done) => this.frontends.delete(done));
    this.frontends.add(f);
  };

  /** A client of our SDK over the multiplexed transport. */
  private readonly onMuxClient = (stream: FramedPacketStream, _hello: Hello, socket: TLSSocket, peer: string): void => {
    if (!this.accepting || clusterFromSubject(socket.getPeerCertificate().subject)) {
      const refusal = this.accepting
        ? new MuxRefusedError('PERMISSION_DENIED', 'agent certificates may not use the client frontend')
        : new MuxRefusedError('UNAVAILABLE', 'server is shutting down');
      this.opts.log.warn({ peer }, `client refused: ${refusal.message}`);
      stream.sendHello(refusalHello(refusal.code, refusal.details));
      stream.end();
      return;
    }
    const client = principalName(certificatePrincipal(socket.getPeerCertificate().subject?.CN));
    const session = new MuxFrontendSession(
      stream,
      _hello,
      this.core,
      this.opts.window ?? INITIAL_CONNECTION_WINDOW,
      this.opts.log.child({ peer }),
      (done) => this.muxClients.delete(done),
      client,
    );
    // SDK clients ping every 30 s: the hub pings only one that went quiet.
    stream.startKeepalive(30_000, 10_000, { whenIdle: true });
    this.muxClients.add(session);
  };

  async start(): Promise<BoundPorts> {
    const { tls, bindAddress } = this.opts;
    // TLS is terminated by TlsPort (ALPN picks the transport); the gRPC server gets verified plaintext.
    this.agentPort = new TlsPort({
      name: 'agent',
      host: bindAddress,
      port: this.opts.agentPort,
      tls,
      grpcServer: this.agentServer,
      onHello: onMuxAgentHello(this.listenerOptions, { intervalMs: 30_000, timeoutMs: 10_000 }),
      http1: this.hubApi,
      log: this.opts.log,
    });
    const agent = await this.agentPort.listen();
    let frontend: number | null = null;
    if (this.opts.frontendPort !== null) {
      this.frontendPort = new TlsPort({
        name: 'frontend',
        host: bindAddress,
        port: this.opts.frontendPort,
        tls,
        grpcServer: this.frontendServer,
        onHello: this.onMuxClient,
        log: this.opts.log,
      });
      frontend = await this.frontendPort.listen();
    }
    let uds: string | null = null;
    if (this.opts.frontendUds) {
      await rm(this.opts.frontendUds, { force: true });
      await this.frontendServer.listenUnix(path.resolve(this.opts.frontendUds));
      uds = path.resolve(this.opts.frontendUds);
    }
    if (this.opts.connectPort != null || this.opts.connectUds || this.opts.connectPlain || this.opts.gatewayPort != null) {
      this.tokens = await TokenStore.open(this.opts.tokensFile ?? path.join(this.opts.dataDir ?? '.', 'tokens.json'), {
        log: this.opts.log,
      });
    }
    if (this.opts.gatewayPort != null) {
      this.gatewayServices = this.opts.gatewayServicesFile
        ? await ServiceAllowlist.open({ file: this.opts.gatewayServicesFile, log: this.opts.log })
        : null;
      this.gatewayAccess = await buildGatewayAccess(this.opts.gatewayAccess ?? {}, {
        tokens: this.tokens!,
        log: this.opts.log,
        ...(this.hubReviews ? { hubReviews: this.hubReviews } : {}),
      });
      this.opts.log.info(this.gatewayAccess.summary, 'gateway access');
      this.gateway = await startGateway({
        core: this.core,
        log: this.opts.log,
        tokens: this.tokens!,
        ...(this.gatewayServices ? { services: this.gatewayServices } : {}),
        ...(this.opts.gatewayIdentityPrefix ? { identityPrefix: this.opts.gatewayIdentityPrefix } : {}),
        ...(this.opts.gatewayResponseTimeoutMs ? { responseTimeoutMs: this.opts.gatewayResponseTimeoutMs } : {}),
        authSources: this.gatewayAccess.sources,
        authorizer: this.gatewayAccess.authorizer,
        tls: { host: bindAddress, port: this.opts.gatewayPort, ...tls },
        clusterKnown: (cluster) => this.clusterKnown?.(cluster) ?? Promise.resolve(false),
      });
    }
    if (this.opts.connectPort != null || this.opts.connectUds || this.opts.connectPlain) {
      this.connect = await startConnectFrontend({
        core: this.core,
        log: this.opts.log,
        tokens: this.tokens!,
        tls: this.opts.connectPort != null ? { host: bindAddress, port: this.opts.connectPort, ...tls } : undefined,
        uds: this.opts.connectUds,
        plain: this.opts.connectPlain,
        maxConnections: this.maxConnections,
      });
    }
    const health = this.opts.healthPort === null ? null : await this.listenHttp(bindAddress, this.opts.healthPort, this.healthHandler);
    const admin = this.opts.adminPort === null ? null : await this.listenHttp('127.0.0.1', this.opts.adminPort, this.adminHandler);
    this.ports = {
      serverID: this.serverID,
      agent,
      frontend,
      frontendUds: uds,
      health,
      admin,
      connect: this.connect?.ports.tls ?? null,
      connectUds: this.connect?.ports.uds ?? null,
      connectPlain: this.connect?.ports.plain ?? null,
      gateway: this.gateway?.port ?? null,
    };
    if (this.opts.dataDir) await writeJsonAtomic(path.join(this.opts.dataDir, 'ports.json'), this.ports);
    if (this.lifecycle === 'starting') this.setState('running');
    this.opts.log.info(this.ports, 'proxy server listening');
    return this.ports;
  }

  /**
   * Swaps the TLS material of every TLS listener (agent, frontend, CONNECT): renewed serving
   * certificate, or a CA bundle with a new CA during a rollover. Open tunnels are not touched.
   */
  reloadTls(m: TlsFiles): void {
    this.opts.tls = m;
    this.agentPort?.setTls(m);
    this.frontendPort?.setTls(m);
    this.connect?.setTls(m);
    this.gateway?.setTls(m);
    this.opts.log.info('TLS certificate and CA bundle reloaded; open connections keep their sessions');
  }

  /** The TLS material in use now. */
  get tls(): TlsFiles {
    return this.opts.tls;
  }

  snapshot(): ReturnType<ProxyCore['snapshot']> & { frontends: { state: string; connectID: number; address: string }[] } {
    return {
      ...this.core.snapshot(),
      frontends: [
        ...[...this.frontends].map((f) => f.description),
        ...[...this.muxClients].flatMap((m) => m.describe()),
        ...(this.connect?.describe() ?? []).map((c) => ({ state: c.state, connectID: c.connectID, address: c.destination })),
      ],
    };
  }

  /** Tunneled connections open or being dialed on this server, over every frontend. */
  private openConnections(): number {
    let n = 0;
    for (const b of this.core.routes.backends()) {
      const sum = b.summary();
      n += sum.pending + sum.established.length;
    }
    return n;
  }

  /**
   * Stop: readiness false and no new work (dials refused), agents told (DRAIN), open connections get
   * `graceMs` to finish while the health listener keeps answering 503, then everything is closed.
   * With `delayMs`, readiness turns false first and work is still accepted for that long, so load
   * balancers and Service endpoints take the replica out before anything is refused.
   */
  async stop(graceMs = 5000, delayMs = 0): Promise<void> {
    if (this.lifecycle === 'starting' || this.lifecycle === 'running') this.setState('unready');
    if (delayMs > 0 && this.lifecycle === 'unready') {
      this.opts.log.info({ delayMs }, 'readiness off; still serving while load balancers notice');
      await new Promise((r) => setTimeout(r, delayMs));
    }
    if (this.lifecycle === 'unready') this.setState('draining');
    this.core.stop();
    // Agents that understand it stop counting this replica and find the others while we finish.
    let told = 0;
    for (const b of this.core.routes.backends()) if (b.sendServerDrain()) told++;
    if (told > 0) this.opts.log.info({ agents: told }, 'told agents this server is shutting down (DRAIN)');
    const deadline = Date.now() + graceMs;
    if (this.openConnections() > 0) this.opts.log.info({ open: this.openConnections(), graceMs }, 'waiting for open connections to finish');
    while (this.openConnections() > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    if (this.openConnections() > 0)
      this.opts.log.warn({ open: this.openConnections() }, 'grace period over; closing the remaining connections');
    graceMs = Math.max(0, Math.min(graceMs, deadline - Date.now()));
    const connectStopped = this.connect?.stop(graceMs) ?? Promise.resolve();
    const gatewayStopped = this.gateway?.stop(graceMs) ?? Promise.resolve();
    this.gatewayServices?.close();
    const frontendsDone = this.frontendServer.shutdown();
    const agentsDone = this.agentServer.shutdown();
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<void>((r) => {
      timer = setTimeout(r, graceMs);
    });
    // Agent streams never end by themselves; after the frontends had their chance, close them.
    await Promise.race([Promise.all([frontendsDone, connectStopped, gatewayStopped]), timeout]);
    for (const b of this.core.routes.backends()) b.close('server shutting down');
    const agentPortClosed = this.agentPort?.close();
    this.hubApi.close();
    const frontendPortClosed = this.frontendPort?.close();
    await Promise.race([agentsDone, timeout]);
    clearTimeout(timer);
    this.frontendServer.forceShutdown();
    this.agentServer.forceShutdown();
    await Promise.all([agentPortClosed, frontendPortClosed, connectStopped, gatewayStopped]);
    this.gatewayAccess?.close();
    await Promise.all(
      this.httpServers.map(
        (s) =>
          new Promise<void>((r) => {
            s.close(() => r());
            s.closeAllConnections();
          }),
      ),
    );
    this.httpServers = [];
    if (this.opts.frontendUds) await rm(this.opts.frontendUds, { force: true });
    this.setState('stopped');
  }

  // ------------------------------------------------------------ HTTP listeners

  private readonly checkListeners = (): void => {
    if (this.lifecycle === 'starting') throw new Error('listeners not bound yet');
    if (this.lifecycle !== 'running') throw new Error('shutting down');
  };

  private readonly healthHandler = (req: HttpTypes.IncomingMessage, res: HttpTypes.ServerResponse): void => {
    const url = new URL(req.url ?? '/', 'http://hub');
    const answer = (p: Promise<{ status: number; body: string }>): void => {
      p.then(
        ({ status, body }) => text(res, status, body),
        (err: Error) => text(res, 500, `${err.message}\n`),
      );
    };
    if (url.pathname === '/healthz' || url.pathname === '/livez') return answer(this.liveness.respond(url));
    if (url.pathname === '/readyz') return answer(this.readiness.respond(url));
    if (url.pathname === '/metrics') {
      return answer(
        this.metrics.expose().then(({ contentType, body }) => {
          res.setHeader('content-type', contentType);
          return { status: 200, body };
        }),
      );
    }
    return text(res, 404, 'not found\n');
  };

  private readonly adminHandler = (req: HttpTypes.IncomingMessage, res: HttpTypes.ServerResponse): void => {
    const url = new URL(req.url ?? '/', 'http://hub');
    if (url.pathname.startsWith('/v1/')) {
      void this.adminApi.handle(req, res);
      return;
    }
    if (url.pathname === '/debug/connections') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ serverID: this.serverID, ...this.snapshot(), handles: process.getActiveResourcesInfo() }));
      return;
    }
    return this.healthHandler(req, res);
  };

  private listenHttp(host: string, port: number, handler: HttpTypes.RequestListener): Promise<number> {
    const server = http.createServer(handler);
    server.keepAliveTimeout = 1000;
    server.headersTimeout = 10_000;
    server.requestTimeout = 10_000;
    this.httpServers.push(server);
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => {
        server.removeListener('error', reject);
        resolve((server.address() as { port: number }).port);
      });
    });
  }
}

function text(res: HttpTypes.ServerResponse, code: number, body: string): void {
  if (!res.hasHeader('content-type')) res.setHeader('content-type', 'text/plain; charset=utf-8');
  res.writeHead(code);
  res.end(body);
}

async function writeJsonAtomic(file: string, value: unknown): Promise<void> {
  await mkdir(path.dirname(file), { recursive: true });
  const tmp = `${file}.${process.pid}.tmp`;
  await writeFile(tmp, `${JSON.stringify(value, null, 2)}\n`);
  await rename(tmp, file);
}
