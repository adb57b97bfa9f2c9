// The hub's HTTP gateway (`--gateway-port`, docs/gateway.md): `https://HUB:PORT/<cluster>/<kube path>`
// to that cluster's kube-apiserver, through the agent's tunnel. Each request, plain or upgrade:
//   target checked (paths.ts, 400) → caller authenticated (auth.ts, 401) → the identity the cluster would
//   see survives the trip unchanged (proto identity-names.ts, 401) →
//   caller's Impersonate-* refused (400) → may reach the cluster? (authorization.ts, 403) → a Service on
//   the allowlist? (403) → cluster known? (404) → agent connected? (503) → forwarded (forward.ts;
//   upgrades: upgrade.ts, spliced after the 101) → one audit line and metrics (an upgraded session's at its end).
// TLS with the hub's serving certificate, client certificates optional (tokens otherwise), as the
// CONNECT frontend's TLS listener. No request timeout: watches and `logs -f` run for hours; the head must
// arrive within the header timeout and the agent's answer's head within the response timeout (504).
// Requests on one connection are read by node's own HTTP parser and handled one after another
// (caller-connection.ts), and after a refusal, which closes the connection, nothing more is read from it:
// a request pipelined behind the refusal is never forwarded.
import type net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { GATEWAY_MAX_HEAD_BYTES, identityProblem, isImpersonationHeader, textAnswer, type Splice } from '@cluster-proxy/proto';
import type { ProxyCore } from '../dataplane/proxy-core.js';
import { avoidPeerCertificateLeak } from '../http/peer-certificate-leak.js';
import { closeServer, listen, peerOf } from '../http/sockets.js';
import { oneLine, printable } from '../http/text.js';
import type { TokenStore } from '../fleet/tokens.js';
import { GatewayPool } from './agent-pool.js';
import { authenticate, certificateSource, hubTokenSource, isFailure, type AuthSource, type GatewayCaller } from './auth.js';
import { scopeAuthorizer, type GatewayAuthorizer } from './authorization.js';
import { CallerConnection, type CallerExchange, type CallerHost, type GatewayRequest } from './caller-connection.js';
import { forward, impersonatedIdentity } from './forward.js';
import { parseGatewayTarget } from './paths.js';
import type { ServiceAllowlist } from './service-allowlist.js';
import { forwardUpgrade } from './upgrade.js';

const DEFAULT_RESPONSE_TIMEOUT_MS = 90_000;
/** First segments of apiserver paths: a request starting with one most likely lost its cluster prefix. */
const KUBE_ROOTS = new Set(['api', 'apis', 'version', 'openapi', 'healthz', 'livez', 'readyz', 'metrics', 'logs', '.well-known']);
const DEFAULT_HEADER_TIMEOUT_MS = 10_000;
/** An idle caller connection closes after this (node:http's default keep-alive timeout). */
const KEEP_ALIVE_TIMEOUT_MS = 5_000;

export interface GatewayOptions {
  core: ProxyCore;
  log: Logger;
  tls: { host: string; port: number; caCert: Buffer; cert: Buffer; key: Buffer };
  tokens: TokenStore;
  /** A cluster the hub knows (registered) though no agent of it may be connected: 503 rather than 404. */
  clusterKnown?: (cluster: string) => Promise<boolean>;
  /** Services the proxy-service form may reach; none without it. */
  services?: ServiceAllowlist;
  /** Prepended to the user and every group impersonated in clusters (e.g. "hub:"). */
  identityPrefix?: string;
  /** Default: hub tokens, then client certificates (access.ts builds the hub's list). */
  authSources?: readonly AuthSource[];
  /** Who may reach which cluster. Default: a credential's own scope (hub tokens' clusters). */
  authorizer?: GatewayAuthorizer;
  /** Largest request head; beyond it 431. Default 16 KiB (GATEWAY_MAX_HEAD_BYTES). */
  maxHeaderBytes?: number;
  headerTimeoutMs?: number;
  /** How long the agent may take to answer with a head; then 504. Default 90 s (an apiserver answers a plain request within its 60 s request timeout, a watch at once). */
  responseTimeoutMs?: number;
}

export interface Gateway {
  readonly port: number;
  /** Requests being served now, upgraded sessions included. */
  requests(): number;
  setTls(tls: { caCert: Buffer; cert: Buffer; key: Buffer }): void;
  /** Stops listening; requests in flight and upgraded sessions get up to `graceMs`, then every connection is closed. */
  stop(graceMs?: number): Promise<void>;
}

interface Audit {
  user?: string;
  groups?: string[];
  cluster?: string;
  /** The cluster as a metric label: only once known to exist (no label per made-up name). */
  clusterLabel: string;
  status: number;
  bytesIn: number;
  bytesOut: number;
  error?: string;
  reason?: string;
  /** The protocol asked for, on an upgrade request. */
  upgrade?: string;
}

/** What a request is answered on: its exchange on the caller's connection, or the raw socket of an upgrade request. */
type Exchange = { kind: 'request'; ex: CallerExchange } | { kind: 'upgrade'; socket: net.Socket; head: Buffer };

/** Where a GatewayServer is in its life (see the class). */
export type GatewayState = 'idle' | 'starting' | 'listening' | 'stopping' | 'stopped';

/** Starts the gateway and resolves once it listens. */
export async function startGateway(opts: GatewayOptions): Promise<Gateway> {
  const gateway = new GatewayServer(opts);
  await gateway.start();
  return gateway;
}

/**
 * The gateway's HTTPS server and what it holds. States:
 *   idle       made; nothing bound
 *   starting   start(): binding the port
 *   listening  requests and upgrades are served
 *   stopping   stop(): no new connections; requests in flight and upgraded sessions get the grace period
 *   stopped    every connection, pooled agent connection and session closed; the server's listeners removed
 *
 *   idle ──start()──▶ starting ──bound──▶ listening ──stop()──▶ stopping ──all closed──▶ stopped
 *   starting ──bind failed──▶ stopped (start() rejects)
 */
export class GatewayServer implements Gateway {
  private state: GatewayState = 'idle';
  private readonly log: Logger;
  private readonly metrics: ProxyCore['metrics'];
  private readonly sources: readonly AuthSource[];
  private readonly pool: GatewayPool;
  private readonly authorizer: GatewayAuthorizer;
  private material: { cert: Buffer; key: Buffer };
  private inFlight = 0;
  /** Upgraded sessions and upgrade requests waiting for their answer: no longer caller connections. */
  private readonly upgrades = new Set<net.Socket>();
  /** Caller connections (not upgraded), by their socket. */
  private readonly connections = new Map<tls.TLSSocket, CallerConnection>();
  private readonly callerHost: CallerHost;
  private readonly sessions = new Set<Splice>();
  private readonly maxHeaderBytes: number;
  private readonly responseTimeoutMs: number;
  private readonly server: tls.Server;
  private boundPort = 0;
  private stopped: Promise<void> | null = null;

  constructor(private readonly opts: GatewayOptions) {
    this.log = opts.log.child({ component: 'gateway' });
    this.metrics = opts.core.metrics;
    this.sources = opts.authSources ?? [hubTokenSource(opts.tokens), certificateSource()];
    this.pool = new GatewayPool(opts.core);
    this.authorizer = opts.authorizer ?? scopeAuthorizer();
    this.material = { cert: opts.tls.cert, key: opts.tls.key };
    this.maxHeaderBytes = opts.maxHeaderBytes ?? GATEWAY_MAX_HEAD_BYTES;
    this.responseTimeoutMs = opts.responseTimeoutMs ?? DEFAULT_RESPONSE_TIMEOUT_MS;
    avoidPeerCertificateLeak();
    this.server = tls.createServer({
      ca: opts.tls.caCert,
      cert: opts.tls.cert,
      key: opts.tls.key,
      requestCert: true,
      rejectUnauthorized: false, // no certificate = token auth; checked per request
      // http/1.0 too: a client that offers only it (curl --http1.0) would otherwise fail the handshake.
      ALPNProtocols: ['http/1.1', 'http/1.0'],
      // A caller's FIN is the caller leaving (as node:http's server reads it): its socket closes, and with it
      // whatever its request started (a watch at the apiserver ends).
      allowHalfOpen: false,
    });
    this.callerHost = {
      maxHeaderBytes: this.maxHeaderBytes,
      headerTimeoutMs: opts.headerTimeoutMs ?? DEFAULT_HEADER_TIMEOUT_MS,
      keepAliveTimeoutMs: KEEP_ALIVE_TIMEOUT_MS,
      request: (req, ex) => {
        this.inFlight++;
        this.handle(req, { kind: 'request', ex })
          .catch(this.failedUnexpectedly)
          .finally(() => this.inFlight--);
      },
      upgrade: (req, rest) => this.onUpgrade(req, rest),
      malformed: (socket, status, detail) => this.onMalformed(socket, status, detail),
    };
  }

  get port(): number {
    return this.boundPort;
  }

  /** Requests being served now, upgraded sessions included. */
  requests(): number {
    return this.inFlight;
  }

  setTls(m: { caCert: Buffer; cert: Buffer; key: Buffer }): void {
    this.material = { cert: m.cert, key: m.key };
    this.server.setSecureContext({ ca: m.caCert, cert: m.cert, key: m.key });
  }

  /** The one place the state changes. */
  private setState(next: GatewayState): void {
    this.log.debug({ from: this.state, to: next }, 'gateway state');
    this.state = next;
  }

  /** Binds the port and serves; resolves with it. */
  async start(): Promise<number> {
    if (this.state !== 'idle') throw new Error(`the gateway was started already (${this.state})`);
    this.setState('starting');
    const server = this.server;
    server.on('secureConnection', this.onConnection);
    server.on('tlsClientError', this.onTlsClientError);
    try {
      this.boundPort = await listen(server, { host: this.opts.tls.host, port: this.opts.tls.port });
    } catch (err) {
      this.removeListeners();
      this.setState('stopped');
      throw err;
    }
    if ((this.state as GatewayState) !== 'starting') return this.boundPort; // stop() came while binding
    this.setState('listening');
    this.log.info({ port: this.boundPort }, 'gateway listening');
    return this.boundPort;
  }

  /** Stops listening; requests in flight and upgraded sessions get up to `graceMs`, then every connection is closed. */
  stop(graceMs = 0): Promise<void> {
    this.stopped ??= (async () => {
      this.setState('stopping');
      const server = this.server;
      const closed = closeServer(server);
      for (const c of this.connections.values()) if (c.state === 'idle') c.destroy();
      this.pool.closeIdle();
      const deadline = Date.now() + graceMs;
      while (this.inFlight > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, Math.min(50, deadline - Date.now())));
      for (const c of this.connections.values()) c.destroy();
      this.pool.close();
      // Upgraded sockets are no longer node's connections: closed here, each session still audited.
      for (const s of this.sessions) s.close('the gateway is shutting down');
      for (const s of this.upgrades) s.destroy();
      await closed;
      this.removeListeners();
      this.setState('stopped');
    })();
    return this.stopped;
  }

  private removeListeners(): void {
    this.server.off('secureConnection', this.onConnection);
    this.server.off('tlsClientError', this.onTlsClientError);
  }

  private readonly onConnection = (socket: tls.TLSSocket): void => {
    if (this.state !== 'listening') {
      socket.destroy();
      return;
    }
    socket.setNoDelay(true);
    this.connections.set(socket, new CallerConnection(socket, this.callerHost));
    socket.once('close', () => this.connections.delete(socket));
  };

  // handle() answers its own failures; this keeps the gateway going should anything escape it.
  private readonly failedUnexpectedly = (err: unknown): void =>
    this.log.error({ err: err instanceof Error ? err.message : String(err) }, 'gateway request failed unexpectedly');

  // kubectl exec/attach/port-forward (WebSocket, SPDY/3.1): the same checks, then spliced (upgrade.ts).
  // In flight from the head until the session closed, so a draining hub gives it the grace period.
  private onUpgrade(req: GatewayRequest, head: Buffer): void {
    const socket = req.socket;
    this.connections.delete(socket);
    socket.on('error', (err: NodeJS.ErrnoException) =>
      this.log.debug({ peer: peerOf(socket), err: oneLine(err.message) }, 'gateway upgrade socket failed'),
    );
    this.inFlight++;
    // Until it closes (a refused caller may keep its end open): closed by stop() if still there.
    this.upgrades.add(socket);
    socket.once('close', () => this.upgrades.delete(socket));
    this.handle(req, { kind: 'upgrade', socket, head })
      .catch(this.failedUnexpectedly)
      .finally(() => this.inFlight--);
  }

  private onMalformed(socket: tls.TLSSocket, status: 400 | 408 | 431, detail: string): void {
    if (status === 431) this.metrics.gatewayRequests.inc({ cluster: '', code: '431' });
    else this.log.debug({ peer: peerOf(socket), err: oneLine(detail) }, 'malformed gateway request');
    rawRefusal(
      socket,
      status,
      status === 431 ? detail : status === 408 ? 'the request head did not arrive in time' : 'malformed HTTP request',
    );
  }

  private readonly onTlsClientError = (err: Error, s: tls.TLSSocket): void => {
    this.log.info({ peer: peerOf(s) }, `gateway TLS handshake failed: ${oneLine(err.message)}`);
    s.destroy();
  };

  private record(req: GatewayRequest, started: bigint, a: Audit): void {
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    this.metrics.gatewayRequests.inc({ cluster: a.clusterLabel, code: String(a.status) });
    this.metrics.gatewayDuration.observe(seconds);
    // The path without its query (a query may carry a value nobody should find in logs).
    const target = req.url;
    const q = target.indexOf('?');
    this.log.info(
      {
        user: a.user,
        groups: a.groups,
        cluster: a.cluster,
        method: printable(req.method, 20),
        path: printable(q < 0 ? target : target.slice(0, q)),
        status: a.status,
        bytesIn: a.bytesIn,
        bytesOut: a.bytesOut,
        durationMs: Math.round(seconds * 1000),
        peer: peerOf(req.socket),
        ...(a.upgrade ? { upgrade: printable(a.upgrade, 64) } : {}),
        ...(a.reason ? { reason: a.reason } : {}),
        ...(a.error ? { error: oneLine(a.error) } : {}),
      },
      'gateway request',
    );
  }

  private async handle(req: GatewayRequest, ex: Exchange): Promise<void> {
    const started = process.hrtime.bigint();
    const audit: Audit = {
      clusterLabel: '',
      status: 0,
      bytesIn: 0,
      bytesOut: 0,
      ...(ex.kind === 'upgrade' ? { upgrade: req.headersDistinct['upgrade']?.join(', ') ?? '' } : {}),
    };
    // Every refusal, here or further down (431, 502, 504, …), closes the connection: nothing after it is handled.
    const fail = (status: number, message: string, reason: string, extra: Record<string, string> = {}): void => {
      // A refused request's body is not read; the connection closes after the answer.
      if (ex.kind === 'request') ex.ex.refuse(status, message, extra);
      else rawRefusal(ex.socket, status, message, extra);
      audit.status = status;
      audit.reason = reason;
    };
    try {
      const target = parseGatewayTarget(req.url);
      if ('error' in target) return fail(400, target.error, 'bad_path');
      const auth = await authenticate(req, this.sources);
      if (isFailure(auth))
        return fail(
          auth.status,
          auth.message,
          'unauthenticated',
          auth.status === 401 ? { 'www-authenticate': 'Bearer realm="cluster-proxy"' } : {},
        );
      const caller: GatewayCaller = auth;
      audit.user = caller.user;
      audit.groups = caller.groups;
      audit.cluster = target.cluster;
      // Judged as the cluster will read it: a name a header would trim or cannot carry is refused, never cleaned.
      const identity = impersonatedIdentity(caller, this.opts.identityPrefix ?? '');
      const problem = identityProblem(identity);
      if (problem)
        return fail(
          401,
          `${caller.source === 'certificate' ? 'the client certificate' : 'the credential'} names an identity the cluster would not read as sent: ${problem}`,
          'bad_identity',
          { 'www-authenticate': 'Bearer realm="cluster-proxy"' },
        );
      const impersonating = Object.keys(req.headersDistinct).find(isImpersonationHeader);
      if (impersonating)
        return fail(
          400,
          `${printable(impersonating)}: the gateway impersonates the authenticated caller itself; callers may not send Impersonate-* headers`,
          'impersonation',
        );
      const decision = await this.authorizer.authorize(caller, target.cluster);
      if (!decision.allowed)
        return fail(decision.status, decision.message, decision.status === 403 ? 'not_authorized' : 'authorization_unavailable');
      // The proxy-service form: default deny, per cluster (service-allowlist.ts).
      const allowed = target.service ? (this.opts.services?.allowed(target.cluster, target.service) ?? null) : null;
      if (target.service && !allowed) {
        const t = target.service;
        return fail(
          403,
          `service ${t.namespace}/${t.name} (${t.protocol}, port ${t.port}) is not in the gateway's service allowlist for cluster ${target.cluster}`,
          'service_not_allowed',
        );
      }
      if (!this.opts.core.hasCluster(target.cluster)) {
        const known = this.opts.clusterKnown ? await this.opts.clusterKnown(target.cluster).catch(() => false) : false;
        if (!known) {
          // `kubectl get --raw` replaces the server URL's path (client-go's RequestURI): say so.
          const hint = KUBE_ROOTS.has(target.cluster)
            ? ` (the path has no /CLUSTER prefix? kubectl get --raw drops the server URL's path: use --raw /CLUSTER${printable(req.url)})`
            : '';
          return fail(404, `cluster ${target.cluster} is not known to this hub${hint}`, 'unknown_cluster');
        }
        audit.clusterLabel = target.cluster;
        return fail(503, `no agent of cluster ${target.cluster} is connected`, 'no_agent');
      }
      audit.clusterLabel = target.cluster;
      const service = target.service ? { target: target.service, ...(allowed?.ca ? { ca: allowed.ca } : {}) } : undefined;
      const r =
        ex.kind === 'request'
          ? await forward(
              {
                core: this.opts.core,
                signing: () => this.material,
                pool: this.pool,
                responseTimeoutMs: this.responseTimeoutMs,
              },
              caller,
              identity,
              target.cluster,
              target.path,
              req,
              ex.ex,
              service,
            )
          : await forwardUpgrade(
              {
                core: this.opts.core,
                signing: () => this.material,
                refuse: (s, status, message) => rawRefusal(s, status, message),
                responseTimeoutMs: this.responseTimeoutMs,
                opened: (session) => {
                  this.sessions.add(session);
                  void session.done.then(() => this.sessions.delete(session));
                },
              },
              caller,
              identity,
              target.cluster,
              target.path,
              req,
              ex.socket,
              ex.head,
              service,
            );
      Object.assign(audit, { status: r.status, bytesIn: r.bytesIn, bytesOut: r.bytesOut, ...(r.error ? { error: r.error } : {}) });
    } catch (err) {
      this.log.error({ err: (err as Error).message }, 'gateway request failed unexpectedly');
      if (ex.kind === 'upgrade') {
        if (audit.status === 0) fail(500, 'internal error in the gateway', 'internal');
        else ex.socket.destroy();
      } else if (!ex.ex.headersSent) fail(500, 'internal error in the gateway', 'internal');
      else ex.ex.destroy();
      audit.status ||= 500;
    } finally {
      // Every answer, refusals included, is one audit line and one count.
      this.record(req, started, audit);
    }
  }
}

/** A one-line text answer on a raw socket (a bad head, an upgrade's refusal); the connection closes after it. */
function rawRefusal(socket: Duplex, status: number, message: string, extra: Record<string, string> = {}): void {
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  socket.end(textAnswer(status, oneLine(message), extra));
}
