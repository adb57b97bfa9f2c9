// Bearer tokens of the hub's own Kubernetes API (`--store kubernetes`): a token that is neither a hub
// token nor an ID token of the configured OIDC issuer is sent to the hub's API server as an
// authentication.k8s.io/v1 TokenReview, which knows its service accounts, its bootstrap tokens and
// whatever authenticators it runs. Answers are cached briefly (10 s, bounded), keyed by the token's
// SHA-256: never the token itself, which appears in no log line and no cache key.
//
// The identity is the review's, with one change: names in Kubernetes' and our reserved namespaces get the
// prefix `cluster:hub:` (hub-names.ts). `system:authenticated` is dropped: the managed apiserver adds it to
// every impersonated user. The hub's own SubjectAccessReview asks about the review's names as they are
// (authorization.ts): they are that API server's users, and its RBAC binds them by those names.
import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import { oneLine } from '../http/text.js';
import type { AuthOutcome, GatewayCaller } from './caller.js';
import type { HubReviews, TokenReviewStatus } from './kube-reviews.js';
import { hubName } from './hub-names.js';
import { TtlCache } from './ttl-cache.js';

const DEFAULT_TTL_MS = 10_000;
const DEFAULT_MAX_ENTRIES = 1024;

export interface TokenReviewerOptions {
  reviews: HubReviews;
  log?: Logger;
  ttlMs?: number;
  maxEntries?: number;
  now?: () => number;
}

export class TokenReviewer {
  private readonly cache: TtlCache<TokenReviewStatus>;

  constructor(private readonly opts: TokenReviewerOptions) {
    this.cache = new TtlCache({
      ttlMs: opts.ttlMs ?? DEFAULT_TTL_MS,
      maxEntries: opts.maxEntries ?? DEFAULT_MAX_ENTRIES,
      ...(opts.now ? { now: opts.now } : {}),
    });
  }

  get cached(): number {
    return this.cache.size;
  }

  async authenticate(token: string): Promise<AuthOutcome> {
    const key = createHash('sha256').update(token, 'utf8').digest('hex');
    let status: TokenReviewStatus;
    try {
      status = await this.cache.getOrLoad(key, () => this.opts.reviews.tokenReview(token));
    } catch (err) {
      // Not cached: the next request asks again. The key is a hash prefix, enough to correlate lines.
      this.opts.log?.warn({ tokenSha256: key.slice(0, 12), err: oneLine((err as Error).message) }, 'TokenReview failed');
      return { status: 503, message: `cannot check the token with the hub's API server: ${oneLine((err as Error).message)}` };
    }
    if (!status.authenticated || !status.user?.username) {
      return {
        status: 401,
        message: `the hub's API server did not accept the token (TokenReview)${status.error ? `: ${oneLine(status.error)}` : ''}`,
      };
    }
    const u = status.user;
    const username = u.username!;
    const caller: GatewayCaller = {
      user: hubName(username),
      groups: (u.groups ?? []).filter((g) => g !== 'system:authenticated').map(hubName),
      ...(u.uid ? { uid: u.uid } : {}),
      ...(u.extra && Object.keys(u.extra).length > 0 ? { extra: u.extra } : {}),
      reviewed: { user: username, groups: u.groups ?? [] },
      source: 'tokenreview',
      name: `kubernetes user "${username}"`,
      clusters: '*',
    };
    return caller;
  }
}
