// A stack of teardown steps: everything the benchmark starts registers how to stop it, and the
// stack is unwound (last in, first out) in main's finally block or on SIGINT/SIGTERM.

export type LogFn = (message: string) => void;

interface Step {
  name: string;
  run: () => Promise<unknown>;
}

export class CleanupStack {
  private readonly steps: Step[] = [];
  private running: Promise<void> | undefined;

  constructor(
    private readonly log: LogFn,
    private readonly stepTimeoutMs = 15_000,
  ) {}

  /** Registers a teardown step. */
  add(name: string, run: () => Promise<unknown>): void {
    if (this.running) {
      // Teardown already started (SIGINT while starting something): stop this at once too.
      void run().catch(() => {});
      return;
    }
    this.steps.push({ name, run });
  }

  /** Runs every step once, newest first; a failing or hanging step does not stop the others. */
  unwind(): Promise<void> {
    this.running ??= (async () => {
      for (let step = this.steps.pop(); step !== undefined; step = this.steps.pop()) {
        let timer: NodeJS.Timeout | undefined;
        const timeout = new Promise<'timeout'>((resolve) => {
          timer = setTimeout(() => resolve('timeout'), this.stepTimeoutMs);
        });
        try {
          const outcome = await Promise.race([step.run().then(() => 'ok' as const), timeout]);
          if (outcome === 'timeout') this.log(`cleanup: "${step.name}" did not finish within ${this.stepTimeoutMs} ms; moving on`);
        } catch (err) {
          this.log(`cleanup: "${step.name}" failed: ${err instanceof Error ? err.message : String(err)}`);
        } finally {
          clearTimeout(timer);
        }
      }
    })();
    return this.running;
  }
}
