// Plugging the tunnel into HTTP stacks that do not take an http.Agent directly.
import type https from 'node:https';
import { isIP } from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { joinHostPort } from '@cluster-proxy/proto';
import { TunnelHttpAgent, TunnelHttpsAgent } from './http-agent.js';
import type { Tunnel } from './tunnel.js';
import type * as HttpTypes from 'node:http';

/** What undici passes to a connector for each new connection. */
export interface ConnectorOptions {
  /** Host to dial through the tunnel. */
  hostname: string;
  /** Port, empty for the protocol's default. */
  port: string;
  /** `http:` or `https:`. */
  protocol: string;
  /** TLS server name, when it differs from `hostname`. */
  servername?: string;
}

/** How a connector hands undici the connected socket, or the error. */
export type ConnectorCallback = (...args: [null, Duplex] | [Error, null]) => void;

/**
 * An undici connector (`new undici.Agent({ connect: tunnelConnector(tunnel) })`): every connection of
 * that dispatcher is dialed through the tunnel; for https: TLS runs end to end over it.
 */
export function tunnelConnector(
  tunnel: Tunnel,
  tlsOptions: tls.ConnectionOptions = {},
): (options: ConnectorOptions, callback: ConnectorCallback) => void {
  return (options, callback) => {
    const https = options.protocol === 'https:';
    const port = Number(options.port) || (https ? 443 : 80);
    const raw = tunnel.connect(joinHostPort(options.hostname, port));
    let settled = false;
    const fail = (err: Error): void => {
      if (settled) return;
      settled = true;
      raw.destroy();
      callback(err, null);
    };
    if (!https) {
      raw.once('error', fail);
      raw.once('connect', () => {
        settled = true;
        raw.removeListener('error', fail);
        callback(null, raw);
      });
      return;
    }
    const servername = options.servername ?? (isIP(options.hostname) ? undefined : options.hostname);
    const secure = tls.connect({ ...tlsOptions, socket: raw, servername });
    raw.once('error', (err) => secure.destroy(err));
    secure.once('error', fail);
    secure.once('secureConnect', () => {
      settled = true;
      secure.removeListener('error', fail);
      callback(null, secure);
    });
  };
}

/** The part of @kubernetes/client-node 1.x's KubeConfig that picks the agent for a request. */
export interface AgentPickingKubeConfig {
  /** Returns the agent for requests to `cluster`; {@link routeKubeConfigThroughTunnel} replaces it. */
  createAgent(cluster: { server?: string } | null | undefined, agentOptions: https.AgentOptions): HttpTypes.Agent;
}

/**
 * Sends every request of a @kubernetes/client-node 1.x KubeConfig through the tunnel. Point the
 * kubeconfig's cluster `server` at `https://CLUSTER` (the agent maps CLUSTER:443 to its apiserver);
 * the kubeconfig's CA and credentials still apply, end to end.
 */
export function routeKubeConfigThroughTunnel(kc: AgentPickingKubeConfig, tunnel: Tunnel): void {
  kc.createAgent = (cluster, agentOptions) =>
    cluster?.server?.startsWith('http:')
      ? new TunnelHttpAgent({ ...agentOptions, tunnel })
      : new TunnelHttpsAgent({ ...agentOptions, tunnel });
}
