// Per-connection child loggers, made on first use. A pino child() costs ~15 µs, and a hub or agent
// makes several per dial (dial ID, then connect ID), while most connections never log a line.

/** What we need of a logger: pino's `child(bindings)`. */
export interface ChildFactory<L> {
  child(bindings: Record<string, unknown>): L;
}

export class LazyLog<L extends ChildFactory<L>> {
  private made: L | null = null;

  constructor(
    private readonly parent: L,
    private bindings: Record<string, unknown>,
  ) {}

  /** The child logger with every binding so far. */
  get log(): L {
    return (this.made ??= this.parent.child(this.bindings));
  }

  /** Adds bindings (e.g. the connect ID once known) for lines logged from now on. */
  bind(more: Record<string, unknown>): void {
    this.bindings = { ...this.bindings, ...more };
    this.made = null;
  }
}
