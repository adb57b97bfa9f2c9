// HTTP CONNECT frontend (contract §5, default port 8089): curl, kubectl's proxy-url, Python, Java —
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
//   reading-head ──► dialing ──► open ──► closed
//        │              │                    ▲
//        └──────────────┴──► refusing (error sent, lingering for the client to read it) ┘
// While open, each direction ends on its own (proto's HalfCloseDirections): outbound, the client's
// FIN (passed on as HALF_CLOSE; one during the dial waits for it); inbound, the destination's end
// (our FIN to the client) or the core's clean close. describe() reports an open connection with
// an ended direction as `half-closed`.
//
// Backpressure: client bytes go to ProxiedConnection.write(), which calls pause()/resume() as
// credit towards the agent runs out/returns; we pause the socket. Bytes to the client go through
// `sink.write(chunk, cb)` = socket.write(chunk, cb): the callback (bytes left our process) returns
// credit to the agent. Bytes the client pipelines after the head (a TLS ClientHello) are held while
// the dial is pending (we stop reading past 64 KiB) and written into the tunnel once it is open.
import { unlink } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import type { Logger } from 'pino';
import type { TokenStore } from '../fleet/tokens.js';
import type { ProxyCore } from '../dataplane/proxy-core.js';
import { ConnectConnection } from './connection.js';
import { ProbeReads } from './probe-reads.js';
import { oneLine } from '../http/text.js';
import { avoidPeerCertificateLeak } from '../http/peer-certificate-leak.js';
import { closeServer, isLoopback, listen, listenUnix, peerOf } from '../http/sockets.js';
import type { ConnectConnectionInfo, ConnectShared, ListenerKind, Principal } from './types.js';

export { DIAL_FAILURE_STATUS } from './responses.js';
export type { ConnectConnectionInfo, ConnectState, ListenerKind, Principal } from './types.js';

export const DEFAULT_CONNECT_PORT = 8089;
const DEFAULT_HEADER_TIMEOUT_MS = 10_000;
const DEFAULT_MAX_HEADER_BYTES = 16 * 1024;
/** What one connection waiting for credit may have read by probes (connection.ts)... */
const PROBE_ALLOWANCE = 256 * 1024;
/** ...and all of them together: this share of the hub's memory budget (16 MiB of the default 256). */
const PROBE_BUDGET_SHARE = 16;

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

export async function startConnectFrontend(opts: ConnectFrontendOptions): Promise<ConnectFrontend> {
  if (!opts.tls && !opts.uds && !opts.plain) throw new Error('the CONNECT frontend needs at least one listener (tls, uds or plain)');
  if (opts.plain && !isLoopback(opts.plain.host)) {
    throw new Error(
      `refusing to serve plain-TCP CONNECT on ${opts.plain.host}: only loopback addresses (127.0.0.0/8, ::1, localhost); use the TLS listener elsewhere`,
    );
  }
  const conns = new Set<ConnectConnection>();
  const shared: ConnectShared = {
    core: opts.core,
    log: opts.log.child({ component: 'connect-frontend' }),
    tokens: opts.tokens,
    authorize: opts.authorize ?? (() => true),
    headerTimeoutMs: opts.headerTimeoutMs ?? DEFAULT_HEADER_TIMEOUT_MS,
    maxHeaderBytes: opts.maxHeaderBytes ?? DEFAULT_MAX_HEADER_BYTES,
    plainAllowsTokens: opts.plain?.allowTokens ?? false,
    conns,
    probeReads: new ProbeReads(PROBE_ALLOWANCE, Math.max(PROBE_ALLOWANCE, opts.core.budget.limit / PROBE_BUDGET_SHARE)),
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
      avoidPeerCertificateLeak();
      const server = (tlsServer = tls.createServer({
        ca: t.caCert,
        cert: t.cert,
        key: t.key,
        requestCert: true,
        rejectUnauthorized: false, // no certificate = token auth; checked per request
        ALPNProtocols: ['http/1.1', 'http/1.0'], // a client offering only http/1.0 would fail the handshake
        handshakeTimeout: shared.headerTimeoutMs,
        allowHalfOpen: true,
      }));
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
