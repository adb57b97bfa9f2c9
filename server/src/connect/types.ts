// The HTTP CONNECT frontend's shared vocabulary: who is asking (Principal), on which listener, in which
// state a client connection is, and what the listeners share with each connection.
import type { Logger } from 'pino';
import type { TokenStore } from '../fleet/tokens.js';
import type { ProxyCore } from '../dataplane/proxy-core.js';
import type { ProbeReads } from './probe-reads.js';

export type ListenerKind = 'tls' | 'uds' | 'plain';

import type { Principal } from '../http/principal.js';

export type { Principal };

/** A client connection's lifecycle; while open, which directions ended is its HalfCloseDirections (proto). */
export type ConnectState = 'reading-head' | 'dialing' | 'open' | 'refusing' | 'closed';

export interface ConnectConnectionInfo {
  /** The state, or `half-closed`: open, and a direction ended. */
  state: ConnectState | 'half-closed';
  listener: ListenerKind;
  peer: string;
  principal: string;
  destination: string;
  connectID: number;
}

/** What the listeners need of a client connection (connection.ts). */
export interface TrackedConnection {
  describe(): ConnectConnectionInfo;
  /** Past the request head: a tunnel that may finish within the stop grace period. */
  isTunnel(): boolean;
  refuseEarly(status: number, message: string, reason: string): void;
  destroy(): void;
}

/** Settings and state every client connection of one frontend shares. */
export interface ConnectShared {
  core: ProxyCore;
  log: Logger;
  tokens: TokenStore;
  authorize: (principal: Principal, cluster: string) => boolean;
  headerTimeoutMs: number;
  maxHeaderBytes: number;
  plainAllowsTokens: boolean;
  conns: Set<TrackedConnection>;
  /** What probes of clients waiting for credit read, per connection and in all (connection.ts). */
  probeReads: ProbeReads;
}
