// The gateway's pure parts: the request target, and the hub-signed identity the agent believes.
import { X509Certificate } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { IDENTITY_TTL_MS, certificatesOf, requestLine, signIdentity, verifyIdentity } from '@cluster-proxy/proto';
import { createCA, issueClientCert, issueServerCert } from '../pki/certificates.js';
import { parseGatewayTarget } from './paths.js';

describe('parseGatewayTarget', () => {
  it('strips the cluster and keeps the rest, query included', () => {
    expect(parseGatewayTarget('/c1/api/v1/pods?limit=1&x=%2F')).toEqual({ cluster: 'c1', path: '/api/v1/pods?limit=1&x=%2F' });
    expect(parseGatewayTarget('/c1')).toEqual({ cluster: 'c1', path: '/' });
    expect(parseGatewayTarget('/c1/')).toEqual({ cluster: 'c1', path: '/' });
    expect(parseGatewayTarget('/c1/api/')).toEqual({ cluster: 'c1', path: '/api/' });
  });
  it.each([
    ['/c1/a/../b', /dot segments/], ['/c1/a/%2E%2e/b', /dot segments/], ['/c1/./b', /dot segments/],
    ['/c1/a%2fb', /encoded slashes/], ['/c1/a%5Cb', /encoded slashes/], ['/c1/a\\b', /backslashes/],
    ['/c1//b', /empty path segments/], ['/', /cluster name/], ['//x', /cluster name/], ['*', /must be \/CLUSTER/],
    ['http://evil/c1/x', /must be \/CLUSTER/], ['/C1/x', /not a cluster name/], ['/c1/a%zz', /malformed percent/], ['/c1/a#b', /fragment/],
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
  it('is good for its one request only: another method or target is refused', () => {
    const a = signIdentity(who, 'c1', GET, serving.certPem, serving.keyPem);
    expect(verifyIdentity(a.assertion, a.signer, trust, 'c1', requestLine('DELETE', '/api/v1/namespaces/default/pods?limit=1'))).toEqual({ error: 'identity assertion for another request' });
    expect(verifyIdentity(a.assertion, a.signer, trust, 'c1', requestLine('GET', '/api/v1/secrets'))).toEqual({ error: 'identity assertion for another request' });
  });
  it('refuses another cluster, an expired one, a tampered payload', () => {
    const a = signIdentity(who, 'c1', GET, serving.certPem, serving.keyPem);
    expect(verifyIdentity(a.assertion, a.signer, trust, 'c2', GET)).toEqual({ error: expect.stringMatching(/for cluster "c1", not c2/) });
    expect(verifyIdentity(a.assertion, a.signer, trust, 'c1', GET, Date.now() + IDENTITY_TTL_MS + 1000)).toEqual({ error: expect.stringMatching(/expired/) });
    const [body, sig] = a.assertion.split('.');
    const forged = Buffer.from(JSON.stringify({ ...JSON.parse(Buffer.from(body!, 'base64url').toString()), user: 'system:admin' })).toString('base64url');
    expect(verifyIdentity(`${forged}.${sig}`, a.signer, trust, 'c1', GET)).toEqual({ error: 'bad identity signature' });
  });
  it('refuses a signer that is a hub user\'s client certificate, or from another CA', () => {
    const client = issueClientCert(ca, { commonName: 'mallory' });
    const byClient = signIdentity(who, 'c1', GET, client.certPem, client.keyPem);
    expect(verifyIdentity(byClient.assertion, byClient.signer, trust, 'c1', GET)).toEqual({ error: 'the identity signer is not a hub serving certificate' });
    const other = createCA({ commonName: 'other' });
    const otherServing = issueServerCert(other, { commonName: 'hub', dnsNames: ['localhost'] });
    const byOther = signIdentity(who, 'c1', GET, otherServing.certPem, otherServing.keyPem);
    expect(verifyIdentity(byOther.assertion, byOther.signer, trust, 'c1', GET)).toEqual({ error: 'the identity signer is not issued by the hub CA' });
    expect(new X509Certificate(serving.certPem).keyUsage).toContain('1.3.6.1.5.5.7.3.1');
  });
});
