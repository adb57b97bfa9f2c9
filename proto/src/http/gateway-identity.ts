// The HTTP gateway's hand-off of a caller's identity from the hub to an agent (docs/gateway.md).
//
// The hub's gateway dials GATEWAY_DESTINATION on the cluster's agent (the hub refuses that address
// to every other client) and sends one HTTP/1.1 request over it carrying an identity assertion:
// `base64url(json payload) "." base64url(signature)`, signed with an Ed25519 key the hub made in memory,
// plus the signer: the hub's serving certificate and that key's delegation (the key, valid for an hour,
// signed with the serving key). The agent believes an assertion only if the certificate chains to the
// hub CA it trusts and is a *serving* certificate (serverAuth: hub users and agents get clientAuth-only
// certificates from the same CA), the delegation and the assertion's signatures hold, it names the
// agent's own cluster and the very request it came with (method and target), and neither has expired.
// So even a dial that got past the hub's refusal cannot make the agent impersonate anyone: it would need
// the hub's private key (or the in-memory key it certified); an assertion read off the wire is good for
// that one request only. Certificate, chain and delegation are checked once per signer, not per request.
//
// Over a link whose agent announced CAP_GATEWAY_HMAC (and the hub accepted it), the same payload is
// authenticated instead with an HMAC-SHA256 (the MAC header, no signer) keyed by the link's own TLS
// session: both ends export the same keying material from it (RFC 5705 / RFC 8446 §7.5, linkIdentityKey),
// which nobody outside that TLS session can compute, not a client whose dial got past the hub, not
// another agent, not another hub replica's link. The agent checks a MAC with the key of the link the
// request's dial came in on, so an assertion replayed on another link (another replica, a reconnect) fails.
import { Buffer } from 'node:buffer';
import {
  X509Certificate,
  createHmac,
  createPrivateKey,
  createPublicKey,
  createSecretKey,
  generateKeyPairSync,
  sign,
  timingSafeEqual,
  verify,
  type KeyObject,
} from 'node:crypto';
import type { TLSSocket } from 'node:tls';

/** The reserved virtual destination the agent serves in process (`.invalid` never resolves: RFC 2606). */
export const GATEWAY_HOST = 'cluster-proxy-gateway.invalid';
export const GATEWAY_DESTINATION = `${GATEWAY_HOST}:443`;
/** Request headers from hub to agent (never from a caller: the hub sets them, the agent strips them). */
export const IDENTITY_HEADER = 'x-cluster-proxy-identity';
export const IDENTITY_SIGNER_HEADER = 'x-cluster-proxy-identity-signer';
/** The identity assertion authenticated by the link's key (HMAC) instead of a signature: `base64url(json payload) "." base64url(mac)`. */
export const IDENTITY_MAC_HEADER = 'x-cluster-proxy-identity-mac';
/** The TLS exporter label of the link key (RFC 5705: labels of private use start with "EXPERIMENTAL"). */
const LINK_KEY_LABEL = 'EXPERIMENTAL-cluster-proxy-gateway-identity-key';
const LINK_KEY_BYTES = 32;
/** The exporter's context: which use of the key this is (a later form of the MAC takes another). */
const LINK_KEY_CONTEXT = Buffer.from('identity-mac-v1');
/** How long an assertion is good for: it is used within a second of being made. */
export const IDENTITY_TTL_MS = 60_000;
/** Clock skew between hub and agent we tolerate on `iat`. */
const SKEW_MS = 30_000;
const SERVER_AUTH_OID = '1.3.6.1.5.5.7.3.1';
const AUDIENCE = 'cluster-proxy-agent-gateway';
const DELEGATION_AUDIENCE = 'cluster-proxy-agent-gateway-key';
/** How long the hub's per-request signing key is certified for (renewed at half of it). */
export const DELEGATION_TTL_MS = 60 * 60_000;

/** Who the caller is, as the agent will impersonate them. */
export interface GatewayIdentity {
  user: string;
  groups: string[];
  uid?: string;
  /** Extra attributes (a TokenReview's user.extra): Impersonate-Extra-<key> in the cluster. */
  extra?: Record<string, string[]>;
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

/** The assertion's payload, base64url JSON: for `request` (requestLine()), valid from `now` for IDENTITY_TTL_MS. */
export function identityPayload(identity: GatewayIdentity, cluster: string, request: string, now = Date.now()): string {
  const extra = identity.extra && Object.keys(identity.extra).length > 0 ? { extra: identity.extra } : {};
  const payload: AssertionPayload = {
    aud: AUDIENCE,
    cluster,
    req: request,
    user: identity.user,
    groups: identity.groups,
    ...(identity.uid ? { uid: identity.uid } : {}),
    ...extra,
    iat: now,
    exp: now + IDENTITY_TTL_MS,
  };
  return Buffer.from(JSON.stringify(payload)).toString('base64url');
}

/** The two header values the hub sends for `request` (requestLine()): the signed assertion and its signer. */
export function signIdentity(
  identity: GatewayIdentity,
  cluster: string,
  request: string,
  servingCertPem: string | Buffer,
  servingKeyPem: string | Buffer,
  now = Date.now(),
): { assertion: string; signer: string } {
  return signPayload(identityPayload(identity, cluster, request, now), servingCertPem, servingKeyPem, now);
}

/** signIdentity() for a payload made already (identityPayload()). */
export function signPayload(
  body: string,
  servingCertPem: string | Buffer,
  servingKeyPem: string | Buffer,
  now = Date.now(),
): { assertion: string; signer: string } {
  const { key, signer } = delegatedKey(servingCertPem, servingKeyPem, now);
  const sig = sign(null, Buffer.from(body), key).toString('base64url');
  return { assertion: `${body}.${sig}`, signer };
}

/** The length of signPayload()'s two header values for a payload of `bodyLength`, without signing (a head's size check). */
export function signedLength(
  bodyLength: number,
  servingCertPem: string | Buffer,
  servingKeyPem: string | Buffer,
  now = Date.now(),
): number {
  // An Ed25519 signature is 64 bytes: 86 in base64url.
  return bodyLength + 1 + 86 + delegatedKey(servingCertPem, servingKeyPem, now).signer.length;
}

/**
 * The key a link's two ends share for the identity MAC: keying material exported from its TLS session,
 * or null when the session cannot give one (not TLS, not established, or not TLS 1.3: TLS 1.2's exporter
 * is bound to the handshake only with the extended master secret, which node does not report, so a 1.2
 * link keeps signed identities).
 */
export function linkIdentityKey(socket: Pick<TLSSocket, 'exportKeyingMaterial' | 'getProtocol'>): KeyObject | null {
  try {
    if (socket.getProtocol() !== 'TLSv1.3') return null;
    const material = socket.exportKeyingMaterial(LINK_KEY_BYTES, LINK_KEY_LABEL, LINK_KEY_CONTEXT);
    return material.length === LINK_KEY_BYTES ? createSecretKey(material) : null;
  } catch {
    return null;
  }
}

/** The MAC header's value: a payload (identityPayload()) and its HMAC-SHA256 under the link's key. */
export function macPayload(body: string, key: KeyObject): string {
  return `${body}.${createHmac('sha256', key).update(body).digest('base64url')}`;
}

/**
 * The per-request key: an Ed25519 key made in the hub's memory and certified by its serving key for
 * DELEGATION_TTL_MS. An RSA signature costs the hub about a millisecond; this one, tens of microseconds.
 * The signer header is `<serving certificate, DER base64>.<delegation body>.<delegation signature>`.
 */
let delegation: { cert: string | Buffer; keyPem: string | Buffer; key: KeyObject; signer: string; renewAt: number } | null = null;

function delegatedKey(certPem: string | Buffer, keyPem: string | Buffer, now: number): { key: KeyObject; signer: string } {
  const same = (a: string | Buffer, b: string | Buffer): boolean => a === b || (Buffer.isBuffer(a) && Buffer.isBuffer(b) && a.equals(b));
  if (delegation && same(delegation.cert, certPem) && same(delegation.keyPem, keyPem) && now < delegation.renewAt) return delegation;
  const ephemeral = generateKeyPairSync('ed25519');
  const body = Buffer.from(
    JSON.stringify({
      aud: DELEGATION_AUDIENCE,
      key: ephemeral.publicKey.export({ type: 'spki', format: 'der' }).toString('base64'),
      iat: now,
      exp: now + DELEGATION_TTL_MS,
    }),
  ).toString('base64url');
  const sig = sign('sha256', Buffer.from(body), createPrivateKey(keyPem)).toString('base64url');
  // The first certificate of the file is the leaf (a chain may follow it).
  const leaf = new X509Certificate(certPem).raw.toString('base64');
  // Renewed at half its life, so an agent never sees one close to expiry.
  delegation = { cert: certPem, keyPem, key: ephemeral.privateKey, signer: `${leaf}.${body}.${sig}`, renewAt: now + DELEGATION_TTL_MS / 2 };
  return delegation;
}

/** A signer header already checked against a trust bundle: the delegated key and until when it holds. */
interface CheckedSigner {
  trust: readonly X509Certificate[];
  key?: KeyObject;
  /** The delegation's and the certificate's validity together. */
  notBefore: number;
  notAfter: number;
  error?: string;
}

/** Signers seen lately (hub replicas' delegations): chain, usage and delegation are checked once each. */
const checkedSigners = new Map<string, CheckedSigner>();
const CHECKED_SIGNERS_MAX = 32;

function checkSigner(signerHeader: string, trustedCas: readonly X509Certificate[]): CheckedSigner {
  const known = checkedSigners.get(signerHeader);
  // Valid for the same trust bundle only (a CA rollover hands the agent a new one).
  if (known && known.trust === trustedCas) return known;
  const checked = { trust: trustedCas, ...checkSignerNow(signerHeader, trustedCas) };
  if (checkedSigners.size >= CHECKED_SIGNERS_MAX) checkedSigners.delete(checkedSigners.keys().next().value!);
  checkedSigners.set(signerHeader, checked);
  return checked;
}

function checkSignerNow(signerHeader: string, trustedCas: readonly X509Certificate[]): Omit<CheckedSigner, 'trust'> {
  const bad = (error: string): Omit<CheckedSigner, 'trust'> => ({ notBefore: 0, notAfter: 0, error });
  const [certB64, body, sig, ...rest] = signerHeader.split('.');
  if (!certB64 || !body || !sig || rest.length > 0) return bad('malformed identity signer');
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(Buffer.from(certB64, 'base64'));
  } catch {
    return bad('the identity signer is not a certificate');
  }
  if (!trustedCas.some((ca) => cert.checkIssued(ca) && cert.verify(ca.publicKey)))
    return bad('the identity signer is not issued by the hub CA');
  if (!(cert.keyUsage ?? []).includes(SERVER_AUTH_OID)) return bad('the identity signer is not a hub serving certificate');
  if (!verify('sha256', Buffer.from(body), cert.publicKey, Buffer.from(sig, 'base64url')))
    return bad('bad identity key delegation signature');
  let d: { aud?: unknown; key?: unknown; iat?: unknown; exp?: unknown };
  let key: KeyObject;
  try {
    d = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as typeof d;
    if (d.aud !== DELEGATION_AUDIENCE || typeof d.key !== 'string' || typeof d.iat !== 'number' || typeof d.exp !== 'number')
      return bad('malformed identity key delegation');
    key = createPublicKey({ key: Buffer.from(d.key, 'base64'), format: 'der', type: 'spki' });
  } catch {
    return bad('malformed identity key delegation');
  }
  if (key.asymmetricKeyType !== 'ed25519') return bad('the identity key is not Ed25519');
  return { key, notBefore: Math.max(Date.parse(cert.validFrom), d.iat - SKEW_MS), notAfter: Math.min(Date.parse(cert.validTo), d.exp) };
}

/** The identity, or why the assertion is not believed for `request` (one line, safe to log: no secrets in it). */
export function verifyIdentity(
  assertion: string,
  signerHeader: string,
  trustedCas: readonly X509Certificate[],
  cluster: string,
  request: string,
  now = Date.now(),
): GatewayIdentity | { error: string } {
  const dot = assertion.indexOf('.');
  if (dot <= 0) return { error: 'malformed identity assertion' };
  const s = checkSigner(signerHeader, trustedCas);
  if (s.error || !s.key) return { error: s.error ?? 'malformed identity signer' };
  if (s.notBefore > now + SKEW_MS || s.notAfter < now) return { error: 'the identity signer is not valid now' };
  const body = assertion.slice(0, dot);
  if (!verify(null, Buffer.from(body), s.key, Buffer.from(assertion.slice(dot + 1), 'base64url')))
    return { error: 'bad identity signature' };
  return checkPayload(body, cluster, request, now);
}

const MAC_BYTES = 32;

/**
 * The identity of a MAC header's assertion (macPayload()) checked with `linkKey`, the key of the link the
 * request came in on (null: the link has none, so no MAC is believed), or why it is not believed (one line).
 */
export function verifyLinkIdentity(
  assertion: string,
  linkKey: KeyObject | null,
  cluster: string,
  request: string,
  now = Date.now(),
): GatewayIdentity | { error: string } {
  if (!linkKey) return { error: 'an identity MAC on a link without an identity key' };
  const dot = assertion.indexOf('.');
  if (dot <= 0) return { error: 'malformed identity assertion' };
  const body = assertion.slice(0, dot);
  const mac = assertion.slice(dot + 1);
  const given = Buffer.from(mac, 'base64url');
  // The exact base64url of the MAC only: no second spelling of the same bytes verifies.
  if (given.length !== MAC_BYTES || given.toString('base64url') !== mac) return { error: 'bad identity MAC' };
  if (!timingSafeEqual(given, createHmac('sha256', linkKey).update(body).digest())) return { error: 'bad identity MAC' };
  return checkPayload(body, cluster, request, now);
}

/** An authenticated payload's identity, if it is for this agent's cluster and `request`, now. */
function checkPayload(body: string, cluster: string, request: string, now: number): GatewayIdentity | { error: string } {
  let p: Partial<AssertionPayload>;
  try {
    p = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as Partial<AssertionPayload>;
  } catch {
    return { error: 'malformed identity payload' };
  }
  if (typeof p !== 'object' || p === null) return { error: 'malformed identity payload' };
  if (p.aud !== AUDIENCE) return { error: 'identity assertion for another audience' };
  if (p.cluster !== cluster) return { error: `identity assertion for cluster ${JSON.stringify(String(p.cluster))}, not ${cluster}` };
  if (p.req !== request) return { error: 'identity assertion for another request' };
  if (typeof p.iat !== 'number' || typeof p.exp !== 'number' || p.exp < now || p.iat > now + SKEW_MS)
    return { error: 'identity assertion expired or not yet valid' };
  if (typeof p.user !== 'string' || p.user === '' || !Array.isArray(p.groups) || !p.groups.every((g) => typeof g === 'string'))
    return { error: 'identity assertion without a user' };
  if (p.extra !== undefined && !isExtra(p.extra)) return { error: 'identity assertion with malformed extra attributes' };
  return {
    user: p.user,
    groups: p.groups,
    ...(typeof p.uid === 'string' && p.uid !== '' ? { uid: p.uid } : {}),
    ...(p.extra && Object.keys(p.extra).length > 0 ? { extra: p.extra } : {}),
  };
}

function isExtra(v: unknown): v is Record<string, string[]> {
  return (
    typeof v === 'object' &&
    v !== null &&
    !Array.isArray(v) &&
    Object.entries(v).every(([k, vs]) => k !== '' && Array.isArray(vs) && vs.every((x) => typeof x === 'string'))
  );
}

/** What an HTTP header name may hold (RFC 9110 tchar), lowercase. */
const HEADER_NAME_CHAR = /^[!#$&'*+.^_`|~0-9a-z-]$/;

/**
 * The Impersonate-Extra-<key> headers for `extra`: the key lowercased and, where it holds what an HTTP
 * header name may not, UTF-8 percent-encoded (Kubernetes' rule, so the apiserver reads it back as sent).
 */
export function impersonateExtraHeaders(extra: Record<string, string[]> | undefined): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const [key, values] of Object.entries(extra ?? {})) {
    if (values.length === 0) continue;
    const name = [...key.toLowerCase()]
      .map((c) =>
        HEADER_NAME_CHAR.test(c) ? c : [...Buffer.from(c, 'utf8')].map((b) => `%${b.toString(16).toUpperCase().padStart(2, '0')}`).join(''),
      )
      .join('');
    out[`impersonate-extra-${name}`] = values;
  }
  return out;
}

/** The certificates of a PEM bundle (the agent's hub CA trust, two CAs during a rollover). */
export function certificatesOf(bundle: string | Buffer): X509Certificate[] {
  const text = bundle.toString();
  return [...text.matchAll(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g)].map((m) => new X509Certificate(m[0]));
}
