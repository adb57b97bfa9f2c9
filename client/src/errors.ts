// Typed dial and connection errors. `reason` matches konnectivity-client's dial_failure_total reasons
// where ANP has one; the message always names the destination.
import type { DialFailureReason } from '@cluster-proxy/proto';

/**
 * Why a dial or connection failed: `no_agent` (no agent serves the destination), `endpoint` (the agent
 * could not connect to it), `forbidden` (outside the agent's allowlist), `timeout`, `draining` (its agents
 * are shutting down), `dialclosed` (the hub or agent gave up the dial), `limit` (a connection limit of the hub or the
 * agent was reached; try later), `unknown`; and on our side
 * `context` (your AbortSignal), `tunnelclosed` (the tunnel to the hub failed or was closed), `closed`
 * (the connection was closed while in use) and `protocol` (the hub broke the protocol).
 */
export type TunnelErrorReason = DialFailureReason | 'context' | 'tunnelclosed' | 'closed' | 'protocol';

/** Every error of a dial or tunneled connection; the message names the destination. */
export class TunnelError extends Error {
  /** Always `TunnelError`. */
  override name = 'TunnelError';
  /** `ERR_TUNNEL_` and the reason in upper case, in the style of Node's error codes. */
  readonly code: string;
  /**
   * A failure of the dial or connection to `destination`.
   * @param reason Why it failed.
   * @param destination The `host:port` that was dialed.
   * @param message What happened; prefixed with the destination unless it names it.
   */
  constructor(
    readonly reason: TunnelErrorReason,
    readonly destination: string,
    message: string,
  ) {
    super(message.includes(destination) ? message : `${destination}: ${message}`);
    this.code = `ERR_TUNNEL_${reason.toUpperCase()}`;
  }
}
