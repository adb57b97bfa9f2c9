// MuxFrontendConn's states, driven through its session: packets from a fake SDK connection (a stream
// that records what we send and can be made congested), the core's side played by the test (the
// Frontend calls a ProxiedConnection makes, and a proxied connection that records what it is told).
import { EventEmitter } from 'node:events';
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import {
  CAP_CREDIT,
  CAP_HALF_CLOSE,
  MAX_CONNECTION_WINDOW,
  MD_CAPABILITIES,
  MD_WINDOW,
  MemoryBudget,
  PacketType,
  packets,
  type FramedPacketStream,
  type Packet,
} from '@cluster-proxy/proto';
import { type MuxFrontendConn, MuxFrontendSession } from './frontend-mux.js';
import { ServerMetrics } from './metrics.js';
import type { ProxiedConnection } from './proxied-connection.js';
import type { ProxyCore } from './proxy-core.js';

const WINDOW = 64 * 1024;

/** Each packet in a word: DIAL_RSP:id or DIAL_RSP:error, DATA:bytes, CREDIT:bytes, HALF_CLOSE, CLOSE_RSP[:error]. */
function word(p: Packet): string {
  switch (p.type) {
    case PacketType.DIAL_RSP:
      return `DIAL_RSP:${p.dialResponse.error || p.dialResponse.connectID}`;
    case PacketType.DATA:
      return `DATA:${p.data.data.length}`;
    case PacketType.CREDIT:
      return `CREDIT:${p.credit.bytes}`;
    case PacketType.CLOSE_RSP:
      return p.closeResponse.error ? `CLOSE_RSP:${p.closeResponse.error}` : 'CLOSE_RSP';
    default:
      return PacketType[p.type]!;
  }
}

function setup(opts: { clientCredit?: boolean } = {}) {
  const out: Packet[] = [];
  const stream = Object.assign(new EventEmitter(), {
    full: false,
    reads: 'flowing',
    sendHello: () => {},
    write: (p: Packet) => (out.push(p), !stream.full),
    onDataViews: () => {},
    pause: () => void (stream.reads = 'paused'),
    resume: () => void (stream.reads = 'flowing'),
    destroy: () => {},
  });
  /** What the proxied connection was told, and the `sent` callbacks of the client bytes it holds. */
  const told: string[] = [];
  const held: (() => void)[] = [];
  const proxied = {
    write: (data: Buffer, sent?: () => void) => {
      told.push(`write:${data.length}`);
      if (sent) held.push(sent);
    },
    endWrite: () => void told.push('endWrite'),
    close: () => void told.push('close'),
  } as unknown as ProxiedConnection;
  let conn: MuxFrontendConn | null = null;
  const core = {
    metrics: new ServerMetrics(),
    budget: new MemoryBudget(256 * 1024 * 1024, { maxWindow: MAX_CONNECTION_WINDOW }),
    awaitAgent: () => null, // an agent is always there: dial at once
    dial: (_address: string, _protocol: string, frontend: MuxFrontendConn) => ((conn = frontend), proxied),
  } as unknown as ProxyCore;
  const caps = opts.clientCredit === false ? [CAP_HALF_CLOSE] : [CAP_CREDIT, CAP_HALF_CLOSE];
  const hello = { [MD_CAPABILITIES]: [caps.join(',')], [MD_WINDOW]: [String(WINDOW)] };
  const session = new MuxFrontendSession(
    stream as unknown as FramedPacketStream,
    hello,
    core,
    WINDOW,
    pino({ level: 'silent' }),
    () => {},
    'sdk-client',
  );
  const fromClient = (p: Packet): boolean => stream.emit('data', p);
  fromClient(packets.dialRequest('c1:443', 5n));
  const c = conn as unknown as MuxFrontendConn;
  /** Packets sent to the client since the last call. */
  const sent = (): string[] => out.splice(0).map(word);
  /** The destination's bytes, as the core hands them over; resolves `acks` as each is delivered. */
  const acks: number[] = [];
  const toClient = (n: number): void => void c.sink.write(Buffer.alloc(n), () => acks.push(n));
  return { conn: c, session, stream, fromClient, sent, told, held, toClient, acks };
}

/** An open connection (connectID 1), with the DIAL_RSP taken off. */
function opened(opts: { clientCredit?: boolean } = {}) {
  const t = setup(opts);
  t.conn.dialSucceeded(9);
  t.sent();
  return t;
}

describe('MuxFrontendConn: dialing', () => {
  it('dialSucceeded: DIAL_RSP with our connectID, then open', () => {
    const { conn, sent, session } = setup();
    expect(conn.state).toBe('dialing');
    conn.dialSucceeded(9);
    expect(conn.state).toBe('open');
    expect(sent()).toEqual(['DIAL_RSP:1']);
    expect(session.describe()).toEqual([{ state: 'open', connectID: 1, address: 'c1:443' }]);
  });

  it('dialFailed: DIAL_RSP with the error, closed and forgotten', () => {
    const { conn, sent, session } = setup();
    conn.dialFailed('timeout', 'dial timed out');
    expect(conn.state).toBe('closed');
    expect(sent()).toEqual(['DIAL_RSP:dial timed out']);
    expect(session.describe()).toEqual([]);
    conn.dialSucceeded(9); // late: ignored
    conn.dialFailed('timeout', 'again');
    expect(sent()).toEqual([]);
  });

  it('DIAL_CLS while dialing: the core is told to close; its late answers change nothing', () => {
    const { conn, sent, told, fromClient } = setup();
    fromClient(packets.closeDial(5n));
    expect(conn.state).toBe('closed');
    expect(told).toEqual(['close']);
    conn.dialSucceeded(9);
    conn.closed('');
    conn.pause();
    expect(conn.state).toBe('closed');
    expect(sent()).toEqual([]);
  });
});

describe('MuxFrontendConn: bytes both ways', () => {
  it('client bytes go to the core; the client gets its credit back as they leave for the agent', () => {
    const { fromClient, told, held, sent } = opened();
    fromClient(packets.data(1, Buffer.alloc(WINDOW / 4)));
    expect(told).toEqual([`write:${WINDOW / 4}`]);
    expect(sent()).toEqual([]);
    held.shift()!();
    expect(sent()).toEqual([`CREDIT:${WINDOW / 4}`]);
  });

  it("destination bytes go out within the client's credit; the rest waits for CREDIT", () => {
    const { conn, toClient, sent, acks, fromClient } = opened();
    toClient(WINDOW + 100);
    expect(sent()).toEqual([`DATA:${WINDOW}`]);
    expect(acks).toEqual([]);
    fromClient(packets.credit(1, 50));
    expect(sent()).toEqual(['DATA:50']);
    fromClient(packets.credit(1, 50));
    expect(sent()).toEqual(['DATA:50']);
    expect(acks).toEqual([WINDOW + 100]);
    expect(conn.state).toBe('open');
  });

  it('a congested connection holds the bytes until it drains', () => {
    const { toClient, sent, stream } = opened();
    stream.full = true;
    toClient(10);
    toClient(20);
    expect(sent()).toEqual(['DATA:10']);
    stream.full = false;
    stream.emit('drain');
    expect(sent()).toEqual(['DATA:20']);
  });

  it('a client without credit is paused as a whole stream while the agent has no credit', () => {
    const { conn, stream } = opened({ clientCredit: false });
    conn.pause();
    expect(stream.reads).toBe('paused');
    conn.resume();
    expect(stream.reads).toBe('flowing');
  });

  it('a client that overruns its window by more than a message: the core closes the connection', () => {
    const { fromClient, told } = opened();
    fromClient(packets.data(1, Buffer.alloc(WINDOW + 4 * 1024 * 1024 + 2048)));
    expect(told.at(-1)).toBe('close');
  });

  it('HALF_CLOSE and CLOSE_REQ from the client go to the core', () => {
    const { conn, fromClient, told } = opened();
    fromClient(packets.halfClose(1));
    fromClient(packets.closeRequest(1));
    expect(told).toEqual(['endWrite', 'close']);
    expect(conn.state).toBe('open');
  });
});

describe('MuxFrontendConn: the end', () => {
  it('the destination ends: HALF_CLOSE behind the queued bytes; the client still sends', () => {
    const { conn, toClient, sent, fromClient, told } = opened();
    toClient(WINDOW + 10);
    sent();
    conn.remoteEnded();
    expect([conn.state, conn.directions.inbound]).toEqual(['open', 'ending']);
    expect(sent()).toEqual([]);
    fromClient(packets.credit(1, WINDOW));
    expect(sent()).toEqual(['DATA:10', 'HALF_CLOSE']);
    expect([conn.state, conn.directions.inbound]).toEqual(['open', 'ended']);
    fromClient(packets.data(1, Buffer.alloc(5)));
    expect(told).toEqual(['write:5']);
    conn.remoteEnded(); // once only
    expect(sent()).toEqual([]);
  });

  it('a clean close: CLOSE_RSP behind the queued bytes, then closed and forgotten', () => {
    const { conn, toClient, sent, fromClient, session } = opened();
    toClient(WINDOW + 10);
    sent();
    conn.closed('');
    expect(conn.state).toBe('closing');
    conn.closed(''); // closed once already
    expect(sent()).toEqual([]);
    fromClient(packets.credit(1, WINDOW));
    expect(sent()).toEqual(['DATA:10', 'CLOSE_RSP']);
    expect(conn.state).toBe('closed');
    expect(session.describe()).toEqual([]);
  });

  it("the client's CLOSE_REQ, then the core's clean close: the queue is dropped, CLOSE_RSP at once (the client wants no more)", () => {
    const { conn, toClient, sent, fromClient, told, session } = opened();
    toClient(WINDOW + 10);
    sent();
    fromClient(packets.closeRequest(1));
    expect(told).toEqual(['close']);
    conn.closed('');
    expect(sent()).toEqual(['CLOSE_RSP']);
    expect(conn.state).toBe('closed');
    expect(session.describe()).toEqual([]);
  });

  it("a clean close waiting for the client's credit, then its CLOSE_REQ: the queue is dropped, CLOSE_RSP, closed", () => {
    const { conn, toClient, sent, fromClient, session } = opened();
    toClient(WINDOW + 10);
    sent();
    conn.closed('');
    expect(conn.state).toBe('closing'); // 10 bytes wait for credit the client will never give
    fromClient(packets.closeRequest(1));
    expect(sent()).toEqual(['CLOSE_RSP']);
    expect(conn.state).toBe('closed');
    expect(session.describe()).toEqual([]);
    fromClient(packets.credit(1, WINDOW)); // late: nothing queued any more
    expect(sent()).toEqual([]);
  });

  it('ending, then a clean close: HALF_CLOSE and CLOSE_RSP, in that order, behind the queued bytes', () => {
    const { conn, toClient, sent, fromClient } = opened();
    toClient(WINDOW + 10);
    sent();
    conn.remoteEnded();
    conn.closed('');
    expect([conn.state, conn.directions.inbound]).toEqual(['closing', 'ending']);
    fromClient(packets.credit(1, WINDOW));
    expect(sent()).toEqual(['DATA:10', 'HALF_CLOSE', 'CLOSE_RSP']);
    expect(conn.state).toBe('closed');
  });

  it('a close with an error (also while half-closed): the queue is dropped, CLOSE_RSP with the error', () => {
    const { conn, toClient, sent, fromClient, acks } = opened();
    toClient(WINDOW + 10);
    conn.remoteEnded();
    sent();
    conn.closed('agent disconnected');
    expect(sent()).toEqual(['CLOSE_RSP:agent disconnected']);
    expect(conn.state).toBe('closed');
    fromClient(packets.credit(1, WINDOW)); // late: nothing queued any more
    expect(sent()).toEqual([]);
    expect(acks).toEqual([]);
  });

  it("the client's connection gone while open: closed, the core told to close; late callbacks change nothing", () => {
    const { conn, session, stream, told, held, sent, fromClient, toClient } = opened({ clientCredit: false });
    fromClient(packets.data(1, Buffer.alloc(100)));
    conn.pause();
    stream.full = true;
    toClient(10);
    stream.emit('close');
    expect(conn.state).toBe('closed');
    expect(told).toEqual(['write:100', 'close']);
    expect(session.sender.readsHeld).toBe(0);
    sent();
    held.shift()!(); // the bytes left for the agent after all: no CREDIT for a closed connection
    conn.closed('');
    conn.remoteEnded();
    conn.pause();
    toClient(10);
    expect(sent()).toEqual([]);
    expect(session.sender.readsHeld).toBe(0);
    expect(conn.state).toBe('closed');
  });
});
