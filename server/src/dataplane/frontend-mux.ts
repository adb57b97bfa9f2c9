// The client frontend over our multiplexed transport: one TLS connection from an SDK Tunnel carries
// many connections. Each connection is a Frontend for the core; per-connection credit runs both ways
// (the client grants us a window per connection, we grant it one), so one slow reader or writer
// never stalls the others.
//
// One connection (MuxFrontendConn), states:
//   dialing  DIAL_REQ taken; the core is dialing
//   open     bytes flow both ways until a direction ends (`directions`, proto's HalfCloseDirections;
//            inbound is the destination's, towards the client):
//              inbound ending  the destination ended: HALF_CLOSE goes to the client behind the queued bytes
//              inbound ended   HALF_CLOSE sent; the client's bytes still go to the destination
//            (the client's HALF_CLOSE goes to the core, which ends the destination's side)
//   closing  the core closed cleanly: CLOSE_RSP goes to the client behind the queued bytes (and
//            HALF_CLOSE before it, while inbound is ending)
//   closed   forgotten by the session; queue, waiter, read hold and window released
//
//   dialing ──dialSucceeded (DIAL_RSP)──▶ open
//   open ──remoteEnded──▶ open, inbound ending ──queue sent (HALF_CLOSE)──▶ open, inbound ended
//   open ──closed('')──▶ closing ──queue sent (HALF_CLOSE if inbound was ending, CLOSE_RSP)──▶ closed
//   dialing ──dialFailed (DIAL_RSP with the error)──▶ closed
//   open ──closed(error), or closed('') after the client's CLOSE_REQ: the queue is dropped, CLOSE_RSP(error)──▶ closed
//   closing ──CLOSE_REQ from the client: the queue is dropped, CLOSE_RSP──▶ closed
//   any ──abandon (DIAL_CLS, the client gone)──▶ closed
// The client's CLOSE_REQ means it wants nothing more (our SDK sends it when its socket is destroyed, and
// forgets the connection if no CLOSE_RSP comes within 5 s): queued bytes wait for its credit no longer,
// or the connection would stay in closing for as long as the client's connection lasts.
// The client's HALF_CLOSE and CLOSE_REQ go to the core (ProxiedConnection): their outcome comes back
// here as closed().
import {
  CAP_CREDIT,
  CAP_HALF_CLOSE,
  ConnectionTable,
  HalfCloseDirections,
  MAX_DATA_CHUNK,
  MAX_MESSAGE_BYTES,
  MD_CAPABILITIES,
  MD_WINDOW,
  ReceiveWindow,
  SendCredit,
  StreamSender,
  packetTypeName,
  packets,
  parseCapabilities,
  queueChunks,
  tapWrites,
  takeQueued,
  type ByteSink,
  type DialFailureReason,
  type FramedPacketStream,
  type Hello,
  type MemoryBudget,
  type QueuedBytes,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import type { Frontend } from './frontend.js';
import type { ServerMetrics } from './metrics.js';
import type { ProxiedConnection } from './proxied-connection.js';
import type { AgentWait } from './agent-wait.js';
import type { ProxyCore } from './proxy-core.js';

export type MuxConnState = 'dialing' | 'open' | 'closing' | 'closed';

export class MuxFrontendConn implements Frontend {
  readonly halfClose = true;
  get client(): string {
    return this.session.client;
  }
  state: MuxConnState = 'dialing';
  /** Inbound: the destination's bytes towards the client (its end passed on as HALF_CLOSE). */
  readonly directions = new HalfCloseDirections();
  id = 0;
  proxied: ProxiedConnection | null = null;
  /** The dial waits for an agent of its cluster to connect to this replica (agent-wait.ts). */
  agentWait: AgentWait | null = null;
  /** The client sent CLOSE_REQ: what is queued for it is dropped rather than delivered. */
  private closeRequested = false;
  private readonly toClient: SendCredit;
  /** Chunks from the destination waiting for the client's credit (bounded by the agent's window). */
  private readonly queue: QueuedBytes[] = [];
  /** Client bytes: credit goes back to the client as they leave for the agent; null until open. */
  private fromClient: ReceiveWindow | null = null;
  readonly sink: ByteSink;

  constructor(
    private readonly session: MuxFrontendSession,
    readonly random: bigint,
    readonly address: string,
  ) {
    this.toClient = new SendCredit(session.peerWindow, () => session.metrics.flowControlStalls.inc({ direction: 'to_client' }));
    this.sink = {
      write: (chunk, cb) => this.onDestinationBytes([chunk], cb),
      writeChunks: (chunks, _length, cb) => this.onDestinationBytes(chunks, cb),
    };
  }

  // ------------------------------------------------------------ from the client

  onData(data: Buffer): void {
    this.onChunks([data], data.length);
  }

  /** One DATA payload as the chunks it arrived in, `n` bytes in all. */
  onChunks(chunks: readonly Buffer[], n: number): void {
    switch (this.state) {
      case 'open':
      case 'closing':
        break;
      case 'dialing': // not registered yet: the session answers an unknown connectID
      case 'closed':
        return;
    }
    const fromClient = this.fromClient!;
    fromClient.writeChunks(chunks, n);
    if (this.session.peerWindow !== null && fromClient.overrun > MAX_MESSAGE_BYTES) {
      this.session.log.warn({ connectID: this.id }, 'client exceeded its flow-control window; closing the connection');
      this.proxied?.close();
    }
  }

  onCredit(bytes: number): void {
    this.toClient.grant(bytes);
    this.flush();
  }

  /** HALF_CLOSE: the client will send no more; the core passes it on (and ignores its later DATA). */
  onHalfClose(): void {
    this.proxied?.endWrite();
  }

  /** CLOSE_REQ from the client; the session then tells the core, whose close comes back as closed(). */
  clientClosing(): void {
    switch (this.state) {
      case 'closing':
        this.drop(''); // the core closed already; its queued bytes were waiting for the client's credit
        return;
      case 'closed':
        return;
      default:
        this.closeRequested = true;
    }
  }

  /** The client went away (DIAL_CLS, or its connection is gone): close our side. */
  abandon(): void {
    switch (this.state) {
      case 'closed':
        return;
      default:
        this.release();
        this.state = 'closed';
        this.agentWait?.cancel();
        this.agentWait = null;
        this.proxied?.close();
    }
  }

  // ------------------------------------------------------------ Frontend (from the core)

  dialSucceeded(_connectID: number): void {
    switch (this.state) {
      case 'dialing':
        break;
      default:
        return; // abandoned while dialing: the core was told to close
    }
    this.state = 'open';
    this.id = this.session.register(this);
    // The bytes wait in the proxied connection until the agent's credit lets them go: that is where
    // they are counted, and when they leave, the client gets its credit back.
    const proxied = this.proxied;
    this.fromClient = new ReceiveWindow({
      sink: {
        write: (chunk, sent) => (proxied?.write(chunk, () => sent()), true),
        writeChunks: (chunks, length, sent) => proxied?.writeChunks(chunks, length, () => sent()),
      },
      initial: this.session.window,
      budget: this.session.budget,
      direction: 'to_agent',
      gauge: false,
      growOnceProven: true,
      report: this.reportCredit,
    });
    this.session.sender.send(packets.dialResponse(this.random, this.id));
  }

  dialFailed(reason: DialFailureReason, message: string): void {
    switch (this.state) {
      case 'dialing':
        this.state = 'closed';
        this.session.forget(this);
        this.session.sender.send(packets.dialResponse(this.random, 0, message, reason));
        return;
      default:
        return; // the core fails only dials in progress; abandoned: nobody to tell
    }
  }

  remoteEnded(): void {
    switch (this.state) {
      case 'open':
        if (this.directions.inboundEnding()) this.flush();
        return; // the core reports the destination's end once
      default:
        return; // and only while open
    }
  }

  closed(error: string): void {
    switch (this.state) {
      case 'open':
        if (error !== '' || this.closeRequested) {
          this.drop(error);
          return;
        }
        // A clean close delivers what is queued first (and a HALF_CLOSE still owed, before it).
        this.state = 'closing';
        this.flush();
        return;
      case 'dialing':
        // Not expected (a dial's end comes through dialFailed): forget the connection.
        this.drop(error);
        return;
      case 'closing':
      case 'closed':
        return; // closed once already
    }
  }

  /** No credit towards the agent. A client with credit is held back by the credit it does not get
   * back; one without (it did not negotiate it) can only be paused as a whole stream. */
  pause(): void {
    switch (this.state) {
      case 'open':
        if (this.session.peerWindow === null) this.session.sender.holdReads(this);
        return;
      default:
        return; // the core pauses only open connections; a hold taken now would never be lifted
    }
  }

  resume(): void {
    switch (this.state) {
      case 'closed':
        return; // released already
      default:
        this.session.sender.releaseReads(this);
    }
  }

  // ------------------------------------------------------------ towards the client

  /** The core's bytes for the client: queued, sent as the client's credit allows. */
  private onDestinationBytes(chunks: readonly Buffer[], cb: (err?: Error | null) => void): boolean {
    switch (this.state) {
      case 'dialing':
      case 'closed':
        return true; // nothing to send them on (dropped, as a closed connection's queue is)
      default:
        queueChunks(this.queue, chunks, () => cb());
        this.flush();
        return true;
    }
  }

  /** Sends queued bytes within the client's credit; once none are left, what waited behind them. */
  private readonly flush = (): void => {
    switch (this.state) {
      case 'dialing':
      case 'closed':
        return; // nothing queued
      default:
        if (!this.sendQueued()) return;
    }
    const sender = this.session.sender;
    // The HALF_CLOSE owed goes first, then (closing) the CLOSE_RSP.
    if (this.directions.inbound === 'ending') {
      this.directions.endInbound();
      sender.send(packets.halfClose(this.id));
    }
    if (this.state === 'closing') this.closeAfterQueue();
  };

  /** True when the queue is empty; false while the client's credit or the stream holds some back. */
  private sendQueued(): boolean {
    const sender = this.session.sender;
    while (this.queue.length > 0) {
      if (sender.congested) {
        sender.whenWritable(this.flush);
        return false;
      }
      const n = this.toClient.allowance(MAX_DATA_CHUNK);
      if (n === 0) return false; // waiting for the client's credit
      const taken = takeQueued(this.queue, n);
      sender.sendData(this.id, taken.chunks, taken.length);
      this.toClient.consume(taken.length);
      for (const sent of taken.sent) sent();
    }
    return true;
  }

  private closeAfterQueue(): void {
    this.state = 'closed';
    this.session.sender.send(packets.closeResponse(this.id, ''));
    this.release();
    this.session.forget(this);
  }

  /** Client bytes left for the agent: the client gets their credit back while it may still send. */
  private readonly reportCredit = (bytes: number): void => {
    // Not before open (no window then), nor once closed (the window is disposed).
    if (this.state !== 'closed') this.session.sender.send(packets.credit(this.id, bytes));
  };

  /** The connection is gone with an error: queued bytes will never be delivered. */
  private drop(error: string): void {
    const wasOpen = this.state !== 'dialing';
    this.release();
    if (wasOpen) this.session.sender.send(packets.closeResponse(this.id, error));
    this.state = 'closed';
    this.session.forget(this);
  }

  private release(): void {
    this.queue.length = 0;
    this.session.sender.cancelWaiter(this.flush);
    this.session.sender.releaseReads(this);
    this.fromClient?.dispose();
  }

  describe(): { state: string; connectID: number; address: string } {
    return { state: this.label(), connectID: this.id, address: this.address };
  }

  /** The state as the snapshot names it: open with its inbound end ending or ended, closing with a HALF_CLOSE still owed. */
  private label(): string {
    const inbound = this.directions.inbound;
    switch (this.state) {
      case 'open':
        return inbound === 'open' ? 'open' : inbound;
      case 'closing':
        return inbound === 'ending' ? 'ending-closing' : 'closing';
      default:
        return this.state;
    }
  }
}

export class MuxFrontendSession {
  readonly sender: StreamSender;
  readonly peerWindow: number | null;
  readonly metrics: ServerMetrics;
  readonly budget: MemoryBudget;
  /** Connections by the client's dial ID (until closed: a DIAL_CLS that crossed our DIAL_RSP must still
   * find it) and, once open, by the connect ID we gave them. */
  private readonly conns: ConnectionTable<MuxFrontendConn>;
  private nextID = 0;
  private gone = false;

  constructor(
    private readonly stream: FramedPacketStream,
    hello: Hello,
    private readonly core: ProxyCore,
    readonly window: number,
    readonly log: Logger,
    private readonly onDone: (s: MuxFrontendSession) => void,
    /** Who the client is (its certificate), for the per-client connection limit. */
    readonly client: string,
  ) {
    const caps = parseCapabilities((hello[MD_CAPABILITIES] ?? []).join(','));
    const w = Number(hello[MD_WINDOW]?.[0]);
    this.peerWindow = caps.has(CAP_CREDIT) && Number.isSafeInteger(w) && w > 0 ? w : null;
    this.metrics = core.metrics;
    this.budget = core.budget;
    this.sender = new StreamSender(tapWrites(stream, (t) => this.metrics.packet('to_client', t)));
    this.conns = new ConnectionTable<MuxFrontendConn>({
      send: (p) => this.sender.send(p),
      unknown: 'close-response',
      count: (t) => this.metrics.packet('from_client', t),
      events: {
        dialRequest: (random, address, protocol) => this.onDialRequest(random, address, protocol),
        dialClose: (conn) => {
          this.forget(conn);
          conn.abandon();
        },
        // The acknowledgement (CLOSE_RSP) comes when the agent confirms, through closed().
        closeRequest: (conn) => {
          conn.clientClosing();
          conn.proxied?.close();
        },
        unexpected: (type) => this.log.warn({ type: packetTypeName(type) }, 'unexpected packet from client, ignored'),
      },
    });
    stream.sendHello({ [MD_CAPABILITIES]: [`${CAP_CREDIT},${CAP_HALF_CLOSE}`], [MD_WINDOW]: [String(window)] });
    stream.on('data', this.conns.dispatch);
    stream.onDataViews(this.conns.dispatchDataViews);
    stream.on('end', () => this.clientGone());
    stream.on('error', () => {
      if (!this.gone) this.metrics.streamError('from_client', 'Unavailable');
      this.clientGone();
    });
    stream.on('close', () => this.clientGone());
  }

  register(conn: MuxFrontendConn): number {
    const id = ++this.nextID;
    this.conns.add(id, conn);
    return id;
  }

  forget(conn: MuxFrontendConn): void {
    this.conns.forget(conn, conn.random, conn.id);
  }

  describe(): { state: string; connectID: number; address: string }[] {
    return this.conns.all().map((c) => c.describe());
  }

  private onDialRequest(random: bigint, address: string, protocol: string): void {
    if (this.conns.hasDial(random)) {
      this.sender.send(packets.dialResponse(random, 0, 'duplicate dial ID on this connection', 'unknown'));
      return;
    }
    const conn = new MuxFrontendConn(this, random, address);
    this.conns.addDial(random, conn);
    // At once, or once an agent of the destination's cluster has connected here.
    conn.agentWait = this.core.awaitAgent(address, protocol, conn, () => {
      conn.agentWait = null;
      if (conn.state === 'dialing') conn.proxied = this.core.dial(address, protocol, conn);
    });
    if (!conn.agentWait) conn.proxied = this.core.dial(address, protocol, conn);
  }

  private clientGone(): void {
    if (this.gone) return;
    this.gone = true;
    this.sender.close();
    this.stream.removeListener('data', this.conns.dispatch);
    for (const c of this.conns.takeAll()) c.abandon();
    this.stream.destroy();
    this.onDone(this);
  }
}
