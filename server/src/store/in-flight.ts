// Store writes a bounded number at a time: a pass over a fleet that all changed (a first install, a restart, a
// CA rollover) takes writes/STORE_WRITES_IN_FLIGHT round trips instead of one per object, without opening a
// request per object at once against an API server that sheds load.
import { TurnBudget } from './turns.js';

/** How many writes of one pass are in flight at once. */
export const STORE_WRITES_IN_FLIGHT = 16;

/**
 * Tasks run between two turns of the event loop, at most, by all the workers together (and no longer than
 * TURN_SLICE_MS): tasks that need no round trip (an object already as it should be) settle in microtasks, and a
 * pass over thousands of them held the hub's one thread for seconds (no TLS handshake, no lease renewal meanwhile).
 */
const TASKS_PER_TURN = 64;

/** Runs the tasks, at most `limit` at a time; rejects with the first failure once the running ones settled. */
export async function inFlight(tasks: (() => Promise<void>)[], limit: number = STORE_WRITES_IN_FLIGHT): Promise<void> {
  let next = 0;
  const budget = new TurnBudget(TASKS_PER_TURN);
  let failure: { err: unknown } | null = null;
  const worker = async (): Promise<void> => {
    while (next < tasks.length && !failure) {
      const task = tasks[next++]!;
      await task().catch((err: unknown) => {
        failure ??= { err };
      });
      await budget.spend();
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, tasks.length) }, worker));
  if (failure) throw (failure as { err: unknown }).err;
}
