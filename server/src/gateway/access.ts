// The gateway's authentication sources and authorizer, built from the hub's configuration: which
// sources exist and in which order (auth.ts), the OIDC verifier's lifetime, and the authorization mode
// (authorization.ts). The hub's API server reviews (TokenReview, SubjectAccessReview) exist only on
// --store kubernetes, and their client module is loaded only then.
import type { Logger } from 'pino';
import type { TokenStore } from '../fleet/tokens.js';
import { certificateSource, hubTokenSource, oidcSource, tokenReviewSource, type AuthSource } from './auth.js';
import { scopeAuthorizer, subjectAccessReviewAuthorizer, type AuthorizationMode, type GatewayAuthorizer } from './authorization.js';
import type { HubReviews } from './kube-reviews.js';
import { OidcVerifier, type OidcConfig, type OidcRuntimeOptions } from './oidc.js';
import { TokenReviewer } from './token-review.js';

export interface GatewayAccessConfig {
  oidc?: OidcConfig;
  /** Default: 'subjectaccessreview' when the hub has an API server (--store kubernetes), else 'scope'. */
  authorization?: AuthorizationMode;
  /** Runtime knobs of the OIDC verifier (tests). */
  oidcRuntime?: Omit<OidcRuntimeOptions, 'log'>;
}

export interface GatewayAccessDeps {
  tokens: TokenStore;
  log: Logger;
  /** The hub's API server reviews (--store kubernetes); absent on other stores. */
  hubReviews?: () => Promise<HubReviews | null>;
}

export interface GatewayAccess {
  sources: AuthSource[];
  authorizer: GatewayAuthorizer;
  /** One line for the startup log. */
  summary: Record<string, unknown>;
  close(): void;
}

export async function buildGatewayAccess(config: GatewayAccessConfig, deps: GatewayAccessDeps): Promise<GatewayAccess> {
  const log = deps.log.child({ component: 'gateway-auth' });
  const reviews = deps.hubReviews ? await deps.hubReviews() : null;
  const mode = config.authorization ?? (reviews ? 'subjectaccessreview' : 'scope');
  if (mode === 'subjectaccessreview' && !reviews)
    throw new Error("gateway authorization subjectaccessreview needs the hub's Kubernetes API (--store kubernetes)");
  const verifier = config.oidc ? new OidcVerifier(config.oidc, { ...config.oidcRuntime, log }) : null;
  const sources: AuthSource[] = [hubTokenSource(deps.tokens, { onlyHubShaped: verifier !== null || reviews !== null })];
  if (verifier) sources.push(oidcSource(verifier, { otherIssuers: reviews ? 'pass' : 'refuse' }));
  if (reviews) sources.push(tokenReviewSource(new TokenReviewer({ reviews, log })));
  sources.push(certificateSource());
  const authorizer = mode === 'subjectaccessreview' ? subjectAccessReviewAuthorizer({ reviews: reviews!, log }) : scopeAuthorizer();
  return {
    sources,
    authorizer,
    summary: {
      authentication: sources.map((s) => s.name),
      authorizationMode: mode,
      ...(config.oidc ? { oidcIssuer: config.oidc.issuerUrl } : {}),
    },
    close: () => verifier?.close(),
  };
}
