// TokenReview and SubjectAccessReview against the hub's own API server (`--store kubernetes`), through
// the Kubernetes store's client configuration. Loaded only on that store (like the store itself:
// @kubernetes/client-node is heavy). The token is sent in the review's body and nowhere else: errors
// carry the HTTP code and the API's Status message, never a response body (a TokenReview echoes its spec).
import { ApiException, AuthenticationV1Api, AuthorizationV1Api, type KubeConfig } from '@kubernetes/client-node';
import type { Store } from '../store/store.js';
import { KubernetesStore } from '../store/kubernetes.js';

export interface ReviewedUser {
  username?: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

/** `status` of an authentication.k8s.io/v1 TokenReview. */
export interface TokenReviewStatus {
  authenticated: boolean;
  user?: ReviewedUser;
  error?: string;
}

/** `spec` of an authorization.k8s.io/v1 SubjectAccessReview (resource attributes only). */
export interface SubjectAccessReviewSpec {
  user: string;
  groups: string[];
  uid?: string;
  extra?: Record<string, string[]>;
  resourceAttributes: { verb: string; group: string; resource: string; subresource?: string; name?: string; namespace?: string };
}

/** `status` of an authorization.k8s.io/v1 SubjectAccessReview. */
export interface SubjectAccessReviewStatus {
  allowed: boolean;
  denied?: boolean;
  reason?: string;
  evaluationError?: string;
}

/** The two reviews the gateway asks the hub's API server for. Rejections are one-line errors. */
export interface HubReviews {
  tokenReview(token: string): Promise<TokenReviewStatus>;
  subjectAccessReview(spec: SubjectAccessReviewSpec): Promise<SubjectAccessReviewStatus>;
}

const DEFAULT_TIMEOUT_MS = 10_000;

/** Reviews through the Kubernetes store's kubeconfig, or null for any other store. */
export function hubReviewsOf(store: Store, timeoutMs = DEFAULT_TIMEOUT_MS): HubReviews | null {
  return store instanceof KubernetesStore ? kubeReviews(store.kubeConfig, timeoutMs) : null;
}

export function kubeReviews(kc: KubeConfig, timeoutMs = DEFAULT_TIMEOUT_MS): HubReviews {
  const authn = kc.makeApiClient(AuthenticationV1Api);
  const authz = kc.makeApiClient(AuthorizationV1Api);
  return {
    async tokenReview(token) {
      const r = await bounded('TokenReview', timeoutMs, () =>
        authn.createTokenReview({ body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token } } }),
      );
      const s = r.status;
      return {
        authenticated: s?.authenticated === true,
        ...(s?.user ? { user: { username: s.user.username, uid: s.user.uid, groups: s.user.groups, extra: s.user.extra } } : {}),
        ...(s?.error ? { error: s.error } : {}),
      };
    },
    async subjectAccessReview(spec) {
      const r = await bounded('SubjectAccessReview', timeoutMs, () =>
        authz.createSubjectAccessReview({ body: { apiVersion: 'authorization.k8s.io/v1', kind: 'SubjectAccessReview', spec } }),
      );
      const s = r.status;
      return {
        allowed: s?.allowed === true,
        ...(s?.denied ? { denied: true } : {}),
        ...(s?.reason ? { reason: s.reason } : {}),
        ...(s?.evaluationError ? { evaluationError: s.evaluationError } : {}),
      };
    },
  };
}

/** The call, failed after `timeoutMs`; errors as one line without any response body. */
async function bounded<T>(what: string, timeoutMs: number, call: () => Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: the hub's API server did not answer within ${timeoutMs} ms`)), timeoutMs);
  });
  try {
    return await Promise.race([call(), timeout]);
  } catch (err) {
    if (err instanceof ApiException) {
      const message = statusMessage(err.body);
      throw new Error(`${what}: HTTP ${err.code}${message ? `: ${message}` : ''}`);
    }
    throw err instanceof Error && err.message.startsWith(what)
      ? err
      : new Error(`${what}: ${err instanceof Error ? err.message : String(err)}`);
  } finally {
    clearTimeout(timer);
  }
}

function statusMessage(body: unknown): string | undefined {
  let o: unknown = body;
  if (typeof body === 'string') {
    try {
      o = JSON.parse(body) as unknown;
    } catch {
      return undefined;
    }
  }
  if (o && typeof o === 'object' && (o as { kind?: unknown }).kind === 'Status') {
    const m = (o as { message?: unknown }).message;
    return typeof m === 'string' ? m : undefined;
  }
  return undefined;
}
