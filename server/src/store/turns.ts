// Long passes on the hub's one thread (a store write per addon, a list of 5,000 ManifestWorks projected) let the
// event loop turn often enough for TLS handshakes and dials to go on beside them: a handshake takes several
// round trips, each waiting for a turn, so a pass that turned every 0.45 s held a restarted hub's reconnects to a
// few a second.
import { setImmediate as nextTurn } from 'node:timers/promises';

/** The longest a pass holds the thread between two turns (ms). */
export const TURN_SLICE_MS = 10;

/**
 * A budget of work between two turns of the event loop, shared by every worker of one pass: spend(), after each
 * piece of work, returns nothing while the budget lasts, and the next turn (to await) once `maxTasks` pieces ran
 * or `sliceMs` went by since the last one. Every caller that spends meanwhile gets that same turn, so N workers
 * together do no more than the budget between two turns (not N budgets).
 */
export class TurnBudget {
  private tasks = 0;
  private since = performance.now();
  private turn: Promise<void> | null = null;

  constructor(
    private readonly maxTasks: number,
    private readonly sliceMs: number = TURN_SLICE_MS,
  ) {}

  spend(): Promise<void> | undefined {
    if (this.turn) return this.turn;
    if (++this.tasks < this.maxTasks && performance.now() - this.since < this.sliceMs) return undefined;
    this.turn = nextTurn().then(() => {
      this.turn = null;
      this.tasks = 0;
      this.since = performance.now();
    });
    return this.turn;
  }
}
