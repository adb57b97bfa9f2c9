// Dial failure classes. They travel in DialResponse.reason (our extension) and name the client-side
// error reason, matching konnectivity-client's dial_failure_total reasons where ANP has one.
export type DialFailureReason =
  | 'no_agent' // no agent registered for the destination
  | 'endpoint' // the agent could not connect to the destination (refused, unresolvable)
  | 'forbidden' // the destination is outside the agent's allowlist
  | 'timeout' // the dial did not complete within its deadline
  | 'draining' // the only agents for the destination are shutting down
  | 'dialclosed' // the hub or agent abandoned the dial (e.g. the agent disconnected)
  | 'limit' // an admission limit was reached (the hub's or the agent's connection count)
  | 'unknown';

const KNOWN: ReadonlySet<string> = new Set(['no_agent', 'endpoint', 'forbidden', 'timeout', 'draining', 'dialclosed', 'limit', 'unknown']);

/** Reason from our extension field, or a best guess from an ANP peer's free-text error. */
export function classifyDialError(reason: string, error: string): DialFailureReason {
  if (KNOWN.has(reason)) return reason as DialFailureReason;
  const e = error.toLowerCase();
  if (e.includes('no agent available')) return 'no_agent';
  if (e.includes('timeout') || e.includes('timed out')) return 'timeout';
  if (e.includes('refused') || e.includes('no such host') || e.includes('unreachable') || e.includes('dial tcp')) return 'endpoint';
  return 'unknown';
}
