// One link (our framed transport, or AgentService.Connect over gRPC) to one proxy-server replica. It announces who we are (agentID,
// agentIdentifiers, capabilities), reads serverID/serverCount from the response headers, and then
// serves DIAL_REQ / DATA / CLOSE_REQ / DIAL_CLS / CREDIT / HALF_CLOSE for the connections it carries.
import type { KeyObject } from 'node:crypto';
import { EventEmitter } from 'node:events';
import {
  GrpcCallError,
  grpcCodeName,
  CAP_CREDIT,
  CAP_GATEWAY_HMAC,
  CAP_HALF_CLOSE,
  CAP_SERVER_DRAIN,
  MD_HELD_SERVERS,
  MD_AGENT_ID,
  MD_AGENT_IDENTIFIERS,
  MD_CAPABILITIES,
  MD_SERVER_COUNT,
  MD_SERVER_ID,
  MD_WINDOW,
  ConnectionTable,
  LazyLog,
  StreamSender,
  packetTypeName,
  packets,
  parseCapabilities,
  tapWrites,
  type MemoryBudget,
  KONNECTIVITY_FIRST_DATA_HOLD_MS,
} from '@cluster-proxy/proto';
import { AgentMetrics } from './metrics.js';
import type { Logger } from 'pino';
import { EndpointConnection, type EndpointOwner } from './endpoint-connection.js';
import { openGrpcLink, openMuxLink, type AgentTransport, type EgressOptions, type Link, type LinkOptions } from './links.js';
import { DialFailure, type TargetDialer } from './target-dialer.js';

export interface ServerConnectionOptions {
  /** host:port of the hub's agent listener (or its load balancer). */
  address: string;
  caCert: Buffer;
  cert: Buffer;
  key: Buffer;
  serverName?: string;
  /** 'mux' tries our transport and falls back to gRPC when the server does not speak it. */
  transport: AgentTransport;
  /** Reach the hub through an egress proxy. */
  egress?: EgressOptions;
  agentID: string;
  identifiers: string;
  /** Window we grant the hub per connection at first. */
  window: number;
  /** The agent's memory budget (one per process, shared by every link). */
  budget: MemoryBudget;
  dialer: TargetDialer;
  /** Announce CAP_GATEWAY_HMAC: the gateway may authenticate identities with this link's key (default: when the dialer serves the gateway). */
  gatewayHmac?: boolean;
  log: Logger;
  /** New dials are refused while this returns true. */
  isDraining: () => boolean;
  /** Admission: a message when the agent holds as many connections as it may, else null. */
  atCapacity: () => string | null;
  /** ServerIDs we already hold: our server refuses a duplicate before registering it. */
  heldServers?: string[];
  nextConnectID: () => number;
  headerTimeoutMs: number;
  keepaliveTimeMs: number;
  keepaliveTimeoutMs: number;
  /** The agent's metrics (default: a registry of its own). */
  metrics?: AgentMetrics;
}

export interface ConnectionSummary {
  connectID: number;
  address: string;
  state: string;
  bytesIn: number;
  bytesOut: number;
}

type LinkState = 'connecting' | 'open' | 'closed';

/** Emits 'closed' (error: Error | null) exactly once, after ready() resolved. */
export class ServerConnection extends EventEmitter implements EndpointOwner {
  serverID = '';
  serverCount = 1;
  credit = false;
  halfClose = false;
  peerWindow: number | null = null;
  /** This link's key for the gateway's identity MAC, when the hub took CAP_GATEWAY_HMAC; null: signed identities only. */
  identityKey: KeyObject | null = null;
  readonly window: number;
  readonly budget: MemoryBudget;
  private senderOrNull: StreamSender | null = null;
  private state: LinkState = 'connecting';
  private link: Link | null = null;
  private readonly abort = new AbortController();
  /** The hub's dials by dial ID, our connections by connect ID (both hold each connection until forget()). */
  private readonly conns: ConnectionTable<EndpointConnection> = new ConnectionTable<EndpointConnection>({
    send: (p) => this.sender.send(p),
    unknown: 'close-response', // ANP: tell the server so it tears down its half
    count: (t) => this.metrics.packet('to_agent', t),
    events: {
      dialRequest: (random, address, protocol) => this.onDialRequest(random, address, protocol),
      closeRequest: (conn) => conn.onCloseRequest(),
      // ANP's agent ignores DIAL_CLS; we abandon the dial (or close the connection it produced).
      dialClose: (conn) => conn.onCloseRequest(),
      drain: () => this.onServerDrain(),
      unexpected: (type) => this.log.warn({ type: packetTypeName(type) }, 'unexpected packet from server, ignored'),
    },
  });
  private log: Logger;
  readonly metrics: AgentMetrics;

  constructor(private readonly opts: ServerConnectionOptions) {
    super();
    this.window = opts.window;
    this.budget = opts.budget;
    this.log = opts.log;
    this.metrics = opts.metrics ?? new AgentMetrics();
  }

  get sender(): StreamSender {
    if (!this.senderOrNull) throw new Error('internal: server connection used before it was ready');
    return this.senderOrNull;
  }

  get transport(): AgentTransport | null {
    return this.link?.transport ?? null;
  }

  /** Opens the link and reads the server's headers (serverID, serverCount, capabilities). */
  async ready(): Promise<void> {
    const linkOpts: LinkOptions = {
      address: this.opts.address,
      caCert: this.opts.caCert,
      cert: this.opts.cert,
      key: this.opts.key,
      serverName: this.opts.serverName,
      metadata: {
        [MD_AGENT_ID]: this.opts.agentID,
        ...(this.opts.identifiers ? { [MD_AGENT_IDENTIFIERS]: this.opts.identifiers } : {}),
        [MD_CAPABILITIES]: [
          CAP_CREDIT,
          CAP_HALF_CLOSE,
          CAP_SERVER_DRAIN,
          ...((this.opts.gatewayHmac ?? true) && this.opts.dialer.servesGateway ? [CAP_GATEWAY_HMAC] : []),
        ].join(','),
        [MD_WINDOW]: String(this.opts.window),
        ...(this.opts.heldServers?.length ? { [MD_HELD_SERVERS]: this.opts.heldServers.join(',') } : {}),
      },
      headerTimeoutMs: this.opts.headerTimeoutMs,
      keepaliveTimeMs: this.opts.keepaliveTimeMs,
      keepaliveTimeoutMs: this.opts.keepaliveTimeoutMs,
      signal: this.abort.signal,
      egress: this.opts.egress,
    };
    const link = this.opts.transport === 'mux' ? await openMuxLink(linkOpts) : await openGrpcLink(linkOpts);
    if (this.state === 'closed') {
      link.close();
      throw new Error('closed while connecting');
    }
    try {
      this.readHeaders(link);
    } catch (err) {
      link.close();
      this.state = 'closed';
      throw err;
    }
    this.link = link;
    this.log = this.log.child({ serverID: this.serverID });
    this.senderOrNull = new StreamSender(tapWrites(link.stream, (t) => this.metrics.packet('from_agent', t)));
    this.state = 'open';
    this.openedAt = Date.now();
    link.onPacket(this.conns.dispatch);
    link.onDataViews?.(this.conns.dispatchDataViews);
    link.onGone((err) => this.shutdown(err));
  }

  private readHeaders(link: Link): void {
    const id = link.header(MD_SERVER_ID);
    const count = link.header(MD_SERVER_COUNT);
    // ANP's agent requires exactly one of each.
    if (id.length !== 1 || count.length !== 1)
      throw new Error(`server ${this.opts.address} sent no serverID/serverCount headers: not a proxy server?`);
    this.serverID = id[0]!;
    const n = Number(count[0]);
    if (!Number.isInteger(n) || n < 1) throw new Error(`server ${this.opts.address} sent an invalid serverCount "${count[0]}"`);
    this.serverCount = n;
    const caps = parseCapabilities(link.header(MD_CAPABILITIES).join(','));
    this.credit = caps.has(CAP_CREDIT);
    this.halfClose = caps.has(CAP_HALF_CLOSE);
    // Only if the hub took it (it has the same key then); without a key here, no MAC is believed on this link.
    this.identityKey = caps.has(CAP_GATEWAY_HMAC) ? (link.identityKey?.() ?? null) : null;
    if (this.credit) {
      const w = Number(link.header(MD_WINDOW)[0]);
      if (!Number.isSafeInteger(w) || w <= 0) throw new Error(`server ${this.opts.address} announced credit without a valid window`);
      this.peerWindow = w;
    }
  }

  /** The server said it is shutting down: this link no longer counts toward the full set. */
  serverDraining = false;

  /** When ready() finished (ms since the epoch); 0 before. */
  openedAt = 0;

  get isOpen(): boolean {
    return this.state === 'open';
  }

  get connectionCount(): number {
    return this.conns.openCount;
  }

  summary(): ConnectionSummary[] {
    return this.conns
      .openConnections()
      .map((c) => ({ connectID: c.connectID, address: c.address, state: c.state, bytesIn: c.bytesIn, bytesOut: c.bytesOut }));
  }

  /** Tell the server we are going away: it stops sending new dials here (ANP's DRAIN). */
  sendDrain(): void {
    if (this.state === 'open') this.sender.send(packets.drain());
  }

  /** Closes the stream and every connection it carries. */
  close(): void {
    this.shutdown(null);
  }

  forget(conn: EndpointConnection): void {
    this.conns.forget(conn, conn.random, conn.connectID);
  }

  // ------------------------------------------------------------ inbound packets

  /** The server is shutting down (server-drain capability): open connections finish, no new dials come. */
  private onServerDrain(): void {
    if (this.serverDraining) return;
    this.serverDraining = true;
    this.log.info('server is shutting down (DRAIN); looking for the other replicas');
    this.emit('serverDraining');
  }

  private onDialRequest(random: bigint, address: string, protocol: string): void {
    const refuse = (reason: string, message: string): void => {
      this.log.info({ dialID: String(random), address, reason }, `dial refused: ${message}`);
      this.metrics.endpointDialFailures.inc({ reason });
      this.sender.send(packets.dialResponse(random, 0, message, reason));
    };
    if (this.opts.isDraining()) return refuse('draining', 'agent is draining');
    const full = this.opts.atCapacity();
    if (full) return refuse('limit', full);
    if (this.conns.hasDial(random)) return refuse('unknown', 'duplicate dial ID');
    let target;
    try {
      target = this.opts.dialer.resolve(address, protocol);
    } catch (err) {
      if (err instanceof DialFailure) return refuse(err.reason, err.message);
      throw err;
    }
    const connectID = this.opts.nextConnectID();
    const logs = new LazyLog(this.log, { connectID, dialID: String(random) });
    const conn = new EndpointConnection(this, connectID, random, address, logs);
    this.conns.add(conn.connectID, conn);
    this.conns.addDial(random, conn);
    const started = process.hrtime.bigint();
    this.opts.dialer.dial(target, conn.abort.signal, this.identityKey).then(
      (socket) => {
        if (conn.state !== 'dialing' || this.state === 'closed') {
          socket.destroy();
          return;
        }
        // Behind a server without our capabilities (ANP's proxy-server), a konnectivity-client may not have
        // registered the connection when the destination's first bytes arrive: they wait a moment (attach).
        conn.attach(socket, this.halfClose ? 0 : KONNECTIVITY_FIRST_DATA_HOLD_MS);
        this.sender.send(packets.dialResponse(random, conn.connectID));
        const seconds = Number(process.hrtime.bigint() - started) / 1e9;
        this.metrics.dialDuration.observe(seconds);
        if (this.log.isLevelEnabled('debug')) logs.log.debug({ address, ms: seconds * 1000 }, 'dial ok');
      },
      (err: unknown) => {
        if (conn.state !== 'dialing') return; // abandoned: CLOSE_RSP already sent
        this.forget(conn);
        conn.dialFailed();
        const f = err instanceof DialFailure ? err : new DialFailure('unknown', String(err));
        this.metrics.endpointDialFailures.inc({ reason: f.reason });
        logs.log.info({ address, reason: f.reason }, f.message);
        this.sender.send(packets.dialResponse(random, 0, f.message, f.reason));
      },
    );
  }

  // ------------------------------------------------------------ teardown

  private shutdown(err: Error | null): void {
    if (this.state === 'closed') return;
    const wasOpen = this.state === 'open';
    this.state = 'closed';
    if (wasOpen && err && err.message !== SERVER_ENDED) this.metrics.streamError('to_agent', streamErrorCode(err));
    this.abort.abort();
    for (const conn of this.conns.takeAll()) conn.destroy();
    this.senderOrNull?.close();
    if (this.link) {
      this.link.offPacket(this.conns.dispatch);
      this.link.onDataViews?.(null);
      this.link.close();
    }
    if (wasOpen) this.emit('closed', err);
  }
}

/** What the links say when the server ended the stream normally (not a stream error). */
const SERVER_ENDED = 'server ended the stream';

/** A gRPC link's status in Go's spelling, as ANP labels stream errors; errors of our transport are Unavailable. */
function streamErrorCode(err: Error): string {
  return err instanceof GrpcCallError ? grpcCodeName(err.code) : 'Unavailable';
}
