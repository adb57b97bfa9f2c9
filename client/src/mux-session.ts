// One multiplexed TLS connection from the SDK to our hub's frontend (ALPN "cluster-proxy-mux/1"),
// carrying every connection of a Tunnel with per-connection credit both ways. Opened on first use;
// when it breaks, its connections fail and the next dial opens a new one.
//
// One connection's share of it (MuxLeg, the Leg a TunnelSocket sends through), states:
//   dialing  DIAL_REQ sent, waiting for DIAL_RSP (found by its dial ID)
//   open     connected (found by its connectID); credit for what the reader took goes back to the hub
//   held     the reader refused bytes: credit for them and what follows is withheld until it reads again
//   closed   out of the session's tables; nothing of it goes out any more
//
//   dialing ──DIAL_RSP──▶ open ──reader refuses bytes──▶ held ──reader reads again (credit returned)──▶ open
//   dialing ──DIAL_RSP with an error──▶ closed
//   open, held ──CLOSE_RSP──▶ closed
//   any ──end() / abort() (the socket is done), the connection to the hub broken──▶ closed
// Half-close is the socket's business: HALF_CLOSE goes through here both ways and changes nothing.
import {
  CAP_CREDIT,
  CAP_HALF_CLOSE,
  CLIENT_HTTP2_WINDOW,
  ConnectionTable,
  MD_CAPABILITIES,
  MD_WINDOW,
  PacketType,
  SendCredit,
  StreamSender,
  connectMux,
  packets,
  parseCapabilities,
  type CloseResponsePacket,
  type DataPacket,
  type DialResponsePacket,
  type HalfClosePacket,
  type FramedPacketStream,
  type Packet,
  type TableConnection,
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

export type MuxLegState = 'dialing' | 'open' | 'held' | 'closed';

export class MuxLeg implements Leg, TableConnection {
  state: MuxLegState = 'dialing';
  connectID = 0;
  private readonly credit: SendCredit;
  /** whenWritable() callers waiting for the hub's credit. */
  private waiting: (() => void)[] = [];
  /** Credit earned by the reader, not yet returned (it goes back in batches of window/8). */
  private unreported = 0;
  /** Bytes received while held: their credit goes back when the reader reads again. */
  private withheld = 0;

  constructor(
    private readonly session: Session,
    readonly random: bigint,
    private readonly h: LegHandlers,
  ) {
    this.credit = new SendCredit(session.peerWindow);
  }

  // ------------------------------------------------------------ from the hub (the session routes)

  onDialResponse(p: DialResponsePacket): void {
    switch (this.state) {
      case 'dialing':
        if (p.dialResponse.connectID !== 0 && p.dialResponse.error === '') {
          this.state = 'open';
          this.connectID = p.dialResponse.connectID;
          this.session.opened(this);
        } else this.enterClosed();
        this.h.onPacket(p);
        return;
      default:
        return; // the session looks dials up only while dialing
    }
  }

  /** Whether the hub knows it by its connectID (the session routes CREDIT, DATA, HALF_CLOSE and CLOSE_RSP only then). */
  private connected(): boolean {
    switch (this.state) {
      case 'open':
      case 'held':
        return true;
      default:
        return false;
    }
  }

  onCredit(bytes: number): void {
    if (!this.connected()) return;
    this.credit.grant(bytes);
    if (this.credit.canSend()) {
      const waiting = this.waiting.splice(0);
      for (const cb of waiting) this.session.sender.whenWritable(cb);
    }
  }

  /** DATA, for the socket. */
  onData(_data: Buffer, p: DataPacket): void {
    if (this.connected()) this.h.onPacket(p);
  }

  /** HALF_CLOSE, for the socket. */
  onHalfClose(p: HalfClosePacket): void {
    if (this.connected()) this.h.onPacket(p);
  }

  /** DATA as the chunks it arrived in, for the socket. */
  onChunks(chunks: readonly Buffer[], length: number): void {
    if (this.connected()) this.h.onChunks(chunks, length);
  }

  onCloseResponse(p: CloseResponsePacket): void {
    if (!this.connected()) return;
    this.enterClosed();
    this.h.onPacket(p);
  }

  /** The connection to the hub broke. */
  onSessionFailed(why: string): void {
    switch (this.state) {
      case 'closed':
        return;
      default:
        this.enterClosed();
        this.h.onFailure(why);
    }
  }

  // ------------------------------------------------------------ Leg (from the socket)

  get halfClose(): boolean {
    return this.session.halfClose;
  }

  send(p: Packet): boolean {
    switch (this.state) {
      case 'closed':
        return false; // the socket sends nothing once its leg is done
      default:
        this.session.sender.send(p);
        if (p.type !== PacketType.DATA) return true;
        this.credit.consume(p.data.data.length);
        return this.credit.canSend() && !this.session.sender.congested;
    }
  }

  whenWritable(cb: () => void): void {
    switch (this.state) {
      case 'closed':
        return; // nothing will be sent: the socket's write fails on its own close
      default:
        if (!this.credit.canSend()) this.waiting.push(cb);
        else this.session.sender.whenWritable(cb);
    }
  }

  received(bytes: number, accepted: boolean): void {
    switch (this.state) {
      case 'open':
        if (accepted) this.returnCredit(bytes);
        else {
          this.state = 'held';
          this.withheld += bytes;
        }
        return;
      case 'held':
        this.withheld += bytes;
        return;
      case 'dialing':
      case 'closed':
        return; // no DATA reaches the socket then
    }
  }

  resumeReading(): void {
    switch (this.state) {
      case 'held': {
        this.state = 'open';
        const n = this.withheld;
        this.withheld = 0;
        this.returnCredit(n);
        return;
      }
      default:
        return; // nothing withheld (closed: the hub has forgotten the connection)
    }
  }

  get backedUp(): boolean {
    return false; // control packets never wait behind credit
  }

  get readyForData(): boolean {
    return this.credit.canSend() && !this.session.sender.congested;
  }

  allowance(bytes: number): number {
    return this.credit.allowance(bytes);
  }

  end(): void {
    this.forget();
  }

  abort(): void {
    this.forget();
  }

  // ------------------------------------------------------------ helpers

  private forget(): void {
    switch (this.state) {
      case 'closed':
        return;
      default:
        this.session.forget(this);
        this.enterClosed();
    }
  }

  private enterClosed(): void {
    this.state = 'closed';
    this.waiting = [];
  }

  private returnCredit(bytes: number): void {
    this.unreported += bytes;
    if (this.unreported >= this.session.window / 8) {
      this.session.sender.send(packets.credit(this.connectID, this.unreported));
      this.unreported = 0;
    }
  }
}

/** What the hub's hello said: it takes HALF_CLOSE; the window it grants per connection (null: no credit). */
export interface SessionPeer {
  readonly halfClose: boolean;
  readonly peerWindow: number | null;
}

/** A Session's connection to the hub: open, or broken for good (with why). Changed only by fail(). */
export type SessionState = { readonly kind: 'open' } | { readonly kind: 'broken'; readonly why: string };

/**
 * One multiplexed connection to the hub and the legs on it. States:
 *   open    legs are opened and their packets flow
 *   broken  the connection failed or was closed (fail()): its sender is closed, the stream destroyed, every
 *           leg told; the factory opens a new Session for the next dial
 *
 *   open ──stream error, end or close; fail() (Tunnel.close())──▶ broken
 */
export class Session {
  readonly sender: StreamSender;
  readonly halfClose: boolean;
  readonly peerWindow: number | null;
  /** Legs by dial ID until DIAL_RSP, then by their connect ID. */
  private readonly legs: ConnectionTable<MuxLeg>;
  private state: SessionState = { kind: 'open' };

  constructor(
    readonly stream: FramedPacketStream,
    readonly window: number,
    peer: SessionPeer,
  ) {
    this.halfClose = peer.halfClose;
    this.peerWindow = peer.peerWindow;
    this.sender = new StreamSender(stream);
    this.legs = new ConnectionTable<MuxLeg>({
      send: (p) => this.sender.send(p),
      unknown: 'ignore',
      events: {
        // For a dial we gave up on after the hub had connected it, the table closes what it opened.
        dialResponse: (leg, p) => leg.onDialResponse(p),
        closeResponse: (leg, p) => {
          this.forget(leg);
          leg.onCloseResponse(p);
        },
      },
    });
    stream.on('data', this.legs.dispatch);
    stream.onDataViews(this.legs.dispatchDataViews);
    const gone = (why: string): void => this.fail(why);
    stream.on('error', (err: Error) => gone(err.message));
    stream.on('end', () => gone('hub closed the connection'));
    stream.on('close', () => gone('connection to the hub closed'));
  }

  get size(): number {
    return this.legs.pendingCount + this.legs.openCount;
  }

  /** Why the connection broke, or null while it is open. */
  get broken(): string | null {
    return this.state.kind === 'broken' ? this.state.why : null;
  }

  open(random: bigint, h: LegHandlers): Leg {
    const leg = new MuxLeg(this, random, h);
    this.legs.addDial(random, leg);
    return leg;
  }

  /** `leg` got its connectID: packets find it by that from now on. */
  opened(leg: MuxLeg): void {
    this.legs.add(leg.connectID, leg);
  }

  forget(leg: MuxLeg): void {
    this.legs.forget(leg, leg.random, leg.connectID);
  }

  fail(why: string): void {
    if (this.state.kind === 'broken') return;
    this.state = { kind: 'broken', why };
    this.sender.close();
    this.stream.destroy();
    for (const leg of this.legs.takeAll()) leg.onSessionFailed(why);
  }
}

/** The factory's connection to the hub: none yet (or the last one broke), being opened, open, or
 * closed for good (Tunnel.close()). Changed only by enter(). */
export type MuxLegFactoryState =
  | { readonly kind: 'idle' }
  | { readonly kind: 'connecting'; readonly connecting: Promise<Session> }
  | { readonly kind: 'connected'; readonly session: Session }
  | { readonly kind: 'closed' };

export class MuxLegFactory implements LegFactory {
  private state: MuxLegFactoryState = { kind: 'idle' };

  constructor(private readonly opts: MuxOptions) {}

  /** Connects (or reuses the connection); rejects with MuxUnsupportedError for a non-mux hub. */
  ready(): Promise<void> {
    return this.get().then(() => undefined);
  }

  open(random: bigint, h: LegHandlers): Leg {
    const s = this.state.kind === 'connected' ? this.state.session : null;
    if (!s || s.broken) throw new Error('internal: mux leg opened before the session was ready');
    return s.open(random, h);
  }

  close(): void {
    if (this.state.kind === 'connected') this.state.session.fail('tunnel closed');
    this.enter({ kind: 'closed' });
  }

  private enter(state: MuxLegFactoryState): void {
    if (this.state.kind === 'closed') return; // for good
    this.state = state;
  }

  private get(): Promise<Session> {
    switch (this.state.kind) {
      case 'closed':
        return Promise.reject(new Error('tunnel is closed'));
      case 'connected':
        if (!this.state.session.broken) return Promise.resolve(this.state.session);
        break; // broken: a new connection
      case 'connecting':
        return this.state.connecting;
      case 'idle':
        break;
    }
    const connecting = this.connect().then(
      (session) => {
        if (this.state.kind === 'closed') {
          // Closed while connecting: nobody will use or close this connection.
          session.fail('tunnel closed');
          throw new Error('tunnel is closed');
        }
        this.enter({ kind: 'connected', session });
        return session;
      },
      (err: unknown) => {
        this.enter({ kind: 'idle' });
        throw err;
      },
    );
    this.enter({ kind: 'connecting', connecting });
    return connecting;
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
    const caps = parseCapabilities((hello[MD_CAPABILITIES] ?? []).join(','));
    const w = Number(hello[MD_WINDOW]?.[0]);
    const session = new Session(stream, window, {
      halfClose: caps.has(CAP_HALF_CLOSE),
      peerWindow: caps.has(CAP_CREDIT) && Number.isSafeInteger(w) && w > 0 ? w : null,
    });
    stream.startKeepalive(30_000, 10_000);
    return session;
  }
}
