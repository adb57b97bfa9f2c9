// Property tests of the client's mux session (client/src/mux-session.ts: one hub connection, a leg per
// tunnel socket): a model hub answers dials, sends DATA (whole or as views), HALF_CLOSE, CREDIT and
// CLOSE_RSP, the stream fills and drains; the sockets' side reads, stops reading, sends within its credit,
// closes, ends and aborts; the hub connection may die. Invariants: a leg's reader gets exactly the DATA
// the hub sent it while it was connected, in order, once; a half-close at most once; a failure once, and
// only to a leg still open; no DATA beyond the hub's credit; credit returned never exceeds what was read;
// the session's tables are empty at the end.
import { EventEmitter } from 'node:events';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { PacketType, packets, type DataViewHandler, type FramedPacketStream, type Packet } from '@cluster-proxy/proto';
import { Session, type MuxLeg } from '@cluster-proxy/client/mux-session';

const WINDOW = 8 * 1024;
const PEER_WINDOW = 4 * 1024;

type Action =
  | { op: 'dialRsp'; leg: number; ok: boolean }
  | { op: 'data'; leg: number; size: number; views: boolean }
  | { op: 'halfClose' | 'closeRsp' | 'closeReq' | 'end' | 'abort' | 'resume'; leg: number }
  | { op: 'credit'; leg: number; bytes: number }
  | { op: 'read'; leg: number; accepted: boolean }
  | { op: 'send'; leg: number; size: number }
  | { op: 'congest' | 'drain' | 'death' };

const LEGS = 3;
const legIndex = fc.nat(LEGS - 1);
const actionArb: fc.Arbitrary<Action> = fc.oneof(
  { arbitrary: fc.record({ op: fc.constant('dialRsp' as const), leg: legIndex, ok: fc.boolean() }), weight: 2 },
  {
    arbitrary: fc.record({ op: fc.constant('data' as const), leg: legIndex, size: fc.integer({ min: 1, max: 3000 }), views: fc.boolean() }),
    weight: 6,
  },
  {
    arbitrary: fc.record({
      op: fc.constantFrom('halfClose' as const, 'closeReq' as const, 'resume' as const, 'resume' as const),
      leg: legIndex,
    }),
    weight: 3,
  },
  { arbitrary: fc.record({ op: fc.constantFrom('closeRsp' as const, 'end' as const, 'abort' as const), leg: legIndex }), weight: 1 },
  { arbitrary: fc.record({ op: fc.constant('credit' as const), leg: legIndex, bytes: fc.integer({ min: 1, max: 5000 }) }), weight: 3 },
  { arbitrary: fc.record({ op: fc.constant('read' as const), leg: legIndex, accepted: fc.boolean() }), weight: 4 },
  { arbitrary: fc.record({ op: fc.constant('send' as const), leg: legIndex, size: fc.integer({ min: 1, max: 3000 }) }), weight: 6 },
  { arbitrary: fc.constantFrom({ op: 'congest' as const }, { op: 'drain' as const }, { op: 'drain' as const }), weight: 2 },
  { arbitrary: fc.constant({ op: 'death' as const }), weight: 1 },
);

/** Most runs begin with the hub connecting some dials, so that the rest happens on open legs. */
const runArb: fc.Arbitrary<Action[]> = fc
  .tuple(
    fc.subarray([0, 1, 2]).map((ls) => ls.map((leg): Action => ({ op: 'dialRsp', leg, ok: true }))),
    fc.array(actionArb, { maxLength: 100 }),
  )
  .map(([opened, rest]) => [...opened, ...rest]);

interface Model {
  random: bigint;
  leg: MuxLeg;
  /** The hub's view. */
  hub: 'dialing' | 'open' | 'gone';
  connectID: number;
  hubHalfClosed: boolean;
  /** DATA the hub sent while the client's leg was connected (what its reader must get). */
  expected: Buffer[];
  /** The client's view: closed once it ended, aborted, was answered CLOSE_RSP or a failed dial, or died. */
  closed: boolean;
  got: Buffer[];
  unacknowledged: number;
  halfCloses: number;
  failures: number;
  /** Credit the hub gave, DATA the client sent, CREDIT the client returned, bytes its reader took. */
  granted: number;
  sentData: number;
  returned: number;
  read: number;
}

function run(actions: readonly Action[]): void {
  const out: Packet[] = [];
  let views: DataViewHandler | null = null;
  let congested = false;
  const stream = Object.assign(new EventEmitter(), {
    write: (p: Packet) => (out.push(p), !congested),
    writableLength: 0,
    onDataViews: (h: DataViewHandler | null) => void (views = h),
    pause: () => {},
    resume: () => {},
    destroy: () => {},
  });
  const session = new Session(stream as unknown as FramedPacketStream, WINDOW, { halfClose: true, peerWindow: PEER_WINDOW });
  let dead = false;
  let nextID = 1;
  let pattern = 0;
  const legs: Model[] = [];
  for (let i = 0; i < LEGS; i++) {
    const m = {} as Model;
    Object.assign(m, {
      random: BigInt(1000 + i),
      hub: 'dialing',
      connectID: 0,
      hubHalfClosed: false,
      expected: [],
      closed: false,
      got: [],
      unacknowledged: 0,
      halfCloses: 0,
      failures: 0,
      granted: PEER_WINDOW,
      sentData: 0,
      returned: 0,
      read: 0,
    });
    m.leg = session.open(m.random, {
      onPacket: (p) => {
        if (p.type === PacketType.DATA) {
          m.got.push(Buffer.from(p.data.data));
          m.unacknowledged += p.data.data.length;
        }
        if (p.type === PacketType.HALF_CLOSE) m.halfCloses++;
      },
      onChunks: (chunks, length) => {
        m.got.push(Buffer.concat(chunks, length));
        m.unacknowledged += length;
      },
      onFailure: () => void m.failures++,
    }) as MuxLeg;
    legs.push(m);
  }
  const connected = (m: Model): boolean => !m.closed && m.hub === 'open';
  const drainOut = (): void => {
    for (const p of out.splice(0)) {
      const m = legs.find(
        (x) =>
          x.connectID !== 0 &&
          ((p.type === PacketType.CREDIT && p.credit.connectID === x.connectID) ||
            (p.type === PacketType.DATA && p.data.connectID === x.connectID)),
      );
      if (p.type === PacketType.CREDIT && m) m.returned += p.credit.bytes;
      if (p.type === PacketType.DATA && m) m.sentData += p.data.data.length;
    }
  };

  for (const a of actions) {
    if (a.op === 'death') {
      if (!dead) {
        dead = true;
        for (const m of legs)
          if (!m.closed) {
            m.closed = true;
            m.failures--;
          } // each still-open leg hears exactly one failure
        stream.emit('close');
      }
      continue;
    }
    if (a.op === 'congest') {
      congested = true;
      continue;
    }
    if (a.op === 'drain') {
      congested = false;
      stream.emit('drain');
      continue;
    }
    if (!('leg' in a)) continue;
    const m = legs[a.leg]!;
    switch (a.op) {
      case 'dialRsp':
        if (dead || m.hub !== 'dialing') break;
        if (a.ok) {
          m.hub = 'open';
          m.connectID = nextID++;
          stream.emit('data', packets.dialResponse(m.random, m.connectID));
        } else {
          m.hub = 'gone';
          stream.emit('data', packets.dialResponse(m.random, 0, 'refused'));
        }
        if (!m.closed) {
          m.closed = !a.ok;
        } // a failed dial closes the leg
        break;
      case 'data': {
        if (dead || m.hub !== 'open' || m.hubHalfClosed) break;
        const data = Buffer.alloc(a.size);
        for (let k = 0; k < a.size; k++) data[k] = (pattern++ * 13 + a.leg) & 0xff;
        if (connected(m)) m.expected.push(data);
        if (a.views)
          views!(
            m.connectID,
            [data.subarray(0, a.size >> 1), data.subarray(a.size >> 1)].filter((c) => c.length > 0),
            a.size,
          );
        else stream.emit('data', packets.data(m.connectID, data));
        break;
      }
      case 'halfClose':
        if (dead || m.hub !== 'open' || m.hubHalfClosed) break;
        m.hubHalfClosed = true;
        if (connected(m)) m.halfCloses--; // expected once
        stream.emit('data', packets.halfClose(m.connectID));
        break;
      case 'credit':
        if (dead || m.hub !== 'open') break;
        if (connected(m)) m.granted += a.bytes;
        stream.emit('data', packets.credit(m.connectID, a.bytes));
        break;
      case 'closeRsp':
        if (dead || m.hub !== 'open') break;
        m.hub = 'gone';
        m.closed = true;
        stream.emit('data', packets.closeResponse(m.connectID));
        break;
      case 'read':
        if (m.unacknowledged === 0) break;
        m.read += m.unacknowledged;
        m.leg.received(m.unacknowledged, a.accepted);
        m.unacknowledged = 0;
        break;
      case 'resume':
        m.leg.resumeReading();
        break;
      case 'send': {
        if (m.closed || m.hub !== 'open' || !m.leg.readyForData) break;
        const n = m.leg.allowance(a.size);
        if (n > 0) m.leg.send(packets.data(m.connectID, Buffer.alloc(n)));
        break;
      }
      case 'closeReq':
        if (m.closed || m.hub !== 'open') break;
        m.leg.send(packets.closeRequest(m.connectID));
        break;
      case 'end':
      case 'abort':
        if (m.closed) break;
        m.closed = true;
        if (a.op === 'end') m.leg.end();
        else m.leg.abort();
        break;
    }
    drainOut();
    for (const x of legs) {
      expect(x.sentData, `leg ${x.random}: sent ${x.sentData} bytes on ${x.granted} of credit`).toBeLessThanOrEqual(x.granted);
      expect(x.returned, `leg ${x.random}: returned more credit than its reader took`).toBeLessThanOrEqual(x.read);
    }
  }
  // The sockets all finish: what is still open ends; the session forgets every leg.
  for (const m of legs)
    if (!m.closed) {
      m.closed = true;
      m.leg.end();
    }
  for (const m of legs) {
    const got = Buffer.concat(m.got);
    const expected = Buffer.concat(m.expected);
    expect(got.length, `leg ${m.random}: got ${got.length} of ${expected.length} bytes`).toBe(expected.length);
    expect(got.equals(expected), `leg ${m.random}: DATA lost, duplicated or reordered`).toBe(true);
    expect(m.halfCloses, `leg ${m.random}: half-closes off by ${m.halfCloses}`).toBe(0);
    expect(m.failures, `leg ${m.random}: failures off by ${m.failures}`).toBe(0);
    expect(m.leg.state).toBe('closed');
  }
  expect(session.size).toBe(0);
  session.fail('test over');
  expect(session.sender['waiters'].size).toBe(0);
}

describe('client mux session: random interleavings (fast-check)', () => {
  it('each leg gets its DATA once and in order, one half-close, one failure; credit kept; tables empty', () => {
    // One run always: credit used up, then given back in part, then used again.
    const example: Action[] = [
      { op: 'dialRsp', leg: 0, ok: true },
      { op: 'send', leg: 0, size: 3000 },
      { op: 'send', leg: 0, size: 3000 },
      { op: 'credit', leg: 0, bytes: 1000 },
      { op: 'send', leg: 0, size: 3000 },
      { op: 'send', leg: 0, size: 3000 },
    ];
    fc.assert(
      fc.property(runArb, (actions) => run(actions)),
      { seed: 20261129, numRuns: 400, examples: [[example]] },
    );
  });
});
