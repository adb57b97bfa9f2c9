// Who the gateway found a request to come from (auth.ts decides), or why it refused.

/** The authenticated caller, as the cluster will see them (by impersonation) and as logs name them. */
export interface GatewayCaller {
  user: string;
  groups: string[];
  uid?: string;
  /** Extra attributes (TokenReview): in the hub's SubjectAccessReview, and Impersonate-Extra-* in the cluster. */
  extra?: Record<string, string[]>;
  /**
   * The user and groups as the hub's API server named them (TokenReview), before the cluster:hub: prefix: what
   * the hub's own SubjectAccessReview asks about, so its RBAC (a ServiceAccount subject, a group) matches.
   */
  reviewed?: { user: string; groups: string[] };
  /** Which source authenticated them ('token', 'certificate', 'oidc', 'tokenreview'), and a display name for logs and the per-client limit. */
  source: string;
  name: string;
  /** Clusters the credential itself is limited to ('*': any). */
  clusters: readonly string[] | '*';
}

export interface AuthFailure {
  /** 503: the credential could not be checked (the OIDC issuer or the hub's API server is unreachable). */
  status: 400 | 401 | 403 | 503;
  message: string;
}

export type AuthOutcome = GatewayCaller | AuthFailure;

export function isFailure(o: AuthOutcome): o is AuthFailure {
  return 'status' in o;
}
