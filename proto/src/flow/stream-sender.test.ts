import { Duplex } from 'node:stream';
import { setImmediate as immediate } from 'node:timers/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { packets, type Packet } from '../wire/packet.js';
import { StreamSender } from './stream-sender.js';

/**
 * An object-mode Duplex with room for one packet: the test decides when the "network" takes a
 * packet (flush), and can push packets to be read.
 */
class ControlledStream extends Duplex {
  private readonly pending: Array<{ packet: Packet; cb: () => void }> = [];
  readonly sent: Packet[] = [];

  constructor() {
    super({ objectMode: true, highWaterMark: 1 });
  }

  override _write(packet: Packet, _enc: BufferEncoding, cb: () => void): void {
    this.pending.push({ packet, cb });
  }

  override _read(): void {}

  /** Lets the network take one packet. */
  async flushOne(): Promise<void> {
    const next = this.pending.shift();
    if (!next) throw new Error('nothing to flush');
    this.sent.push(next.packet);
    next.cb();
    await immediate();
  }

  /** Lets the network take every queued packet; resolves after 'drain' had its chance to fire. */
  async flush(): Promise<void> {
    for (;;) {
      const next = this.pending.shift();
      if (next) {
        this.sent.push(next.packet);
        next.cb();
        continue;
      }
      await immediate();
      if (this.pending.length === 0) return;
    }
  }
}

const streams: ControlledStream[] = [];
function newStream(): ControlledStream {
  const s = new ControlledStream();
  streams.push(s);
  return s;
}

afterEach(() => {
  for (const s of streams.splice(0)) s.destroy();
});

describe('StreamSender', () => {
  it('becomes congested when write() returns false and clears on drain', async () => {
    const stream = newStream();
    const sender = new StreamSender(stream);
    expect(sender.congested).toBe(false);
    sender.send(packets.credit(1, 10)); // highWaterMark 1: the buffer is full after one packet
    expect(sender.congested).toBe(true);
    sender.send(packets.credit(2, 10));
    expect(stream.listenerCount('drain')).toBe(1); // one listener however many sends
    await stream.flush();
    expect(sender.congested).toBe(false);
    expect(stream.sent.map((p) => (p.type === 100 ? p.credit.connectID : -1))).toEqual([1, 2]);
    expect(stream.listenerCount('drain')).toBe(0);
  });

  it('runs whenWritable waiters at once when not congested, and after drain otherwise', async () => {
    const stream = newStream();
    const sender = new StreamSender(stream);
    const calls: string[] = [];
    sender.whenWritable(() => calls.push('now'));
    expect(calls).toEqual(['now']);
    sender.send(packets.drain());
    sender.whenWritable(() => calls.push('a'));
    sender.whenWritable(() => calls.push('b'));
    await immediate();
    expect(calls).toEqual(['now']); // still congested: nobody runs
    await stream.flush();
    expect(calls).toEqual(['now', 'a', 'b']);
  });

  it('runs each waiter once, and not at all once cancelled', async () => {
    const stream = newStream();
    const sender = new StreamSender(stream);
    let a = 0;
    let b = 0;
    const wa = (): void => {
      a++;
    };
    const wb = (): void => {
      b++;
    };
    sender.send(packets.drain());
    sender.whenWritable(wa);
    sender.whenWritable(wb);
    sender.cancelWaiter(wb);
    await stream.flush();
    expect([a, b]).toEqual([1, 0]);
    sender.send(packets.drain());
    await stream.flush();
    expect([a, b]).toEqual([1, 0]);
  });

  it('leaves the remaining waiters for the next drain when a waiter fills the buffer again', async () => {
    const stream = newStream();
    const sender = new StreamSender(stream);
    const calls: string[] = [];
    sender.send(packets.drain());
    sender.whenWritable(() => {
      calls.push('first');
      sender.send(packets.drain());
    });
    sender.whenWritable(() => calls.push('second'));
    sender.whenWritable(() => calls.push('third'));
    await stream.flushOne(); // the first packet leaves: 'drain'; 'first' refills the buffer
    expect(calls).toEqual(['first']);
    expect(sender.congested).toBe(true);
    await stream.flushOne();
    expect(calls).toEqual(['first', 'second', 'third']);
    expect(sender.congested).toBe(false);
    expect(stream.sent).toHaveLength(2);
  });

  it('takes turns: a waiter that fills the buffer at every drain and asks again does not starve the others', async () => {
    const stream = newStream();
    const sender = new StreamSender(stream);
    const turns: string[] = [];
    // 'greedy' always has more to send: it fills the buffer and waits again, every time.
    const greedy = (): void => {
      turns.push('greedy');
      sender.send(packets.drain());
      sender.whenWritable(greedy);
    };
    const patient = (): void => {
      turns.push('patient');
      sender.send(packets.drain());
    };
    sender.send(packets.drain());
    sender.whenWritable(greedy);
    sender.whenWritable(patient);
    for (let i = 0; i < 3; i++) await stream.flushOne();
    expect(turns).toEqual(['greedy', 'patient', 'greedy']);
    sender.close();
  });

  it('pauses reading while anyone holds reads, resumes when the last hold is released', () => {
    const stream = newStream();
    const sender = new StreamSender(stream);
    stream.resume();
    expect(stream.isPaused()).toBe(false);
    sender.holdReads('a');
    expect(stream.isPaused()).toBe(true);
    sender.holdReads('b');
    sender.holdReads('a'); // holding twice is one hold
    expect(sender.readsHeld).toBe(2);
    sender.releaseReads('a');
    expect(stream.isPaused()).toBe(true);
    sender.releaseReads('zzz'); // unknown key: no effect
    expect(stream.isPaused()).toBe(true);
    expect(sender.readsHeld).toBe(1);
    sender.releaseReads('b');
    expect(stream.isPaused()).toBe(false);
    expect(sender.readsHeld).toBe(0);
  });

  it('does not resume a stream it never paused', () => {
    const stream = newStream();
    const sender = new StreamSender(stream);
    stream.pause(); // paused by its owner, not by the sender
    sender.releaseReads('nobody');
    expect(stream.isPaused()).toBe(true);
  });

  it('close() stops everything: no writes, no waiters, no drain listener, no pausing', async () => {
    const stream = newStream();
    const sender = new StreamSender(stream);
    stream.resume();
    let ran = 0;
    sender.send(packets.drain());
    sender.whenWritable(() => {
      ran++;
    });
    sender.holdReads('x');
    sender.close();
    expect(sender.congested).toBe(false);
    expect(sender.readsHeld).toBe(0);
    expect(stream.listenerCount('drain')).toBe(0);
    sender.send(packets.drain());
    await stream.flush();
    expect(stream.sent).toHaveLength(1); // only the packet sent before close()
    expect(ran).toBe(0);
    stream.resume();
    sender.holdReads('y');
    expect(stream.isPaused()).toBe(false);
  });

  it('sendData: a stream that writes chunks gets them as they are; another gets one DATA packet', async () => {
    const withChunks: { id: number; chunks: readonly Buffer[]; length: number }[] = [];
    const stream = newStream();
    const chunked = Object.assign(stream, {
      writeData: (id: number, chunks: readonly Buffer[], length: number) => (withChunks.push({ id, chunks, length }), true),
    });
    const a = Buffer.from('ab');
    new StreamSender(chunked).sendData(3, [a, Buffer.from('cd')], 4);
    expect(withChunks).toHaveLength(1);
    expect(withChunks[0]!.chunks[0]).toBe(a);

    const plain = newStream();
    const sender = new StreamSender(plain);
    sender.sendData(5, [Buffer.from('ab'), Buffer.from('cd')], 4);
    sender.sendData(6, [a], 2);
    await plain.flush();
    expect(plain.sent).toEqual([packets.data(5, Buffer.from('abcd')), packets.data(6, a)]);
    expect((plain.sent[1] as { data: { data: Buffer } }).data.data).toBe(a); // one chunk: not copied
  });
});
