// One client connection of the HTTP CONNECT frontend: reads and checks the request head, authenticates,
// dials through the core, then is that connection's Frontend (see frontend.ts for the state diagram).
import type net from 'node:net';
import type tls from 'node:tls';
import { HalfCloseDirections, STARTING_UNSENT_LIMIT, limitUnsentBytes, type ByteSink, type DialFailureReason } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { clusterFromSubject } from '../pki/agent-identity.js';
import { tokenAllowsCluster } from '../fleet/tokens.js';
import type { Frontend } from '../dataplane/frontend.js';
import type { ProxiedConnection } from '../dataplane/proxied-connection.js';
import type { AgentWait } from '../dataplane/agent-wait.js';
import { findHeadEnd, parseAuthority, parseHead } from './request.js';
import { DIAL_FAILURE_STATUS, PROXY_AUTHENTICATE, STATUS_TEXT } from './responses.js';
import { tokenFromHeader } from '../http/bearer-token.js';
import { certificatePrincipal, principalName } from '../http/principal.js';
import { oneLine, printable } from '../http/text.js';
import { peerOf, peerReset, resetSocket } from '../http/sockets.js';
import type { ConnectConnectionInfo, ConnectShared, ConnectState, ListenerKind, Principal, TrackedConnection } from './types.js';

/** Bytes the client may send after the head while the dial is pending before we stop reading. */
const PIPELINE_LIMIT = 64 * 1024;
/** After an error response: how long we keep reading (and discarding) so the client gets to read
 * the response instead of a reset, before closing anyway. */
const LINGER_MS = 2000;
/** After the tunnel closed cleanly: how long a client may take to read what is still queued for it
 * (at most one flow-control window) before we give up on it. */
const FLUSH_TIMEOUT_MS = 60_000;
/** A socket paused for lack of credit is out of the event loop: a client that leaves (FIN or reset)
 * would go unnoticed for as long as its destination stalls. So once in a while the kernel is asked
 * whether the client reset the connection (no read needed), and the socket is read one chunk at a
 * time (kept for the agent, nothing lost) within the probe allowances (probe-reads.ts) until the
 * credit comes back. A probe that finds nothing to read leaves the socket flowing: it then sees the
 * client's end at once. A FIN behind more than the allowance is seen when the destination reads again. */
const PROBE_INTERVAL_MS = 5000;

export class ConnectConnection implements Frontend, TrackedConnection {
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
  /** The dial waits for an agent of its cluster to connect to this replica. */
  private agentWait: AgentWait | null = null;
  private connectID = 0;
  private destination = '';
  private principal: Principal | null = null;
  /** Outbound: the client's bytes towards the agent (its FIN); inbound: the destination's bytes to the client. */
  private readonly directions = new HalfCloseDirections();
  private corePaused = false;
  private timer: NodeJS.Timeout | null = null;
  private probeTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly socket: net.Socket,
    private readonly listener: ListenerKind,
    private readonly shared: ConnectShared,
  ) {
    this.peer = peerOf(socket) || listener;
    this.log = shared.log.child({ listener, peer: this.peer });
    shared.conns.add(this);
    if (listener !== 'uds') {
      socket.setNoDelay(true);
      socket.setKeepAlive(true, 30_000);
      // Small until the client shows it keeps up (onBulk): what it does not read stays in our budget.
      limitUnsentBytes(socket, STARTING_UNSENT_LIMIT);
    }
    this.sink = {
      write: (chunk, callback) => {
        if (this.socket.destroyed || this.socket.writableEnded) {
          process.nextTick(callback, new Error('client connection closed'));
          return false;
        }
        return this.socket.write(chunk, callback);
      },
      cork: () => this.socket.cork(),
      uncork: () => this.socket.uncork(),
    };
    socket.on('data', this.onData);
    socket.on('end', this.onEnd);
    socket.on('error', (err: Error) => this.log.debug({ err: err.message, state: this.state }, 'client socket error'));
    socket.once('close', this.onClose);
    this.timer = setTimeout(this.onHeaderTimeout, shared.headerTimeoutMs);
  }

  onBulk(): void {
    if (this.listener !== 'uds') limitUnsentBytes(this.socket);
  }

  /** For the per-client connection limit (known once authenticated, before the dial). */
  get client(): string {
    return this.principal ? principalName(this.principal) : this.peer;
  }

  describe(): ConnectConnectionInfo {
    return {
      state: this.state === 'open' && this.directions.anyEnded ? 'half-closed' : this.state,
      listener: this.listener,
      peer: this.peer,
      principal: this.principal ? principalName(this.principal) : '',
      destination: this.destination,
      connectID: this.connectID,
    };
  }

  isTunnel(): boolean {
    return this.state === 'open';
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
        if (this.directions.outbound === 'open') this.conn?.write(chunk);
        if (this.corePaused) {
          // Read by a probe: one chunk, then paused again until the next probe.
          this.shared.probeReads.read(this, chunk.length);
          this.socket.pause();
          this.scheduleProbe();
        }
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
        this.directions.endOutbound(); // applied once the tunnel is open
        return;
      case 'open':
        if (!this.directions.endOutbound()) return;
        this.conn?.endWrite();
        return;
      default:
        return;
    }
  };

  private readonly onClose = (): void => {
    this.clearTimer();
    this.stopProbe();
    this.shared.probeReads.release(this);
    const was = this.state;
    this.state = 'closed';
    this.shared.conns.delete(this);
    this.pending = [];
    this.head = null;
    // A waiting or pending dial is abandoned, an open connection closed (a no-op once the core closed it).
    this.agentWait?.cancel();
    this.agentWait = null;
    const conn = this.conn;
    this.conn = null;
    conn?.close();
    if (was === 'open') {
      this.log.info(
        { destination: this.destination, bytesToAgent: conn?.bytesToAgent, bytesToClient: conn?.bytesToClient },
        'CONNECT tunnel closed',
      );
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
    if (!address)
      return this.refuse(
        400,
        'the CONNECT target must be HOST:PORT (a DNS name, IPv4 address or [IPv6] address, port 1-65535)',
        'bad_request',
      );
    this.destination = address;

    const auth = this.authenticate(headers.get('proxy-authorization'));
    if ('status' in auth) {
      const extra = auth.status === 407 ? [`Proxy-Authenticate: ${PROXY_AUTHENTICATE}`] : [];
      return this.refuse(auth.status, auth.message, auth.reason, extra);
    }
    this.principal = auth.principal;

    // Pipelined bytes are kept from here on; the dial goes at once, or once an agent of the
    // destination's cluster has connected to this replica (agent-wait.ts).
    this.state = 'dialing';
    const principal = auth.principal;
    this.agentWait = this.shared.core.awaitAgent(address, 'tcp', this, () => {
      this.agentWait = null;
      if (this.state === 'dialing') this.authorizeAndDial(address, principal);
    });
    if (!this.agentWait) this.authorizeAndDial(address, principal);
  }

  private authorizeAndDial(address: string, principal: Principal): void {
    // Authorize on the cluster the destination routes to. core.dial() routes again in the same
    // synchronous turn, so it sees the same table and picks the same agent (checked below).
    const route = this.shared.core.routes.route(address);
    if (!('backend' in route)) {
      this.shared.core.metrics.routeFailure(route.reason);
      return this.dialFailed(route.reason, route.message);
    }
    const cluster = route.backend.cluster;
    if (principal.kind === 'token' && !tokenAllowsCluster(principal, cluster)) {
      return this.refuse(403, `token "${principal.name}" may not reach cluster ${cluster}`, 'not_authorized');
    }
    if (!this.shared.authorize(principal, cluster)) {
      return this.refuse(403, `${principalName(principal)} may not reach cluster ${cluster}`, 'not_authorized');
    }

    const conn = this.shared.core.dial(address, 'tcp', this);
    if (!conn || this.state !== 'dialing') return; // dialFailed already answered
    if (conn.backend.cluster !== cluster) {
      // Cannot happen with a synchronous core; refuse rather than tunnel into an unauthorized cluster.
      this.log.error(
        { destination: address, authorized: cluster, routed: conn.backend.cluster },
        'dial routed to another cluster than the one authorized; closing it',
      );
      conn.close();
      return this.refuse(403, `the destination moved to cluster ${conn.backend.cluster} during authorization`, 'not_authorized');
    }
    this.conn = conn;
  }

  private authenticate(
    values: string[] | undefined,
  ): { principal: Principal } | { status: 400 | 403 | 407; message: string; reason: string } {
    if (values && values.length > 1) return { status: 400, message: 'more than one Proxy-Authorization header', reason: 'bad_request' };
    const header = values?.[0];
    let certNote = '';
    if (this.listener === 'tls') {
      const s = this.socket as tls.TLSSocket;
      const cert = s.getPeerCertificate();
      if (cert && Object.keys(cert).length > 0) {
        if (s.authorized) {
          // Agents share the CA with hub users; an agent certificate must not open connections into other clusters.
          if (clusterFromSubject(cert.subject))
            return { status: 403, message: 'agent certificates may not use the client frontend', reason: 'agent_certificate' };
          return { principal: certificatePrincipal(cert.subject?.CN) };
        }
        certNote = ` (the client certificate was not accepted: ${oneLine(String(s.authorizationError ?? 'not verified'))})`;
      }
    }
    if (header === undefined) {
      if (this.listener === 'uds') return { principal: { kind: 'unix-socket', name: 'unix-socket' } };
      if (this.listener === 'plain') {
        return {
          status: 407,
          message: this.shared.plainAllowsTokens
            ? 'no credentials: send Proxy-Authorization: Bearer <token> (or Basic with the token as password)'
            : 'the plain-TCP listener authenticates nobody: tokens are not accepted on it (they would travel unencrypted); use the TLS listener or the Unix socket',
          reason: 'unauthenticated',
        };
      }
      return {
        status: 407,
        message: `no credentials: present a client certificate signed by the hub CA, or send Proxy-Authorization: Bearer <token> (or Basic with the token as password)${certNote}`,
        reason: 'unauthenticated',
      };
    }
    if (this.listener === 'plain' && !this.shared.plainAllowsTokens) {
      return {
        status: 407,
        message:
          'tokens are not accepted on the plain-TCP listener (they would travel unencrypted); use the TLS listener or the Unix socket',
        reason: 'token_over_plaintext',
      };
    }
    const token = tokenFromHeader(header);
    if (token === null)
      return {
        status: 407,
        message: `unsupported Proxy-Authorization: use "Bearer <token>" or "Basic" with the token as password${certNote}`,
        reason: 'unauthenticated',
      };
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
    if (this.directions.outbound === 'ended') this.conn.endWrite();
    if (!this.corePaused) this.socket.resume();
  }

  dialFailed(reason: DialFailureReason, message: string): void {
    if (this.state !== 'dialing' && this.state !== 'reading-head') return;
    this.conn = null;
    const m = DIAL_FAILURE_STATUS[reason] ?? DIAL_FAILURE_STATUS.unknown;
    this.refuse(m.status, `${m.why}: ${message}`, reason);
  }

  remoteEnded(): void {
    if (!this.isTunnel() || !this.directions.endInbound()) return;
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
    // Nothing more comes from the destination: an open connection with its inbound direction over.
    this.state = 'open';
    this.directions.endInbound();
    this.linger();
    this.socket.once('data', () => resetSocket(this.socket));
  }

  heldBytes(): number {
    return this.socket.readableLength;
  }

  pause(): void {
    this.corePaused = true;
    this.socket.pause();
    this.scheduleProbe();
  }

  private scheduleProbe(): void {
    if (this.probeTimer) return;
    this.probeTimer = setTimeout(() => {
      this.probeTimer = null;
      if (!this.corePaused || !this.isTunnel()) return;
      if (this.listener !== 'uds' && peerReset(this.socket)) {
        this.log.debug({ destination: this.destination }, 'client reset the connection while it waited for credit');
        this.socket.destroy();
        return;
      }
      // Reads until the next chunk, EOF or reset; past the allowance only the kernel is asked.
      if (this.shared.probeReads.mayRead(this)) this.socket.resume();
      else this.scheduleProbe();
    }, PROBE_INTERVAL_MS);
  }

  resume(): void {
    this.corePaused = false;
    this.shared.probeReads.release(this);
    // The probe timer stays: pause and resume come by the thousand in a bulk transfer, and it does
    // nothing when it finds the socket flowing.
    if (this.isTunnel()) this.socket.resume();
  }

  private stopProbe(): void {
    if (this.probeTimer) clearTimeout(this.probeTimer);
    this.probeTimer = null;
  }

  // ------------------------------------------------------------ responses and teardown

  private refuse(status: number, message: string, reason: string, extraHeaders: string[] = []): void {
    if (this.state === 'refusing' || this.state === 'closed') return;
    const dest = this.destination || '-';
    const level = status === 408 || status === 431 ? 'debug' : 'info';
    this.log[level](
      { status, reason, destination: dest, principal: this.principal ? principalName(this.principal) : undefined },
      `CONNECT refused: ${message}`,
    );
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
