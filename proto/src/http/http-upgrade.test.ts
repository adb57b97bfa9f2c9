import { once } from 'node:events';
import { duplexPair, type Duplex } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { responseHead, splice } from './http-upgrade.js';

/** Two in-memory links: caller ⇄ [a | splice | b] ⇄ callee. */
function rig(): { caller: Duplex; callee: Duplex; a: Duplex; b: Duplex } {
  const [caller, a] = duplexPair({ allowHalfOpen: true });
  const [b, callee] = duplexPair({ allowHalfOpen: true });
  return { caller, callee, a, b };
}

const readAll = (s: Duplex): Promise<string> =>
  new Promise((resolve) => {
    let text = '';
    s.setEncoding('utf8')
      .on('data', (d: string) => (text += d))
      .once('end', () => resolve(text));
  });

describe('splice', () => {
  it('moves bytes both ways, counts them, and half-closes each direction on its own', async () => {
    const { caller, callee, a, b } = rig();
    const session = splice(a, b);
    const atCallee = readAll(callee);
    caller.end('ping');
    expect(await atCallee).toBe('ping');
    expect(session.state()).toBe('half-closed');
    // The other direction still flows after the first one ended.
    const atCaller = readAll(caller);
    callee.end('pong');
    expect(await atCaller).toBe('pong');
    const r = await session.done;
    expect(r).toEqual({ aToB: 4, bToA: 4 });
    expect(session.state()).toBe('closed');
  });

  it('a reader that stops holds the writer back', async () => {
    const { caller, a, b } = rig();
    const session = splice(a, b);
    let written = 0;
    const block = Buffer.alloc(64 * 1024);
    // The callee reads nothing. The caller writes whenever it may: without backpressure that is all
    // 64 MiB; with it, the splice pauses its side of the caller's link and the writes stop there.
    const paused = once(a, 'pause');
    const pumped = new Promise<void>((resolve) => {
      const pump = (): void => {
        while (written < 64 * 1024 * 1024) {
          written += block.length;
          if (!caller.write(block)) {
            caller.once('drain', pump);
            return;
          }
        }
        resolve();
      };
      pump();
    });
    await Promise.race([paused, pumped]);
    expect(a.isPaused()).toBe(true);
    expect(written).toBeLessThan(2 * 1024 * 1024);
    caller.removeAllListeners('drain');
    session.close('test over');
    const r = await session.done;
    expect(r.error).toBe('test over');
  });

  it('one side destroyed: the other is destroyed too, with the reason', async () => {
    const { a, b } = rig();
    const session = splice(a, b);
    a.destroy(new Error('caller reset'));
    const r = await session.done;
    expect(r.error).toBe('caller reset');
    expect(b.destroyed).toBe(true);
  });
});

describe('responseHead', () => {
  it('writes the status line and the raw headers as they came', () => {
    expect(responseHead(101, 'Switching Protocols', ['Upgrade', 'websocket', 'Connection', 'Upgrade']).toString()).toBe(
      'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n',
    );
  });
});
