// Typed dial and connection errors. `reason` matches konnectivity-client's dial_failure_total reasons
// where ANP has one; the message always names the destination.
import type { DialFailureReason } from '@cluster-proxy/proto';

export type TunnelErrorReason = DialFailureReason | 'context' | 'tunnelclosed' | 'closed' | 'protocol';

export class TunnelError extends Error {
  override name = 'TunnelError';
  readonly code: string;
  constructor(readonly reason: TunnelErrorReason, readonly destination: string, message: string) {
    super(message.includes(destination) ? message : `${destination}: ${message}`);
    this.code = `ERR_TUNNEL_${reason.toUpperCase()}`;
  }
}
