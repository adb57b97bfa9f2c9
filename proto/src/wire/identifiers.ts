// Agent identifiers (ANP's `agentIdentifiers` metadata, a URL query string) and OCM's host names
// for a managed cluster.
import { createHash } from 'node:crypto';

export interface AgentIdentifiers {
  host: string[];
  ipv4: string[];
  ipv6: string[];
  cidr: string[];
  defaultRoute: boolean;
}

export function emptyIdentifiers(): AgentIdentifiers {
  return { host: [], ipv4: [], ipv6: [], cidr: [], defaultRoute: false };
}

/** Parses like ANP's header.GenAgentIdentifiers: unknown keys are ignored (version skew). */
export function parseIdentifiers(query: string): AgentIdentifiers {
  const ids = emptyIdentifiers();
  const params = new URLSearchParams(query);
  let sawDefaultRoute = false;
  for (const [key, value] of params) {
    switch (key) {
      case 'host':
        ids.host.push(value.toLowerCase());
        break;
      case 'ipv4':
        ids.ipv4.push(value);
        break;
      case 'ipv6':
        ids.ipv6.push(value);
        break;
      case 'cidr':
        ids.cidr.push(value);
        break;
      case 'default-route':
        // ANP reads only the first value, with Go's strconv.ParseBool.
        if (!sawDefaultRoute) ids.defaultRoute = ['1', 't', 'T', 'true', 'TRUE', 'True'].includes(value);
        sawDefaultRoute = true;
        break;
      default:
        break;
    }
  }
  return ids;
}

export function formatIdentifiers(ids: AgentIdentifiers): string {
  const params = new URLSearchParams();
  for (const h of ids.host) params.append('host', h);
  for (const a of ids.ipv4) params.append('ipv4', a);
  for (const a of ids.ipv6) params.append('ipv6', a);
  for (const c of ids.cidr) params.append('cidr', c);
  if (ids.defaultRoute) params.append('default-route', 'true');
  return params.toString();
}

/** OCM's service-proxy host: "cluster-" + first 48 hex chars of sha256(name) + ".open-cluster-management.proxy". */
export function serviceProxyHost(cluster: string): string {
  return `cluster-${createHash('sha256').update(cluster).digest('hex').slice(0, 48)}.open-cluster-management.proxy`;
}

/** The host identifiers an agent of cluster C installed in namespace N registers (contract §4). */
export function clusterHostNames(cluster: string, namespace: string): string[] {
  return [cluster, `${cluster}.${namespace}`, serviceProxyHost(cluster)];
}

/** Splits "host:port" / "[v6]:port"; the host comes back without brackets, lower-cased. */
export function splitHostPort(address: string): { host: string; port: number } | null {
  let host: string;
  let portText: string;
  if (address.startsWith('[')) {
    const close = address.indexOf(']');
    if (close < 0 || address[close + 1] !== ':') return null;
    host = address.slice(1, close);
    portText = address.slice(close + 2);
  } else {
    const colon = address.lastIndexOf(':');
    if (colon <= 0) return null;
    host = address.slice(0, colon);
    if (host.includes(':')) return null; // bare IPv6 without brackets is ambiguous
    portText = address.slice(colon + 1);
  }
  if (!/^\d{1,5}$/.test(portText)) return null;
  const port = Number(portText);
  if (port < 1 || port > 65535 || host === '') return null;
  return { host: host.toLowerCase(), port };
}

export function joinHostPort(host: string, port: number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}
