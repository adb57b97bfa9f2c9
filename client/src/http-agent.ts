// http.Agent / https.Agent whose connections go through the tunnel, so Node HTTP clients (and
// @kubernetes/client-node) reach a managed apiserver unchanged: `https.get({ host: 'cluster1', agent })`.
import { http } from '@cluster-proxy/proto';
import https from 'node:https';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import type { Tunnel } from './tunnel.js';
import type * as HttpTypes from 'node:http';

function destination(
  options: { host?: string | null; hostname?: string | null; port?: number | string | null },
  defaultPort: number,
): string {
  const host = options.hostname ?? options.host ?? 'localhost';
  const port = Number(options.port ?? defaultPort) || defaultPort;
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/** What a {@link TunnelHttpAgent} or {@link TunnelHttpsAgent} adds to Node's agent options. */
export interface TunnelAgentOptions {
  /** The tunnel every connection of the agent is dialed through. */
  tunnel: Tunnel;
  /** Deadline of each dial (see {@link ConnectOptions.timeoutMs}). */
  dialTimeoutMs?: number;
}

/** An `http.Agent` whose connections are dialed through a {@link Tunnel}: `http.get({ host: 'cluster1', port: 8080, agent })`. */
export class TunnelHttpAgent extends http.Agent {
  private readonly tunnel: Tunnel;
  private readonly dialTimeoutMs: number | undefined;
  /**
   * An agent that dials through `opts.tunnel`.
   * @param opts The tunnel, and any `http.Agent` option (keepAlive, maxSockets, …).
   */
  constructor(opts: TunnelAgentOptions & HttpTypes.AgentOptions) {
    super(opts);
    this.tunnel = opts.tunnel;
    this.dialTimeoutMs = opts.dialTimeoutMs;
  }

  // Returning the socket synchronously (like net.connect) is enough: Node's agent adopts it, and
  // dial errors reach the request through the socket's 'error' event.
  override createConnection(options: HttpTypes.ClientRequestArgs): Duplex {
    return this.tunnel.connect(destination(options, 80), { timeoutMs: this.dialTimeoutMs });
  }
}

/**
 * An `https.Agent` whose connections are dialed through a {@link Tunnel}; TLS runs end to end between
 * the client and the destination, so the hub and the agent see only ciphertext.
 */
export class TunnelHttpsAgent extends https.Agent {
  private readonly tunnel: Tunnel;
  private readonly dialTimeoutMs: number | undefined;
  /**
   * An agent that dials through `opts.tunnel` and runs TLS over each connection.
   * @param opts The tunnel, and any `https.Agent` option (ca, rejectUnauthorized, keepAlive, …).
   */
  constructor(opts: TunnelAgentOptions & https.AgentOptions) {
    super(opts);
    this.tunnel = opts.tunnel;
    this.dialTimeoutMs = opts.dialTimeoutMs;
  }

  /** Dials through the tunnel and starts TLS over the connection (Node's agent calls this). */
  override createConnection(options: https.RequestOptions): Duplex {
    const raw = this.tunnel.connect(destination(options, 443), { timeoutMs: this.dialTimeoutMs });
    // TLS runs end to end, client ↔ destination; the hub and agent see only ciphertext.
    const servername = options.servername ?? (options.host && !/^[\d.:[\]]+$/.test(options.host) ? options.host : undefined);
    const secure = tls.connect({ ...(options as tls.ConnectionOptions), socket: raw, servername });
    raw.once('error', (err) => secure.destroy(err));
    return secure;
  }
}
