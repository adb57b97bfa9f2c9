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

/**
 * The delay before a retry by an agent left with no tunnel at all (its hub restarted, or the way to it
 * broke), `retry` counting from 0: a uniform random part of the hub's reconnect spread, so a hub's agents
 * come back spread over it instead of within its first second back. A retry after that (the hub was not back
 * yet) draws again from what is left of the spread (`remainingMs`, counted from the loss), plus the backoff for
 * a hub that stays away: a restarted hub has its fleet back within the spread, not within two of them.
 */
export function spreadRetryDelay(
  retry: number,
  spreadMs: number,
  backoff: Backoff,
  random: () => number = Math.random,
  remainingMs: number = spreadMs,
): number {
  if (retry === 0) return random() * spreadMs;
  return random() * Math.max(0, Math.min(spreadMs, remainingMs)) + backoff.next();
}
