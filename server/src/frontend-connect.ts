// HTTP CONNECT frontend (SPEC §5, default port 8089): curl, kubectl's proxy-url, Python, Java —
// anything that speaks an HTTP proxy — reaches a managed cluster through the tunnel.
//
// Listeners: TLS (client certificates signed by the hub CA authenticate; agent certificates are
// refused), a Unix socket (trusted by its file mode, 0660), and opt-in plain TCP that may only bind
// loopback. Clients without a certificate send `Proxy-Authorization: Bearer <token>` or `Basic`
// with any user name and the token as password; tokens are accepted over TLS and the Unix socket,
// on plain TCP only when `plain.allowTokens` is set.
//
// One client connection carries one CONNECT. We read the request head ourselves (bounded in size
// by maxHeaderBytes and in time by headerTimeoutMs, measured from accept, TLS handshake included,
// so a slow client cannot hold a slot), answer errors with a one-line text/plain body and
// `Connection: close`, and after `200 Connection Established` (and nothing else) the socket is
// this connection's Frontend towards the core:
//
//   reading-head ──► dialing ──► open ──► half-closed ──► closed
//        │              │                                  ▲
//        └──────────────┴──► refusing (error sent, lingering for the client to read it) ┘
//
// Backpressure: client bytes go to ProxiedConnection.write(), which calls pause()/resume() as
// credit towards the agent runs out/returns; we pause the socket. Bytes to the client go through
// `sink.write(chunk, cb)` = socket.write(chunk, cb): the callback (bytes left our process) returns
// credit to the agent. Bytes the client pipelines after the head (a TLS ClientHello) are held —
// at most PIPELINE_LIMIT, then the socket is paused — and forwarded once the dial succeeds.
import { lstat, chmod, unlink } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { joinHostPort, type ByteSink, type DialFailureReason } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import type { Frontend } from './frontend.js';
import { clusterFromSubject } from './pki/agent-identity.js';
import type { ProxiedConnection } from './proxied-connection.js';
import type { ProxyCore } from './proxy-core.js';
import { findHeadEnd, parseAuthority, parseHead, tokenFromHeader } from './connect-request.js';
import { tokenAllowsCluster, type TokenPrincipal, type TokenStore } from './tokens.js';

export const DEFAULT_CONNECT_PORT = 8089;
const DEFAULT_HEADER_TIMEOUT_MS = 10_000;
const DEFAULT_MAX_HEADER_BYTES = 16 * 1024;
/** Bytes the client may send after the head while the dial is pending before we stop reading. */
const PIPELINE_LIMIT = 64 * 1024;
/** After an error response: how long we keep reading (and discarding) so the client gets to read
 * the response instead of a reset, before closing anyway. */
const LINGER_MS = 2000;
/** After the tunnel closed cleanly: how long a client may take to read what is still queued for it
 * (at most one flow-control window) before we give up on it. */
const FLUSH_TIMEOUT_MS = 60_000;
const UDS_MODE = 0o660;
const REALM = 'cluster-proxy';
const PROXY_AUTHENTICATE = `Bearer realm="${REALM}", Basic realm="${REALM}"`;

/**
 * How each dial failure class of the core becomes an HTTP status. The one place this is decided.
 *   - `forbidden` is the agent's allowlist refusing the destination: a policy decision, so 403
 *     (as a proxy's ACL denial is), not 502 — the destination was never tried.
 *   - `dialclosed` (the agent vanished mid-dial) and anything unclassified are a bad gateway.
 */
export const DIAL_FAILURE_STATUS: Readonly<Record<DialFailureReason, { status: number; why: string }>> = {
  no_agent: { status: 503, why: 'no agent is connected for this destination' },
  draining: { status: 503, why: 'the agents for this destination are shutting down' },
  endpoint: { status: 502, why: 'the agent could not connect to the destination (refused or unresolvable)' },
  forbidden: { status: 403, why: "the destination is not in the agent's allowlist" },
  timeout: { status: 504, why: 'the dial timed out' },
  dialclosed: { status: 502, why: 'the agent disconnected during the dial' },
  unknown: { status: 502, why: 'the dial failed' },
};

const STATUS_TEXT: Readonly<Record<number, string>> = {
  400: 'Bad Request',
  403: 'Forbidden',
  405: 'Method Not Allowed',
  407: 'Proxy Authentication Required',
  408: 'Request Timeout',
  431: 'Request Header Fields Too Large',
  502: 'Bad Gateway',
  503: 'Service Unavailable',
  504: 'Gateway Timeout',
};

export type ListenerKind = 'tls' | 'uds' | 'plain';

/** Who is asking. Certificates and Unix-socket peers may reach every cluster (subject to
 * `authorize`); a token only the clusters it was issued for. */
export type Principal =
  | { kind: 'certificate'; name: string }
  | { kind: 'unix-socket'; name: string }
  | TokenPrincipal;

export interface ConnectFrontendOptions {
  core: ProxyCore;
  log: Logger;
  /** TLS listener; client certificates are optional (tokens otherwise). PEM contents. */
  tls?: { host: string; port: number; caCert: Buffer; cert: Buffer; key: Buffer };
  /** Unix socket (created 0660); peers are trusted by the file's permissions. */
  uds?: string;
  /** Plain TCP, loopback addresses only. Tokens would travel in clear text, so they are refused
   * unless `allowTokens`; without it the listener authenticates nobody. */
  plain?: { host: string; port: number; allowTokens?: boolean };
  tokens: TokenStore;
  /** Extra policy after authentication; default: every authenticated principal may reach every
   * cluster (a token is always limited to its own clusters first). */
  authorize?: (principal: Principal, cluster: string) => boolean;
  /** From accept (TLS handshake included) to the end of the request head. Default 10 s. */
  headerTimeoutMs?: number;
  /** Largest request head accepted. Default 16 KiB. */
  maxHeaderBytes?: number;
  /** Client connections held at once over all listeners (any state); more get 503. Default: no limit. */
  maxConnections?: number;
}

export interface ConnectFrontendPorts {
  tls: number | null;
  uds: string | null;
  plain: number | null;
}

export type ConnectState = 'reading-head' | 'dialing' | 'open' | 'half-closed' | 'refusing' | 'closed';

export interface ConnectConnectionInfo {
  state: ConnectState;
  listener: ListenerKind;
  peer: string;
  principal: string;
  destination: string;
  connectID: number;
}

export interface ConnectFrontend {
  readonly ports: ConnectFrontendPorts;
  /** Stops listening, lets open tunnels run for up to `graceMs`, then closes everything. */
  stop(graceMs?: number): Promise<void>;
  /** Client connections currently held, in any state. */
  connections(): number;
  /** One entry per client connection (for /debug/connections). */
  describe(): ConnectConnectionInfo[];
  /** New TLS material for connections from now on (open ones keep theirs). */
  setTls(tls: { caCert: Buffer; cert: Buffer; key: Buffer }): void;
}

interface Shared {
  core: ProxyCore;
  log: Logger;
  tokens: TokenStore;
  authorize: (principal: Principal, cluster: string) => boolean;
  headerTimeoutMs: number;
  maxHeaderBytes: number;
  plainAllowsTokens: boolean;
  conns: Set<ConnectConnection>;
}

export async function startConnectFrontend(opts: ConnectFrontendOptions): Promise<ConnectFrontend> {
  if (!opts.tls && !opts.uds && !opts.plain) throw new Error('the CONNECT frontend needs at least one listener (tls, uds or plain)');
  if (opts.plain && !isLoopback(opts.plain.host)) {
    throw new Error(`refusing to serve plain-TCP CONNECT on ${opts.plain.host}: only loopback addresses (127.0.0.0/8, ::1, localhost); use the TLS listener elsewhere`);
  }
  const conns = new Set<ConnectConnection>();
  const shared: Shared = {
    core: opts.core,
    log: opts.log.child({ component: 'connect-frontend' }),
    tokens: opts.tokens,
    authorize: opts.authorize ?? (() => true),
    headerTimeoutMs: opts.headerTimeoutMs ?? DEFAULT_HEADER_TIMEOUT_MS,
    maxHeaderBytes: opts.maxHeaderBytes ?? DEFAULT_MAX_HEADER_BYTES,
    plainAllowsTokens: opts.plain?.allowTokens ?? false,
    conns,
  };
  const maxConnections = opts.maxConnections ?? Number.POSITIVE_INFINITY;
  const servers: net.Server[] = [];
  const rawSockets = new Set<net.Socket>();
  let stopping = false;
  let stopped: Promise<void> | null = null;

  const accept = (socket: net.Socket, kind: ListenerKind): void => {
    const c = new ConnectConnection(socket, kind, shared);
    if (stopping) c.refuseEarly(503, 'the hub is shutting down', 'shutting_down');
    else if (conns.size > maxConnections) c.refuseEarly(503, `too many client connections (limit ${maxConnections})`, 'overloaded');
  };
  const track = (server: net.Server): void => {
    servers.push(server);
    server.on('connection', (s: net.Socket) => {
      rawSockets.add(s);
      s.once('close', () => rawSockets.delete(s));
    });
  };

  const ports: ConnectFrontendPorts = { tls: null, uds: null, plain: null };
  let tlsServer: tls.Server | null = null;
  try {
    if (opts.tls) {
      const t = opts.tls;
      const server = tlsServer = tls.createServer({
        ca: t.caCert, cert: t.cert, key: t.key,
        requestCert: true, rejectUnauthorized: false, // no certificate = token auth; checked per request
        ALPNProtocols: ['http/1.1'],
        handshakeTimeout: shared.headerTimeoutMs,
        allowHalfOpen: true,
      });
      server.on('secureConnection', (s: tls.TLSSocket) => accept(s, 'tls'));
      server.on('tlsClientError', (err, s) => {
        shared.log.info({ listener: 'tls', peer: peerOf(s) }, `TLS handshake failed: ${oneLine(err.message)}`);
        // With a listener here Node leaves the socket open, even after ERR_TLS_HANDSHAKE_TIMEOUT.
        s.destroy();
      });
      track(server);
      ports.tls = await listen(server, { host: t.host, port: t.port });
    }
    if (opts.plain) {
      const server = net.createServer({ allowHalfOpen: true }, (s) => accept(s, 'plain'));
      track(server);
      ports.plain = await listen(server, { host: opts.plain.host, port: opts.plain.port });
    }
    if (opts.uds) {
      const file = path.resolve(opts.uds);
      const server = net.createServer({ allowHalfOpen: true }, (s) => accept(s, 'uds'));
      track(server);
      await listenUnix(server, file);
      ports.uds = file;
    }
  } catch (err) {
    await Promise.all(servers.map(closeServer));
    throw err;
  }
  shared.log.info(ports, 'CONNECT frontend listening');

  return {
    ports,
    setTls: (m) => tlsServer?.setSecureContext({ ca: m.caCert, cert: m.cert, key: m.key }),
    connections: () => conns.size,
    describe: () => [...conns].map((c) => c.describe()),
    stop(graceMs = 0): Promise<void> {
      stopped ??= (async () => {
        stopping = true;
        const closed = Promise.all(servers.map(closeServer));
        for (const c of conns) if (!c.isTunnel()) c.destroy();
        const deadline = Date.now() + graceMs;
        while (conns.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, Math.min(50, deadline - Date.now())));
        for (const c of conns) c.destroy();
        for (const s of rawSockets) s.destroy(); // TLS handshakes still in progress
        await closed;
        if (ports.uds) await unlink(ports.uds).catch(() => undefined);
      })();
      return stopped;
    },
  };
}

// ------------------------------------------------------------ one client connection

class ConnectConnection implements Frontend {
  readonly halfClose = true; // a TCP socket can half-close
  readonly sink: ByteSink;
  private state: ConnectState = 'reading-head';
  private log: Logger;
  private readonly peer: string;
  private head: Buffer | null = null;
  private headLen = 0;
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private conn: ProxiedConnection | null = null;
  private connectID = 0;
  private destination = '';
  private principal: Principal | null = null;
  private clientEnded = false;
  private remoteEnded_ = false;
  private corePaused = false;
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly socket: net.Socket, private readonly listener: ListenerKind, private readonly shared: Shared) {
    this.peer = peerOf(socket) || listener;
    this.log = shared.log.child({ listener, peer: this.peer });
    shared.conns.add(this);
    if (listener !== 'uds') {
      socket.setNoDelay(true);
      socket.setKeepAlive(true, 30_000);
    }
    this.sink = {
      write: (chunk, callback) => {
        if (this.socket.destroyed || this.socket.writableEnded) {
          process.nextTick(callback, new Error('client connection closed'));
          return false;
        }
        return this.socket.write(chunk, callback);
      },
    };
    socket.on('data', this.onData);
    socket.on('end', this.onEnd);
    socket.on('error', (err: Error) => this.log.debug({ err: err.message, state: this.state }, 'client socket error'));
    socket.once('close', this.onClose);
    this.timer = setTimeout(this.onHeaderTimeout, shared.headerTimeoutMs);
  }

  describe(): ConnectConnectionInfo {
    return { state: this.state, listener: this.listener, peer: this.peer, principal: this.principal ? principalName(this.principal) : '', destination: this.destination, connectID: this.connectID };
  }

  isTunnel(): boolean {
    return this.state === 'open' || this.state === 'half-closed';
  }

  /** Answer before reading anything (shutting down, over the connection limit). */
  refuseEarly(status: number, message: string, reason: string): void {
    if (this.state === 'reading-head') this.refuse(status, message, reason);
  }

  destroy(): void {
    this.socket.destroy();
  }

  // ------------------------------------------------------------ socket events

  private readonly onData = (chunk: Buffer): void => {
    switch (this.state) {
      case 'reading-head':
        return this.readHead(chunk);
      case 'dialing':
        this.pending.push(chunk);
        this.pendingBytes += chunk.length;
        if (this.pendingBytes >= PIPELINE_LIMIT) this.socket.pause();
        return;
      case 'open':
      case 'half-closed':
        if (!this.clientEnded) this.conn?.write(chunk);
        return;
      default:
        return; // refusing / closed: discard
    }
  };

  private readonly onEnd = (): void => {
    switch (this.state) {
      case 'reading-head':
        return this.refuse(400, 'the connection ended before the request head was complete', 'bad_request');
      case 'dialing':
        this.clientEnded = true; // applied once the tunnel is open
        return;
      case 'open':
      case 'half-closed':
        if (this.clientEnded) return;
        this.clientEnded = true;
        this.state = 'half-closed';
        this.conn?.endWrite();
        return;
      default:
        return;
    }
  };

  private readonly onClose = (): void => {
    this.clearTimer();
    const was = this.state;
    this.state = 'closed';
    this.shared.conns.delete(this);
    this.pending = [];
    this.head = null;
    // A pending dial is abandoned, an open connection closed (a no-op once the core closed it).
    const conn = this.conn;
    this.conn = null;
    conn?.close();
    if (was === 'open' || was === 'half-closed') {
      this.log.info({ destination: this.destination, bytesToAgent: conn?.bytesToAgent, bytesToClient: conn?.bytesToClient }, 'CONNECT tunnel closed');
    }
  };

  private readonly onHeaderTimeout = (): void => {
    this.timer = null;
    if (this.state !== 'reading-head') return;
    this.refuse(408, `the request head did not arrive within ${this.shared.headerTimeoutMs} ms`, 'header_timeout');
  };

  // ------------------------------------------------------------ request head

  private readHead(chunk: Buffer): void {
    const max = this.shared.maxHeaderBytes;
    const old = this.headLen;
    const take = Math.min(chunk.length, max - old);
    if (!this.head || this.head.length < old + take) {
      const grown = Buffer.allocUnsafe(Math.min(max, Math.max(1024, (old + take) * 2)));
      this.head?.copy(grown, 0, 0, old);
      this.head = grown;
    }
    chunk.copy(this.head, old, 0, take);
    this.headLen = old + take;
    const end = findHeadEnd(this.head.subarray(0, this.headLen), Math.max(0, old - 2));
    if (end < 0) {
      if (this.headLen >= max) this.refuse(431, `the request head is larger than ${max} bytes`, 'header_too_large');
      return;
    }
    // Bytes after the head (pipelined tunnel data) come from this chunk, never from an earlier one.
    const rest = chunk.subarray(end - old);
    const text = this.head.toString('latin1', 0, end);
    this.head = null;
    this.clearTimer();
    if (rest.length > 0) {
      this.pending.push(rest);
      this.pendingBytes = rest.length;
    }
    this.handleRequest(text);
  }

  private handleRequest(text: string): void {
    // Name the target in every answer, even when the rest of the head is malformed.
    const named = /^[^\s]+ ([^\s]+) /.exec(text.slice(0, text.indexOf('\n')));
    if (named) this.destination = printable(named[1]!);
    const parsed = parseHead(text);
    if (typeof parsed === 'string') return this.refuse(400, parsed, 'bad_request');
    const { method, target, headers } = parsed;
    this.destination = printable(target);
    if (method !== 'CONNECT') {
      return this.refuse(405, `only CONNECT is supported, not ${printable(method)}`, 'method_not_allowed', ['Allow: CONNECT']);
    }
    const address = parseAuthority(target);
    if (!address) return this.refuse(400, 'the CONNECT target must be HOST:PORT (a DNS name, IPv4 address or [IPv6] address, port 1-65535)', 'bad_request');
    this.destination = address;

    const auth = this.authenticate(headers.get('proxy-authorization'));
    if ('status' in auth) {
      const extra = auth.status === 407 ? [`Proxy-Authenticate: ${PROXY_AUTHENTICATE}`] : [];
      return this.refuse(auth.status, auth.message, auth.reason, extra);
    }
    this.principal = auth.principal;

    // Authorize on the cluster the destination routes to. core.dial() routes again in the same
    // synchronous turn, so it sees the same table and picks the same agent (checked below).
    const route = this.shared.core.routes.route(address);
    if (!('backend' in route)) {
      this.shared.core.metrics.routeFailure(route.reason);
      return this.dialFailed(route.reason, route.message);
    }
    const cluster = route.backend.cluster;
    if (auth.principal.kind === 'token' && !tokenAllowsCluster(auth.principal, cluster)) {
      return this.refuse(403, `token "${auth.principal.name}" may not reach cluster ${cluster}`, 'not_authorized');
    }
    if (!this.shared.authorize(auth.principal, cluster)) {
      return this.refuse(403, `${principalName(auth.principal)} may not reach cluster ${cluster}`, 'not_authorized');
    }

    this.state = 'dialing';
    const conn = this.shared.core.dial(address, 'tcp', this);
    if (!conn || this.state !== 'dialing') return; // dialFailed already answered
    if (conn.backend.cluster !== cluster) {
      // Cannot happen with a synchronous core; refuse rather than tunnel into an unauthorized cluster.
      this.log.error({ destination: address, authorized: cluster, routed: conn.backend.cluster }, 'dial routed to another cluster than the one authorized; closing it');
      conn.close();
      return this.refuse(403, `the destination moved to cluster ${conn.backend.cluster} during authorization`, 'not_authorized');
    }
    this.conn = conn;
  }

  private authenticate(values: string[] | undefined): { principal: Principal } | { status: 400 | 403 | 407; message: string; reason: string } {
    if (values && values.length > 1) return { status: 400, message: 'more than one Proxy-Authorization header', reason: 'bad_request' };
    const header = values?.[0];
    let certNote = '';
    if (this.listener === 'tls') {
      const s = this.socket as tls.TLSSocket;
      const cert = s.getPeerCertificate();
      if (cert && Object.keys(cert).length > 0) {
        if (s.authorized) {
          // Agents share the CA with hub users; an agent certificate must not open connections into other clusters.
          if (clusterFromSubject(cert.subject)) return { status: 403, message: 'agent certificates may not use the client frontend', reason: 'agent_certificate' };
          return { principal: { kind: 'certificate', name: firstValue(cert.subject?.CN) || 'unnamed-certificate' } };
        }
        certNote = ` (the client certificate was not accepted: ${oneLine(String(s.authorizationError ?? 'not verified'))})`;
      }
    }
    if (header === undefined) {
      if (this.listener === 'uds') return { principal: { kind: 'unix-socket', name: 'unix-socket' } };
      if (this.listener === 'plain') {
        return { status: 407, message: this.shared.plainAllowsTokens ? 'no credentials: send Proxy-Authorization: Bearer <token> (or Basic with the token as password)' : 'the plain-TCP listener authenticates nobody: tokens are not accepted on it (they would travel unencrypted); use the TLS listener or the Unix socket', reason: 'unauthenticated' };
      }
      return { status: 407, message: `no credentials: present a client certificate signed by the hub CA, or send Proxy-Authorization: Bearer <token> (or Basic with the token as password)${certNote}`, reason: 'unauthenticated' };
    }
    if (this.listener === 'plain' && !this.shared.plainAllowsTokens) {
      return { status: 407, message: 'tokens are not accepted on the plain-TCP listener (they would travel unencrypted); use the TLS listener or the Unix socket', reason: 'token_over_plaintext' };
    }
    const token = tokenFromHeader(header);
    if (token === null) return { status: 407, message: `unsupported Proxy-Authorization: use "Bearer <token>" or "Basic" with the token as password${certNote}`, reason: 'unauthenticated' };
    const principal = this.shared.tokens.verify(token);
    if (!principal) return { status: 407, message: `the token is invalid, expired or revoked${certNote}`, reason: 'bad_token' };
    return { principal };
  }

  // ------------------------------------------------------------ Frontend (called by the core)

  dialSucceeded(connectID: number): void {
    if (this.state !== 'dialing' || !this.conn) {
      this.conn?.close();
      return;
    }
    this.connectID = connectID;
    this.log = this.log.child({ connectID });
    this.state = 'open';
    this.shared.core.metrics.connectRequests.inc({ status: '200' });
    // Exactly the status line and the empty line: the next byte is the destination's.
    this.socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    this.log.info({ destination: this.destination, principal: principalName(this.principal!) }, 'CONNECT tunnel open');
    const pipelined = this.pending;
    this.pending = [];
    this.pendingBytes = 0;
    for (const b of pipelined) this.conn.write(b);
    if (this.clientEnded) {
      this.state = 'half-closed';
      this.conn.endWrite();
    }
    if (!this.corePaused) this.socket.resume();
  }

  dialFailed(reason: DialFailureReason, message: string): void {
    if (this.state !== 'dialing' && this.state !== 'reading-head') return;
    this.conn = null;
    const m = DIAL_FAILURE_STATUS[reason] ?? DIAL_FAILURE_STATUS.unknown;
    this.refuse(m.status, `${m.why}: ${message}`, reason);
  }

  remoteEnded(): void {
    if (!this.isTunnel() || this.remoteEnded_) return;
    this.remoteEnded_ = true;
    this.state = 'half-closed';
    this.socket.end(); // after everything queued before it
  }

  closed(error: string): void {
    this.conn = null;
    if (this.state === 'closed' || this.state === 'refusing') return;
    if (error) {
      // The tunnel broke: a reset tells the client its data may be incomplete (a FIN would not).
      this.log.info({ destination: this.destination, error }, 'CONNECT tunnel closed with an error; resetting the client connection');
      resetSocket(this.socket);
      return;
    }
    // Clean close: flush, FIN, and give the client a moment to close its side. Bytes it still
    // sends have nowhere to go: they get a reset, as TCP answers data for a closed socket, so a
    // client that keeps writing learns at once that nobody reads them.
    this.state = 'half-closed';
    this.remoteEnded_ = true;
    this.linger();
    this.socket.once('data', () => resetSocket(this.socket));
  }

  pause(): void {
    this.corePaused = true;
    this.socket.pause();
  }

  resume(): void {
    this.corePaused = false;
    if (this.isTunnel()) this.socket.resume();
  }

  // ------------------------------------------------------------ responses and teardown

  private refuse(status: number, message: string, reason: string, extraHeaders: string[] = []): void {
    if (this.state === 'refusing' || this.state === 'closed') return;
    const dest = this.destination || '-';
    const level = status === 408 || status === 431 ? 'debug' : 'info';
    this.log[level]({ status, reason, destination: dest, principal: this.principal ? principalName(this.principal) : undefined }, `CONNECT refused: ${message}`);
    this.state = 'refusing';
    this.shared.core.metrics.connectRequests.inc({ status: String(status) });
    this.clearTimer();
    this.pending = [];
    this.pendingBytes = 0;
    this.head = null;
    const body = `CONNECT ${dest}: ${oneLine(message)} (${reason})\n`;
    const head = [
      `HTTP/1.1 ${status} ${STATUS_TEXT[status] ?? 'Error'}`,
      'Content-Type: text/plain; charset=utf-8',
      `Content-Length: ${Buffer.byteLength(body)}`,
      'Connection: close',
      `X-Cluster-Proxy-Reason: ${reason}`,
      ...extraHeaders,
    ];
    if (!this.socket.destroyed && !this.socket.writableEnded) this.socket.write(`${head.join('\r\n')}\r\n\r\n${body}`);
    this.linger();
  }

  /** End our side, keep reading (and discarding) so the client sees our last bytes rather than a
   * reset, and close for good when it closes, or LINGER_MS after everything was flushed (bounded
   * by FLUSH_TIMEOUT_MS for a client that stopped reading). */
  private linger(): void {
    const s = this.socket;
    this.clearTimer();
    s.resume();
    if (s.destroyed) return;
    const afterFlush = (): void => {
      this.clearTimer();
      this.timer = setTimeout(() => s.destroy(), LINGER_MS);
    };
    if (s.writableFinished) return afterFlush();
    this.timer = setTimeout(() => s.destroy(), FLUSH_TIMEOUT_MS);
    s.once('finish', afterFlush);
    if (!s.writableEnded) s.end();
  }

  private clearTimer(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }
}

// ------------------------------------------------------------ helpers

function principalName(p: Principal): string {
  switch (p.kind) {
    case 'certificate':
      return `certificate "${p.name}"`;
    case 'token':
      return `token "${p.name}" (${p.id})`;
    default:
      return p.name;
  }
}

/**
 * RST for a TCP client, TLS included (it learns the stream is incomplete; a FIN, or a TLS
 * close_notify, would read as a complete stream). A Unix socket has no reset: it just closes.
 */
function resetSocket(s: net.Socket): void {
  if (s.destroyed) return;
  // A TLS socket's TCP connection is the net.Socket it wraps (`_parent`, set by node:tls for
  // server-side sockets); resetAndDestroy() works only on that TCP handle.
  const raw = s instanceof tls.TLSSocket ? (s as tls.TLSSocket & { _parent?: unknown })._parent : s;
  try {
    if (raw instanceof net.Socket && !raw.destroyed) raw.resetAndDestroy();
  } catch {
    // Not a TCP handle (a Unix socket): a close is all there is.
  }
  s.destroy();
}

function firstValue(v: string | string[] | undefined): string {
  return Array.isArray(v) ? (v[0] ?? '') : (v ?? '');
}

function peerOf(s: net.Socket): string {
  if (!s.remoteAddress) return '';
  return joinHostPort(s.remoteAddress, s.remotePort ?? 0);
}

/** Printable ASCII only, bounded: client-supplied text that ends up in a response or a log. */
function printable(s: string, max = 300): string {
  // eslint-disable-next-line no-control-regex
  const t = s.replace(/[^\x20-\x7e]/g, '?');
  return t.length > max ? `${t.slice(0, max)}...` : t;
}

function oneLine(s: string): string {
  return printable(s.replace(/\s+/g, ' ').trim(), 500);
}

function isLoopback(host: string): boolean {
  if (host === 'localhost') return true;
  if (net.isIPv4(host)) return host.startsWith('127.');
  if (net.isIPv6(host)) return host === '::1' || /^::ffff:127\./i.test(host);
  return false;
}

function listen(server: net.Server, where: net.ListenOptions): Promise<number> {
  return new Promise((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException): void => reject(new Error(`cannot listen on ${where.host}:${where.port}: ${err.code ?? err.message}`));
    server.once('error', onError);
    server.listen(where, () => {
      server.removeListener('error', onError);
      resolve((server.address() as net.AddressInfo).port);
    });
  });
}

/** Binds a Unix socket that is 0660 from the start (umask during the synchronous bind), removing a
 * stale socket file but never a live one or a non-socket. */
async function listenUnix(server: net.Server, file: string): Promise<void> {
  await removeStaleSocket(file);
  await new Promise<void>((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException): void => reject(new Error(`cannot listen on ${file}: ${err.code ?? err.message}`));
    server.once('error', onError);
    let oldMask: number | null = null;
    try {
      oldMask = process.umask(0o777 & ~UDS_MODE);
    } catch {
      // Worker threads cannot change the umask; the chmod below still applies.
    }
    try {
      server.listen(file, () => {
        server.removeListener('error', onError);
        resolve();
      });
    } finally {
      if (oldMask !== null) process.umask(oldMask);
    }
  });
  await chmod(file, UDS_MODE);
}

async function removeStaleSocket(file: string): Promise<void> {
  let st;
  try {
    st = await lstat(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw err;
  }
  if (!st.isSocket()) throw new Error(`cannot listen on ${file}: it exists and is not a socket`);
  const live = await new Promise<boolean>((resolve) => {
    const probe = net.connect(file);
    probe.once('connect', () => {
      probe.destroy();
      resolve(true);
    });
    probe.once('error', () => resolve(false));
  });
  if (live) throw new Error(`cannot listen on ${file}: another process is serving it`);
  await unlink(file);
}

function closeServer(server: net.Server): Promise<void> {
  return new Promise((resolve) => {
    if (!server.listening) return resolve();
    server.close(() => resolve());
  });
}
