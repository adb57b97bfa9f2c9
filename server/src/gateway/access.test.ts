// The gateway's sources in order, TokenReview, SubjectAccessReview and their caches, with a stand-in
// for the hub's API server reviews (the e2e test has the real HTTP round trips).
import type http from 'node:http';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { SignJWT } from 'jose';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TokenStore } from '../fleet/tokens.js';
import { buildGatewayAccess, type GatewayAccess } from './access.js';
import { authenticate, isFailure, type AuthOutcome, type GatewayCaller } from './auth.js';
import { PROXY_ACCESS } from './authorization.js';
import type { HubReviews, SubjectAccessReviewSpec, SubjectAccessReviewStatus, TokenReviewStatus } from './kube-reviews.js';
import { TtlCache } from './ttl-cache.js';

const log = pino({ level: 'silent' });
let dir: string;
let tokens: TokenStore;
let hubToken: string;

beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'gw-access-'));
  tokens = await TokenStore.open(path.join(dir, 'tokens.json'));
  hubToken = (await tokens.issue({ name: 'bob', clusters: ['c1'] })).token;
});
afterAll(() => rm(dir, { recursive: true, force: true }));

function request(authorization?: string | string[]): http.IncomingMessage {
  const values = authorization === undefined ? undefined : Array.isArray(authorization) ? authorization : [authorization];
  return {
    headers: values ? { authorization: values.join(', ') } : {},
    headersDistinct: values ? { authorization: values } : {},
    socket: {},
  } as unknown as http.IncomingMessage;
}

class FakeReviews implements HubReviews {
  tokenReviews = 0;
  sars: SubjectAccessReviewSpec[] = [];
  users = new Map<string, TokenReviewStatus['user']>();
  allow = new Set<string>();
  down = false;
  tokenReview(token: string): Promise<TokenReviewStatus> {
    this.tokenReviews++;
    if (this.down) return Promise.reject(new Error('TokenReview: connect ECONNREFUSED'));
    const user = this.users.get(token);
    return Promise.resolve(user ? { authenticated: true, user } : { authenticated: false, error: 'invalid bearer token' });
  }
  subjectAccessReview(spec: SubjectAccessReviewSpec): Promise<SubjectAccessReviewStatus> {
    this.sars.push(spec);
    if (this.down) return Promise.reject(new Error('SubjectAccessReview: HTTP 500'));
    return Promise.resolve(
      this.allow.has(`${spec.user}/${spec.resourceAttributes.name}`)
        ? { allowed: true }
        : spec.user === 'mallory'
          ? { allowed: false, denied: true, reason: 'mallory is banned' }
          : { allowed: false },
    );
  }
}

const jwt = (iss: string): Promise<string> =>
  new SignJWT({ iss, sub: 'x', aud: 'gw', exp: Math.floor(Date.now() / 1000) + 60 })
    .setProtectedHeader({ alg: 'HS256' })
    .sign(new Uint8Array(32));

describe('gateway access: the sources in order', () => {
  it('embedded store, no OIDC: hub tokens and certificates, scope authorization, the old messages', async () => {
    const a = await buildGatewayAccess({}, { tokens, log });
    expect(a.summary).toEqual({ authentication: ['token', 'certificate'], authorizationMode: 'scope' });
    expect(await authenticate(request(`Bearer ${hubToken}`), a.sources)).toMatchObject({
      user: 'cluster-proxy:token:bob',
      clusters: ['c1'],
    });
    expect(await authenticate(request('Bearer nope'), a.sources)).toEqual({
      status: 401,
      message: 'the token is invalid, expired or revoked',
    });
    expect(await authenticate(request(), a.sources)).toEqual({
      status: 401,
      message: 'no credentials: present a client certificate of the hub CA or send Authorization: Bearer <hub token>',
    });
    expect(await authenticate(request('Basic dTpw'), a.sources)).toEqual({
      status: 401,
      message: 'unsupported Authorization scheme: use Bearer <hub token>',
    });
    expect(await authenticate(request(['Bearer a', 'Bearer b']), a.sources)).toMatchObject({ status: 400 });
    const bob = (await authenticate(request(`Bearer ${hubToken}`), a.sources)) as GatewayCaller;
    expect(await a.authorizer.authorize(bob, 'c1')).toEqual({ allowed: true });
    expect(await a.authorizer.authorize(bob, 'c2')).toEqual({
      allowed: false,
      status: 403,
      message: expect.stringMatching(/^token "bob" \([0-9a-f]{16}\) may not reach cluster c2$/),
    });
    a.close();
  });

  it("OIDC without TokenReview: a JWT of another issuer is refused, a non-JWT is nobody's", async () => {
    const a = await buildGatewayAccess({ oidc: { issuerUrl: 'https://issuer.example', clientId: 'gw' } }, { tokens, log });
    expect(a.summary['authentication']).toEqual(['token', 'oidc', 'certificate']);
    expect(await authenticate(request(`Bearer ${await jwt('https://other.example')}`), a.sources)).toEqual({
      status: 401,
      message: 'the token is not issued by https://issuer.example (--oidc-issuer-url)',
    });
    expect(await authenticate(request('Bearer not-a-jwt'), a.sources)).toEqual({
      status: 401,
      message: 'the token is neither a hub token nor an OIDC ID token',
    });
    expect(await authenticate(request(), a.sources)).toMatchObject({ message: /Bearer <hub token \| OIDC ID token>$/ });
    // Still a hub token when shaped like one.
    expect(await authenticate(request(`Bearer ${hubToken}`), a.sources)).toMatchObject({ source: 'token' });
    expect(await authenticate(request(`Bearer ${'A'.repeat(43)}`), a.sources)).toEqual({
      status: 401,
      message: 'the token is invalid, expired or revoked',
    });
    a.close();
  });

  it('--store kubernetes: other tokens go to TokenReview (JWTs of other issuers too), cached by hash; SAR authorization', async () => {
    const reviews = new FakeReviews();
    reviews.users.set('sa-token', {
      username: 'system:serviceaccount:team:ci',
      uid: 'u-1',
      groups: ['system:serviceaccounts', 'system:serviceaccounts:team', 'system:authenticated', 'devs'],
      extra: { 'authentication.kubernetes.io/pod-name': ['p'] },
    });
    const a = await buildGatewayAccess(
      { oidc: { issuerUrl: 'https://issuer.example', clientId: 'gw' } },
      { tokens, log, hubReviews: () => Promise.resolve(reviews) },
    );
    expect(a.summary).toMatchObject({
      authentication: ['token', 'oidc', 'tokenreview', 'certificate'],
      authorizationMode: 'subjectaccessreview',
    });
    const sa = await authenticate(request('Bearer sa-token'), a.sources);
    expect(sa).toEqual({
      user: 'cluster:hub:system:serviceaccount:team:ci',
      groups: ['cluster:hub:system:serviceaccounts', 'cluster:hub:system:serviceaccounts:team', 'devs'],
      uid: 'u-1',
      extra: { 'authentication.kubernetes.io/pod-name': ['p'] },
      reviewed: {
        user: 'system:serviceaccount:team:ci',
        groups: ['system:serviceaccounts', 'system:serviceaccounts:team', 'system:authenticated', 'devs'],
      },
      source: 'tokenreview',
      name: 'kubernetes user "system:serviceaccount:team:ci"',
      clusters: '*',
    });
    await authenticate(request('Bearer sa-token'), a.sources);
    expect(reviews.tokenReviews).toBe(1);
    const otherJwt = await jwt('https://kubernetes.default.svc');
    expect(await authenticate(request(`Bearer ${otherJwt}`), a.sources)).toEqual({
      status: 401,
      message: "the hub's API server did not accept the token (TokenReview): invalid bearer token",
    });
    expect(reviews.tokenReviews).toBe(2);
    // Hub tokens never reach the API server.
    await authenticate(request(`Bearer ${'A'.repeat(43)}`), a.sources);
    expect(reviews.tokenReviews).toBe(2);

    // Authorization: SAR for the TokenReview user as the API server named it (its RBAC binds those names), cached;
    // the hub token by its scope alone.
    const caller = sa as GatewayCaller;
    reviews.allow.add('system:serviceaccount:team:ci/c1');
    expect(await a.authorizer.authorize(caller, 'c1')).toEqual({ allowed: true });
    expect(await a.authorizer.authorize(caller, 'c1')).toEqual({ allowed: true });
    expect(reviews.sars).toHaveLength(1);
    expect(reviews.sars[0]).toEqual({
      user: 'system:serviceaccount:team:ci',
      groups: ['system:serviceaccounts', 'system:serviceaccounts:team', 'system:authenticated', 'devs'],
      uid: 'u-1',
      extra: caller.extra,
      resourceAttributes: { ...PROXY_ACCESS, name: 'c1' },
    });
    const denied = await a.authorizer.authorize(caller, 'c2');
    expect(denied).toEqual({
      allowed: false,
      status: 403,
      message:
        'kubernetes user "system:serviceaccount:team:ci" may not reach cluster c2: the hub\'s RBAC does not allow get on managedclusters/proxy "c2" (cluster.open-cluster-management.io)',
    });
    const mallory: GatewayCaller = { user: 'mallory', groups: [], source: 'oidc', name: 'oidc user "mallory"', clusters: '*' };
    expect(await a.authorizer.authorize(mallory, 'c1')).toMatchObject({ status: 403, message: /: mallory is banned$/ });
    const bob = (await authenticate(request(`Bearer ${hubToken}`), a.sources)) as GatewayCaller;
    const before = reviews.sars.length;
    expect(await a.authorizer.authorize(bob, 'c1')).toEqual({ allowed: true });
    expect(await a.authorizer.authorize(bob, 'c2')).toMatchObject({ allowed: false, status: 403 });
    expect(reviews.sars.length).toBe(before);

    // The API server away: 503 for both, nothing cached.
    reviews.down = true;
    expect(await authenticate(request('Bearer other'), a.sources)).toEqual({
      status: 503,
      message: "cannot check the token with the hub's API server: TokenReview: connect ECONNREFUSED",
    });
    expect(await a.authorizer.authorize({ ...caller, reviewed: { user: 'someone', groups: [] } }, 'c1')).toMatchObject({
      allowed: false,
      status: 503,
    });
    a.close();
  });

  it("subjectaccessreview without the hub's API server is a configuration error", async () => {
    await expect(buildGatewayAccess({ authorization: 'subjectaccessreview' }, { tokens, log })).rejects.toThrow(
      /needs the hub's Kubernetes API/,
    );
    const scoped: GatewayAccess = await buildGatewayAccess(
      { authorization: 'scope' },
      { tokens, log, hubReviews: () => Promise.resolve(new FakeReviews()) },
    );
    expect(scoped.summary).toMatchObject({ authorizationMode: 'scope', authentication: ['token', 'tokenreview', 'certificate'] });
  });

  it('a failure is never a fall-through: a bad hub-shaped token with OIDC and TokenReview behind it is 401 at once', async () => {
    const reviews = new FakeReviews();
    const a = await buildGatewayAccess({}, { tokens, log, hubReviews: () => Promise.resolve(reviews) });
    const r: AuthOutcome = await authenticate(request(`Bearer ${'B'.repeat(43)}`), a.sources);
    expect(isFailure(r) && r.status).toBe(401);
    expect(reviews.tokenReviews).toBe(0);
  });
});

describe('TtlCache', () => {
  it('expires, stays bounded, shares concurrent loads and does not cache failures', async () => {
    let now = 0;
    const c = new TtlCache<number>({ ttlMs: 100, maxEntries: 2, now: () => now });
    c.set('a', 1);
    c.set('b', 2);
    c.set('c', 3);
    expect([c.get('a'), c.get('b'), c.get('c'), c.size]).toEqual([undefined, 2, 3, 2]);
    now = 100;
    expect(c.get('b')).toBeUndefined();
    let loads = 0;
    const load = (): Promise<number> => new Promise((r) => setTimeout(() => r(++loads), 10));
    expect(await Promise.all([c.getOrLoad('x', load), c.getOrLoad('x', load)])).toEqual([1, 1]);
    expect(await c.getOrLoad('x', load)).toBe(1);
    await expect(c.getOrLoad('y', () => Promise.reject(new Error('down')))).rejects.toThrow('down');
    expect(await c.getOrLoad('y', load)).toBe(2);
  });
});
