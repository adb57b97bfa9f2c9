// Property tests of per-connection flow control as the mux owns it (proto's SendCredit, ReceiveWindow,
// StreamSender and queued bytes): several connections share one ordered stream each way; random
// interleavings of writes, ends, resets, deliveries of DATA and CREDIT, the stream filling and draining, the
// destination flushing, and process death. Invariants: no byte lost, duplicated or reordered; an end
// reaches the other side exactly once; the sender never overruns its credit; the budget and the waiter
// tables are empty at the end.
import { EventEmitter } from 'node:events';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  MemoryBudget,
  ReceiveWindow,
  SendCredit,
  StreamSender,
  queueChunks,
  takeQueued,
  type Packet,
  type PacketStream,
  type QueuedBytes,
} from '@cluster-proxy/proto';

type Wire =
  | { kind: 'data'; conn: number; data: Buffer }
  | { kind: 'end'; conn: number }
  | { kind: 'reset'; conn: number }
  | { kind: 'credit'; conn: number; bytes: number };

/** One direction of the shared stream: ordered, with a writable buffer that fills and drains. */
class FakeStream extends EventEmitter implements PacketStream {
  readonly wire: { w: Wire; n: number }[] = [];
  queued = 0;
  constructor(private readonly highWater: number) {
    super();
  }
  private push(w: Wire, n: number): boolean {
    this.wire.push({ w, n });
    this.queued += n;
    return this.queued < this.highWater;
  }
  write(p: Packet): boolean {
    if (p.type === 101) return this.push({ kind: 'end', conn: p.halfClose.connectID }, 8);
    if (p.type === 2) return this.push({ kind: 'reset', conn: p.closeRequest.connectID }, 8);
    if (p.type === 100) return this.push({ kind: 'credit', conn: p.credit.connectID, bytes: p.credit.bytes }, 8);
    if (p.type === 4) return this.push({ kind: 'data', conn: p.data.connectID, data: Buffer.from(p.data.data) }, p.data.data.length + 8);
    throw new Error(`unexpected packet ${p.type}`);
  }
  writeData(connectID: number, chunks: readonly Buffer[], length: number): boolean {
    return this.push({ kind: 'data', conn: connectID, data: Buffer.concat(chunks, length) }, length + 8);
  }
  get writableLength(): number {
    return this.queued;
  }
  /** Hands the next packet to the other side; 'drain' once the buffer is below half its high water. */
  take(): Wire | undefined {
    const next = this.wire.shift();
    if (!next) return undefined;
    this.queued -= next.n;
    if (this.queued < this.highWater / 2 && this.listenerCount('drain') > 0) this.emit('drain');
    return next.w;
  }
  pause(): void {}
  resume(): void {}
}

const MAX_CHUNK = 700;

interface Sender {
  credit: SendCredit;
  queue: QueuedBytes[];
  written: Buffer[];
  ended: boolean;
  endSent: boolean;
  reset: boolean;
  waiting: boolean;
}

interface Receiver {
  window: ReceiveWindow | null;
  got: Buffer[];
  ends: number;
  /** Sink callbacks not yet run: the destination has not taken those bytes yet. */
  unflushed: (() => void)[];
  overrun: number;
}

type Action =
  | { op: 'write'; conn: number; size: number }
  | { op: 'end'; conn: number }
  | { op: 'reset'; conn: number }
  | { op: 'deliver'; count: number }
  | { op: 'credit'; count: number }
  | { op: 'flush'; conn: number; count: number };

const action = (conns: number): fc.Arbitrary<Action> =>
  fc.oneof(
    {
      arbitrary: fc.record({ op: fc.constant('write' as const), conn: fc.nat(conns - 1), size: fc.integer({ min: 1, max: 3000 }) }),
      weight: 5,
    },
    { arbitrary: fc.record({ op: fc.constant('end' as const), conn: fc.nat(conns - 1) }), weight: 1 },
    { arbitrary: fc.record({ op: fc.constant('reset' as const), conn: fc.nat(conns - 1) }), weight: 1 },
    { arbitrary: fc.record({ op: fc.constant('deliver' as const), count: fc.integer({ min: 1, max: 6 }) }), weight: 4 },
    { arbitrary: fc.record({ op: fc.constant('credit' as const), count: fc.integer({ min: 1, max: 6 }) }), weight: 3 },
    {
      arbitrary: fc.record({ op: fc.constant('flush' as const), conn: fc.nat(conns - 1), count: fc.integer({ min: 1, max: 4 }) }),
      weight: 4,
    },
  );

function run(conns: number, initial: number, highWater: number, actions: readonly Action[], death: boolean): void {
  const budget = new MemoryBudget(1 << 20, { maxWindow: 64 * 1024 });
  const forward = new FakeStream(highWater);
  const back = new FakeStream(Number.POSITIVE_INFINITY);
  const streamSender = new StreamSender(forward);
  let pattern = 0;
  const senders: Sender[] = [];
  const receivers: Receiver[] = [];
  for (let i = 0; i < conns; i++) {
    senders.push({ credit: new SendCredit(initial), queue: [], written: [], ended: false, endSent: false, reset: false, waiting: false });
    const r: Receiver = { window: null, got: [], ends: 0, unflushed: [], overrun: 0 };
    r.window = new ReceiveWindow({
      sink: {
        write: (chunk, cb) => {
          r.got.push(Buffer.from(chunk));
          r.unflushed.push(() => cb());
          return true;
        },
      },
      initial,
      budget,
      direction: 'to_endpoint',
      report: (bytes) => back.write({ type: 100, credit: { connectID: i + 1, bytes } }),
    });
    receivers.push(r);
  }

  const pump = (i: number): void => {
    const s = senders[i]!;
    if (s.reset) return;
    while (s.queue.length > 0 && s.credit.canSend()) {
      if (streamSender.congested) {
        if (!s.waiting) {
          s.waiting = true;
          streamSender.whenWritable(() => {
            s.waiting = false;
            pump(i);
          });
        }
        return;
      }
      const queued = s.queue.reduce((n, q) => n + q.chunk.length, 0);
      const taken = takeQueued(s.queue, s.credit.allowance(Math.min(MAX_CHUNK, queued)));
      s.credit.consume(taken.length);
      streamSender.sendData(i + 1, taken.chunks, taken.length);
      for (const sent of taken.sent) sent();
    }
    if (s.ended && !s.endSent && s.queue.length === 0 && !streamSender.congested) {
      s.endSent = true;
      streamSender.send({ type: 101, halfClose: { connectID: i + 1 } });
    } else if (s.ended && !s.endSent && s.queue.length === 0 && !s.waiting) {
      s.waiting = true;
      streamSender.whenWritable(() => {
        s.waiting = false;
        pump(i);
      });
    }
  };

  const deliver = (w: Wire): void => {
    const r = receivers[w.conn - 1]!;
    if (w.kind === 'reset') {
      r.window?.dispose();
      r.window = null;
      return;
    }
    if (!r.window) return; // after a reset: the connection is gone on this side
    if (w.kind === 'data') {
      r.window.write(w.data);
      r.overrun = Math.max(r.overrun, r.window.overrun);
    } else if (w.kind === 'end') r.ends++;
  };

  const grant = (w: Wire): void => {
    if (w.kind !== 'credit') return;
    const s = senders[w.conn - 1]!;
    if (s.credit.grant(w.bytes)) pump(w.conn - 1);
  };

  const flush = (i: number, count: number): void => {
    const r = receivers[i]!;
    for (let k = 0; k < count && r.unflushed.length > 0; k++) r.unflushed.shift()!();
  };

  for (const a of actions) {
    const s = a.op === 'write' || a.op === 'end' || a.op === 'reset' ? senders[a.conn]! : null;
    switch (a.op) {
      case 'write': {
        if (s!.ended || s!.reset) break;
        const data = Buffer.alloc(a.size);
        for (let k = 0; k < a.size; k++) data[k] = (pattern++ * 31 + a.conn) & 0xff;
        s!.written.push(data);
        queueChunks(s!.queue, [data]);
        pump(a.conn);
        break;
      }
      case 'end':
        if (s!.ended || s!.reset) break;
        s!.ended = true;
        pump(a.conn);
        break;
      case 'reset':
        if (s!.reset || s!.endSent) break;
        s!.reset = true;
        s!.queue.length = 0;
        streamSender.send({ type: 2, closeRequest: { connectID: a.conn + 1 } });
        break;
      case 'deliver':
        for (let k = 0; k < a.count; k++) {
          const w = forward.take();
          if (!w) break;
          deliver(w);
        }
        break;
      case 'credit':
        for (let k = 0; k < a.count; k++) {
          const w = back.take();
          if (!w) break;
          grant(w);
        }
        break;
      case 'flush':
        flush(a.conn, a.count);
        break;
    }
  }

  if (!death) {
    // Everything settles: the stream delivers, destinations read, credit returns, until nothing moves.
    for (let round = 0; round < 10_000; round++) {
      let moved = false;
      for (let w = forward.take(); w; w = forward.take()) {
        deliver(w);
        moved = true;
      }
      for (let i = 0; i < conns; i++)
        if (receivers[i]!.unflushed.length > 0) {
          flush(i, Number.POSITIVE_INFINITY);
          moved = true;
        }
      for (let w = back.take(); w; w = back.take()) {
        grant(w);
        moved = true;
      }
      if (!moved) break;
    }
    for (let i = 0; i < conns; i++) {
      const s = senders[i]!;
      const r = receivers[i]!;
      const sent = Buffer.concat(s.written);
      const got = Buffer.concat(r.got);
      expect(r.overrun, `connection ${i + 1} overran its credit`).toBe(0);
      if (s.reset) {
        // What arrived before the reset is a prefix of what was written; no end after a reset.
        expect(sent.subarray(0, got.length).equals(got), `connection ${i + 1}: bytes before its reset differ`).toBe(true);
        expect(r.ends).toBe(0);
      } else {
        expect(got.length, `connection ${i + 1}: ${got.length} of ${sent.length} bytes arrived`).toBe(sent.length);
        expect(got.equals(sent), `connection ${i + 1}: bytes lost, duplicated or reordered`).toBe(true);
        expect(r.ends, `connection ${i + 1}: its end arrived ${r.ends} times`).toBe(s.ended ? 1 : 0);
        expect(s.queue.length).toBe(0);
      }
    }
    expect(streamSender.congested).toBe(false);
    expect(streamSender['waiters'].size).toBe(0);
  }
  // Both processes' connections close (or one died): the tables empty, the budget is whole again.
  streamSender.close();
  for (const r of receivers) r.window?.dispose();
  for (const r of receivers) for (const cb of r.unflushed) cb(); // late callbacks change nothing
  expect(budget.committed).toBe(0);
  expect(budget.usageByDirection().every((u) => u.committed === 0 && u.buffered === 0)).toBe(true);
  expect(streamSender['waiters'].size).toBe(0);
  expect(streamSender.readsHeld).toBe(0);
}

describe('flow control: random interleavings (fast-check)', () => {
  it('no byte lost, duplicated or reordered; one end each; credit respected; tables empty', () => {
    fc.assert(
      fc.property(
        fc
          .integer({ min: 1, max: 3 })
          .chain((conns) =>
            fc.tuple(
              fc.constant(conns),
              fc.integer({ min: 64, max: 4096 }),
              fc.integer({ min: 200, max: 20_000 }),
              fc.array(action(conns), { maxLength: 120 }),
              fc.boolean(),
            ),
          ),
        ([conns, initial, highWater, actions, death]) => run(conns, initial, highWater, actions, death),
      ),
      { seed: 20261129, numRuns: 300 },
    );
  });
});
