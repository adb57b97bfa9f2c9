// Who a gateway request comes from: one authenticate(req) over pluggable sources, tried in order;
// the first source that recognises the request's credentials decides (a bad credential is a failure,
// never a fall-through to the next source). There is no anonymous mode: no source, no access.
// Sources, in the order the gateway tries them (access.ts builds the list):
//   hub token     a bearer token shaped like a hub token (43 base64url characters)
//   OIDC          a bearer token that parses as a JWT whose `iss` is the configured issuer (oidc.ts)
//   TokenReview   any other bearer token, on --store kubernetes (token-review.ts)
//   certificate   a client certificate of the hub CA, when no bearer token was sent; its system: and
//                 cluster-proxy: names get the prefix cluster:hub: (hub-names.ts), so the hub's own admin
//                 certificate (O=system:masters) is not cluster-admin in every cluster
// Who may then reach which cluster is authorization.ts.
import type net from 'node:net';
import type tls from 'node:tls';
import { clusterFromSubject } from '../pki/agent-identity.js';
import { looksLikeHubToken, tokenAllowsCluster, type TokenStore } from '../fleet/tokens.js';
import { tokenFromHeader } from '../http/bearer-token.js';
import { certificatePrincipal } from '../http/principal.js';
import { oneLine } from '../http/text.js';
import { hubName } from './hub-names.js';
import { peekJwt, type OidcVerifier } from './oidc.js';
import type { TokenReviewer } from './token-review.js';
import { isFailure, type AuthFailure, type AuthOutcome, type GatewayCaller } from './caller.js';

export { isFailure, type AuthFailure, type AuthOutcome, type GatewayCaller };

/** What authentication reads of a request: its headers (node's headersDistinct) and its connection (a client certificate). */
export interface AuthRequest {
  headersDistinct: Readonly<Record<string, string[] | undefined>>;
  socket: net.Socket;
}

/** One way to authenticate. null: this request carries no credential of this kind. */
export interface AuthSource {
  readonly name: string;
  /** The bearer tokens it takes, for the 401 answers ("hub token", "OIDC ID token", …); absent: none. */
  readonly bearer?: string;
  authenticate(req: AuthRequest): AuthOutcome | null | Promise<AuthOutcome | null>;
}

/** The request's bearer token; call after authenticate() checked the header (null: none or not Bearer). */
export function bearerToken(req: AuthRequest): string | null {
  const values = req.headersDistinct['authorization'];
  if (!values || values.length !== 1 || !/^Bearer /i.test(values[0]!)) return null;
  return tokenFromHeader(values[0]!);
}

/** Tries the sources in order; none applies → 401. */
export async function authenticate(req: AuthRequest, sources: readonly AuthSource[]): Promise<AuthOutcome> {
  const kinds = sources.flatMap((s) => (s.bearer ? [s.bearer] : []));
  const values = req.headersDistinct['authorization'];
  if (values && values.length > 1) return { status: 400, message: 'more than one Authorization header' };
  const header = values?.[0];
  if (header !== undefined) {
    if (!/^Bearer /i.test(header))
      return { status: 401, message: `unsupported Authorization scheme: use Bearer <${kinds[0] ?? 'hub token'}>` };
    if (tokenFromHeader(header) === null) return { status: 401, message: 'the Authorization header holds no bearer token' };
  }
  for (const s of sources) {
    const outcome = await s.authenticate(req);
    if (outcome) return outcome;
  }
  if (header !== undefined) {
    // A bearer token no source took as its own.
    return {
      status: 401,
      message:
        kinds.length <= 1
          ? 'the token is invalid, expired or revoked'
          : `the token is neither ${kinds.map((k) => `${/^[aeiouAEIOU]/.test(k) ? 'an' : 'a'} ${k}`).join(' nor ')}`,
    };
  }
  const tlsSocket = req.socket as tls.TLSSocket;
  const note =
    tlsSocket.getPeerCertificate && Object.keys(tlsSocket.getPeerCertificate()).length > 0 && !tlsSocket.authorized
      ? ` (the client certificate was not accepted: ${oneLine(String(tlsSocket.authorizationError ?? 'not verified'))})`
      : '';
  return {
    status: 401,
    message: `no credentials: present a client certificate of the hub CA or send Authorization: Bearer <${kinds.join(' | ') || 'hub token'}>${note}`,
  };
}

/** Hub tokens (`cluster-proxy token issue`): user `cluster-proxy:token:<name>`, uid the token id. */
export function hubTokenSource(tokens: TokenStore, opts: { onlyHubShaped?: boolean } = {}): AuthSource {
  return {
    name: 'token',
    bearer: 'hub token',
    authenticate(req) {
      const token = bearerToken(req);
      if (token === null) return null;
      // With other bearer sources behind it, only tokens shaped like ours are ours.
      if (opts.onlyHubShaped && !looksLikeHubToken(token)) return null;
      const p = tokens.verify(token);
      if (!p) return { status: 401, message: 'the token is invalid, expired or revoked' };
      // Namespaced, so a token can never pose as a certificate's user or a cluster's own user.
      return {
        user: `cluster-proxy:token:${p.name}`,
        groups: ['cluster-proxy:tokens'],
        uid: p.id,
        source: 'token',
        name: `token "${p.name}" (${p.id})`,
        clusters: p.clusters,
      };
    },
  };
}

/**
 * OIDC ID tokens: bearer tokens that parse as JWTs. A JWT of another issuer is refused here unless
 * `otherIssuers` is 'pass' (then TokenReview, next, judges it: the hub's service-account tokens are JWTs).
 */
export function oidcSource(verifier: OidcVerifier, opts: { otherIssuers: 'refuse' | 'pass' }): AuthSource {
  return {
    name: 'oidc',
    bearer: 'OIDC ID token',
    async authenticate(req) {
      const token = bearerToken(req);
      const jwt = token === null ? null : peekJwt(token);
      if (!jwt) return null;
      if (!verifier.isOurs(jwt.payload)) {
        if (opts.otherIssuers === 'pass') return null;
        return { status: 401, message: `the token is not issued by ${verifier.config.issuerUrl} (--oidc-issuer-url)` };
      }
      const r = await verifier.verify(token!);
      if (!r.ok) return { status: r.status, message: r.message };
      return { user: r.identity.user, groups: r.identity.groups, source: 'oidc', name: `oidc user "${r.identity.user}"`, clusters: '*' };
    },
  };
}

/** Any other bearer token, judged by the hub's API server (TokenReview). */
export function tokenReviewSource(reviewer: TokenReviewer): AuthSource {
  return {
    name: 'tokenreview',
    bearer: "token of the hub's Kubernetes API",
    authenticate(req) {
      const token = bearerToken(req);
      return token === null ? null : reviewer.authenticate(token);
    },
  };
}

/** Client certificates of the hub CA: CN is the user, each O a group. Agent certificates are refused. */
export function certificateSource(): AuthSource {
  return {
    name: 'certificate',
    authenticate(req) {
      // A bearer token decides (the sources before this one); one none of them took is a failure, not a cue to try the certificate.
      if (req.headersDistinct['authorization'] !== undefined) return null;
      const s = req.socket as tls.TLSSocket;
      if (typeof s.getPeerCertificate !== 'function' || !s.authorized) return null;
      // One TLS connection carries many keep-alive requests: its certificate is read once.
      let outcome = byConnection.get(s);
      if (outcome === undefined) byConnection.set(s, (outcome = certificateCaller(s.getPeerCertificate())));
      return outcome;
    },
  };
}

const byConnection = new WeakMap<tls.TLSSocket, AuthOutcome | null>();

function certificateCaller(cert: tls.PeerCertificate | undefined): AuthOutcome | null {
  if (!cert || Object.keys(cert).length === 0) return null;
  if (clusterFromSubject(cert.subject)) return { status: 403, message: 'agent certificates may not use the gateway' };
  const principal = certificatePrincipal(cert.subject?.CN);
  const o = cert.subject?.O as string | string[] | undefined;
  const groups = (Array.isArray(o) ? o : o ? [o] : []).filter((g) => g !== '').map(hubName);
  return { user: hubName(principal.name), groups, source: 'certificate', name: `certificate "${principal.name}"`, clusters: '*' };
}

/** Whether the credential may reach `cluster` (a token is limited to the clusters it was issued for). */
export function callerMayReach(caller: GatewayCaller, cluster: string): boolean {
  return tokenAllowsCluster(caller, cluster);
}
