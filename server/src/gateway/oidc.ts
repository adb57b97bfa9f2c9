// OIDC ID tokens for the gateway, as kube-apiserver's `--oidc-*` flags define them: the issuer's keys
// from its discovery document (`/.well-known/openid-configuration` → `jwks_uri`), the token's `iss` the
// configured issuer URL exactly, `aud` containing the client id, `exp` required and `nbf` honoured (30 s of
// clock skew), the username from a claim (default `sub`) with kube's prefix rules, groups from a claim,
// required claims, and for the `email` claim kube's `email_verified` rule. Signature checks are jose's
// (a maintained, dependency-free JOSE implementation over WebCrypto): we keep only fetching and rotation.
//
// Keys rotate: a token whose `kid` is not in the cached key set triggers a refetch of the JWKS. Refetches
// are at most one per `refetchIntervalMs` (5 s), so a stream of made-up key ids costs the issuer one
// request per interval; a request that arrives inside the interval waits for the next allowed refetch
// rather than failing, so the first token of a freshly rotated key is accepted. The key set is also
// refetched when older than `keySetMaxAgeMs` (1 h), so a key the issuer withdrew stops being accepted.
import https from 'node:https';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { JSONWebKeySet, JWTPayload, JWTVerifyGetKey, ProtectedHeaderParameters } from 'jose';

type Jose = typeof import('jose');
/** jose, loaded when the first token is verified: a hub without OIDC never needs it (~3.7 MiB of RSS at start). */
let joseModule: Promise<Jose> | undefined;
const loadJose = (): Promise<Jose> => (joseModule ??= import('jose'));

/** What kube-apiserver accepts for --oidc-signing-algs (asymmetric only: never `none` or HMAC). */
export const OIDC_SIGNING_ALGS = ['RS256', 'RS384', 'RS512', 'ES256', 'ES384', 'ES512', 'PS256', 'PS384', 'PS512'] as const;
const DEFAULT_SKEW_SECONDS = 30;
const DEFAULT_REFETCH_INTERVAL_MS = 5_000;
const DEFAULT_KEY_SET_MAX_AGE_MS = 3_600_000;
const DEFAULT_FETCH_TIMEOUT_MS = 10_000;
const MAX_DOCUMENT_BYTES = 1 << 20;
/** Names the gateway keeps for itself and for Kubernetes: an ID token may not claim them. */
const RESERVED = /^(system:|cluster-proxy:)/;

/** The `--oidc-*` flags. */
export interface OidcConfig {
  issuerUrl: string;
  /** The audience (`aud` must contain it). */
  clientId: string;
  /** Default `sub`. */
  usernameClaim?: string;
  /** Unset: `<issuerUrl>#` unless the claim is `email`; `-`: none. */
  usernamePrefix?: string;
  groupsClaim?: string;
  groupsPrefix?: string;
  /** Each claim must be present with exactly this string value. */
  requiredClaims?: Readonly<Record<string, string>>;
  /** PEM bundle to verify the issuer's TLS certificate with (default: the system's roots). */
  caCert?: Buffer;
  /** Default ['RS256']. */
  signingAlgs?: readonly string[];
}

export interface OidcRuntimeOptions {
  log?: Logger;
  /** Clock, ms (tests). */
  now?: () => number;
  clockSkewSeconds?: number;
  refetchIntervalMs?: number;
  keySetMaxAgeMs?: number;
  fetchTimeoutMs?: number;
}

export interface OidcIdentity {
  user: string;
  groups: string[];
}

export type OidcResult = { ok: true; identity: OidcIdentity; expiresAt: number } | { ok: false; status: 401 | 503; message: string };

/** The problem with a configuration, one line, or null. */
export function checkOidcConfig(c: OidcConfig): string | null {
  let url: URL;
  try {
    url = new URL(c.issuerUrl);
  } catch {
    return `--oidc-issuer-url "${c.issuerUrl}" is not a URL`;
  }
  if (url.protocol !== 'https:') return `--oidc-issuer-url must be an https:// URL, got "${c.issuerUrl}"`;
  if (url.search !== '' || url.hash !== '' || url.username !== '' || url.password !== '')
    return `--oidc-issuer-url "${c.issuerUrl}" may not hold a query, a fragment or credentials`;
  if (!c.clientId) return '--oidc-client-id is required with --oidc-issuer-url (it is the audience tokens must carry)';
  if (c.usernameClaim === '') return '--oidc-username-claim may not be empty';
  for (const a of c.signingAlgs ?? []) {
    if (!(OIDC_SIGNING_ALGS as readonly string[]).includes(a))
      return `--oidc-signing-algs: "${a}" is not one of ${OIDC_SIGNING_ALGS.join(', ')}`;
  }
  if (c.signingAlgs && c.signingAlgs.length === 0) return '--oidc-signing-algs names no algorithm';
  for (const k of Object.keys(c.requiredClaims ?? {})) if (k === '') return '--oidc-required-claim needs KEY=VALUE with a non-empty KEY';
  return null;
}

/** kube's rule: `-` means none; unset means `<issuer>#`, except for the `email` claim. */
export function usernamePrefixOf(c: OidcConfig): string {
  const claim = c.usernameClaim ?? 'sub';
  if (c.usernamePrefix === '-') return '';
  if (c.usernamePrefix !== undefined) return c.usernamePrefix;
  return claim === 'email' ? '' : `${c.issuerUrl}#`;
}

/**
 * Header and payload, if the token is a compact JWS at all (no signature check: base64url JSON objects,
 * as jose's decodeProtectedHeader and decodeJwt read them; verify() leaves the checks to jose).
 */
export function peekJwt(token: string): { header: ProtectedHeaderParameters; payload: JWTPayload } | null {
  if (!/^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/.test(token)) return null;
  const [header, payload] = token.split('.').slice(0, 2).map(jsonObjectOf);
  return header && payload ? { header: header as ProtectedHeaderParameters, payload: payload as JWTPayload } : null;
}

function jsonObjectOf(segment: string): Record<string, unknown> | null {
  try {
    const v: unknown = JSON.parse(Buffer.from(segment, 'base64url').toString('utf8'));
    return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

interface KeySet {
  getKey: JWTVerifyGetKey;
  fetchedAt: number;
}

export class OidcVerifier {
  private readonly now: () => number;
  private readonly algs: string[];
  private readonly prefix: string;
  private keys: KeySet | null = null;
  private jwksUri: string | null = null;
  private refreshing: Promise<void> | null = null;
  private lastFetchAt = Number.NEGATIVE_INFINITY;
  private readonly closing = new AbortController();

  constructor(
    readonly config: OidcConfig,
    private readonly opts: OidcRuntimeOptions = {},
  ) {
    const problem = checkOidcConfig(config);
    if (problem) throw new Error(problem);
    this.now = opts.now ?? Date.now;
    this.algs = [...(config.signingAlgs ?? ['RS256'])];
    this.prefix = usernamePrefixOf(config);
  }

  /** Whether `iss` names our issuer (a JWT of another issuer is another authenticator's). */
  isOurs(payload: JWTPayload): boolean {
    return payload.iss === this.config.issuerUrl;
  }

  /** Verifies a token that peekJwt() parsed and isOurs() claimed. */
  async verify(token: string): Promise<OidcResult> {
    const peeked = peekJwt(token);
    if (!peeked) return fail('the token is not a JWT');
    const { header } = peeked;
    if (typeof header.alg !== 'string' || !this.algs.includes(header.alg)) {
      return fail(
        `the token is signed with ${JSON.stringify(header.alg ?? null)}; this hub accepts ${this.algs.join(', ')} (--oidc-signing-algs)`,
      );
    }
    try {
      await this.ensureKeys();
    } catch (err) {
      return { ok: false, status: 503, message: `cannot fetch the OIDC issuer's keys: ${(err as Error).message}` };
    }
    const jose = await loadJose();
    let payload: JWTPayload;
    try {
      ({ payload } = await jose.jwtVerify(token, this.keyLookup, {
        issuer: this.config.issuerUrl,
        audience: this.config.clientId,
        algorithms: this.algs,
        clockTolerance: this.opts.clockSkewSeconds ?? DEFAULT_SKEW_SECONDS,
        requiredClaims: ['exp'],
        currentDate: new Date(this.now()),
      }));
    } catch (err) {
      return this.refusal(jose, err, header);
    }
    const mapped = this.identityOf(payload);
    if ('error' in mapped) return fail(mapped.error);
    return { ok: true, identity: mapped, expiresAt: (payload.exp ?? 0) * 1000 };
  }

  /** Stops refetches in flight and any wait for the next allowed one. */
  close(): void {
    this.closing.abort();
  }

  /** jose's key lookup over the cached set; an unknown key id refetches the set once (rate-limited). */
  private readonly keyLookup: JWTVerifyGetKey = async (header, token) => {
    const { errors } = await loadJose();
    const set = this.keys;
    if (!set) throw new errors.JWKSNoMatchingKey();
    try {
      return await set.getKey(header, token);
    } catch (err) {
      if (!(err instanceof errors.JWKSNoMatchingKey)) throw err;
      await this.refresh();
      return this.keys!.getKey(header, token);
    }
  };

  private async ensureKeys(): Promise<void> {
    if (!this.keys || this.now() - this.keys.fetchedAt > (this.opts.keySetMaxAgeMs ?? DEFAULT_KEY_SET_MAX_AGE_MS)) {
      try {
        await this.refresh();
      } catch (err) {
        // An old key set is better than none while the issuer is away.
        if (!this.keys) throw err;
        this.opts.log?.warn(
          { issuer: this.config.issuerUrl, err: (err as Error).message },
          'OIDC key set refresh failed; keeping the old one',
        );
      }
    }
  }

  /** One refetch at a time, at most one per interval: callers inside the interval wait for it. */
  private refresh(): Promise<void> {
    this.refreshing ??= (async () => {
      const wait = this.lastFetchAt + (this.opts.refetchIntervalMs ?? DEFAULT_REFETCH_INTERVAL_MS) - this.now();
      if (wait > 0) await sleep(wait, undefined, { signal: this.closing.signal });
      this.lastFetchAt = this.now();
      const uri = this.jwksUri ?? (await this.discover());
      let jwks: unknown;
      try {
        jwks = await this.getJson(uri, 'JWKS');
      } catch (err) {
        // Perhaps the issuer moved its keys: discover again next time.
        this.jwksUri = null;
        throw err;
      }
      const getKey = (await loadJose()).createLocalJWKSet(jwks as JSONWebKeySet);
      this.keys = { getKey, fetchedAt: this.now() };
      this.opts.log?.info({ issuer: this.config.issuerUrl, keys: (jwks as JSONWebKeySet).keys.length }, 'OIDC key set fetched');
    })().finally(() => {
      this.refreshing = null;
    });
    return this.refreshing;
  }

  private async discover(): Promise<string> {
    const base = this.config.issuerUrl.replace(/\/$/, '');
    const doc = (await this.getJson(`${base}/.well-known/openid-configuration`, 'discovery document')) as {
      issuer?: unknown;
      jwks_uri?: unknown;
    };
    // As kube: the document must name the configured issuer exactly (OIDC Discovery §4.3).
    if (doc.issuer !== this.config.issuerUrl)
      throw new Error(`the discovery document names issuer ${JSON.stringify(doc.issuer)}, not ${this.config.issuerUrl}`);
    if (typeof doc.jwks_uri !== 'string' || !doc.jwks_uri.startsWith('https://'))
      throw new Error('the discovery document has no https jwks_uri');
    this.jwksUri = doc.jwks_uri;
    return doc.jwks_uri;
  }

  private getJson(url: string, what: string): Promise<unknown> {
    return new Promise((resolve, reject) => {
      const signal = AbortSignal.any([this.closing.signal, AbortSignal.timeout(this.opts.fetchTimeoutMs ?? DEFAULT_FETCH_TIMEOUT_MS)]);
      const req = https.get(
        url,
        { ...(this.config.caCert ? { ca: this.config.caCert } : {}), headers: { accept: 'application/json' }, signal, agent: false },
        (res) => {
          if (res.statusCode !== 200) {
            res.resume();
            reject(new Error(`${what} ${url}: HTTP ${res.statusCode}`));
            return;
          }
          const chunks: Buffer[] = [];
          let size = 0;
          res.on('data', (c: Buffer) => {
            size += c.length;
            if (size > MAX_DOCUMENT_BYTES) req.destroy(new Error(`${what} ${url}: larger than ${MAX_DOCUMENT_BYTES} bytes`));
            else chunks.push(c);
          });
          res.on('end', () => {
            try {
              resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown);
            } catch {
              reject(new Error(`${what} ${url}: not JSON`));
            }
          });
          res.on('error', reject);
        },
      );
      req.on('error', (err) =>
        reject(
          err.name === 'AbortError' || err.name === 'TimeoutError'
            ? new Error(`${what} ${url}: ${this.closing.signal.aborted ? 'shutting down' : 'timed out'}`)
            : new Error(`${what} ${url}: ${err.message}`),
        ),
      );
    });
  }

  private refusal({ errors }: Jose, err: unknown, header: ProtectedHeaderParameters): OidcResult {
    if (err instanceof errors.JWTExpired) return fail('the token has expired');
    if (err instanceof errors.JWTClaimValidationFailed) {
      switch (err.claim) {
        case 'aud':
          return fail(`the token's audience is not ${this.config.clientId} (--oidc-client-id)`);
        case 'iss':
          return fail(`the token is not issued by ${this.config.issuerUrl}`);
        case 'nbf':
          return fail('the token is not valid yet (nbf)');
        case 'exp':
          return fail('the token has no expiry (exp)');
        default:
          return fail(`the token's ${err.claim} claim is invalid: ${err.reason}`);
      }
    }
    if (err instanceof errors.JWKSNoMatchingKey)
      return fail(`no key of the issuer matches the token's key id ${JSON.stringify(header.kid ?? null)}`);
    if (err instanceof errors.JWSSignatureVerificationFailed || err instanceof errors.JWKSMultipleMatchingKeys)
      return fail("the token's signature does not verify");
    if (err instanceof errors.JOSEAlgNotAllowed) return fail(`the token's algorithm ${JSON.stringify(header.alg ?? null)} is not accepted`);
    if (err instanceof errors.JOSEError) return fail(`the token is malformed: ${err.message}`);
    if (err instanceof Error && this.closing.signal.aborted) return { ok: false, status: 503, message: 'the gateway is shutting down' };
    return { ok: false, status: 503, message: `cannot verify the token: ${err instanceof Error ? err.message : String(err)}` };
  }

  private identityOf(payload: JWTPayload): OidcIdentity | { error: string } {
    for (const [k, v] of Object.entries(this.config.requiredClaims ?? {})) {
      if (payload[k] !== v)
        return { error: `the token's claim ${JSON.stringify(k)} is missing or does not equal the required value (--oidc-required-claim)` };
    }
    const claim = this.config.usernameClaim ?? 'sub';
    const name = payload[claim];
    if (typeof name !== 'string' || name === '')
      return { error: `the token has no string claim ${JSON.stringify(claim)} for the username` };
    if (claim === 'email' && 'email_verified' in payload) {
      // kube: if the issuer says whether the address is verified, it must say true.
      if (payload['email_verified'] !== true) return { error: "the token's email is not verified (email_verified is not true)" };
    }
    const user = `${this.prefix}${name}`;
    if (RESERVED.test(user))
      return {
        error: `the username ${JSON.stringify(user)} is reserved (system: and cluster-proxy: names are not taken from ID tokens; set --oidc-username-prefix)`,
      };
    let groups: string[] = [];
    if (this.config.groupsClaim) {
      const g = payload[this.config.groupsClaim];
      if (typeof g === 'string') groups = [g];
      else if (Array.isArray(g) && g.every((x): x is string => typeof x === 'string')) groups = g;
      else if (g !== undefined)
        return { error: `the token's ${JSON.stringify(this.config.groupsClaim)} claim is neither a string nor a list of strings` };
      groups = groups.map((x) => `${this.config.groupsPrefix ?? ''}${x}`);
      const reserved = groups.find((x) => RESERVED.test(x));
      if (reserved)
        return {
          error: `the group ${JSON.stringify(reserved)} is reserved (system: and cluster-proxy: names are not taken from ID tokens; set --oidc-groups-prefix)`,
        };
    }
    return { user, groups };
  }
}

function fail(message: string): OidcResult {
  return { ok: false, status: 401, message };
}
