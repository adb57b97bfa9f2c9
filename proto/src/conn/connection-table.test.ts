import { describe, expect, it } from 'vitest';
import { PacketType, packets, type Packet } from '../wire/packet.js';
import { ConnectionTable, type ConnectionEvents, type UnknownConnectionAnswer } from './connection-table.js';

/** A connection that records what reached it. */
class Conn {
  readonly got: string[] = [];
  constructor(
    readonly dialID: bigint,
    public connectID = 0,
  ) {}
  onData(data: Buffer): void {
    this.got.push(`data:${data.toString()}`);
  }
  onChunks(chunks: readonly Buffer[], n: number): void {
    this.got.push(`chunks:${Buffer.concat(chunks).toString()}/${n}`);
  }
  onCredit(bytes: number): void {
    this.got.push(`credit:${bytes}`);
  }
  onHalfClose(): void {
    this.got.push('half-close');
  }
}

function table(unknown: UnknownConnectionAnswer, events: ConnectionEvents<Conn> = {}) {
  const sent: Packet[] = [];
  const counted: PacketType[] = [];
  const t = new ConnectionTable<Conn>({ send: (p) => sent.push(p), unknown, events, count: (type) => counted.push(type) });
  return { t, sent, counted };
}

describe("ConnectionTable: a connection's own packets", () => {
  it('hands DATA, DATA views, CREDIT and HALF_CLOSE to the connection of that connect ID, counting each packet', () => {
    const { t, sent, counted } = table('close-response');
    const a = new Conn(1n, 7);
    const b = new Conn(2n, 8);
    t.add(7, a);
    t.add(8, b);
    t.dispatch(packets.data(7, Buffer.from('hi')));
    t.dispatchDataViews(8, [Buffer.from('a'), Buffer.from('bc')], 3);
    t.dispatch(packets.credit(7, 100));
    t.dispatch(packets.halfClose(8));
    expect(a.got).toEqual(['data:hi', 'credit:100']);
    expect(b.got).toEqual(['chunks:abc/3', 'half-close']);
    expect(sent).toEqual([]);
    expect(counted).toEqual([PacketType.DATA, PacketType.DATA, PacketType.CREDIT, PacketType.HALF_CLOSE]);
  });
});

describe('ConnectionTable: an unknown connect ID', () => {
  it('close-response: CLOSE_RSP to DATA (packet or views) and to CLOSE_REQ; CREDIT and HALF_CLOSE are dropped', () => {
    const closed: Conn[] = [];
    const { t, sent } = table('close-response', { closeRequest: (c) => closed.push(c) });
    t.dispatch(packets.data(5, Buffer.from('x')));
    t.dispatchDataViews(6, [Buffer.from('y')], 1);
    t.dispatch(packets.closeRequest(9));
    t.dispatch(packets.credit(5, 1));
    t.dispatch(packets.halfClose(5));
    expect(sent).toEqual([
      packets.closeResponse(5, 'unrecognized connectID'),
      packets.closeResponse(6, 'unrecognized connectID'),
      packets.closeResponse(9, 'Unknown connectID'),
    ]);
    expect(closed).toEqual([]);
  });

  it('close-request: CLOSE_REQ to DATA, except for connect ID 0', () => {
    const { t, sent } = table('close-request');
    t.dispatch(packets.data(5, Buffer.from('x')));
    t.dispatchDataViews(0, [Buffer.from('y')], 1);
    expect(sent).toEqual([packets.closeRequest(5)]);
  });

  it('ignore: nothing is sent', () => {
    const { t, sent } = table('ignore');
    t.dispatch(packets.data(5, Buffer.from('x')));
    t.dispatchDataViews(6, [Buffer.from('y')], 1);
    expect(sent).toEqual([]);
  });
});

describe('ConnectionTable: dials', () => {
  it('DIAL_RSP takes the dial out of the pending table and hands it on; a stale one gets CLOSE_REQ for what the peer opened', () => {
    const answered: [Conn, number][] = [];
    const stale: number[] = [];
    const { t, sent } = table('ignore', {
      dialResponse: (c, p) => answered.push([c, p.dialResponse.connectID]),
      staleDialResponse: (id) => stale.push(id),
    });
    const a = new Conn(11n);
    t.addDial(11n, a);
    expect(t.hasDial(11n)).toBe(true);
    t.dispatch(packets.dialResponse(11n, 3));
    expect(answered).toEqual([[a, 3]]);
    expect(t.hasDial(11n)).toBe(false);
    t.dispatch(packets.dialResponse(11n, 4)); // again: stale now
    t.dispatch(packets.dialResponse(12n, 0, 'refused')); // a failed dial opened nothing
    expect(sent).toEqual([packets.closeRequest(4)]);
    expect(stale).toEqual([4, 0]);
  });

  it('DIAL_REQ, DIAL_CLS (the pending dial, left in the table), CLOSE_REQ, CLOSE_RSP and DRAIN go to their events', () => {
    const seen: string[] = [];
    const { t } = table('close-response', {
      dialRequest: (random, address, protocol) => seen.push(`dial ${random} ${address} ${protocol}`),
      dialClose: (c) => seen.push(`dial-close ${c.dialID}`),
      closeRequest: (c) => seen.push(`close-req ${c.connectID}`),
      closeResponse: (c, p) => seen.push(`close-rsp ${c.connectID} ${p.closeResponse.error}`),
      drain: () => seen.push('drain'),
    });
    const a = new Conn(21n, 5);
    t.addDial(21n, a);
    t.add(5, a);
    t.dispatch(packets.dialRequest('10.0.0.1:443', 30n));
    t.dispatch(packets.closeDial(21n));
    t.dispatch(packets.closeDial(99n)); // no such dial: nothing
    t.dispatch(packets.closeRequest(5));
    t.dispatch(packets.closeResponse(5, 'gone'));
    t.dispatch(packets.drain());
    expect(seen).toEqual(['dial 30 10.0.0.1:443 tcp', 'dial-close 21', 'close-req 5', 'close-rsp 5 gone', 'drain']);
    expect(t.dial(21n)).toBe(a);
  });

  it('a packet type the end has no event for goes to unexpected', () => {
    const unexpected: PacketType[] = [];
    const { t, sent } = table('close-response', { unexpected: (type) => unexpected.push(type) });
    t.dispatch(packets.dialRequest('a:1', 1n));
    t.dispatch(packets.dialResponse(1n, 2));
    t.dispatch(packets.closeRequest(3));
    t.dispatch(packets.drain());
    expect(unexpected).toEqual([PacketType.DIAL_REQ, PacketType.DIAL_RSP, PacketType.CLOSE_REQ, PacketType.DRAIN]);
    expect(sent).toEqual([]); // not answered as an unknown connect ID either
  });
});

describe('ConnectionTable: bookkeeping', () => {
  it('forget takes a connection out only where it is the one held; takeAll returns each once and empties both tables', () => {
    const { t } = table('ignore');
    const a = new Conn(1n, 1);
    const b = new Conn(2n, 2);
    const c = new Conn(3n);
    t.addDial(1n, a);
    t.add(1, a);
    t.add(2, b);
    t.addDial(3n, c);
    t.forget(c, 1n, 2); // neither ID is c's: nothing goes
    expect([t.pendingCount, t.openCount]).toEqual([2, 2]);
    t.forget(b, 2n, 2);
    expect(t.get(2)).toBeUndefined();
    expect(t.openConnections()).toEqual([a]);
    expect(t.all()).toEqual([a, c]);
    expect(t.takeAll()).toEqual([a, c]);
    expect([t.pendingCount, t.openCount]).toEqual([0, 0]);
  });
});
