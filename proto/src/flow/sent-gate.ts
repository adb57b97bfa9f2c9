// Tells when the bytes a socket has taken have also left its kernel.
//
// A socket's write callback runs once the kernel has taken the bytes, not once it has sent them. A
// destination that stops reading leaves them unsent, and TCP_NOTSENT_LOWAT does not stop the kernel
// from taking more: it checks the limit only before it starts a new packet buffer, and a write goes on
// filling the last one, up to 64 KiB on loopback. If the credit for those bytes went back to the
// sender at the callback, a stuck destination held its window twice: once unsent in our kernel and
// once more in our process, where the next window waits for a write the kernel refuses (80 KiB per
// stuck destination at the agent, 1,024 of them 80 MiB).
//
// So a connection not yet proven to keep up returns the credit for bytes only once its kernel has sent
// them all (ReceiveWindow's `gate`): then a stuck destination holds at most one window in all, in the
// kernel. Whether the kernel has sent everything is asked (SIOCOUTQNSD) right after each write, which
// a destination that reads passes at once, and otherwise by one timer for all waiting sockets, at
// first every few milliseconds and less often while nothing moves. A connection proven to keep up
// (onBulk) stops asking: a bulk transfer pays no system call for it.
import type { Duplex } from 'node:stream';
import { unsentBytesOf } from '../runtime/socket-options.js';
import type { KernelSentGate } from './flow-control.js';

/** The first wait after a socket was found with bytes unsent, and again each time some were sent. */
const FIRST_CHECK_MS = 2;
/** The longest wait between two checks of one socket whose unsent bytes have not moved. */
const LONGEST_CHECK_MS = 200;

type GateState = 'open' | 'waiting' | 'disposed';

/** All gates waiting, checked by one timer; it runs only while one waits. */
const waiting = new Set<SentGate>();
let timer: NodeJS.Timeout | null = null;
let timerDue = 0;

function schedule(due: number): void {
  if (timer && timerDue <= due) return;
  if (timer) clearTimeout(timer);
  timerDue = due;
  timer = setTimeout(checkDue, Math.max(1, due - Date.now()));
  timer.unref();
}

function checkDue(): void {
  timer = null;
  const now = Date.now();
  let next = Number.POSITIVE_INFINITY;
  for (const gate of waiting) {
    if (gate.dueAt <= now) gate.check(now);
    if (gate.state === 'waiting' && gate.dueAt < next) next = gate.dueAt;
  }
  if (next !== Number.POSITIVE_INFINITY) schedule(next);
}

/** One socket's gate: whether its kernel still holds bytes it has not sent. */
export class SentGate implements KernelSentGate {
  private stateNow: GateState = 'open';
  private then: (() => void) | null = null;
  private lastUnsent = 0;
  private delay = FIRST_CHECK_MS;
  /** When the timer checks this socket next (while waiting). */
  dueAt = 0;

  /** A gate for `socket`, or null where its unsent bytes cannot be read (no system calls installed). */
  static of(socket: Duplex): SentGate | null {
    return unsentBytesOf(socket) === null ? null : new SentGate(socket);
  }

  private constructor(private readonly socket: Duplex) {}

  get state(): GateState {
    return this.stateNow;
  }

  /**
   * True if the kernel has sent everything written so far. Otherwise false, and `then` runs once it has
   * (or once the socket is gone), unless the gate is disposed first. One waiter at a time: while one
   * waits, this returns false and keeps the first `then`.
   */
  passes(then: () => void): boolean {
    if (this.stateNow !== 'open') return false;
    const unsent = unsentBytesOf(this.socket);
    if (unsent === null || unsent === 0) return true;
    this.then = then;
    this.lastUnsent = unsent;
    this.delay = FIRST_CHECK_MS;
    this.dueAt = Date.now() + this.delay;
    this.setState('waiting');
    return false;
  }

  /** Asks the kernel again (the timer, for a waiting gate that is due). */
  check(now: number): void {
    if (this.stateNow !== 'waiting') return;
    const unsent = unsentBytesOf(this.socket);
    if (unsent === null || unsent === 0) {
      const then = this.then;
      this.setState('open');
      then?.();
      return;
    }
    // Some were sent: the reader is reading, ask again soon. Else less and less often; at the longest
    // wait every stuck socket's check falls on the same tick, so a thousand of them wake the timer once.
    this.delay = unsent < this.lastUnsent ? FIRST_CHECK_MS : Math.min(this.delay * 2, LONGEST_CHECK_MS);
    this.lastUnsent = unsent;
    this.dueAt = this.delay === LONGEST_CHECK_MS ? Math.ceil((now + 1) / LONGEST_CHECK_MS) * LONGEST_CHECK_MS : now + this.delay;
  }

  /** No more waiting: a waiter that has not run never will. */
  dispose(): void {
    this.setState('disposed');
  }

  private setState(next: GateState): void {
    this.stateNow = next;
    if (next === 'waiting') {
      waiting.add(this);
      schedule(this.dueAt);
      return;
    }
    this.then = null;
    waiting.delete(this);
    if (waiting.size === 0 && timer) {
      clearTimeout(timer);
      timer = null;
    }
  }
}

/** How many gates wait now (for tests: none once their connections are gone). */
export function sentGatesWaiting(): number {
  return waiting.size;
}
