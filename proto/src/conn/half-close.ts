// Half-close of one tunneled connection, per direction, as one of its ends sees it. A direction is open
// until its sender ends it (the FIN behind its last byte: HALF_CLOSE on the wire); the other direction
// may go on for as long as it likes. Every end (the agent's, the hub's frontends, the SDK's socket) keeps
// its lifecycle in its own state (dialing, open, closing, closed) and which directions ended in this.
//   inbound   what this end receives through the tunnel: ended by the peer's HALF_CLOSE
//   outbound  what this end sends into the tunnel: ended when this end sends HALF_CLOSE (its own side's EOF)
//
//   both open ──endInbound()──▶ inbound ended ──endOutbound()──▶ both ended
//   both open ──endOutbound()──▶ outbound ended ──endInbound()──▶ both ended
//   open ──inboundEnding()──▶ ending ──endInbound()──▶ ended   (an end that queues what it passes on)
// A direction ends once: ending it again changes nothing (and says so).

/**
 * One direction of a connection: bytes may still come; its end is known but bytes before it are still
 * queued at this end (ending: only at an end that queues them itself); or it ended.
 */
export type DirectionState = 'open' | 'ending' | 'ended';

export class HalfCloseDirections {
  private inboundNow: DirectionState = 'open';
  private outboundNow: DirectionState = 'open';

  get inbound(): DirectionState {
    return this.inboundNow;
  }

  get outbound(): DirectionState {
    return this.outboundNow;
  }

  /** The peer ended its direction and bytes before its end wait here: true if this is news. */
  inboundEnding(): boolean {
    if (this.inboundNow !== 'open') return false;
    this.inboundNow = 'ending';
    return true;
  }

  /** The peer ended its direction (and nothing before its end waits here): true if this is news (false: ended already). */
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

  /** Either direction ended or is ending (the connection is half-closed, or both halves are). */
  get anyEnded(): boolean {
    return this.inboundNow !== 'open' || this.outboundNow !== 'open';
  }

  get bothEnded(): boolean {
    return this.inboundNow === 'ended' && this.outboundNow === 'ended';
  }
}
