// Who a gateway request comes from: one authenticate(req) over pluggable sources, tried in order;
// the first source that recognises the request's credentials decides (a bad credential is a failure,
// never a fall-through to the next source). There is no anonymous mode: no source, no access.
// Sources now: hub bearer tokens (`Authorization: Bearer`) and hub client certificates. OIDC and
// TokenReview will be sources too; SubjectAccessReview belongs to authorization, after this.
import type http from 'node:http';
import type tls from 'node:tls';
import { clusterFromSubject } from '../pki/agent-identity.js';
import { tokenAllowsCluster, type TokenStore } from '../fleet/tokens.js';
import { tokenFromHeader } from '../dataplane/connect/request.js';
import { certificatePrincipal, oneLine } from '../dataplane/connect/responses.js';

/** The authenticated caller, as the cluster will see them (by impersonation) and as logs name them. */
export interface GatewayCaller {
  user: string;
  groups: string[];
  uid?: string;
  /** Which source authenticated them, and a display name for logs and the per-client limit. */
  source: string;
  name: string;
  /** Clusters the credential itself is limited to ('*': any). */
  clusters: readonly string[] | '*';
}

export interface AuthFailure {
  status: 400 | 401 | 403;
  message: string;
}

export type AuthOutcome = GatewayCaller | AuthFailure;

/** One way to authenticate. null: this request carries no credential of this kind. */
export interface AuthSource {
  readonly name: string;
  authenticate(req: http.IncomingMessage): AuthOutcome | null | Promise<AuthOutcome | null>;
}

export function isFailure(o: AuthOutcome): o is AuthFailure {
  return 'status' in o;
}

/** Tries the sources in order; none applies → 401. */
export async function authenticate(req: http.IncomingMessage, sources: readonly AuthSource[]): Promise<AuthOutcome> {
  for (const s of sources) {
    const outcome = await s.authenticate(req);
    if (outcome) return outcome;
  }
  const tlsSocket = req.socket as tls.TLSSocket;
  const note = tlsSocket.getPeerCertificate && Object.keys(tlsSocket.getPeerCertificate()).length > 0 && !tlsSocket.authorized
    ? ` (the client certificate was not accepted: ${oneLine(String(tlsSocket.authorizationError ?? 'not verified'))})` : '';
  return { status: 401, message: `no credentials: present a client certificate of the hub CA or send Authorization: Bearer <hub token>${note}` };
}

/** Hub tokens (`cluster-proxy token issue`): user `cluster-proxy:token:<name>`, uid the token id. */
export function hubTokenSource(tokens: TokenStore): AuthSource {
  return {
    name: 'token',
    authenticate(req) {
      const values = req.headersDistinct['authorization'];
      if (!values || values.length === 0) return null;
      if (values.length > 1) return { status: 400, message: 'more than one Authorization header' };
      const value = values[0]!;
      if (!/^Bearer /i.test(value)) return { status: 401, message: 'unsupported Authorization scheme: use Bearer <hub token>' };
      const token = tokenFromHeader(value);
      const p = token === null ? null : tokens.verify(token);
      if (!p) return { status: 401, message: 'the token is invalid, expired or revoked' };
      // Namespaced, so a token can never pose as a certificate's user or a cluster's own user.
      return { user: `cluster-proxy:token:${p.name}`, groups: ['cluster-proxy:tokens'], uid: p.id, source: 'token', name: `token "${p.name}" (${p.id})`, clusters: p.clusters };
    },
  };
}

/** Client certificates of the hub CA: CN is the user, each O a group. Agent certificates are refused. */
export function certificateSource(): AuthSource {
  return {
    name: 'certificate',
    authenticate(req) {
      const s = req.socket as tls.TLSSocket;
      if (typeof s.getPeerCertificate !== 'function' || !s.authorized) return null;
      const cert = s.getPeerCertificate();
      if (!cert || Object.keys(cert).length === 0) return null;
      if (clusterFromSubject(cert.subject)) return { status: 403, message: 'agent certificates may not use the gateway' };
      const principal = certificatePrincipal(cert.subject?.CN);
      const o = cert.subject?.O as string | string[] | undefined;
      const groups = (Array.isArray(o) ? o : o ? [o] : []).filter((g) => g !== '');
      return { user: principal.name, groups, source: 'certificate', name: `certificate "${principal.name}"`, clusters: '*' };
    },
  };
}

/** Whether the credential may reach `cluster` (a token is limited to the clusters it was issued for). */
export function callerMayReach(caller: GatewayCaller, cluster: string): boolean {
  return tokenAllowsCluster(caller, cluster);
}
