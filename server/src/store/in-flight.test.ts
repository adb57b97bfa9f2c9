// Store writes a bounded number at a time, and a long pass of tasks that need no round trip still lets the
// event loop turn.
import { describe, expect, it } from 'vitest';
import { inFlight } from './in-flight.js';

describe('inFlight', () => {
  it('runs at most `limit` tasks at once, every task once, and rejects with the first failure', async () => {
    let running = 0;
    let most = 0;
    const ran: number[] = [];
    const tasks = Array.from({ length: 50 }, (_, i) => async () => {
      running++;
      most = Math.max(most, running);
      await new Promise((r) => setTimeout(r, 1));
      ran.push(i);
      running--;
    });
    await inFlight(tasks, 4);
    expect(most).toBe(4);
    expect(ran.sort((a, b) => a - b)).toEqual(Array.from({ length: 50 }, (_, i) => i));
    await expect(inFlight([async () => Promise.reject(new Error('first')), async () => undefined], 2)).rejects.toThrow('first');
  });

  it('lets the event loop turn during thousands of tasks that settle at once', async () => {
    let done = 0;
    let doneWhenTurned = -1;
    setImmediate(() => {
      doneWhenTurned = done;
    });
    await inFlight(
      Array.from({ length: 5000 }, () => async () => {
        done++;
      }),
    );
    expect(done).toBe(5000);
    expect(doneWhenTurned).toBeGreaterThanOrEqual(0);
    expect(doneWhenTurned).toBeLessThan(5000);
  });
});
