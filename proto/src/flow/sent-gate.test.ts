// SentGate against a stand-in for the kernel's unsent count (the real call is tested in the CLI's
// native-calls.test.ts and, through the agent, in endpoint-connection.test.ts).
import { PassThrough } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { useNativeCalls } from '../runtime/socket-options.js';
import { SentGate, sentGatesWaiting } from './sent-gate.js';

/** A socket with a file descriptor, and what its kernel has unsent (null: the socket is gone). */
function fakeSocket(): { socket: PassThrough; unsent: { bytes: number | null }; asked: () => number } {
  const socket = new PassThrough();
  (socket as unknown as { _handle: { fd: number } })._handle = { fd: 7 };
  const unsent = { bytes: 0 as number | null };
  let asked = 0;
  useNativeCalls({
    setUnsentLimit: () => true,
    unsentLimit: () => null,
    unsentBytes: () => {
      asked++;
      return unsent.bytes;
    },
    trim: null,
  });
  return { socket, unsent, asked: () => asked };
}

describe('SentGate', () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => {
    vi.useRealTimers();
    useNativeCalls(null);
  });

  it('is null where the unsent bytes cannot be read', () => {
    useNativeCalls(null);
    expect(SentGate.of(new PassThrough())).toBeNull();
  });

  it('passes at once when the kernel has sent everything; otherwise calls back once it has', () => {
    const { socket, unsent } = fakeSocket();
    const gate = SentGate.of(socket)!;
    const then = vi.fn();
    expect(gate.passes(then)).toBe(true);
    unsent.bytes = 40_000;
    expect(gate.passes(then)).toBe(false);
    expect(gate.passes(() => then('second'))).toBe(false); // one waiter: the first
    vi.advanceTimersByTime(500);
    expect(then).not.toHaveBeenCalled();
    unsent.bytes = 0;
    vi.advanceTimersByTime(250);
    expect(then).toHaveBeenCalledTimes(1);
    expect(then).toHaveBeenCalledWith();
    expect(sentGatesWaiting()).toBe(0);
    expect(gate.passes(then)).toBe(true);
  });

  it('calls back once the socket is gone (nothing more will be sent)', () => {
    const { socket, unsent } = fakeSocket();
    const gate = SentGate.of(socket)!;
    const then = vi.fn();
    unsent.bytes = 10;
    expect(gate.passes(then)).toBe(false);
    unsent.bytes = null;
    vi.advanceTimersByTime(10);
    expect(then).toHaveBeenCalledTimes(1);
  });

  it('asks less and less often while nothing moves, and soon again once some bytes were sent', () => {
    const { socket, unsent, asked } = fakeSocket();
    const gate = SentGate.of(socket)!;
    unsent.bytes = 50_000;
    gate.passes(() => {});
    const before = asked();
    vi.advanceTimersByTime(10_000);
    const stuck = asked() - before;
    // 2, 4, … 128 ms, then every 200 ms: about 56 in 10 s, where a fixed 2 ms tick would ask 5,000 times.
    expect(stuck).toBeGreaterThan(40);
    expect(stuck).toBeLessThan(70);
    unsent.bytes = 49_000; // the reader took some
    const beforeMove = asked();
    vi.advanceTimersByTime(400);
    // The next 200 ms tick sees it; then 2, 4, 8 … ms again: at least 6 more within 200 ms, not 1.
    expect(asked() - beforeMove).toBeGreaterThanOrEqual(7);
    gate.dispose();
  });

  it('a disposed gate never calls back, and its timer stops', () => {
    const { socket, unsent } = fakeSocket();
    const gate = SentGate.of(socket)!;
    const then = vi.fn();
    unsent.bytes = 10;
    gate.passes(then);
    expect(sentGatesWaiting()).toBe(1);
    expect(vi.getTimerCount()).toBe(1);
    gate.dispose();
    expect(sentGatesWaiting()).toBe(0);
    expect(vi.getTimerCount()).toBe(0);
    unsent.bytes = 0;
    vi.advanceTimersByTime(1000);
    expect(then).not.toHaveBeenCalled();
    expect(gate.passes(then)).toBe(false);
  });

  it('checks a thousand stuck sockets on shared ticks', () => {
    const { socket, unsent } = fakeSocket();
    unsent.bytes = 1;
    const gates = Array.from({ length: 1000 }, () => SentGate.of(socket)!);
    for (const [i, g] of gates.entries()) {
      vi.advanceTimersByTime(i % 7); // started at different times
      g.passes(() => {});
    }
    vi.advanceTimersByTime(2000); // all at the longest wait by now
    let ticks = 0;
    const spy = vi.spyOn(globalThis, 'setTimeout');
    vi.advanceTimersByTime(2000);
    ticks = spy.mock.calls.length;
    spy.mockRestore();
    expect(ticks).toBeLessThanOrEqual(11); // one tick per 200 ms, not one per socket
    for (const g of gates) g.dispose();
    expect(vi.getTimerCount()).toBe(0);
  });
});
