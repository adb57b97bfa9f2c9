// The HTTP gateway's hand-off of a caller's identity from the hub to an agent (docs/gateway.md).
//
// The hub's gateway dials GATEWAY_DESTINATION on the cluster's agent (the hub refuses that address
// to every other client) and sends one HTTP/1.1 request over it carrying an identity assertion:
// `base64url(json payload) "." base64url(signature)`, signed with the hub's serving key, plus the
// serving certificate that signed it. The agent believes an assertion only if the certificate chains
// to the hub CA it trusts and is a *serving* certificate (serverAuth: hub users and agents get
// clientAuth-only certificates from the same CA), the signature holds, it names the agent's own
// cluster and the very request it came with (method and target), and it has not expired. So even a
// dial that got past the hub's refusal cannot make the agent impersonate anyone: it would need the
// hub's private key; and an assertion read off the wire is good for that one request only.
import { X509Certificate, createPrivateKey, sign, verify, type KeyObject } from 'node:crypto';

/** The reserved virtual destination the agent serves in process (`.invalid` never resolves: RFC 2606). */
export const GATEWAY_HOST = 'cluster-proxy-gateway.invalid';
export const GATEWAY_DESTINATION = `${GATEWAY_HOST}:443`;
/** Request headers from hub to agent (never from a caller: the hub sets them, the agent strips them). */
export const IDENTITY_HEADER = 'x-cluster-proxy-identity';
export const IDENTITY_SIGNER_HEADER = 'x-cluster-proxy-identity-signer';
/** How long an assertion is good for: it is used within a second of being made. */
export const IDENTITY_TTL_MS = 60_000;
/** Clock skew between hub and agent we tolerate on `iat`. */
const SKEW_MS = 30_000;
const SERVER_AUTH_OID = '1.3.6.1.5.5.7.3.1';
const AUDIENCE = 'cluster-proxy-agent-gateway';

/** Who the caller is, as the agent will impersonate them. */
export interface GatewayIdentity {
  user: string;
  groups: string[];
  uid?: string;
}

interface AssertionPayload extends GatewayIdentity {
  aud: string;
  cluster: string;
  /** The one request it is for: "METHOD /path?query" (a captured assertion is good for nothing else). */
  req: string;
  iat: number;
  exp: number;
}

/** True if `host` (any case, with or without a trailing dot) names the reserved destination. */
export function isGatewayHost(host: string): boolean {
  return host.toLowerCase().replace(/\.$/, '') === GATEWAY_HOST;
}

/** What an assertion is bound to: the request line's method and target. */
export function requestLine(method: string | undefined, target: string | undefined): string {
  return `${method ?? ''} ${target ?? ''}`;
}

/** The two header values the hub sends for `request` (requestLine()): the signed assertion and its signer (DER, base64). */
export function signIdentity(identity: GatewayIdentity, cluster: string, request: string, servingCertPem: string | Buffer, servingKeyPem: string | Buffer, now = Date.now()): { assertion: string; signer: string } {
  const payload: AssertionPayload = { aud: AUDIENCE, cluster, req: request, user: identity.user, groups: identity.groups, ...(identity.uid ? { uid: identity.uid } : {}), iat: now, exp: now + IDENTITY_TTL_MS };
  const body = Buffer.from(JSON.stringify(payload)).toString('base64url');
  const { key, signer } = signingMaterial(servingCertPem, servingKeyPem);
  const sig = sign('sha256', Buffer.from(body), key).toString('base64url');
  return { assertion: `${body}.${sig}`, signer };
}

/** The parsed key and the leaf's DER of the last serving pair: parsed once, not per request (they change only on a reload). */
let lastSigning: { cert: string | Buffer; keyPem: string | Buffer; key: KeyObject; signer: string } | null = null;

function signingMaterial(certPem: string | Buffer, keyPem: string | Buffer): { key: KeyObject; signer: string } {
  const same = (a: string | Buffer, b: string | Buffer): boolean => a === b || (Buffer.isBuffer(a) && Buffer.isBuffer(b) && a.equals(b));
  if (lastSigning && same(lastSigning.cert, certPem) && same(lastSigning.keyPem, keyPem)) return lastSigning;
  // The first certificate of the file is the leaf (a chain may follow it).
  lastSigning = { cert: certPem, keyPem, key: createPrivateKey(keyPem), signer: new X509Certificate(certPem).raw.toString('base64') };
  return lastSigning;
}

/** A signer already checked against a trust bundle: its certificate, validity and whether it passed. */
interface CheckedSigner {
  trust: readonly X509Certificate[];
  cert: X509Certificate;
  notBefore: number;
  notAfter: number;
  error?: string;
}

/** Signers seen lately (the hub replicas' serving certificates): chain and usage are checked once each. */
const checkedSigners = new Map<string, CheckedSigner>();
const CHECKED_SIGNERS_MAX = 32;

function checkSigner(signerB64: string, trustedCas: readonly X509Certificate[]): { checked: CheckedSigner } | { error: string } {
  const known = checkedSigners.get(signerB64);
  // Valid for the same trust bundle only (a CA rollover hands the agent a new one).
  if (known && known.trust === trustedCas) return { checked: known };
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(Buffer.from(signerB64, 'base64'));
  } catch {
    return { error: 'the identity signer is not a certificate' };
  }
  const issuer = trustedCas.find((ca) => cert.checkIssued(ca) && cert.verify(ca.publicKey));
  const error = !issuer ? 'the identity signer is not issued by the hub CA'
    : !(cert.keyUsage ?? []).includes(SERVER_AUTH_OID) ? 'the identity signer is not a hub serving certificate' : undefined;
  const checked: CheckedSigner = { trust: trustedCas, cert, notBefore: Date.parse(cert.validFrom), notAfter: Date.parse(cert.validTo), ...(error ? { error } : {}) };
  if (checkedSigners.size >= CHECKED_SIGNERS_MAX) checkedSigners.delete(checkedSigners.keys().next().value!);
  checkedSigners.set(signerB64, checked);
  return { checked };
}

/** The identity, or why the assertion is not believed for `request` (one line, safe to log: no secrets in it). */
export function verifyIdentity(assertion: string, signerB64: string, trustedCas: readonly X509Certificate[], cluster: string, request: string, now = Date.now()): GatewayIdentity | { error: string } {
  const dot = assertion.indexOf('.');
  if (dot <= 0) return { error: 'malformed identity assertion' };
  const result = checkSigner(signerB64, trustedCas);
  if ('error' in result) return { error: result.error };
  const s = result.checked;
  if (s.error) return { error: s.error };
  if (s.notBefore > now + SKEW_MS || s.notAfter < now) return { error: 'the identity signer is not valid now' };
  const body = assertion.slice(0, dot);
  if (!verify('sha256', Buffer.from(body), s.cert.publicKey, Buffer.from(assertion.slice(dot + 1), 'base64url'))) return { error: 'bad identity signature' };
  let p: Partial<AssertionPayload>;
  try {
    p = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as Partial<AssertionPayload>;
  } catch {
    return { error: 'malformed identity payload' };
  }
  if (p.aud !== AUDIENCE) return { error: 'identity assertion for another audience' };
  if (p.cluster !== cluster) return { error: `identity assertion for cluster ${JSON.stringify(String(p.cluster))}, not ${cluster}` };
  if (p.req !== request) return { error: 'identity assertion for another request' };
  if (typeof p.iat !== 'number' || typeof p.exp !== 'number' || p.exp < now || p.iat > now + SKEW_MS) return { error: 'identity assertion expired or not yet valid' };
  if (typeof p.user !== 'string' || p.user === '' || !Array.isArray(p.groups) || !p.groups.every((g) => typeof g === 'string')) return { error: 'identity assertion without a user' };
  return { user: p.user, groups: p.groups, ...(typeof p.uid === 'string' && p.uid !== '' ? { uid: p.uid } : {}) };
}

/** The certificates of a PEM bundle (the agent's hub CA trust, two CAs during a rollover). */
export function certificatesOf(bundle: string | Buffer): X509Certificate[] {
  const text = bundle.toString();
  return [...text.matchAll(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g)].map((m) => new X509Certificate(m[0]));
}
