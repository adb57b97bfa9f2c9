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
    // The 16 workers share one budget of 64 tasks between turns, plus the task each other worker has started
    // (each had its own: 1,024 ran first, ~0.45 s of a 5,000-cluster installer pass, and a restarted hub's TLS
    // handshakes waited that long per round trip).
    expect(doneWhenTurned).toBeLessThanOrEqual(64 + 15);
  });

  it('lets the event loop turn once a slice of time went by, however few tasks ran', async () => {
    let done = 0;
    let doneWhenTurned = -1;
    setImmediate(() => {
      doneWhenTurned = done;
    });
    const busy = (ms: number): void => {
      const end = performance.now() + ms;
      while (performance.now() < end);
    };
    await inFlight(
      Array.from({ length: 40 }, () => async () => {
        busy(1);
        done++;
      }),
    );
    expect(done).toBe(40);
    // 1 ms each: the loop turns after a 10 ms slice, well before the 64-task budget.
    expect(doneWhenTurned).toBeGreaterThan(0);
    expect(doneWhenTurned).toBeLessThan(20);
  });
});
