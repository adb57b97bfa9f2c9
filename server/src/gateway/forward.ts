// One authenticated gateway request, forwarded to the agent of its cluster: over a connection through
// the agent's tunnel (TunnelSocket: the core's in-process dial, no new tunnel; kept alive in agent-pool.ts),
// as HTTP/1.1 to the agent's reserved destination, with the caller's identity authenticated by the hub
// (proto gateway-identity.ts: an HMAC under the key of the link the connection rides when the agent takes
// one, else a signature) and none of the caller's credentials. The head is written here; bodies go on as
// node's parser hands them over (re-chunked when chunked), with backpressure both ways (a write that
// returns false waits for 'drain'); nothing is buffered whole. The agent's answer is parsed (agent-pool.ts)
// and passed on with its end-to-end headers.
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import {
  GATEWAY_AGENT_MAX_HEAD_BYTES,
  GATEWAY_HOST,
  IDENTITY_HEADER,
  IDENTITY_MAC_HEADER,
  IDENTITY_SIGNER_HEADER,
  appendForwardedFor,
  distinctHeaders,
  endToEndHeaders,
  gatewayForwardedHeaders,
  headerLines,
  identityPayload,
  LAST_CHUNK,
  macPayload,
  requestLine,
  signPayload,
  signedLength,
  type DialFailureReason,
  writeChunk,
  type GatewayIdentity,
} from '@cluster-proxy/proto';
import type { ProxyCore } from '../dataplane/proxy-core.js';
import { AgentLeg, type GatewayPool } from './agent-pool.js';
import type { GatewayCaller } from './auth.js';
import type { CallerExchange, GatewayRequest } from './caller-connection.js';
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
    req: Pick<GatewayRequest, 'method'>,
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
export function callerHeaders(req: Pick<GatewayRequest, 'headersDistinct' | 'socket'>): Record<string, string | string[]> {
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

/** The agent gave no answer's head within `ms`. */
function agentTimedOut(ms: number): ResponseTimeoutError {
  return new ResponseTimeoutError(`the cluster's agent did not answer within ${Math.round(ms / 1000)} s`);
}

/** Arms the response-head timer of `upstream`; returns the function that disarms it. */
export function responseTimer(upstream: HttpTypes.ClientRequest, ms: number): () => void {
  const t = setTimeout(() => upstream.destroy(agentTimedOut(ms)), ms);
  return () => clearTimeout(t);
}

export function forward(
  ctx: ForwardContext,
  caller: GatewayCaller,
  identity: GatewayIdentity,
  cluster: string,
  path: string,
  req: GatewayRequest,
  ex: CallerExchange,
  service?: ServiceDestination,
): Promise<ForwardResult> {
  return new Promise((resolve) => {
    let bytesIn = 0;
    let bytesOut = 0;
    let done = false;
    let leg: AgentLeg | null = null;
    let timer: NodeJS.Timeout | null = null;
    // The caller's input, paused while the agent's connection is full, resumes on its 'drain' or 'close'.
    let waiting: (() => void) | null = null;
    const wake = (): void => {
      const f = waiting;
      waiting = null;
      f?.();
    };
    let unhook: (() => void) | null = null;
    const finish = (status: number, error?: string): void => {
      if (done) return;
      done = true;
      if (timer) clearTimeout(timer);
      unhook?.();
      resolve({ status, bytesIn, bytesOut, ...(error ? { error } : {}) });
    };

    const headers = callerHeaders(req);
    delete headers['expect']; // answered here (caller-connection.ts: 100 Continue)
    const host = service ? serviceHost(service.target) : GATEWAY_HOST;
    headers['host'] = service ? `${host}:${service.target.port}` : host;
    const handoff = service ? null : new IdentityHandoff(ctx, identity, cluster, path, req);
    // A Service gets one connection per request (nothing of it idles in the tables); the agent's
    // reserved destination is reached through the keep-alive pool.
    if (service) headers['connection'] = 'close';
    // A chunked body stays chunked (no length to give); its chunks are written here.
    if (req.chunked) headers['transfer-encoding'] = 'chunked';
    const tooLarge = headTooLarge(req.method, path, headers, handoff?.maxBytes() ?? 0);
    if (tooLarge) {
      ex.refuse(431, tooLarge);
      finish(431, tooLarge);
      return;
    }

    // Before the answer's head: a one-line refusal; after it, a broken answer (the caller must not see a clean end).
    const failed = (err: Error): void => {
      if (done) return;
      leg?.destroy();
      if (ex.headersSent) {
        ex.destroy();
        finish(ex.status, `upstream failed: ${err.message}`);
        return;
      }
      const m = failureOf(err, service);
      ex.refuse(m.status, m.why);
      finish(m.status, err.message);
    };
    ex.onGone(() => {
      leg?.destroy();
      finish(ex.headersSent ? ex.status : 499, 'the caller went away');
    });
    timer = setTimeout(() => failed(agentTimedOut(ctx.responseTimeoutMs)), ctx.responseTimeoutMs);

    const send = (l: AgentLeg): void => {
      if (done || !ex.open) {
        l.destroy();
        return;
      }
      leg = l;
      const socket = l.socket;
      let informational = false;
      let keep = false;
      // The agent's connection is paused until the caller took the answer so far (one wait at a time).
      let callerFull = false;
      l.use({
        head: (h) => {
          // 1xx: not passed on (a 100 Continue was the gateway's to send).
          informational = h.status < 200;
          if (informational) return false;
          if (timer) clearTimeout(timer);
          timer = null;
          keep = h.keepAlive;
          ex.head(h.status, h.statusMessage, endToEndHeaders(distinctHeaders(h.rawHeaders)));
          return req.method === 'HEAD';
        },
        body: (chunk) => {
          bytesOut += chunk.length;
          if (!ex.write(chunk) && !callerFull) {
            callerFull = true;
            socket.pause();
            ex.drained(() => {
              callerFull = false;
              socket.resume();
            });
          }
        },
        end: () => {
          if (informational) {
            informational = false;
            return;
          }
          ex.end();
          // Kept for the next request once the request went out whole as well; else closed.
          if (keep && ex.requestEnded && !service) ctx.pool.release(l);
          else l.destroy();
          finish(ex.status);
        },
        failed,
      });
      const all = handoff ? { ...headers, ...handoff.headers(socket) } : headers;
      socket.write(`${req.method} ${path} HTTP/1.1\r\n${headerLines(all)}\r\n`, 'latin1');
      socket.on('drain', wake);
      socket.on('close', wake);
      unhook = () => {
        socket.off('drain', wake);
        socket.off('close', wake);
        wake();
      };
      ex.bodyTo({
        chunk: (b) => {
          bytesIn += b.length;
          // Answered already and the connection closed: the rest of the body is read and dropped.
          if (socket.destroyed) return true;
          return req.chunked ? writeChunk(socket, b) : socket.write(b);
        },
        end: () => {
          if (req.chunked && !socket.destroyed) socket.write(LAST_CHUNK);
        },
        failed: (why) => {
          l.destroy();
          if (done) return;
          if (ex.headersSent) ex.destroy();
          else ex.refuse(400, why);
          finish(ex.headersSent ? ex.status : 400, `request body cut off: ${why}`);
        },
        drained: (f) => {
          if (socket.destroyed || done) f();
          else waiting = f;
        },
      });
    };

    const got = (err: Error | null, l?: AgentLeg): void => (err ? failed(err) : send(l!));
    if (service) dialService(ctx.core, cluster, caller, service, (err, s) => (err ? failed(err) : send(new AgentLeg(s!, ''))));
    else ctx.pool.take(cluster, caller.name, got);
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

/** A Service's connection: NAME.NS.svc:PORT dialed on an agent of `cluster`, TLS inside for https. */
export function dialService(
  core: ProxyCore,
  cluster: string,
  caller: GatewayCaller,
  service: ServiceDestination,
  done: (err: Error | null, socket?: Duplex) => void,
): void {
  const host = serviceHost(service.target);
  new TunnelSocket(
    core,
    cluster,
    caller.name,
    (err, socket) => {
      if (err) done(err);
      else if (service.target.protocol === 'https') startServiceTls(socket, host, service.ca, done);
      else done(null, socket);
    },
    `${host}:${service.target.port}`,
  );
}

/** node:http's createConnection for a Service (dialService). */
export function serviceConnection(
  core: ProxyCore,
  cluster: string,
  caller: GatewayCaller,
  service: ServiceDestination,
): HttpTypes.RequestOptions['createConnection'] {
  return ((_opts: unknown, oncreate: (err: Error | null, socket?: Duplex) => void) => {
    dialService(core, cluster, caller, service, oncreate);
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
