// The connections one stream of packets carries, and the dispatch of its packets to them. Every end
// of a stream of ANP packets keeps the same two tables: dials in progress by their dial ID (ANP's
// `random`) and connections by their connect ID; and answers a packet for a connect ID it does not
// know the same way. The four ends (the agent's link to a hub, the hub's stream from an agent, the
// hub's mux frontend session, the SDK's mux session) each hold one ConnectionTable.
//
// What the table does on its own, per packet:
//   DATA, CREDIT, HALF_CLOSE  to the connection of that connect ID (onData / onChunks, onCredit, onHalfClose)
//   DIAL_RSP                  the pending dial of that dial ID, taken out of the pending table, to `dialResponse`;
//                             for no pending dial (given up on), CLOSE_REQ for what the peer opened
//   CLOSE_REQ, CLOSE_RSP      the connection of that connect ID to `closeRequest` / `closeResponse`
//   DIAL_REQ, DIAL_CLS, DRAIN to `dialRequest`, `dialClose` (the pending dial), `drain`
//   a type this end has no event for: `unexpected`
// A packet for a connect ID the table does not know is answered as `unknown` says (below).
import { PacketType, packets, type Packet } from '../wire/packet.js';

export type DialResponsePacket = Extract<Packet, { type: PacketType.DIAL_RSP }>;
export type CloseResponsePacket = Extract<Packet, { type: PacketType.CLOSE_RSP }>;
export type DataPacket = Extract<Packet, { type: PacketType.DATA }>;
export type HalfClosePacket = Extract<Packet, { type: PacketType.HALF_CLOSE }>;

/** What a connection in a table takes from the stream (the packet too, for an end that hands packets on). */
export interface TableConnection {
  onData(data: Buffer, p: DataPacket): void;
  /** One DATA payload as the chunks it arrived in, `n` bytes in all. */
  onChunks(chunks: readonly Buffer[], n: number): void;
  onCredit(bytes: number): void;
  /** The peer will send no more on this connection. */
  onHalfClose(p: HalfClosePacket): void;
}

/** What an end does with the packets that are not a connection's own bytes. Absent: `unexpected`. */
export interface ConnectionEvents<C> {
  /** DIAL_REQ: the peer asks this end to dial (the dialed ends: the agent, the hub's mux frontend). */
  dialRequest?(random: bigint, address: string, protocol: string): void;
  /** DIAL_RSP for a dial of ours, already out of the pending table. */
  dialResponse?(conn: C, p: DialResponsePacket): void;
  /** DIAL_RSP for a dial given up on; the table has sent CLOSE_REQ for a connection it opened. */
  staleDialResponse?(connectID: number): void;
  /** DIAL_CLS for a pending dial (still in the table: the end forgets it or not). */
  dialClose?(conn: C): void;
  /** CLOSE_REQ for a connection of this table. */
  closeRequest?(conn: C): void;
  /** CLOSE_RSP for a connection of this table (still in it). */
  closeResponse?(conn: C, p: CloseResponsePacket): void;
  /** DRAIN: the peer is going away. */
  drain?(): void;
  /** A packet type this end does not take. */
  unexpected?(type: PacketType): void;
}

/**
 * How an end answers DATA or CLOSE_REQ for a connect ID it does not know:
 * - `close-response` (the dialed ends, as ANP's agent): CLOSE_RSP "unrecognized connectID" to DATA,
 *   CLOSE_RSP "Unknown connectID" to CLOSE_REQ, so the peer tears down its half;
 * - `close-request` (the hub towards an agent): CLOSE_REQ to DATA (connect ID 0 is nobody's);
 * - `ignore` (the SDK): nothing.
 */
export type UnknownConnectionAnswer = 'close-response' | 'close-request' | 'ignore';

export interface ConnectionTableOptions<C> {
  /** Sends an answer to the peer (the end's StreamSender). */
  send: (p: Packet) => void;
  unknown: UnknownConnectionAnswer;
  events: ConnectionEvents<C>;
  /** Called with every packet's type as it arrives (the end's packet counter). */
  count?: (type: PacketType) => void;
}

export class ConnectionTable<C extends TableConnection> {
  private readonly dials = new Map<bigint, C>();
  private readonly byConnectID = new Map<number, C>();
  private readonly send: (p: Packet) => void;
  private readonly unknown: UnknownConnectionAnswer;
  private readonly events: ConnectionEvents<C>;
  private readonly count: ((type: PacketType) => void) | undefined;

  constructor(opts: ConnectionTableOptions<C>) {
    this.send = opts.send;
    this.unknown = opts.unknown;
    this.events = opts.events;
    this.count = opts.count;
  }

  // ------------------------------------------------------------ the tables

  /** Dials in progress (connections may stay here after they have a connect ID too). */
  get pendingCount(): number {
    return this.dials.size;
  }

  /** Connections found by their connect ID. */
  get openCount(): number {
    return this.byConnectID.size;
  }

  addDial(dialID: bigint, conn: C): void {
    this.dials.set(dialID, conn);
  }

  hasDial(dialID: bigint): boolean {
    return this.dials.has(dialID);
  }

  dial(dialID: bigint): C | undefined {
    return this.dials.get(dialID);
  }

  add(connectID: number, conn: C): void {
    this.byConnectID.set(connectID, conn);
  }

  get(connectID: number): C | undefined {
    return this.byConnectID.get(connectID);
  }

  /** Takes `conn` out of both tables (only where it is the one held under its IDs). */
  forget(conn: C, dialID: bigint, connectID: number): void {
    if (this.dials.get(dialID) === conn) this.dials.delete(dialID);
    if (connectID !== 0 && this.byConnectID.get(connectID) === conn) this.byConnectID.delete(connectID);
  }

  /** The connections found by connect ID (a copy: the caller may close them). */
  openConnections(): C[] {
    return [...this.byConnectID.values()];
  }

  /** Every connection of both tables, once each (a copy). */
  all(): C[] {
    return [...new Set([...this.dials.values(), ...this.byConnectID.values()])];
  }

  /** Empties both tables and returns what they held, once each: the end closes them. */
  takeAll(): C[] {
    const all = this.all();
    this.dials.clear();
    this.byConnectID.clear();
    return all;
  }

  // ------------------------------------------------------------ inbound packets

  /** DATA as the chunks it arrived in (the framed transport's DataViewHandler). */
  readonly dispatchDataViews = (connectID: number, chunks: readonly Buffer[], n: number): void => {
    this.count?.(PacketType.DATA);
    this.forData(connectID)?.onChunks(chunks, n);
  };

  /** One packet from the peer. */
  readonly dispatch = (p: Packet): void => {
    this.count?.(p.type);
    const ev = this.events;
    switch (p.type) {
      case PacketType.DATA:
        this.forData(p.data.connectID)?.onData(p.data.data, p);
        return;
      case PacketType.CREDIT:
        this.byConnectID.get(p.credit.connectID)?.onCredit(p.credit.bytes);
        return;
      case PacketType.HALF_CLOSE:
        this.byConnectID.get(p.halfClose.connectID)?.onHalfClose(p);
        return;
      case PacketType.DIAL_REQ:
        if (!ev.dialRequest) break;
        ev.dialRequest(p.dialRequest.random, p.dialRequest.address, p.dialRequest.protocol);
        return;
      case PacketType.DIAL_RSP: {
        if (!ev.dialResponse) break;
        const r = p.dialResponse;
        const conn = this.dials.get(r.random);
        if (!conn) {
          // Given up on (timed out or cancelled): do not leave the peer's connection open.
          if (r.connectID !== 0) this.send(packets.closeRequest(r.connectID));
          ev.staleDialResponse?.(r.connectID);
          return;
        }
        this.dials.delete(r.random);
        ev.dialResponse(conn, p);
        return;
      }
      case PacketType.DIAL_CLS: {
        if (!ev.dialClose) break;
        const conn = this.dials.get(p.closeDial.random);
        if (conn) ev.dialClose(conn);
        return;
      }
      case PacketType.CLOSE_REQ: {
        if (!ev.closeRequest) break;
        const id = p.closeRequest.connectID;
        const conn = this.byConnectID.get(id);
        if (conn) ev.closeRequest(conn);
        else if (this.unknown === 'close-response') this.send(packets.closeResponse(id, 'Unknown connectID'));
        return;
      }
      case PacketType.CLOSE_RSP: {
        if (!ev.closeResponse) break;
        const conn = this.byConnectID.get(p.closeResponse.connectID);
        if (conn) ev.closeResponse(conn, p);
        return;
      }
      case PacketType.DRAIN:
        if (!ev.drain) break;
        ev.drain();
        return;
      default:
        break;
    }
    ev.unexpected?.(p.type);
  };

  /** The connection DATA is for; answers the peer (as `unknown` says) when there is none. */
  private forData(connectID: number): C | undefined {
    const conn = this.byConnectID.get(connectID);
    if (conn) return conn;
    if (this.unknown === 'close-response') this.send(packets.closeResponse(connectID, 'unrecognized connectID'));
    else if (this.unknown === 'close-request' && connectID !== 0) this.send(packets.closeRequest(connectID));
    return undefined;
  }
}
