// Who may reach which cluster through the gateway, decided at the hub after authentication and before
// anything is sent to an agent (the managed cluster's RBAC then decides what the caller may do there).
//
//   scope                 the credential's own limit only: a hub token reaches the clusters it was issued
//                         for; client certificates, OIDC and TokenReview users reach every cluster.
//   subjectaccessreview   the same limit, then for every caller but a hub token (whose clusters the hub
//                         admin named when issuing it) an authorization.k8s.io/v1 SubjectAccessReview on
//                         the hub: verb `get` on `managedclusters/proxy` in `cluster.open-cluster-management.io`,
//                         name = the cluster. Answers cached 10 s, bounded. Needs --store kubernetes.
import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import { oneLine } from '../http/text.js';
import { callerMayReach, type GatewayCaller } from './auth.js';
import type { HubReviews, SubjectAccessReviewSpec, SubjectAccessReviewStatus } from './kube-reviews.js';
import { TtlCache } from './ttl-cache.js';

export type AuthorizationMode = 'scope' | 'subjectaccessreview';
export const AUTHORIZATION_MODES: readonly AuthorizationMode[] = ['scope', 'subjectaccessreview'];

/** What the SubjectAccessReview asks for; the cluster is the name. */
export const PROXY_ACCESS = {
  verb: 'get',
  group: 'cluster.open-cluster-management.io',
  resource: 'managedclusters',
  subresource: 'proxy',
} as const;

export type Decision = { allowed: true } | { allowed: false; status: 403 | 503; message: string };

export interface GatewayAuthorizer {
  readonly mode: AuthorizationMode;
  authorize(caller: GatewayCaller, cluster: string): Promise<Decision>;
}

function scopeDecision(caller: GatewayCaller, cluster: string): Decision {
  return callerMayReach(caller, cluster)
    ? { allowed: true }
    : { allowed: false, status: 403, message: `${caller.name} may not reach cluster ${cluster}` };
}

export function scopeAuthorizer(): GatewayAuthorizer {
  return { mode: 'scope', authorize: (caller, cluster) => Promise.resolve(scopeDecision(caller, cluster)) };
}

export interface SarAuthorizerOptions {
  reviews: HubReviews;
  log?: Logger;
  ttlMs?: number;
  maxEntries?: number;
  now?: () => number;
}

export function subjectAccessReviewSpec(caller: GatewayCaller, cluster: string): SubjectAccessReviewSpec {
  return {
    // A TokenReview's user as the hub's API server knows it (a ServiceAccount subject matches), not the cluster-side name.
    user: caller.reviewed?.user ?? caller.user,
    groups: caller.reviewed?.groups ?? caller.groups,
    ...(caller.uid ? { uid: caller.uid } : {}),
    ...(caller.extra ? { extra: caller.extra } : {}),
    resourceAttributes: { ...PROXY_ACCESS, name: cluster },
  };
}

export function subjectAccessReviewAuthorizer(opts: SarAuthorizerOptions): GatewayAuthorizer {
  const cache = new TtlCache<SubjectAccessReviewStatus>({
    ttlMs: opts.ttlMs ?? 10_000,
    maxEntries: opts.maxEntries ?? 4096,
    ...(opts.now ? { now: opts.now } : {}),
  });
  return {
    mode: 'subjectaccessreview',
    async authorize(caller, cluster) {
      const scoped = scopeDecision(caller, cluster);
      if (!scoped.allowed || caller.source === 'token') return scoped;
      const spec = subjectAccessReviewSpec(caller, cluster);
      const key = createHash('sha256').update(JSON.stringify(spec)).digest('hex');
      let status: SubjectAccessReviewStatus;
      try {
        status = await cache.getOrLoad(key, () => opts.reviews.subjectAccessReview(spec));
      } catch (err) {
        opts.log?.warn({ user: caller.user, cluster, err: oneLine((err as Error).message) }, 'SubjectAccessReview failed');
        return {
          allowed: false,
          status: 503,
          message: `cannot check access with the hub's API server: ${oneLine((err as Error).message)}`,
        };
      }
      if (status.allowed && !status.denied) return { allowed: true };
      const why = status.reason || status.evaluationError;
      return {
        allowed: false,
        status: 403,
        message: `${caller.name} may not reach cluster ${cluster}: the hub's RBAC does not allow ${PROXY_ACCESS.verb} on ${PROXY_ACCESS.resource}/${PROXY_ACCESS.subresource} "${cluster}" (${PROXY_ACCESS.group})${why ? `: ${oneLine(why)}` : ''}`,
      };
    },
  };
}
