// The agent's requests to its cluster's apiserver for the gateway (plain ones in impersonating-proxy.ts,
// upgrades in upgrade.ts): where they go, with which credentials, and what a caller hears when the
// apiserver cannot be reached.
import type https from 'node:https';
import type { GatewayIdentity } from '@cluster-proxy/proto';
import { kubeTls, type KubeRestConfig } from '../kube-rest.js';

/** A request the agent will send on: where, and with which headers (the impersonation ones included). */
export interface Prepared {
  kube: KubeRestConfig;
  headers: Record<string, string | string[]>;
  identity: GatewayIdentity;
}

/** The caller's one line when the apiserver cannot be reached: no address, the error code only. */
export function apiserverUnreachable(err: Error): string {
  const code = (err as NodeJS.ErrnoException).code;
  return `the agent could not reach the cluster's apiserver${code ? ` (${code})` : ''}`;
}

/** Where the apiserver of `kube` listens: its host (an IPv6 literal without brackets) and port. */
export function apiserverAddress(kube: KubeRestConfig): { host: string; port: number } {
  return { host: kube.server.hostname.replace(/^\[(.*)\]$/, '$1'), port: Number(kube.server.port) || 443 };
}

/** A request target on the apiserver of `kube`: its server URL's path prefixed. */
export function apiserverPath(kube: KubeRestConfig, path: string): string {
  return `${kube.server.pathname.replace(/\/$/, '')}${path}`;
}

/** A request to the apiserver of `kube` (its server URL's path prefixed), verified with its CA, with its client certificate if any (kubeTls). */
export function apiserverRequest(
  kube: KubeRestConfig,
  method: string | undefined,
  path: string,
  headers: Record<string, string | string[]>,
  agent: https.Agent | false,
): https.RequestOptions {
  const { host, port } = apiserverAddress(kube);
  return {
    protocol: 'https:',
    hostname: host,
    port,
    method,
    path: apiserverPath(kube, path),
    headers,
    ...kubeTls(kube),
    agent,
  };
}
