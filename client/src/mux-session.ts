// One multiplexed TLS connection from the SDK to our hub's frontend (ALPN "cluster-proxy-mux/1"),
// carrying every connection of a Tunnel with per-connection credit both ways. Opened on first use;
// when it breaks, its connections fail and the next dial opens a new one.
import {
  CAP_CREDIT, CAP_HALF_CLOSE, CLIENT_HTTP2_WINDOW, MD_CAPABILITIES, MD_WINDOW, PacketType, SendCredit, StreamSender, connectMux, packets,
  parseCapabilities, type FramedPacketStream, type Packet,
} from '@cluster-proxy/proto';
import type { Leg, LegFactory, LegHandlers } from './legs.js';

export interface MuxOptions {
  address: string;
  caCert: Buffer;
  cert: Buffer;
  key: Buffer;
  serverName?: string;
  /** Per-connection window we grant the hub (what one unread connection may hold here). */
  window?: number;
  connectTimeoutMs?: number;
}


interface Entry {
  h: LegHandlers;
  credit: SendCredit;
  waiting: (() => void)[];
  unreported: number;
  withheld: number;
  paused: boolean;
  connectID: number;
}

class Session {
  readonly sender: StreamSender;
  halfClose = false;
  peerWindow: number | null = null;
  private readonly byRandom = new Map<bigint, Entry>();
  private readonly byID = new Map<number, Entry>();
  broken: string | null = null;

  constructor(readonly stream: FramedPacketStream, readonly window: number) {
    this.sender = new StreamSender(stream);
    stream.on('data', this.onPacket);
    const gone = (why: string): void => this.fail(why);
    stream.on('error', (err: Error) => gone(err.message));
    stream.on('end', () => gone('hub closed the connection'));
    stream.on('close', () => gone('connection to the hub closed'));
  }

  get size(): number {
    return this.byRandom.size + this.byID.size;
  }

  open(random: bigint, h: LegHandlers): Leg {
    const e: Entry = { h, credit: new SendCredit(this.peerWindow), waiting: [], unreported: 0, withheld: 0, paused: false, connectID: 0 };
    this.byRandom.set(random, e);
    const forget = (): void => {
      if (this.byRandom.get(random) === e) this.byRandom.delete(random);
      if (e.connectID && this.byID.get(e.connectID) === e) this.byID.delete(e.connectID);
    };
    const returnCredit = (bytes: number): void => {
      e.unreported += bytes;
      if (e.unreported >= this.window / 8 && e.connectID) {
        this.sender.send(packets.credit(e.connectID, e.unreported));
        e.unreported = 0;
      }
    };
    const session = this;
    return {
      get halfClose() {
        return session.halfClose;
      },
      send: (p) => {
        this.sender.send(p);
        if (p.type !== PacketType.DATA) return true;
        e.credit.consume(p.data.data.length);
        return e.credit.canSend() && !this.sender.congested;
      },
      whenWritable: (cb) => {
        if (!e.credit.canSend()) e.waiting.push(cb);
        else this.sender.whenWritable(cb);
      },
      received: (bytes, accepted) => {
        if (e.paused || !accepted) {
          e.paused = true;
          e.withheld += bytes;
        } else returnCredit(bytes);
      },
      resumeReading: () => {
        if (!e.paused) return;
        e.paused = false;
        const n = e.withheld;
        e.withheld = 0;
        returnCredit(n);
      },
      get backedUp() {
        return false; // control packets never wait behind credit
      },
      get readyForData() {
        return e.credit.canSend() && !session.sender.congested;
      },
      allowance: (bytes) => e.credit.allowance(bytes),
      end: forget,
      abort: forget,
    };
  }

  private readonly onPacket = (p: Packet): void => {
    switch (p.type) {
      case PacketType.DIAL_RSP: {
        const e = this.byRandom.get(p.dialResponse.random);
        if (!e) {
          // We gave up on this dial after the hub had connected it: close what it opened.
          if (p.dialResponse.connectID !== 0) this.sender.send(packets.closeRequest(p.dialResponse.connectID));
          return;
        }
        this.byRandom.delete(p.dialResponse.random);
        if (p.dialResponse.connectID !== 0 && p.dialResponse.error === '') {
          e.connectID = p.dialResponse.connectID;
          this.byID.set(e.connectID, e);
        }
        e.h.onPacket(p);
        return;
      }
      case PacketType.CREDIT: {
        const e = this.byID.get(p.credit.connectID);
        if (!e) return;
        e.credit.grant(p.credit.bytes);
        if (e.credit.canSend()) {
          const waiting = e.waiting.splice(0);
          for (const cb of waiting) this.sender.whenWritable(cb);
        }
        return;
      }
      case PacketType.DATA:
        this.route(p.data.connectID, p);
        return;
      case PacketType.HALF_CLOSE:
        this.route(p.halfClose.connectID, p);
        return;
      case PacketType.CLOSE_RSP: {
        const e = this.byID.get(p.closeResponse.connectID);
        if (e) this.byID.delete(p.closeResponse.connectID);
        e?.h.onPacket(p);
        return;
      }
      default:
        return;
    }
  };

  private route(connectID: number, p: Packet): void {
    this.byID.get(connectID)?.h.onPacket(p);
  }

  fail(why: string): void {
    if (this.broken) return;
    this.broken = why;
    this.sender.close();
    this.stream.destroy();
    const all = [...this.byRandom.values(), ...this.byID.values()];
    this.byRandom.clear();
    this.byID.clear();
    for (const e of all) e.h.onFailure(why);
  }
}

export class MuxLegFactory implements LegFactory {
  private session: Session | null = null;
  private connecting: Promise<Session> | null = null;
  private closed = false;

  constructor(private readonly opts: MuxOptions) {}

  /** Connects (or reuses the connection); rejects with MuxUnsupportedError for a non-mux hub. */
  ready(): Promise<void> {
    return this.get().then(() => undefined);
  }

  open(random: bigint, h: LegHandlers): Leg {
    const s = this.session;
    if (!s || s.broken) throw new Error('internal: mux leg opened before the session was ready');
    return s.open(random, h);
  }

  close(): void {
    this.closed = true;
    this.session?.fail('tunnel closed');
    this.session = null;
  }

  private get(): Promise<Session> {
    if (this.closed) return Promise.reject(new Error('tunnel is closed'));
    if (this.session && !this.session.broken) return Promise.resolve(this.session);
    if (!this.connecting) {
      this.connecting = this.connect().finally(() => {
        this.connecting = null;
      });
    }
    return this.connecting;
  }

  private async connect(): Promise<Session> {
    const window = this.opts.window ?? CLIENT_HTTP2_WINDOW;
    const { stream, hello } = await connectMux({
      address: this.opts.address,
      caCert: this.opts.caCert,
      cert: this.opts.cert,
      key: this.opts.key,
      serverName: this.opts.serverName,
      hello: { [MD_CAPABILITIES]: [`${CAP_CREDIT},${CAP_HALF_CLOSE}`], [MD_WINDOW]: [String(window)] },
      timeoutMs: this.opts.connectTimeoutMs ?? 10_000,
    });
    const session = new Session(stream, window);
    const caps = parseCapabilities((hello[MD_CAPABILITIES] ?? []).join(','));
    session.halfClose = caps.has(CAP_HALF_CLOSE);
    const w = Number(hello[MD_WINDOW]?.[0]);
    session.peerWindow = caps.has(CAP_CREDIT) && Number.isSafeInteger(w) && w > 0 ? w : null;
    stream.startKeepalive(30_000, 10_000);
    this.session = session;
    return session;
  }
}
