// What an agent's connection to one proxy server is, whichever transport carries it (links.ts opens one:
// our framed transport or ANP's gRPC, grpc-link.ts).
import type { KeyObject } from 'node:crypto';
import type { DataViewHandler, Packet, PacketStream } from '@cluster-proxy/proto';

export type AgentTransport = 'mux' | 'grpc';

export interface Link {
  readonly transport: AgentTransport;
  readonly stream: PacketStream;
  header(key: string): string[];
  onPacket(listener: (p: Packet) => void): void;
  offPacket(listener: (p: Packet) => void): void;
  /** DATA payloads as the chunks they arrived in (not copied into one Buffer); null: as packets again. */
  onDataViews?(handler: DataViewHandler | null): void;
  /** The key this link's TLS session gives the gateway's identity MAC (proto linkIdentityKey), if it gives one. */
  identityKey?(): KeyObject | null;
  /** Called at most once, when the link ends or breaks. */
  onGone(listener: (err: Error) => void): void;
  close(): void;
}

export interface LinkOptions {
  address: string;
  caCert: Buffer;
  cert: Buffer;
  key: Buffer;
  serverName?: string;
  /** Metadata we send (agentID, identifiers, capabilities, window). */
  metadata: Record<string, string>;
  headerTimeoutMs: number;
  keepaliveTimeMs: number;
  keepaliveTimeoutMs: number;
  /** Aborts a link that is still being opened. */
  signal: AbortSignal;
  /** Reach the hub through this HTTP(S) CONNECT proxy (contract §8). */
  egress?: EgressOptions;
}

export interface EgressOptions {
  proxy: URL;
  /** CA bundle for an https:// proxy. */
  ca?: Buffer;
  connectTimeoutMs: number;
}
