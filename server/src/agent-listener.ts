// AgentService.Connect: authenticates an agent by its client certificate, checks that the
// identifiers it registers are its own (or granted by the hub), answers with serverID/serverCount
// and the capabilities in effect, and hands the stream to the proxy core.
import * as grpc from '@grpc/grpc-js';
import {
  CAP_CREDIT, CAP_HALF_CLOSE, MD_AGENT_ID, MD_AGENT_IDENTIFIERS, MD_CAPABILITIES, MD_SERVER_COUNT, MD_SERVER_ID, MD_WINDOW,
  parseCapabilities, parseIdentifiers, serviceProxyHost, type AgentIdentifiers, type Packet,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { AgentBackend } from './backend.js';
import { clusterFromSubject } from './pki/agent-identity.js';
import type { ProxyCore } from './proxy-core.js';
import { cidrContains, isValidCidr } from './routing.js';
import { isIP } from 'node:net';

/** Identifiers the hub grants a cluster's agents beyond the cluster's own names. */
export interface Grant {
  hosts: string[];
  cidrs: string[];
  defaultRoute: boolean;
}

export interface AgentListenerOptions {
  serverID: string;
  serverCount: () => number;
  window: number;
  grants: ReadonlyMap<string, Grant>;
  core: ProxyCore;
  log: Logger;
  /** False once the server is shutting down: new agent streams are refused. */
  accepting: () => boolean;
}

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

export class IdentityError extends Error {}

/** Throws IdentityError naming the first identifier the cluster's agent may not register. */
export function checkIdentifiers(cluster: string, ids: AgentIdentifiers, grant: Grant | undefined): void {
  const own = new Set([cluster, serviceProxyHost(cluster), ...(grant?.hosts ?? []).map((h) => h.toLowerCase())]);
  for (const h of ids.host) {
    if (own.has(h)) continue;
    // `<cluster>.<namespace>`: the agent's install namespace is a single DNS label.
    if (h.startsWith(`${cluster}.`) && DNS_LABEL.test(h.slice(cluster.length + 1))) continue;
    throw new IdentityError(`agent of cluster "${cluster}" may not register host=${h}: it is neither one of the cluster's names nor granted by the hub`);
  }
  const granted = grant?.cidrs ?? [];
  for (const [key, values] of [['ipv4', ids.ipv4], ['ipv6', ids.ipv6], ['cidr', ids.cidr]] as const) {
    for (const v of values) {
      const asCidr = key === 'cidr' ? v : `${v}/${key === 'ipv4' ? 32 : 128}`;
      if (!isValidCidr(asCidr) || (key !== 'cidr' && isIP(v) !== (key === 'ipv4' ? 4 : 6))) throw new IdentityError(`agent of cluster "${cluster}" sent an invalid ${key}=${v}`);
      if (!granted.some((g) => cidrContains(g, asCidr))) throw new IdentityError(`agent of cluster "${cluster}" may not register ${key}=${v}: not within an address range granted by the hub`);
    }
  }
  if (ids.defaultRoute && !grant?.defaultRoute) throw new IdentityError(`agent of cluster "${cluster}" may not register default-route: not granted by the hub`);
}

export function makeAgentConnectHandler(opts: AgentListenerOptions): grpc.handleBidiStreamingCall<Packet, Packet> {
  let streamNo = 0;
  return (call) => {
    const refuse = (code: grpc.status, details: string): void => {
      opts.log.warn({ peer: call.getPeer(), code: grpc.status[code] }, `agent refused: ${details}`);
      call.on('error', () => {});
      call.emit('error', { code, details });
    };
    if (!opts.accepting()) return refuse(grpc.status.UNAVAILABLE, 'server is shutting down');
    const cert = call.getAuthContext().sslPeerCertificate;
    const identity = clusterFromSubject(cert?.subject);
    if (!identity) return refuse(grpc.status.UNAUTHENTICATED, 'client certificate does not identify a managed cluster agent');
    const { cluster } = identity;
    const agentIDs = call.metadata.get(MD_AGENT_ID);
    if (agentIDs.length !== 1 || String(agentIDs[0]) === '') return refuse(grpc.status.INVALID_ARGUMENT, `expected one agentID metadata value, got ${agentIDs.length}`);
    const agentID = String(agentIDs[0]);
    const idValues = call.metadata.get(MD_AGENT_IDENTIFIERS);
    if (idValues.length > 1) return refuse(grpc.status.INVALID_ARGUMENT, 'expected at most one agentIdentifiers metadata value');
    const ids = idValues.length === 1 ? parseIdentifiers(String(idValues[0])) : parseIdentifiers('');
    // An agent that registers nothing is reachable by its cluster's names, as identified by its certificate.
    if (ids.host.length + ids.ipv4.length + ids.ipv6.length + ids.cidr.length === 0 && !ids.defaultRoute) ids.host.push(cluster, serviceProxyHost(cluster));
    const grant = opts.grants.get(cluster);
    try {
      checkIdentifiers(cluster, ids, grant);
    } catch (err) {
      if (err instanceof IdentityError) return refuse(grpc.status.PERMISSION_DENIED, err.message);
      throw err;
    }
    const caps = parseCapabilities(call.metadata.get(MD_CAPABILITIES).map(String).join(','));
    const peerWindow = Number(call.metadata.get(MD_WINDOW)[0]);
    const credit = caps.has(CAP_CREDIT) && Number.isSafeInteger(peerWindow) && peerWindow > 0;
    const halfClose = caps.has(CAP_HALF_CLOSE);
    const md = new grpc.Metadata();
    md.set(MD_SERVER_ID, opts.serverID);
    md.set(MD_SERVER_COUNT, String(opts.serverCount()));
    const accepted = [credit ? CAP_CREDIT : '', halfClose ? CAP_HALF_CLOSE : ''].filter(Boolean);
    if (accepted.length) md.set(MD_CAPABILITIES, accepted.join(','));
    if (credit) md.set(MD_WINDOW, String(opts.window));
    call.sendMetadata(md);
    const log = opts.log.child({ agentID, cluster });
    const backend = new AgentBackend(call, {
      agentID,
      cluster,
      hosts: ids.host,
      cidrs: [...ids.cidr, ...ids.ipv4.map((a) => `${a}/32`), ...ids.ipv6.map((a) => `${a}/128`)],
      defaultRoute: ids.defaultRoute,
      credit,
      halfClose,
      window: opts.window,
      peerWindow: credit ? peerWindow : null,
      log,
    }, ++streamNo);
    opts.core.addBackend(backend);
    log.info({ peer: call.getPeer(), hosts: ids.host, credit, halfClose }, 'agent connected');
  };
}
