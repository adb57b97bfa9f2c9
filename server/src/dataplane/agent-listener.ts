// AgentService.Connect: authenticates an agent by its client certificate, checks that the
// identifiers it registers are its own (or granted by the hub), answers with serverID/serverCount
// and the capabilities in effect, and hands the stream to the proxy core.
import {
  CAP_CREDIT,
  CAP_GATEWAY_HMAC,
  CAP_HALF_CLOSE,
  CAP_SERVER_DRAIN,
  MD_AGENT_ID,
  MD_HELD_SERVERS,
  MD_AGENT_IDENTIFIERS,
  MD_CAPABILITIES,
  MD_SERVER_COUNT,
  MD_SERVER_ID,
  MD_WINDOW,
  linkIdentityKey,
  parseCapabilities,
  parseIdentifiers,
  serviceProxyHost,
  type AgentIdentifiers,
  type FramedPacketStream,
  type Hello,
  refusalHello,
  type MuxRefusalCode,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import type { KeyObject } from 'node:crypto';
import type { PeerCertificate, TLSSocket } from 'node:tls';
import { GrpcStatus, type GrpcHandler } from './grpc-server.js';
import { AgentBackend, grpcAgentChannel, muxAgentChannel, type AgentBackendOptions, type AgentChannel } from './backend.js';
import { clusterFromSubject } from '../pki/agent-identity.js';
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
  /**
   * The hub's registry says whether this cluster's agents may connect (registered, accepted, the
   * certificate from the cluster's current incarnation): null to admit, else the reason to refuse.
   */
  registry?: { check(cluster: string, cert: PeerCertificate): string | null };
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
    throw new IdentityError(
      `agent of cluster "${cluster}" may not register host=${h}: it is neither one of the cluster's names nor granted by the hub`,
    );
  }
  const granted = grant?.cidrs ?? [];
  for (const [key, values] of [
    ['ipv4', ids.ipv4],
    ['ipv6', ids.ipv6],
    ['cidr', ids.cidr],
  ] as const) {
    for (const v of values) {
      const asCidr = key === 'cidr' ? v : `${v}/${key === 'ipv4' ? 32 : 128}`;
      if (!isValidCidr(asCidr) || (key !== 'cidr' && isIP(v) !== (key === 'ipv4' ? 4 : 6)))
        throw new IdentityError(`agent of cluster "${cluster}" sent an invalid ${key}=${v}`);
      if (!granted.some((g) => cidrContains(g, asCidr)))
        throw new IdentityError(
          `agent of cluster "${cluster}" may not register ${key}=${v}: not within an address range granted by the hub`,
        );
    }
  }
  if (ids.defaultRoute && !grant?.defaultRoute)
    throw new IdentityError(`agent of cluster "${cluster}" may not register default-route: not granted by the hub`);
}

export type Refusal = { code: Exclude<MuxRefusalCode, 'UNKNOWN'>; message: string };

export interface Admission {
  backend: Omit<AgentBackendOptions, 'log' | 'budget'>;
  /** serverID, serverCount, capabilities and window, as response metadata. */
  headers: Record<string, string>;
}

/**
 * The transport-independent part of accepting an agent: identity from the verified certificate,
 * agentID and identifiers from its metadata, capabilities. `get(key)` returns every value sent for
 * a (lower-case) metadata key. `identityKey`: the link's key for gateway identity MACs, where its TLS
 * session exports one (CAP_GATEWAY_HMAC is accepted only then).
 */
export function admitAgent(
  opts: AgentListenerOptions,
  cert: PeerCertificate | undefined,
  get: (key: string) => string[],
  identityKey: KeyObject | null = null,
): Admission | Refusal {
  if (!opts.accepting()) return { code: 'UNAVAILABLE', message: 'server is shutting down' };
  if (get(MD_HELD_SERVERS).join(',').split(',').includes(opts.serverID))
    return { code: 'ALREADY_EXISTS', message: `agent already holds a stream to server ${opts.serverID}` };
  const identity = clusterFromSubject(cert?.subject);
  if (!identity) return { code: 'UNAUTHENTICATED', message: 'client certificate does not identify a managed cluster agent' };
  const { cluster } = identity;
  const revoked = opts.registry && cert ? opts.registry.check(cluster, cert) : null;
  if (revoked) return { code: 'PERMISSION_DENIED', message: revoked };
  const agentIDs = get(MD_AGENT_ID);
  if (agentIDs.length !== 1 || agentIDs[0] === '')
    return { code: 'INVALID_ARGUMENT', message: `expected one agentID metadata value, got ${agentIDs.length}` };
  const idValues = get(MD_AGENT_IDENTIFIERS);
  if (idValues.length > 1) return { code: 'INVALID_ARGUMENT', message: 'expected at most one agentIdentifiers metadata value' };
  const ids = parseIdentifiers(idValues[0] ?? '');
  // An agent that registers nothing is reachable by its cluster's names, as identified by its certificate.
  if (ids.host.length + ids.ipv4.length + ids.ipv6.length + ids.cidr.length === 0 && !ids.defaultRoute)
    ids.host.push(cluster, serviceProxyHost(cluster));
  try {
    checkIdentifiers(cluster, ids, opts.grants.get(cluster));
  } catch (err) {
    if (err instanceof IdentityError) return { code: 'PERMISSION_DENIED', message: err.message };
    throw err;
  }
  const caps = parseCapabilities(get(MD_CAPABILITIES).join(','));
  const peerWindow = Number(get(MD_WINDOW)[0]);
  const credit = caps.has(CAP_CREDIT) && Number.isSafeInteger(peerWindow) && peerWindow > 0;
  const halfClose = caps.has(CAP_HALF_CLOSE);
  const serverDrain = caps.has(CAP_SERVER_DRAIN);
  const gatewayKey = caps.has(CAP_GATEWAY_HMAC) ? identityKey : null;
  const headers: Record<string, string> = { [MD_SERVER_ID]: opts.serverID, [MD_SERVER_COUNT]: String(opts.serverCount()) };
  const accepted = [
    credit ? CAP_CREDIT : '',
    halfClose ? CAP_HALF_CLOSE : '',
    serverDrain ? CAP_SERVER_DRAIN : '',
    gatewayKey ? CAP_GATEWAY_HMAC : '',
  ].filter(Boolean);
  if (accepted.length) headers[MD_CAPABILITIES] = accepted.join(',');
  if (credit) headers[MD_WINDOW] = String(opts.window);
  return {
    headers,
    backend: {
      agentID: agentIDs[0]!,
      cluster,
      hosts: ids.host,
      cidrs: [...ids.cidr, ...ids.ipv4.map((a) => `${a}/32`), ...ids.ipv6.map((a) => `${a}/128`)],
      defaultRoute: ids.defaultRoute,
      credit,
      halfClose,
      serverDrain,
      identityKey: gatewayKey,
      window: opts.window,
      peerWindow: credit ? peerWindow : null,
    },
  };
}

let streamNo = 0;

/** Registers an admitted agent's channel with the core. */
export function startBackend(opts: AgentListenerOptions, admission: Admission, channel: AgentChannel, peer: string): AgentBackend {
  const log = opts.log.child({ agentID: admission.backend.agentID, cluster: admission.backend.cluster });
  const backend = new AgentBackend(
    channel,
    { ...admission.backend, log, metrics: opts.core.metrics, budget: opts.core.budget },
    ++streamNo,
  );
  opts.core.addBackend(backend);
  log.info(
    {
      peer,
      hosts: admission.backend.hosts,
      credit: admission.backend.credit,
      halfClose: admission.backend.halfClose,
      gatewayIdentityMac: admission.backend.identityKey != null,
      transport: channel.transport,
    },
    'agent connected',
  );
  return backend;
}

/** AgentService.Connect over gRPC (unmodified ANP agents, and ours when told to use gRPC). */
export function makeAgentConnectHandler(opts: AgentListenerOptions): GrpcHandler {
  return (call) => {
    const result = admitAgent(opts, call.peerCertificate(), (key) => call.metadata.get(key), call.identityKey());
    if (!('headers' in result)) {
      opts.log[result.code === 'ALREADY_EXISTS' ? 'debug' : 'warn'](
        { peer: call.getPeer(), code: result.code },
        `agent refused: ${result.message}`,
      );
      opts.core.metrics.agentRefusals.inc({ code: result.code });
      call.endWithStatus(GrpcStatus[result.code], result.message);
      return;
    }
    call.sendMetadata(result.headers);
    startBackend(opts, result, grpcAgentChannel(call, opts.core.metrics), call.getPeer());
  };
}

/** A mux agent said hello on the agent port: admit it or refuse it. */
export function onMuxAgentHello(opts: AgentListenerOptions, keepalive: { intervalMs: number; timeoutMs: number }) {
  return (stream: FramedPacketStream, hello: Hello, socket: TLSSocket, peer: string): void => {
    const result = admitAgent(opts, socket.getPeerCertificate(), (key) => hello[key] ?? [], linkIdentityKey(socket));
    if (!('headers' in result)) {
      opts.log[result.code === 'ALREADY_EXISTS' ? 'debug' : 'warn']({ peer, code: result.code }, `agent refused: ${result.message}`);
      opts.core.metrics.agentRefusals.inc({ code: result.code });
      stream.sendHello(refusalHello(result.code, result.message));
      stream.end();
      return;
    }
    const headers: Hello = {};
    for (const [k, v] of Object.entries(result.headers)) headers[k] = [v];
    stream.sendHello(headers);
    // Agents ping every --keepalive-time (15 s by default): the hub pings only one that went quiet.
    stream.startKeepalive(keepalive.intervalMs, keepalive.timeoutMs, { whenIdle: true });
    startBackend(opts, result, muxAgentChannel(stream, opts.core.metrics), peer);
  };
}
