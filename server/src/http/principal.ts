// Who is asking, as every frontend (CONNECT, gRPC, mux, the gateway) names a client in messages and limits.

/** Who a valid bearer token speaks for (`fleet/tokens.ts` issues and verifies them). */
export interface TokenPrincipal {
  kind: 'token';
  id: string;
  name: string;
  /** Clusters this token may reach, or '*' for every cluster. */
  clusters: readonly string[] | '*';
  expiresAt: string | null;
}

/** Who is asking. Certificates and Unix-socket peers may reach every cluster (subject to
 * `authorize`); a token only the clusters it was issued for. */
export type Principal = { kind: 'certificate'; name: string } | { kind: 'unix-socket'; name: string } | TokenPrincipal;

/** A certificate subject field (node:tls gives an array when a name repeats): its first value. */
function firstValue(v: string | string[] | undefined): string {
  return Array.isArray(v) ? (v[0] ?? '') : (v ?? '');
}

/** Who a client certificate names, as every frontend shows it (messages, the per-client limit). */
export function certificatePrincipal(cn: string | string[] | undefined): Principal {
  return { kind: 'certificate', name: firstValue(cn) || 'unnamed-certificate' };
}

export function principalName(p: Principal): string {
  switch (p.kind) {
    case 'certificate':
      return `certificate "${p.name}"`;
    case 'token':
      return `token "${p.name}" (${p.id})`;
    default:
      return p.name;
  }
}
