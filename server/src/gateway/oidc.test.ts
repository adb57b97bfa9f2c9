// OIDC verification against a real local HTTPS issuer (discovery + JWKS) with keys made by jose.
import https from 'node:https';
import type net from 'node:net';
import { SignJWT, exportJWK, generateKeyPair, type CryptoKey, type JWK, type JWTPayload } from 'jose';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { createCA, issueServerCert } from '../pki/certificates.js';
import { OidcVerifier, checkOidcConfig, peekJwt, usernamePrefixOf, type OidcConfig, type OidcRuntimeOptions } from './oidc.js';

interface Key {
  kid: string;
  privateKey: CryptoKey;
  jwk: JWK;
}

const ca = createCA({ commonName: 'oidc-test-ca' });
const serving = issueServerCert(ca, { commonName: 'issuer', ipAddresses: ['127.0.0.1'] });
let server: https.Server;
let issuer: string;
let keys: Key[] = [];
let discoveryIssuer: string | null = null;
const served = { discovery: 0, jwks: 0 };
let n = 0;
const verifiers: OidcVerifier[] = [];

async function newKey(alg = 'RS256'): Promise<Key> {
  const { privateKey, publicKey } = await generateKeyPair(alg, { extractable: true });
  const kid = `k${++n}`;
  return { kid, privateKey, jwk: { ...(await exportJWK(publicKey)), kid, alg, use: 'sig' } };
}

function sign(claims: JWTPayload, o: { key?: Key; kid?: string; alg?: string; omit?: string[] } = {}): Promise<string> {
  const now = Math.floor(Date.now() / 1000);
  const payload: JWTPayload = { iss: issuer, aud: 'gw', sub: 'alice', iat: now, exp: now + 600, ...claims };
  for (const c of o.omit ?? []) delete payload[c];
  const key = o.key ?? keys[0]!;
  return new SignJWT(payload).setProtectedHeader({ alg: o.alg ?? 'RS256', kid: o.kid ?? key.kid }).sign(key.privateKey);
}

function verifier(extra: Partial<OidcConfig> = {}, runtime: OidcRuntimeOptions = {}): OidcVerifier {
  const v = new OidcVerifier(
    { issuerUrl: issuer, clientId: 'gw', caCert: Buffer.from(ca.certPem), ...extra },
    { refetchIntervalMs: 300, ...runtime },
  );
  verifiers.push(v);
  return v;
}

beforeAll(async () => {
  keys = [await newKey()];
  server = https.createServer({ cert: serving.certPem, key: serving.keyPem }, (req, res) => {
    if (req.url === '/idp/.well-known/openid-configuration') {
      served.discovery++;
      res.end(JSON.stringify({ issuer: discoveryIssuer ?? issuer, jwks_uri: `${issuer}/keys` }));
    } else if (req.url === '/idp/keys') {
      served.jwks++;
      res.end(JSON.stringify({ keys: keys.map((k) => k.jwk) }));
    } else {
      res.statusCode = 404;
      res.end();
    }
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  issuer = `https://127.0.0.1:${(server.address() as net.AddressInfo).port}/idp`;
});

afterEach(() => {
  for (const v of verifiers.splice(0)) v.close();
  discoveryIssuer = null;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
});

describe("OIDC configuration (kube-apiserver's rules)", () => {
  it('checks the flags', () => {
    expect(checkOidcConfig({ issuerUrl: 'http://x', clientId: 'a' })).toMatch(/must be an https:\/\/ URL/);
    expect(checkOidcConfig({ issuerUrl: 'https://x', clientId: '' })).toMatch(/--oidc-client-id is required/);
    expect(checkOidcConfig({ issuerUrl: 'https://x?a=b', clientId: 'a' })).toMatch(/may not hold a query/);
    expect(checkOidcConfig({ issuerUrl: 'https://x', clientId: 'a', signingAlgs: ['HS256'] })).toMatch(/"HS256" is not one of RS256/);
    expect(checkOidcConfig({ issuerUrl: 'https://x', clientId: 'a', signingAlgs: ['RS256', 'ES256'] })).toBeNull();
  });
  it('username prefix: ISSUER# by default, none for email, - for none', () => {
    expect(usernamePrefixOf({ issuerUrl: 'https://x', clientId: 'a' })).toBe('https://x#');
    expect(usernamePrefixOf({ issuerUrl: 'https://x', clientId: 'a', usernameClaim: 'email' })).toBe('');
    expect(usernamePrefixOf({ issuerUrl: 'https://x', clientId: 'a', usernamePrefix: '-' })).toBe('');
    expect(usernamePrefixOf({ issuerUrl: 'https://x', clientId: 'a', usernamePrefix: 'oidc:' })).toBe('oidc:');
  });
  it('peekJwt parses compact JWS only', () => {
    expect(peekJwt('abc')).toBeNull();
    expect(peekJwt('a.b.c')).toBeNull();
    expect(peekJwt('A'.repeat(43))).toBeNull();
  });
});

describe('OidcVerifier', () => {
  it('accepts a good token: discovery, JWKS, prefixes for user and groups', async () => {
    const v = verifier({ groupsClaim: 'groups', groupsPrefix: 'oidc:' });
    const r = await v.verify(await sign({ groups: ['dev', 'ops'] }));
    expect(r).toMatchObject({ ok: true, identity: { user: `${issuer}#alice`, groups: ['oidc:dev', 'oidc:ops'] } });
    // Keys are cached: a second token costs no fetch.
    const jwks = served.jwks;
    expect((await v.verify(await sign({ sub: 'bob' }))).ok).toBe(true);
    expect(served.jwks).toBe(jwks);
  });

  it('refuses: expired, not yet valid, wrong audience, no exp, bad signature, disallowed alg', async () => {
    const v = verifier();
    const foreign = await newKey();
    const now = Math.floor(Date.now() / 1000);
    const cases: [Promise<string>, RegExp][] = [
      [sign({ exp: now - 120 }), /has expired/],
      [sign({ nbf: now + 600 }), /not valid yet/],
      [sign({ aud: 'other' }), /audience is not gw/],
      [sign({}, { omit: ['exp'] }), /no expiry|"exp" claim/],
      [sign({}, { key: foreign, kid: keys[0]!.kid }), /signature does not verify/],
    ];
    for (const [token, why] of cases) {
      const r = await v.verify(await token);
      expect(r.ok).toBe(false);
      expect(!r.ok && r.status).toBe(401);
      expect(!r.ok && r.message).toMatch(why);
    }
    const hs = await new SignJWT({ iss: issuer, aud: 'gw', sub: 'x', exp: now + 60 })
      .setProtectedHeader({ alg: 'HS256' })
      .sign(new Uint8Array(32));
    expect(await v.verify(hs)).toMatchObject({ ok: false, message: expect.stringMatching(/signed with "HS256"; this hub accepts RS256/) });
  });

  it('a small clock skew is tolerated', async () => {
    const v = verifier();
    const now = Math.floor(Date.now() / 1000);
    expect((await v.verify(await sign({ exp: now - 5 }))).ok).toBe(true);
    expect((await v.verify(await sign({ nbf: now + 5 }))).ok).toBe(true);
  });

  it('claims: required claims, email with email_verified, reserved names, groups of the wrong type', async () => {
    const req = verifier({ requiredClaims: { tenant: 'a' } });
    expect(await req.verify(await sign({ tenant: 'b' }))).toMatchObject({
      ok: false,
      message: expect.stringMatching(/claim "tenant" is missing or does not equal/),
    });
    expect((await req.verify(await sign({ tenant: 'a' }))).ok).toBe(true);
    const email = verifier({ usernameClaim: 'email' });
    expect(await email.verify(await sign({ email: 'a@x.io' }))).toMatchObject({ ok: true, identity: { user: 'a@x.io' } });
    expect(await email.verify(await sign({ email: 'a@x.io', email_verified: true }))).toMatchObject({ ok: true });
    expect(await email.verify(await sign({ email: 'a@x.io', email_verified: false }))).toMatchObject({
      ok: false,
      message: expect.stringMatching(/email is not verified/),
    });
    expect(await email.verify(await sign({}))).toMatchObject({ ok: false, message: expect.stringMatching(/no string claim "email"/) });
    const bare = verifier({ usernamePrefix: '-', groupsClaim: 'groups' });
    expect(await bare.verify(await sign({ sub: 'system:admin' }))).toMatchObject({ ok: false, message: expect.stringMatching(/reserved/) });
    expect(await bare.verify(await sign({ groups: ['system:masters'] }))).toMatchObject({
      ok: false,
      message: expect.stringMatching(/group "system:masters" is reserved/),
    });
    expect(await bare.verify(await sign({ groups: 7 }))).toMatchObject({
      ok: false,
      message: expect.stringMatching(/neither a string nor a list/),
    });
    expect(await bare.verify(await sign({ groups: 'one' }))).toMatchObject({ ok: true, identity: { user: 'alice', groups: ['one'] } });
  });

  it('rotation: an unknown kid refetches the JWKS once, rate-limited, and the new key works', async () => {
    const v = verifier({}, { refetchIntervalMs: 400 });
    expect((await v.verify(await sign({}))).ok).toBe(true);
    const fetched = served.jwks;
    const next = await newKey();
    keys = [next, ...keys];
    // Two tokens with unknown kids at once: one refetch, after the interval since the last one.
    const t0 = Date.now();
    const [a, b] = await Promise.all([v.verify(await sign({}, { key: next })), v.verify(await sign({}, { key: next }))]);
    expect([a.ok, b.ok]).toEqual([true, true]);
    expect(served.jwks).toBe(fetched + 1);
    // A made-up kid: at most one more fetch per interval, and a refusal that names the kid.
    const bogus = await v.verify(await sign({}, { kid: 'nope' }));
    expect(bogus).toMatchObject({ ok: false, status: 401, message: 'no key of the issuer matches the token\'s key id "nope"' });
    expect(served.jwks).toBe(fetched + 2);
    expect(Date.now() - t0).toBeGreaterThanOrEqual(350);
    keys = keys.filter((k) => k !== next);
  });

  it('a wrong issuer in the discovery document or an unreachable issuer is 503, not a verdict on the token', async () => {
    discoveryIssuer = 'https://evil.example';
    const v = verifier();
    expect(await v.verify(await sign({}))).toMatchObject({
      ok: false,
      status: 503,
      message: expect.stringMatching(/names issuer "https:\/\/evil.example"/),
    });
    const untrusted = verifier({ caCert: undefined });
    expect(await untrusted.verify(await sign({}))).toMatchObject({
      ok: false,
      status: 503,
      message: expect.stringMatching(/cannot fetch the OIDC issuer's keys/),
    });
  });

  it('isOurs: only tokens whose iss is the configured issuer', async () => {
    const v = verifier();
    expect(v.isOurs(peekJwt(await sign({}))!.payload)).toBe(true);
    expect(v.isOurs(peekJwt(await sign({ iss: 'https://other' }))!.payload)).toBe(false);
  });
});
