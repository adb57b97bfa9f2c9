// Reconnect delays: exponential with "full jitter" (uniform in [0, capped exponential]), so a fleet
// of agents that lost the hub at the same moment does not come back in lock-step.
export interface BackoffOptions {
  initialMs: number;
  maxMs: number;
  factor?: number;
  random?: () => number;
}

export class Backoff {
  private attempt = 0;
  constructor(private readonly opts: BackoffOptions) {}

  next(): number {
    const factor = this.opts.factor ?? 2;
    const ceiling = Math.min(this.opts.maxMs, this.opts.initialMs * factor ** this.attempt);
    this.attempt++;
    const random = this.opts.random ?? Math.random;
    // Never below a tenth of the initial delay: a zero wait would hammer a hub that refuses us.
    return Math.max(this.opts.initialMs / 10, Math.round(random() * ceiling));
  }

  reset(): void {
    this.attempt = 0;
  }
}
