// http.Agent / https.Agent whose connections go through the tunnel, so Node HTTP clients (and
// @kubernetes/client-node) reach a managed apiserver unchanged: `https.get({ host: 'cluster1', agent })`.
import http from 'node:http';
import https from 'node:https';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import type { Tunnel } from './tunnel.js';

function destination(options: { host?: string | null; hostname?: string | null; port?: number | string | null }, defaultPort: number): string {
  const host = options.hostname ?? options.host ?? 'localhost';
  const port = Number(options.port ?? defaultPort) || defaultPort;
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

export interface TunnelAgentOptions {
  tunnel: Tunnel;
  dialTimeoutMs?: number;
}

export class TunnelHttpAgent extends http.Agent {
  private readonly tunnel: Tunnel;
  private readonly dialTimeoutMs: number | undefined;
  constructor(opts: TunnelAgentOptions & http.AgentOptions) {
    super(opts);
    this.tunnel = opts.tunnel;
    this.dialTimeoutMs = opts.dialTimeoutMs;
  }

  // Returning the socket synchronously (like net.connect) is enough: Node's agent adopts it, and
  // dial errors reach the request through the socket's 'error' event.
  override createConnection(options: http.ClientRequestArgs): Duplex {
    return this.tunnel.connect(destination(options, 80), { timeoutMs: this.dialTimeoutMs });
  }
}

export class TunnelHttpsAgent extends https.Agent {
  private readonly tunnel: Tunnel;
  private readonly dialTimeoutMs: number | undefined;
  constructor(opts: TunnelAgentOptions & https.AgentOptions) {
    super(opts);
    this.tunnel = opts.tunnel;
    this.dialTimeoutMs = opts.dialTimeoutMs;
  }

  override createConnection(options: https.RequestOptions): Duplex {
    const raw = this.tunnel.connect(destination(options, 443), { timeoutMs: this.dialTimeoutMs });
    // TLS runs end to end, client ↔ destination; the hub and agent see only ciphertext.
    const servername = options.servername ?? (options.host && !/^[\d.:[\]]+$/.test(options.host) ? options.host : undefined);
    const secure = tls.connect({ ...(options as tls.ConnectionOptions), socket: raw, servername });
    raw.once('error', (err) => secure.destroy(err));
    return secure;
  }
}
