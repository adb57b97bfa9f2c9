// gRPC metadata keys. ANP's are mixed-case in Go source; HTTP/2 carries them lower-cased, and
// grpc-js normalises keys the same way, so these are the names on the wire.
export const MD_AGENT_ID = 'agentid';
export const MD_AGENT_IDENTIFIERS = 'agentidentifiers';
export const MD_SERVER_ID = 'serverid';
export const MD_SERVER_COUNT = 'servercount';

// Extensions (SPEC §3): unknown metadata is ignored by ANP peers, so these are safe to send.
/** Comma-separated capabilities the sender supports; the server answers with the ones in effect. */
export const MD_CAPABILITIES = 'cluster-proxy-capabilities';
/** Per-connection receive window (bytes) the sender grants its peer when "credit" is in effect. */
export const MD_WINDOW = 'cluster-proxy-window';

export const CAP_CREDIT = 'credit';
export const CAP_HALF_CLOSE = 'half-close';

export function parseCapabilities(value: string | undefined): Set<string> {
  const caps = new Set<string>();
  for (const part of (value ?? '').split(',')) {
    const c = part.trim().toLowerCase();
    if (c) caps.add(c);
  }
  return caps;
}
