// How a bench entry point (main.ts, ab.ts) runs and ends: one cleanup stack that SIGINT, SIGTERM and
// a watchdog unwind before exiting (a second signal exits at once), the reaper for what it spawns, and
// an exit only once the report has reached stdout (writes to a pipe are asynchronous: exiting right
// after a report longer than the pipe's 64 KiB cut it off).
import { stdioFlushed } from '@cluster-proxy/proto';
import { CleanupStack } from './cleanup.js';
import { startReaper, stopReaper } from './reaper.js';

export interface BenchRun {
  readonly cleanup: CleanupStack;
  /** True once a signal or the watchdog started tearing everything down. */
  stopping(): boolean;
  /** The work is over (or failed): stops the watchdog and unwinds the cleanup stack. */
  finish(): Promise<void>;
}

export function startBenchRun(log: (message: string) => void, watchdogMs: number): BenchRun {
  const cleanup = new CleanupStack(log);
  let stopping = false;
  const abort = (why: string, code: number): void => {
    if (stopping) {
      log(`${why} again: exiting without waiting for cleanup`);
      process.exit(code);
    }
    stopping = true;
    log(`${why}: stopping everything ...`);
    void cleanup.unwind().finally(() => {
      stopReaper();
      process.exit(code);
    });
  };
  process.on('SIGINT', () => abort('SIGINT', 130));
  process.on('SIGTERM', () => abort('SIGTERM', 143));
  const watchdog = setTimeout(() => abort(`watchdog: the run took longer than ${(watchdogMs / 60_000).toFixed(1)} min`, 1), watchdogMs);
  watchdog.unref();
  startReaper();
  return {
    cleanup,
    stopping: () => stopping,
    finish: async () => {
      clearTimeout(watchdog);
      log('stopping processes and servers ...');
      await cleanup.unwind();
      stopReaper();
    },
  };
}

/** Runs an entry point's `main` and exits with its code once stdout and stderr are flushed. */
export function runToExit(main: () => Promise<number>, log: (message: string) => void): void {
  main()
    .then(
      (code) => code,
      (err: unknown) => {
        log(`error: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
        return 1;
      },
    )
    .then(async (code) => {
      await stdioFlushed();
      process.exit(code);
    });
}
