// What the proxy core needs from a client-facing leg (a gRPC Proxy stream, a connection of our mux
// transport, an HTTP CONNECT connection). Bytes towards the client go through `sink` so its backpressure
// reaches the agent as credit.
import type { ByteSink, DialFailureReason } from '@cluster-proxy/proto';

export interface Frontend {
  readonly sink: ByteSink;
  /** Who the client is, for the per-client connection limit (a certificate's or token's name). */
  readonly client: string;
  /** True if the client understands half-close (our SDK); ANP clients only know full close. */
  readonly halfClose: boolean;
  dialSucceeded(connectID: number): void;
  dialFailed(reason: DialFailureReason, message: string): void;
  /** The destination sent FIN. */
  remoteEnded(): void;
  /** The connection is closed (acknowledged by the agent, or the agent is gone). */
  closed(error: string): void;
  /** Stop / restart reading bytes from the client (no credit left towards the agent). */
  pause(): void;
  resume(): void;
  /** The client keeps up with a bulk transfer towards it (its socket may keep more unsent now). */
  onBulk?(): void;
  /** Client bytes held for this connection before the core has them: a paused socket's or stream's buffer (the held gauge counts them). */
  heldBytes?(): number;
}
