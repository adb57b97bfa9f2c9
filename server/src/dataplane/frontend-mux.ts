// The client frontend over our multiplexed transport: one TLS connection from an SDK Tunnel carries
// many connections. Each connection is a Frontend for the core; per-connection credit runs both ways
// (the client grants us a window per connection, we grant it one), so one slow reader or writer
// never stalls the others.
import {
  CAP_CREDIT, CAP_HALF_CLOSE, MD_CAPABILITIES, MD_WINDOW, PacketType, SendCredit, StreamSender, packetTypeName, packets, parseCapabilities, tapWrites,
  type ByteSink, type DialFailureReason, type FramedPacketStream, type Hello, type Packet,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import type { Frontend } from './frontend.js';
import type { ServerMetrics } from './metrics.js';
import type { ProxiedConnection } from './proxied-connection.js';
import type { ProxyCore } from './proxy-core.js';

type ConnState = 'dialing' | 'open' | 'closed';

class MuxFrontendConn implements Frontend {
  readonly halfClose = true;
  state: ConnState = 'dialing';
  id = 0;
  proxied: ProxiedConnection | null = null;
  private readonly toClient: SendCredit;
  /** Chunks from the destination waiting for the client's credit (bounded by the agent's window). */
  private readonly queue: { chunk: Buffer; cb: (err?: Error | null) => void }[] = [];
  private endAfterQueue = false;
  private closeAfterQueue: string | null = null;
  private paused = false;
  private withheld = 0;
  private unreported = 0;
  readonly sink: ByteSink;

  constructor(private readonly session: MuxFrontendSession, readonly random: bigint, readonly address: string) {
    this.toClient = new SendCredit(session.peerWindow, () => session.metrics.flowControlStalls.inc({ direction: 'to_client' }));
    this.sink = {
      write: (chunk, cb) => {
        this.queue.push({ chunk, cb });
        this.flush();
        return true;
      },
    };
  }

  // ------------------------------------------------------------ from the client

  onData(data: Buffer): void {
    if (this.state !== 'open' || !this.proxied) return;
    this.proxied.write(data);
    // Credit goes back to the client once the bytes are on their way to the agent, unless the
    // core paused us (no credit towards the agent): then it waits for resume().
    if (this.paused) this.withheld += data.length;
    else this.returnCredit(data.length);
  }

  onCredit(bytes: number): void {
    this.toClient.grant(bytes);
    this.flush();
  }

  // ------------------------------------------------------------ Frontend

  dialSucceeded(_connectID: number): void {
    if (this.state !== 'dialing') return;
    this.state = 'open';
    this.id = this.session.register(this);
    this.session.sender.send(packets.dialResponse(this.random, this.id));
  }

  dialFailed(reason: DialFailureReason, message: string): void {
    if (this.state === 'closed') return;
    this.state = 'closed';
    this.session.forget(this);
    this.session.sender.send(packets.dialResponse(this.random, 0, message, reason));
  }

  remoteEnded(): void {
    this.endAfterQueue = true;
    this.flush();
  }

  closed(error: string): void {
    if (this.state === 'closed') return;
    if (error !== '') this.drop(error);
    // A clean close delivers what is queued first.
    this.closeAfterQueue = error;
    this.flush();
  }

  pause(): void {
    this.paused = true;
  }

  resume(): void {
    if (!this.paused) return;
    this.paused = false;
    const n = this.withheld;
    this.withheld = 0;
    this.returnCredit(n);
  }

  // ------------------------------------------------------------ helpers

  private returnCredit(bytes: number): void {
    this.unreported += bytes;
    if (this.unreported >= this.session.window / 8 && this.state === 'open') {
      this.session.sender.send(packets.credit(this.id, this.unreported));
      this.unreported = 0;
    }
  }

  private readonly flush = (): void => {
    const sender = this.session.sender;
    while (this.queue.length > 0 && this.toClient.canSend()) {
      if (sender.congested) {
        sender.whenWritable(this.flush);
        return;
      }
      const { chunk, cb } = this.queue.shift()!;
      sender.send(packets.data(this.id, chunk));
      this.toClient.consume(chunk.length);
      cb();
    }
    if (this.queue.length > 0) return; // waiting for the client's credit
    if (this.endAfterQueue && this.state === 'open') {
      this.endAfterQueue = false;
      sender.send(packets.halfClose(this.id));
    }
    if (this.closeAfterQueue !== null && this.state === 'open') {
      this.state = 'closed';
      sender.send(packets.closeResponse(this.id, this.closeAfterQueue));
      this.session.forget(this);
    }
  };

  /** The connection is gone with an error: queued bytes will never be delivered. */
  private drop(error: string): void {
    this.queue.length = 0;
    this.session.sender.cancelWaiter(this.flush);
    if (this.state === 'open') this.session.sender.send(packets.closeResponse(this.id, error));
    this.state = 'closed';
    this.session.forget(this);
  }

  /** The client went away: close our side. */
  abandon(): void {
    this.queue.length = 0;
    this.session.sender.cancelWaiter(this.flush);
    this.state = 'closed';
    this.proxied?.close();
  }

  describe(): { state: string; connectID: number; address: string } {
    return { state: this.state, connectID: this.id, address: this.address };
  }
}

export class MuxFrontendSession {
  readonly sender: StreamSender;
  readonly peerWindow: number | null;
  readonly metrics: ServerMetrics;
  private readonly pending = new Map<bigint, MuxFrontendConn>();
  private readonly open = new Map<number, MuxFrontendConn>();
  private nextID = 0;
  private gone = false;

  constructor(
    private readonly stream: FramedPacketStream,
    hello: Hello,
    private readonly core: ProxyCore,
    readonly window: number,
    private readonly log: Logger,
    private readonly onDone: (s: MuxFrontendSession) => void,
  ) {
    const caps = parseCapabilities((hello[MD_CAPABILITIES] ?? []).join(','));
    const w = Number(hello[MD_WINDOW]?.[0]);
    this.peerWindow = caps.has(CAP_CREDIT) && Number.isSafeInteger(w) && w > 0 ? w : null;
    this.metrics = core.metrics;
    this.sender = new StreamSender(tapWrites(stream, (p) => this.metrics.packet('to_client', p)));
    stream.sendHello({ [MD_CAPABILITIES]: [`${CAP_CREDIT},${CAP_HALF_CLOSE}`], [MD_WINDOW]: [String(window)] });
    stream.on('data', this.onPacket);
    stream.on('end', () => this.clientGone());
    stream.on('error', () => {
      if (!this.gone) this.metrics.streamError('from_client', 'Unavailable');
      this.clientGone();
    });
    stream.on('close', () => this.clientGone());
  }

  register(conn: MuxFrontendConn): number {
    // Stays in `pending` (keyed by the client's dial ID) until closed: a DIAL_CLS that crossed our
    // DIAL_RSP must still find it.
    const id = ++this.nextID;
    this.open.set(id, conn);
    return id;
  }

  forget(conn: MuxFrontendConn): void {
    if (this.pending.get(conn.random) === conn) this.pending.delete(conn.random);
    if (conn.id && this.open.get(conn.id) === conn) this.open.delete(conn.id);
  }

  describe(): { state: string; connectID: number; address: string }[] {
    return [...new Set([...this.pending.values(), ...this.open.values()])].map((c) => c.describe());
  }

  private readonly onPacket = (p: Packet): void => {
    this.metrics.packet('from_client', p);
    switch (p.type) {
      case PacketType.DIAL_REQ: {
        const { random, address, protocol } = p.dialRequest;
        if (this.pending.has(random)) {
          this.sender.send(packets.dialResponse(random, 0, 'duplicate dial ID on this connection', 'unknown'));
          return;
        }
        const conn = new MuxFrontendConn(this, random, address);
        this.pending.set(random, conn);
        conn.proxied = this.core.dial(address, protocol, conn);
        return;
      }
      case PacketType.DIAL_CLS: {
        const conn = this.pending.get(p.closeDial.random);
        if (!conn) return;
        this.forget(conn);
        conn.abandon();
        return;
      }
      case PacketType.DATA: {
        const conn = this.open.get(p.data.connectID);
        if (conn) conn.onData(p.data.data);
        else this.sender.send(packets.closeResponse(p.data.connectID, 'unrecognized connectID'));
        return;
      }
      case PacketType.CREDIT:
        this.open.get(p.credit.connectID)?.onCredit(p.credit.bytes);
        return;
      case PacketType.HALF_CLOSE:
        this.open.get(p.halfClose.connectID)?.proxied?.endWrite();
        return;
      case PacketType.CLOSE_REQ: {
        const conn = this.open.get(p.closeRequest.connectID);
        // The acknowledgement (CLOSE_RSP) comes when the agent confirms, through closed().
        if (conn?.proxied) conn.proxied.close();
        else this.sender.send(packets.closeResponse(p.closeRequest.connectID, 'Unknown connectID'));
        return;
      }
      default:
        this.log.warn({ type: packetTypeName(p.type) }, 'unexpected packet from client, ignored');
    }
  };

  private clientGone(): void {
    if (this.gone) return;
    this.gone = true;
    this.sender.close();
    this.stream.removeListener('data', this.onPacket);
    const all = new Set([...this.pending.values(), ...this.open.values()]);
    this.pending.clear();
    this.open.clear();
    for (const c of all) c.abandon();
    this.stream.destroy();
    this.onDone(this);
  }
}
