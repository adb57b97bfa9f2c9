// Half-close of one tunneled connection, per direction, as one of its ends sees it. A direction is open
// until its sender ends it (the FIN behind its last byte: HALF_CLOSE on the wire); the other direction
// may go on for as long as it likes. Every end (the agent's, the hub's frontends, the SDK's socket) keeps
// its lifecycle in its own state (dialing, open, closing, closed) and which directions ended in this.
//   inbound   what this end receives through the tunnel: ended by the peer's HALF_CLOSE
//   outbound  what this end sends into the tunnel: ended when this end sends HALF_CLOSE (its own side's EOF)
//
//   both open ──endInbound()──▶ inbound ended ──endOutbound()──▶ both ended
//   both open ──endOutbound()──▶ outbound ended ──endInbound()──▶ both ended
// A direction ends once: ending it again changes nothing (and says so).

/** One direction of a connection: bytes may still come, or its sender ended it. */
export type DirectionState = 'open' | 'ended';

export class HalfCloseDirections {
  private inboundNow: DirectionState = 'open';
  private outboundNow: DirectionState = 'open';

  get inbound(): DirectionState {
    return this.inboundNow;
  }

  get outbound(): DirectionState {
    return this.outboundNow;
  }

  /** The peer ended its direction: true if this is news (false: ended already). */
  endInbound(): boolean {
    if (this.inboundNow === 'ended') return false;
    this.inboundNow = 'ended';
    return true;
  }

  /** This end ended its direction: true if this is news (false: ended already). */
  endOutbound(): boolean {
    if (this.outboundNow === 'ended') return false;
    this.outboundNow = 'ended';
    return true;
  }

  /** Either direction ended (the connection is half-closed, or both halves are). */
  get anyEnded(): boolean {
    return this.inboundNow === 'ended' || this.outboundNow === 'ended';
  }

  get bothEnded(): boolean {
    return this.inboundNow === 'ended' && this.outboundNow === 'ended';
  }
}
