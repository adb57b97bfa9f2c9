// The gateway's pure parts: the request target, and the hub-signed identity the agent believes.
import { X509Certificate, generateKeyPairSync, sign } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  DELEGATION_TTL_MS,
  GATEWAY_AGENT_MAX_HEAD_BYTES,
  IDENTITY_TTL_MS,
  certificatesOf,
  impersonateExtraHeaders,
  requestLine,
  signIdentity,
  verifyIdentity,
} from '@cluster-proxy/proto';
import { createCA, issueClientCert, issueServerCert } from '../pki/certificates.js';
import { headTooLarge, impersonatedIdentity } from './forward.js';
import { parseGatewayTarget } from './paths.js';

describe('parseGatewayTarget', () => {
  it('strips the cluster and keeps the rest, query included', () => {
    expect(parseGatewayTarget('/c1/api/v1/pods?limit=1&x=%2F')).toEqual({ cluster: 'c1', path: '/api/v1/pods?limit=1&x=%2F' });
    expect(parseGatewayTarget('/c1')).toEqual({ cluster: 'c1', path: '/' });
    expect(parseGatewayTarget('/c1/')).toEqual({ cluster: 'c1', path: '/' });
    expect(parseGatewayTarget('/c1/api/')).toEqual({ cluster: 'c1', path: '/api/' });
  });
  it.each([
    ['/c1/a/../b', /dot segments/],
    ['/c1/a/%2E%2e/b', /dot segments/],
    ['/c1/./b', /dot segments/],
    ['/c1/a%2fb', /encoded slashes/],
    ['/c1/a%5Cb', /encoded slashes/],
    ['/c1/a\\b', /backslashes/],
    ['/c1//b', /empty path segments/],
    ['/', /cluster name/],
    ['//x', /cluster name/],
    ['*', /must be \/CLUSTER/],
    ['http://evil/c1/x', /must be \/CLUSTER/],
    ['/C1/x', /not a cluster name/],
    ['/c1/a%zz', /malformed percent/],
    ['/c1/a#b', /fragment/],
  ])('refuses %s', (target, why) => {
    const r = parseGatewayTarget(target);
    expect('error' in r && r.error).toMatch(why);
  });
});

describe('gateway identity assertion', () => {
  const ca = createCA({ commonName: 'hub-ca' });
  const serving = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'] });
  const trust = certificatesOf(ca.certPem);
  const who = { user: 'alice', groups: ['team-a'], uid: 'u1' };
  const GET = requestLine('GET', '/api/v1/namespaces/default/pods?limit=1');

  it('round-trips for the right cluster within its lifetime', () => {
    const a = signIdentity(who, 'c1', GET, serving.certPem, serving.keyPem);
    expect(verifyIdentity(a.assertion, a.signer, trust, 'c1', GET)).toEqual(who);
  });
  it('carries extra attributes, refuses malformed ones, and makes their Impersonate-Extra-* headers', () => {
    const withExtra = { ...who, extra: { scopes: ['view', 'edit'], 'acme.com/Project Ü': ['x'] } };
    const a = signIdentity(withExtra, 'c1', GET, serving.certPem, serving.keyPem);
    const got = verifyIdentity(a.assertion, a.signer, trust, 'c1', GET);
    expect(got).toEqual(withExtra);
    expect(impersonateExtraHeaders(withExtra.extra)).toEqual({
      'impersonate-extra-scopes': ['view', 'edit'],
      'impersonate-extra-acme.com%2Fproject%20%C3%BC': ['x'],
    });
    expect(impersonateExtraHeaders(undefined)).toEqual({});
    const bad = signIdentity({ ...who, extra: { scopes: [1 as unknown as string] } }, 'c1', GET, serving.certPem, serving.keyPem);
    expect(verifyIdentity(bad.assertion, bad.signer, trust, 'c1', GET)).toEqual({
      error: 'identity assertion with malformed extra attributes',
    });
  });
  it('is good for its one request only: another method or target is refused', () => {
    const a = signIdentity(who, 'c1', GET, serving.certPem, serving.keyPem);
    expect(verifyIdentity(a.assertion, a.signer, trust, 'c1', requestLine('DELETE', '/api/v1/namespaces/default/pods?limit=1'))).toEqual({
      error: 'identity assertion for another request',
    });
    expect(verifyIdentity(a.assertion, a.signer, trust, 'c1', requestLine('GET', '/api/v1/secrets'))).toEqual({
      error: 'identity assertion for another request',
    });
  });
  it('refuses another cluster, an expired one, a tampered payload', () => {
    const a = signIdentity(who, 'c1', GET, serving.certPem, serving.keyPem);
    expect(verifyIdentity(a.assertion, a.signer, trust, 'c2', GET)).toEqual({ error: expect.stringMatching(/for cluster "c1", not c2/) });
    expect(verifyIdentity(a.assertion, a.signer, trust, 'c1', GET, Date.now() + IDENTITY_TTL_MS + 1000)).toEqual({
      error: expect.stringMatching(/expired/),
    });
    const [body, sig] = a.assertion.split('.');
    const forged = Buffer.from(
      JSON.stringify({ ...JSON.parse(Buffer.from(body!, 'base64url').toString()), user: 'system:admin' }),
    ).toString('base64url');
    expect(verifyIdentity(`${forged}.${sig}`, a.signer, trust, 'c1', GET)).toEqual({ error: 'bad identity signature' });
  });
  it("refuses a signer that is a hub user's client certificate, or from another CA", () => {
    const client = issueClientCert(ca, { commonName: 'mallory' });
    const byClient = signIdentity(who, 'c1', GET, client.certPem, client.keyPem);
    expect(verifyIdentity(byClient.assertion, byClient.signer, trust, 'c1', GET)).toEqual({
      error: 'the identity signer is not a hub serving certificate',
    });
    const other = createCA({ commonName: 'other' });
    const otherServing = issueServerCert(other, { commonName: 'hub', dnsNames: ['localhost'] });
    const byOther = signIdentity(who, 'c1', GET, otherServing.certPem, otherServing.keyPem);
    expect(verifyIdentity(byOther.assertion, byOther.signer, trust, 'c1', GET)).toEqual({
      error: 'the identity signer is not issued by the hub CA',
    });
    expect(new X509Certificate(serving.certPem).keyUsage).toContain('1.3.6.1.5.5.7.3.1');
  });
  it('the per-request key: its delegation must be signed by the serving key, and it expires', () => {
    const a = signIdentity(who, 'c1', GET, serving.certPem, serving.keyPem);
    const [cert, body, sig] = a.signer.split('.');
    // Another Ed25519 key in the delegation: the serving key never signed it.
    const mine = generateKeyPairSync('ed25519');
    const swapped = Buffer.from(
      JSON.stringify({
        ...JSON.parse(Buffer.from(body!, 'base64url').toString()),
        key: mine.publicKey.export({ type: 'spki', format: 'der' }).toString('base64'),
      }),
    ).toString('base64url');
    const [payload] = a.assertion.split('.');
    const mySig = sign(null, Buffer.from(payload!), mine.privateKey).toString('base64url');
    expect(verifyIdentity(`${payload}.${mySig}`, `${cert}.${swapped}.${sig}`, trust, 'c1', GET)).toEqual({
      error: 'bad identity key delegation signature',
    });
    expect(verifyIdentity(a.assertion, `${cert}.${body}`, trust, 'c1', GET)).toEqual({ error: 'malformed identity signer' });
    // Past the delegation's hour the signer itself is refused.
    expect(verifyIdentity(a.assertion, a.signer, trust, 'c1', GET, Date.now() + DELEGATION_TTL_MS + 60_000)).toEqual({
      error: 'the identity signer is not valid now',
    });
    // The hub makes a new key before then: one signer per half hour, not per request.
    expect(signIdentity(who, 'c1', GET, serving.certPem, serving.keyPem).signer).toBe(a.signer);
    const renewed = signIdentity(who, 'c1', GET, serving.certPem, serving.keyPem, Date.now() + DELEGATION_TTL_MS / 2 + 1000);
    expect(renewed.signer).not.toBe(a.signer);
    expect(verifyIdentity(renewed.assertion, renewed.signer, trust, 'c1', GET, Date.now() + DELEGATION_TTL_MS / 2 + 1000)).toEqual(who);
  });
});

describe('what the gateway hands the agent', () => {
  it('the identity the cluster sees: the prefix before the user and every group, uid and extra as they are', () => {
    const caller = {
      user: 'alice',
      groups: ['ops', 'dev'],
      uid: 'u1',
      extra: { k: ['v'] },
      source: 'oidc',
      name: 'oidc user "alice"',
      clusters: '*' as const,
    };
    expect(impersonatedIdentity(caller, 'hub:')).toEqual({
      user: 'hub:alice',
      groups: ['hub:ops', 'hub:dev'],
      uid: 'u1',
      extra: { k: ['v'] },
    });
    expect(impersonatedIdentity(caller, '')).toEqual({ user: 'alice', groups: ['ops', 'dev'], uid: 'u1', extra: { k: ['v'] } });
  });

  it('a head the identity would take past what an agent takes is refused in one line; one within it passes', () => {
    expect(headTooLarge('GET', '/version', { host: 'x', 'x-cluster-proxy-identity': 'a'.repeat(30_000) })).toBeNull();
    const why = headTooLarge('GET', '/version', { host: 'x', 'x-cluster-proxy-identity': 'a'.repeat(GATEWAY_AGENT_MAX_HEAD_BYTES) });
    expect(why).toMatch(
      new RegExp(
        `^the request head with the caller's identity \\(\\d+ bytes\\) is larger than the ${GATEWAY_AGENT_MAX_HEAD_BYTES} bytes an agent takes$`,
      ),
    );
    // Every value of a repeated header counts.
    expect(headTooLarge('GET', '/', { 'x-a': Array.from({ length: 70 }, () => 'b'.repeat(1000)) })).not.toBeNull();
  });
});
