// The hub's small HTTP API for agents, served on the agent listener (ALPN "http/1.1") so a firewall
// that lets agents reach :8091 needs no other hole: bootstrap (token → certificate), certificate
// renewal, and lease renewal with the agent's health report. Routes register themselves; each one
// says whether it needs a verified agent certificate.
import { http } from '@cluster-proxy/proto';
import type { PeerCertificate, TLSSocket } from 'node:tls';
import type { Logger } from 'pino';
import { clusterFromSubject, type AgentIdentity } from '../pki/agent-identity.js';
import type * as HttpTypes from 'node:http';
import { HTTP1_ALPN } from '../dataplane/tls-port.js';

export const HUB_API_ALPN = HTTP1_ALPN;
/**
 * An idle hub API connection is closed after this long. Agents' requests are minutes apart (lease renewals,
 * replica syncs), so keeping their connections open would not save handshakes without holding an idle TLS
 * connection per agent (~68 KiB of hub memory each: +330 MiB at 5,000 agents).
 */
export const HUB_API_KEEPALIVE_MS = 5000;
/** Request bodies are small JSON documents (a CSR, a health report). */
export const MAX_HUB_API_BODY_BYTES = 64 * 1024;

export interface HubApiCaller {
  /** TLS verified the client certificate against the hub CA. */
  authorized: boolean;
  /** The verified certificate's cluster identity (agent certificates only). */
  agent: AgentIdentity | null;
  certificate: PeerCertificate | null;
  peer: string;
}

export interface HubApiRequest {
  method: string;
  path: string;
  headers: HttpTypes.IncomingHttpHeaders;
  /** Parsed JSON body (null when there was none). */
  body: unknown;
  caller: HubApiCaller;
}

export interface HubApiResponse {
  status: number;
  body: unknown;
}

export type HubApiHandler = (req: HubApiRequest) => Promise<HubApiResponse>;

/** Thrown by handlers for an answer that is not 200: `{ error: message }` with this status. */
export class HubApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

interface Route {
  handler: HubApiHandler;
  /** true: only callers with a verified agent certificate reach the handler (401 otherwise). */
  agentOnly: boolean;
}

export class HubApi {
  private readonly routes = new Map<string, Route>();
  private readonly server: HttpTypes.Server;
  private draining = false;
  /**
   * Open connections and how many requests each is answering. Tracked here because this server never
   * listens (sockets come from the agent port), so Node's own closeIdleConnections() does not know them.
   */
  private readonly sockets = new Map<TLSSocket, number>();

  constructor(private readonly log: Logger) {
    this.server = http.createServer((req, res) => void this.handle(req, res));
    this.server.keepAliveTimeout = HUB_API_KEEPALIVE_MS;
    this.server.headersTimeout = 10_000;
    this.server.requestTimeout = 15_000;
  }

  /** A route registered as `/v1/things/*` matches `/v1/things/NAME`; the handler reads NAME from `path`. */
  private prefixRoute(method: string, path: string): Route | undefined {
    const cut = path.lastIndexOf('/');
    return cut > 0 ? this.routes.get(`${method} ${path.slice(0, cut)}/*`) : undefined;
  }

  /** `method path` → handler (`path` may end in `/*`). Registering the same route twice is a programming error. */
  route(method: string, path: string, handler: HubApiHandler, opts: { agentOnly: boolean }): void {
    const key = `${method} ${path}`;
    if (this.routes.has(key)) throw new Error(`hub API route ${key} registered twice`);
    this.routes.set(key, { handler, agentOnly: opts.agentOnly });
  }

  /** Hands a TLS socket that negotiated http/1.1 to the HTTP server. */
  accept(socket: TLSSocket): void {
    // Even while draining: the hub keeps serving until its listener closes (load balancers may still send
    // requests during --shutdown-delay); such a connection carries one request and closes after it.
    this.sockets.set(socket, 0);
    socket.once('close', () => this.sockets.delete(socket));
    this.server.emit('connection', socket);
  }

  /**
   * Shutdown begins: idle keep-alive connections close now and busy ones after their answer (`connection:
   * close`), so no kept connection holds this replica (or its load balancer's backend) until close().
   */
  drain(): void {
    this.draining = true;
    for (const [socket, busy] of this.sockets) if (busy === 0) socket.destroy();
  }

  close(): void {
    this.draining = true;
    for (const socket of this.sockets.keys()) socket.destroy();
    this.sockets.clear();
    this.server.close();
  }

  /** Answers one request; also used by the plain-HTTP loopback admin listener (no client certificate there). */
  async handle(req: HttpTypes.IncomingMessage, res: HttpTypes.ServerResponse): Promise<void> {
    const socket = req.socket as TLSSocket;
    const busy = this.sockets.get(socket);
    if (busy !== undefined) {
      this.sockets.set(socket, busy + 1);
      res.once('close', () => {
        // Draining: the answer carries `connection: close`, so Node ends the connection after it.
        const n = this.sockets.get(socket);
        if (n !== undefined) this.sockets.set(socket, n - 1);
      });
    }
    const cert = socket.authorized === true ? socket.getPeerCertificate() : null;
    const caller: HubApiCaller = {
      authorized: socket.authorized === true,
      certificate: cert && Object.keys(cert).length > 0 ? cert : null,
      agent: cert ? clusterFromSubject(cert.subject) : null,
      peer: `${socket.remoteAddress}:${socket.remotePort}`,
    };
    const path = new URL(req.url ?? '/', 'https://hub').pathname;
    const send = (status: number, body: unknown): void => {
      if (res.headersSent) return;
      res.writeHead(status, { 'content-type': 'application/json', ...(this.draining ? { connection: 'close' } : {}) });
      res.end(`${JSON.stringify(body)}\n`);
    };
    const route = this.routes.get(`${req.method} ${path}`) ?? this.prefixRoute(req.method ?? '', path);
    if (!route) {
      req.resume();
      return send(404, { error: `no such hub API endpoint: ${req.method} ${path}` });
    }
    if (route.agentOnly && !caller.agent) {
      req.resume();
      return send(401, { error: 'this endpoint needs a valid agent client certificate' });
    }
    let body: unknown = null;
    try {
      body = await readJson(req);
    } catch (err) {
      return send((err as HubApiError).status ?? 400, { error: (err as Error).message });
    }
    try {
      const out = await route.handler({ method: req.method ?? 'GET', path, headers: req.headers, body, caller });
      send(out.status, out.body);
    } catch (err) {
      if (err instanceof HubApiError) return send(err.status, { error: err.message });
      this.log.error({ path, peer: caller.peer, err: (err as Error).message }, 'hub API handler failed');
      send(500, { error: 'internal error; see the hub log' });
    }
  }
}

function readJson(req: HttpTypes.IncomingMessage): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > MAX_HUB_API_BODY_BYTES) {
        reject(new HubApiError(413, `request body over ${MAX_HUB_API_BODY_BYTES} bytes`));
        req.destroy();
        return;
      }
      chunks.push(c);
    });
    req.once('error', reject);
    req.once('end', () => {
      if (size === 0) return resolve(null);
      try {
        resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch {
        reject(new HubApiError(400, 'request body is not JSON'));
      }
    });
  });
}
