// Hub identities that would mean something else in a managed cluster. A name in Kubernetes' reserved
// namespace (`system:…`) or in ours (`cluster-proxy:…`) that the hub's own authentication gave a caller
// (a TokenReview of the hub's API server, a client certificate's CN and O) gets the prefix `cluster:hub:`,
// as OCM's cluster-proxy names hub service accounts: the hub's `system:serviceaccount:ns:sa` never acts as
// the managed cluster's service account of that name, a certificate with O=system:masters (the hub's own
// admin certificate) is not cluster-admin everywhere, and nobody poses as a hub token's user.

export const HUB_IDENTITY_PREFIX = 'cluster:hub:';
const RESERVED = /^(system:|cluster-proxy:)/;

/** The cluster-side name for a hub user or group. */
export function hubName(name: string): string {
  return RESERVED.test(name) ? `${HUB_IDENTITY_PREFIX}${name}` : name;
}
