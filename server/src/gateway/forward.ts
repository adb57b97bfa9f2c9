// One authenticated gateway request, forwarded to the agent of its cluster: over a connection through
// the agent's tunnel (TunnelSocket: the core's in-process dial, no new tunnel), as HTTP/1.1 to the
// agent's reserved destination, with the caller's identity authenticated by the hub (proto
// gateway-identity.ts: an HMAC under the key of the link the connection rides when the agent takes one,
// else a signature) and none of the caller's credentials. Bodies stream both ways through relay()
// (proto http-relay.ts), which honours backpressure (write() → false → wait for 'drain'); nothing is
// buffered whole.
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import {
  GATEWAY_AGENT_MAX_HEAD_BYTES,
  GATEWAY_HOST,
  IDENTITY_HEADER,
  IDENTITY_MAC_HEADER,
  IDENTITY_SIGNER_HEADER,
  appendForwardedFor,
  endToEndHeaders,
  gatewayForwardedHeaders,
  hasNoBody,
  identityPayload,
  macPayload,
  relay,
  relayResponse,
  requestLine,
  signPayload,
  signedLength,
  type DialFailureReason,
  type GatewayIdentity,
  http,
} from '@cluster-proxy/proto';
import type { ProxyCore } from '../dataplane/proxy-core.js';
import type { GatewayPool } from './agent-pool.js';
import type { GatewayCaller } from './auth.js';
import type { ServiceTarget } from './paths.js';
import { GatewayDialError, TunnelSocket } from './tunnel-socket.js';
import type * as HttpTypes from 'node:http';

/** What a dial failure becomes for the caller. */
export const DIAL_STATUS: Readonly<Record<DialFailureReason, { status: number; why: string }>> = {
  no_agent: { status: 503, why: 'no agent of this cluster is connected' },
  draining: { status: 503, why: "this cluster's agents are shutting down" },
  limit: { status: 503, why: 'a connection limit of the hub or the agent was reached' },
  timeout: { status: 504, why: 'the agent did not answer in time' },
  forbidden: { status: 502, why: 'the agent does not serve the gateway (an older agent?)' },
  endpoint: { status: 502, why: 'the agent could not serve the request' },
  dialclosed: { status: 502, why: 'the agent disconnected' },
  unknown: { status: 502, why: 'the agent could not be reached' },
};

export interface ForwardResult {
  status: number;
  bytesIn: number;
  bytesOut: number;
  /** Why the request ended without a complete answer (one line), if it did. */
  error?: string;
}

export interface ForwardContext {
  core: ProxyCore;
  /** The hub's serving certificate and key (they sign the identity the agent believes). */
  signing: () => { cert: Buffer; key: Buffer };
  /** A one-line error answer (used while nothing was sent yet). */
  refuse: (res: HttpTypes.ServerResponse, status: number, message: string) => void;
  /** Keep-alive connections to the agents' reserved destination (agent-pool.ts). */
  pool: GatewayPool;
  /** How long the agent may take to answer with a response head (a watch's comes at once); then 504. */
  responseTimeoutMs: number;
}

/** The proxy-service form's destination: a Service, reached directly (no identity, no impersonation). */
export interface ServiceDestination {
  target: ServiceTarget;
  /** CA of the Service's certificate (https); default: Node's public roots. */
  ca?: Buffer;
}

/** The identity the cluster sees: the caller's names with --gateway-identity-prefix ('' for none) before the user and each group. */
export function impersonatedIdentity(caller: GatewayCaller, prefix: string): GatewayIdentity {
  return {
    user: `${prefix}${caller.user}`,
    groups: caller.groups.map((g) => `${prefix}${g}`),
    ...(caller.uid ? { uid: caller.uid } : {}),
    ...(caller.extra ? { extra: caller.extra } : {}),
  };
}

/**
 * The caller's identity for the agent, bound to this request's method and target (upgrades too). Its
 * payload is made at once; it is authenticated for the connection the request gets (headers()): with the
 * MAC of that connection's link when the agent takes one (CAP_GATEWAY_HMAC), else signed.
 */
export class IdentityHandoff {
  private readonly body: string;

  constructor(
    private readonly ctx: Pick<ForwardContext, 'signing'>,
    identity: GatewayIdentity,
    cluster: string,
    path: string,
    req: HttpTypes.IncomingMessage,
  ) {
    this.body = identityPayload(identity, cluster, requestLine(req.method, path));
  }

  /** The most the identity headers add to the head (the signed form: the MAC form is shorter). */
  maxBytes(): number {
    const { cert, key } = this.ctx.signing();
    return IDENTITY_HEADER.length + IDENTITY_SIGNER_HEADER.length + 8 + signedLength(this.body.length, cert, key);
  }

  /** The headers for a request on `socket` (a TunnelSocket: its link's key decides the form). */
  headers(socket: Duplex): Record<string, string> {
    const linkKey = socket instanceof TunnelSocket ? socket.identityKey : null;
    if (linkKey) return { [IDENTITY_MAC_HEADER]: macPayload(this.body, linkKey) };
    const { cert, key } = this.ctx.signing();
    const signed = signPayload(this.body, cert, key);
    return { [IDENTITY_HEADER]: signed.assertion, [IDENTITY_SIGNER_HEADER]: signed.signer };
  }

  /** Sets the headers on `upstream` once it has its connection, then runs `start` (which sends the head). */
  whenConnected(upstream: HttpTypes.ClientRequest, start: () => void): void {
    upstream.once('socket', (socket: Duplex) => {
      for (const [name, value] of Object.entries(this.headers(socket))) upstream.setHeader(name, value);
      start();
    });
  }
}

/** The caller's end-to-end headers for the agent: less its credentials (a WebSocket's bearer subprotocol too), with our X-Forwarded-For. */
export function callerHeaders(req: HttpTypes.IncomingMessage): Record<string, string | string[]> {
  const headers = gatewayForwardedHeaders(req.headersDistinct);
  headers['x-forwarded-for'] = appendForwardedFor(req.headersDistinct['x-forwarded-for'], req.socket.remoteAddress ?? 'unknown');
  return headers;
}

/**
 * Why the head the agent would get is too large for it (GATEWAY_AGENT_MAX_HEAD_BYTES), or null: the caller's
 * head is within the hub's own limit, but the identity assertion adds to it (a caller with many groups).
 */
export function headTooLarge(
  method: string | undefined,
  path: string,
  headers: Record<string, string | string[]>,
  /** Bytes headers added later will take (IdentityHandoff.maxBytes()). */
  more = 0,
): string | null {
  let n = (method ?? '').length + path.length + 12 + more;
  for (const [name, v] of Object.entries(headers))
    for (const value of Array.isArray(v) ? v : [v]) n += name.length + Buffer.byteLength(value, 'latin1') + 4;
  return n > GATEWAY_AGENT_MAX_HEAD_BYTES
    ? `the request head with the caller's identity (${n} bytes) is larger than the ${GATEWAY_AGENT_MAX_HEAD_BYTES} bytes an agent takes`
    : null;
}

/** Fails a request whose agent has not answered with a head in time (ForwardContext.responseTimeoutMs). */
export class ResponseTimeoutError extends Error {
  override name = 'ResponseTimeoutError';
}

/** Arms the response-head timer of `upstream`; returns the function that disarms it. */
export function responseTimer(upstream: HttpTypes.ClientRequest, ms: number): () => void {
  const t = setTimeout(
    () => upstream.destroy(new ResponseTimeoutError(`the cluster's agent did not answer within ${Math.round(ms / 1000)} s`)),
    ms,
  );
  return () => clearTimeout(t);
}

export function forward(
  ctx: ForwardContext,
  caller: GatewayCaller,
  identity: GatewayIdentity,
  cluster: string,
  path: string,
  req: HttpTypes.IncomingMessage,
  res: HttpTypes.ServerResponse,
  service?: ServiceDestination,
): Promise<ForwardResult> {
  return new Promise((resolve) => {
    let bytesIn = 0;
    let bytesOut = 0;
    let done = false;
    const finish = (status: number, error?: string): void => {
      if (done) return;
      done = true;
      resolve({ status, bytesIn, bytesOut, ...(error ? { error } : {}) });
    };

    const headers = callerHeaders(req);
    const host = service ? serviceHost(service.target) : GATEWAY_HOST;
    headers['host'] = service ? `${host}:${service.target.port}` : host;
    const handoff = service ? null : new IdentityHandoff(ctx, identity, cluster, path, req);
    // A Service gets one connection per request (nothing of it idles in the tables); the agent's
    // reserved destination is reached through the keep-alive pool.
    if (service) headers['connection'] = 'close';
    // A chunked body stays chunked (no length to give); node's client frames it.
    if (req.headers['transfer-encoding']) headers['transfer-encoding'] = 'chunked';
    const tooLarge = headTooLarge(req.method, path, headers, handoff?.maxBytes() ?? 0);
    if (tooLarge) {
      req.resume();
      ctx.refuse(res, 431, tooLarge);
      finish(431, tooLarge);
      return;
    }

    const upstream = http.request({
      method: req.method,
      path,
      headers,
      ...(service
        ? { createConnection: serviceConnection(ctx.core, cluster, caller, service) }
        : { agent: ctx.pool.agentFor(cluster, caller.name) }),
    });

    const disarm = responseTimer(upstream, ctx.responseTimeoutMs);
    upstream.on('response', (up) => {
      disarm();
      const out = endToEndHeaders(up.headersDistinct);
      res.writeHead(up.statusCode ?? 502, out);
      up.on('data', (chunk: Buffer) => (bytesOut += chunk.length));
      relayResponse(up, res, (err) => {
        if (err) {
          // Truncated: the caller must see a broken response, not a clean end.
          res.destroy();
          finish(up.statusCode ?? 502, `response cut off: ${err.message}`);
        } else finish(up.statusCode ?? 502);
      });
    });
    upstream.on('error', (err) => {
      disarm();
      if (res.headersSent) {
        res.destroy();
        finish(res.statusCode, `upstream failed: ${err.message}`);
        return;
      }
      // No connection, so nothing of the caller's body was read: it is read to its end and dropped.
      if (!started) req.resume();
      const m = failureOf(err, service);
      ctx.refuse(res, m.status, m.why);
      finish(m.status, err.message);
    });

    let started = false;
    const start = (): void => {
      started = true;
      if (hasNoBody(req)) {
        // Nothing to relay: the request goes out whole now (node reads the caller's empty body to its end).
        req.resume();
        upstream.end();
      } else {
        req.on('data', (chunk: Buffer) => (bytesIn += chunk.length));
        relay(req, upstream, (err) => {
          if (err && !done) {
            upstream.destroy();
            if (!res.headersSent && !res.destroyed) ctx.refuse(res, 400, `the request body was cut off: ${err.message}`);
            else res.destroy();
            finish(res.headersSent ? res.statusCode : 400, `request body cut off: ${err.message}`);
          }
        });
      }
    };
    // The identity is authenticated for the connection the request gets, so its head waits for it.
    if (handoff) handoff.whenConnected(upstream, start);
    else start();
    // The caller left: stop the upstream request (its tunnel connection closes with it).
    res.on('close', () => {
      if (!res.writableFinished) {
        disarm();
        upstream.destroy();
        finish(res.headersSent ? res.statusCode : 499, 'the caller went away');
      }
    });
  });
}

/**
 * What a failed connection to the agent (or through it, to a Service) becomes for the caller: a status and
 * one line in our words, with at most an error code. The underlying message (an agent's dial error may
 * name a Service's cluster IP) goes to the audit log, never to the caller.
 */
export function failureOf(err: Error, service?: ServiceDestination): { status: number; why: string } {
  if (err instanceof GatewayDialError && service && err.reason === 'forbidden') {
    return {
      status: 403,
      why: `the cluster's agent does not allow ${serviceHost(service.target)}:${service.target.port} (its --allow list)`,
    };
  }
  if (err instanceof GatewayDialError) return DIAL_STATUS[err.reason];
  if (err instanceof ServiceTlsError) return { status: 502, why: `TLS to the service failed: ${err.message}` };
  if (err instanceof ResponseTimeoutError) return { status: 504, why: err.message };
  const code = (err as NodeJS.ErrnoException).code;
  return { status: 502, why: `${service ? 'the service connection failed' : 'the agent connection failed'}${code ? ` (${code})` : ''}` };
}

/** node:http's createConnection for a Service: NAME.NS.svc:PORT dialed on an agent of `cluster`, TLS inside for https. */
export function serviceConnection(
  core: ProxyCore,
  cluster: string,
  caller: GatewayCaller,
  service: ServiceDestination,
): HttpTypes.RequestOptions['createConnection'] {
  const host = serviceHost(service.target);
  return ((_opts: unknown, oncreate: (err: Error | null, socket?: Duplex) => void) => {
    new TunnelSocket(
      core,
      cluster,
      caller.name,
      (err, socket) => {
        if (err) oncreate(err);
        else if (service.target.protocol === 'https') startServiceTls(socket, host, service.ca, oncreate);
        else oncreate(null, socket);
      },
      `${host}:${service.target.port}`,
    );
    return undefined; // the socket comes through oncreate, once the agent accepted the dial
  }) as unknown as HttpTypes.RequestOptions['createConnection'];
}

/** A Service's in-cluster name, as its certificate names it. */
export function serviceHost(t: ServiceTarget): string {
  return `${t.name}.${t.namespace}.svc`;
}

class ServiceTlsError extends Error {
  override name = 'ServiceTlsError';
}

/** TLS to an https Service over its tunneled connection, verified as `name.ns.svc`. */
function startServiceTls(
  socket: TunnelSocket,
  host: string,
  ca: Buffer | undefined,
  done: (err: Error | null, socket?: Duplex) => void,
): void {
  const t = tls.connect({ socket, servername: host, ...(ca ? { ca } : {}), ALPNProtocols: ['http/1.1'] });
  const failed = (err: Error): void => {
    t.destroy();
    socket.destroy();
    const code = (err as NodeJS.ErrnoException).code ?? 'handshake failed';
    done(
      new ServiceTlsError(
        `${code}${ca ? '' : " (no caFile for this service in the gateway's service allowlist: its certificate must chain to a public root)"}`,
      ),
    );
  };
  t.once('error', failed);
  t.once('secureConnect', () => {
    t.off('error', failed);
    done(null, t);
  });
}
