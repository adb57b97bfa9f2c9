// gRPC metadata keys. ANP's are mixed-case in Go source; HTTP/2 carries them lower-cased, and
// gRPC implementations normalise keys the same way, so these are the names on the wire.
export const MD_AGENT_ID = 'agentid';
export const MD_AGENT_IDENTIFIERS = 'agentidentifiers';
export const MD_SERVER_ID = 'serverid';
export const MD_SERVER_COUNT = 'servercount';

// Extensions (contract §3): unknown metadata is ignored by ANP peers, so these are safe to send.
/** Comma-separated capabilities the sender supports; the server answers with the ones in effect. */
export const MD_CAPABILITIES = 'cluster-proxy-capabilities';
/** Per-connection receive window (bytes) the sender grants its peer when "credit" is in effect. */
export const MD_WINDOW = 'cluster-proxy-window';

/**
 * ServerIDs the agent already holds a stream to (comma-separated). Our server refuses a stream to a
 * replica on the list before registering it, so no dial is ever routed over a duplicate that the
 * agent is about to close; an ANP server ignores the key (and the agent closes the duplicate, as ANP does).
 */
export const MD_HELD_SERVERS = 'cluster-proxy-held-servers';

export const CAP_CREDIT = 'credit';
export const CAP_HALF_CLOSE = 'half-close';
/** The server may send DRAIN to the agent: "I am shutting down; count me out and find the other replicas". */
export const CAP_SERVER_DRAIN = 'server-drain';
/**
 * The agent believes a gateway identity authenticated with the link's own key (an HMAC, proto
 * http/gateway-identity.ts) as well as a signed one. Only where the link's TLS session can export keying material.
 */
export const CAP_GATEWAY_HMAC = 'gateway-hmac';

export function parseCapabilities(value: string | undefined): Set<string> {
  const caps = new Set<string>();
  for (const part of (value ?? '').split(',')) {
    const c = part.trim().toLowerCase();
    if (c) caps.add(c);
  }
  return caps;
}
