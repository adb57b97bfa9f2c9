// The mux session's legs (one per TunnelSocket), state by state: packets from a fake hub connection
// (a stream that records what we send), the socket's side played by the test (its handlers record
// what reaches it; it calls the Leg as TunnelSocket does).
import { EventEmitter } from 'node:events';
import { describe, expect, it } from 'vitest';
import { PacketType, packets, type DataViewHandler, type FramedPacketStream, type Packet } from '@cluster-proxy/proto';
import { Session, type MuxLeg } from './mux-session.js';

const WINDOW = 64 * 1024;

function setup() {
  const out: Packet[] = [];
  let views: DataViewHandler | null = null;
  const stream = Object.assign(new EventEmitter(), {
    write: (p: Packet) => (out.push(p), true),
    onDataViews: (h: DataViewHandler | null) => void (views = h),
    pause: () => {},
    resume: () => {},
    destroy: () => {},
  });
  const session = new Session(stream as unknown as FramedPacketStream, WINDOW, { halfClose: true, peerWindow: WINDOW });
  /** What reached the socket: packet types, and failures. */
  const heard: string[] = [];
  const leg = session.open(5n, {
    onPacket: (p) => void heard.push(PacketType[p.type]!),
    onChunks: (chunks, length) => void heard.push(`chunks:${chunks.map((c) => c.toString()).join('+')}=${length}`),
    onFailure: (why) => void heard.push(`failure:${why}`),
  }) as MuxLeg;
  const fromHub = (p: Packet): boolean => stream.emit('data', p);
  /** A DATA frame as the framed stream hands it over: its payload as the chunks it arrived in. */
  const viewsFromHub = (connectID: number, chunks: Buffer[]): void =>
    views!(
      connectID,
      chunks,
      chunks.reduce((n, c) => n + c.length, 0),
    );
  /** Packets sent to the hub since the last call: type, with CREDIT's and DATA's bytes. */
  const sent = (): string[] =>
    out
      .splice(0)
      .map((p) =>
        p.type === PacketType.CREDIT
          ? `CREDIT:${p.credit.bytes}`
          : p.type === PacketType.DATA
            ? `DATA:${p.data.data.length}`
            : PacketType[p.type]!,
      );
  return { session, leg, heard, fromHub, viewsFromHub, sent, stream };
}

function opened() {
  const t = setup();
  t.fromHub(packets.dialResponse(5n, 3));
  t.heard.length = 0;
  return t;
}

describe('MuxLeg: dialing', () => {
  it('DIAL_RSP opens it: found by its connectID from then on', () => {
    const { leg, heard, fromHub, session } = setup();
    expect(leg.state).toBe('dialing');
    fromHub(packets.data(3, Buffer.alloc(1))); // not known by that ID yet
    expect(heard).toEqual([]);
    fromHub(packets.dialResponse(5n, 3));
    expect(leg.state).toBe('open');
    expect(leg.connectID).toBe(3);
    fromHub(packets.data(3, Buffer.alloc(1)));
    fromHub(packets.halfClose(3));
    expect(heard).toEqual(['DIAL_RSP', 'DATA', 'HALF_CLOSE']);
    expect(session.size).toBe(1);
  });

  it('DIAL_RSP with an error: closed and forgotten; the socket finishing it changes nothing', () => {
    const { leg, heard, fromHub, session, sent } = setup();
    fromHub(packets.dialResponse(5n, 0, 'refused', 'endpoint'));
    expect(leg.state).toBe('closed');
    expect(heard).toEqual(['DIAL_RSP']);
    expect(session.size).toBe(0);
    leg.end();
    expect(leg.send(packets.closeDial(5n))).toBe(false);
    expect(sent()).toEqual([]);
  });

  it('the socket gives up while dialing (DIAL_CLS, end): a DIAL_RSP that crossed it is answered with CLOSE_REQ', () => {
    const { leg, heard, fromHub, session, sent } = setup();
    leg.send(packets.closeDial(5n));
    leg.end();
    expect(leg.state).toBe('closed');
    expect(session.size).toBe(0);
    fromHub(packets.dialResponse(5n, 3));
    expect(sent()).toEqual(['DIAL_CLS', 'CLOSE_REQ']);
    expect(heard).toEqual([]);
  });
});

describe('MuxLeg: credit', () => {
  it("DATA within the hub's credit; without credit the writer waits for CREDIT", () => {
    const { leg, fromHub, sent } = opened();
    expect(leg.allowance(WINDOW + 1)).toBe(WINDOW);
    expect(leg.send(packets.data(3, Buffer.alloc(WINDOW)))).toBe(false);
    expect(leg.readyForData).toBe(false);
    let woken = 0;
    leg.whenWritable(() => woken++);
    expect(woken).toBe(0);
    fromHub(packets.credit(3, 100));
    expect(woken).toBe(1);
    expect(leg.readyForData).toBe(true);
    expect(sent()).toEqual([`DATA:${WINDOW}`]);
  });

  it('DATA handed over as chunks reaches the socket as they are, once the connection is open; for another connectID, nowhere', () => {
    const t = setup();
    t.viewsFromHub(3, [Buffer.from('early')]); // not open yet: the session does not know connectID 3
    expect(t.heard).toEqual([]);
    t.fromHub(packets.dialResponse(5n, 3));
    t.heard.length = 0;
    t.viewsFromHub(3, [Buffer.from('ab'), Buffer.from('cde')]);
    t.viewsFromHub(4, [Buffer.from('other')]);
    expect(t.heard).toEqual(['chunks:ab+cde=5']);
  });

  it("the reader's credit goes back in batches; a reader that refuses bytes holds it until it reads again", () => {
    const { leg, sent } = opened();
    leg.received(WINDOW / 16, true);
    expect(sent()).toEqual([]);
    leg.received(WINDOW / 16, true);
    expect(sent()).toEqual([`CREDIT:${WINDOW / 8}`]);
    leg.received(WINDOW / 8, false);
    expect(leg.state).toBe('held');
    leg.received(WINDOW / 8, true); // behind refused bytes: withheld too
    expect(sent()).toEqual([]);
    leg.resumeReading();
    expect(leg.state).toBe('open');
    expect(sent()).toEqual([`CREDIT:${WINDOW / 4}`]);
    leg.resumeReading(); // nothing withheld: ignored
    expect(sent()).toEqual([]);
  });
});

describe('MuxLeg: the end', () => {
  it('CLOSE_RSP: closed and forgotten; no CREDIT for what the reader takes afterwards', () => {
    const { leg, heard, fromHub, session, sent } = opened();
    leg.received(WINDOW / 8, false);
    fromHub(packets.closeResponse(3));
    expect(leg.state).toBe('closed');
    expect(heard).toEqual(['CLOSE_RSP']);
    expect(session.size).toBe(0);
    leg.resumeReading();
    leg.received(10, true);
    fromHub(packets.data(3, Buffer.alloc(1)));
    fromHub(packets.closeResponse(3));
    expect(sent()).toEqual([]);
    expect(heard).toEqual(['CLOSE_RSP']);
  });

  it('the connection to the hub breaks: the socket hears it once; writers waiting for credit are dropped', () => {
    const { leg, heard, session, stream } = opened();
    leg.send(packets.data(3, Buffer.alloc(WINDOW)));
    let woken = 0;
    leg.whenWritable(() => woken++);
    stream.emit('error', new Error('reset'));
    stream.emit('close');
    expect(leg.state).toBe('closed');
    expect(heard).toEqual(['failure:reset']);
    expect(session.broken).toBe('reset');
    leg.abort();
    leg.whenWritable(() => woken++);
    expect(woken).toBe(0);
  });

  it('abort while open: forgotten at once; later packets for it are not routed', () => {
    const { leg, heard, fromHub, session } = opened();
    leg.abort();
    expect(leg.state).toBe('closed');
    expect(session.size).toBe(0);
    fromHub(packets.data(3, Buffer.alloc(1)));
    fromHub(packets.credit(3, 1));
    expect(heard).toEqual([]);
  });
});
