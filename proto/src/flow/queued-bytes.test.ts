import { describe, expect, it } from 'vitest';
import { queueChunks, takeQueued, type QueuedBytes } from './queued-bytes.js';

describe('takeQueued', () => {
  it('takes whole entries as they are (no copy), in order, with the callbacks of the entries taken whole', () => {
    const a = Buffer.from('aaaa');
    const b = Buffer.from('bbb');
    const order: string[] = [];
    const queue: QueuedBytes[] = [{ chunk: a }, { chunk: b, sent: () => order.push('b') }];
    const taken = takeQueued(queue, 100);
    expect(taken.length).toBe(7);
    expect(taken.chunks[0]).toBe(a);
    expect(taken.chunks[1]).toBe(b);
    expect(queue).toEqual([]);
    for (const s of taken.sent) s();
    expect(order).toEqual(['b']);
  });

  it('splits the entry at the limit: a view is taken, the rest stays first with its callback', () => {
    const a = Buffer.from('aaaa');
    const b = Buffer.from('bbbbbb');
    let sentB = 0;
    const queue: QueuedBytes[] = [
      { chunk: a, sent: () => {} },
      { chunk: b, sent: () => sentB++ },
    ];
    const first = takeQueued(queue, 6);
    expect(Buffer.concat(first.chunks).toString()).toBe('aaaabb');
    expect(first.chunks[1]!.buffer).toBe(b.buffer);
    expect(first.sent).toHaveLength(1); // a's only: b is not gone yet
    expect(queue).toHaveLength(1);
    expect(queue[0]!.chunk.toString()).toBe('bbbb');
    const rest = takeQueued(queue, 6);
    expect(rest.length).toBe(4);
    for (const s of rest.sent) s();
    expect(sentB).toBe(1);
    expect(queue).toEqual([]);
  });

  it('takes nothing from an empty queue', () => {
    expect(takeQueued([], 10)).toEqual({ chunks: [], length: 0, sent: [] });
  });

  it('queueChunks: one payload, its callback on the last chunk only', () => {
    const queue: QueuedBytes[] = [];
    let sent = 0;
    queueChunks(queue, [Buffer.from('a'), Buffer.from('b'), Buffer.from('c')], () => sent++);
    expect(queue.map((e) => [e.chunk.toString(), e.sent !== undefined])).toEqual([
      ['a', false],
      ['b', false],
      ['c', true],
    ]);
    for (const s of takeQueued(queue, 3).sent) s();
    expect(sent).toBe(1);
  });
});
