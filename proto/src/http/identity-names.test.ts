import { describe, expect, it } from 'vitest';
import { identityProblem, isReservedInCluster, nameProblem, quoteName, utf8HeaderValue } from './identity-names.js';
import { withoutBearerProtocols, isCredentialHeader } from './http-headers.js';

describe('identity names', () => {
  it.each([
    ['alice', null],
    ['system:masters', null],
    ['josé', null],
    ['開発', null],
    ['a b', null],
    ['a\u00a0b', null],
    ['', 'is empty'],
    [' alice', 'begins or ends with whitespace'],
    ['alice\t', 'begins or ends with whitespace'],
    ['\u00a0alice', 'begins or ends with whitespace'],
    ['al\u0000ice', 'holds a control character'],
    ['al\rice', 'holds a control character'],
    ['a\u007fb', 'holds a control character'],
    ['a\u0085b', 'holds a control character'],
    ['a\tb', 'holds a control character'],
    ['\ud800x', 'is not valid Unicode'],
    ['x\udc00', 'is not valid Unicode'],
    ['😀', null],
  ])('%j: %s', (name, problem) => {
    expect(nameProblem(name)).toBe(problem);
  });

  it('names the part of the identity at fault, quoted with escapes', () => {
    expect(identityProblem({ user: 'alice', groups: ['ops', ' system:masters'] })).toBe(
      'the group " system:masters" begins or ends with whitespace',
    );
    expect(identityProblem({ user: 'alice', groups: [], uid: '' })).toBe('the uid "" is empty');
    expect(identityProblem({ user: 'alice', groups: [], extra: { 'a\nb': ['x'] } })).toBe(
      'the extra key "a\\u000ab" holds a control character',
    );
    expect(identityProblem({ user: 'alice', groups: ['ops'], uid: '1', extra: { k: ['v'] } })).toBeNull();
    expect(quoteName('a"b\\c\u00e9')).toBe('"a\\"b\\\\c\\u00e9"');
    expect(quoteName('x'.repeat(100))).toBe(`"${'x'.repeat(80)}\\u2026"`);
  });

  it('header values go out as UTF-8 bytes', () => {
    expect(utf8HeaderValue('alice')).toBe('alice');
    expect(Buffer.from(utf8HeaderValue('josé'), 'latin1')).toEqual(Buffer.from('josé', 'utf8'));
    expect(Buffer.from(utf8HeaderValue('開発'), 'latin1')).toEqual(Buffer.from('開発', 'utf8'));
  });

  it('reserved in a cluster: system: names but system:authenticated', () => {
    expect(isReservedInCluster('system:masters')).toBe(true);
    expect(isReservedInCluster('system:serviceaccount:a:b')).toBe(true);
    expect(isReservedInCluster('system:authenticated')).toBe(false);
    expect(isReservedInCluster('cluster:hub:system:masters')).toBe(false);
    expect(isReservedInCluster('System:masters')).toBe(false);
  });

  it('credential headers and bearer subprotocols', () => {
    expect(['X-Remote-User', 'x-remote-group', 'x-remote-uid', 'x-remote-extra-scopes'].every(isCredentialHeader)).toBe(true);
    expect(isCredentialHeader('x-remote-addr')).toBe(false);
    expect(withoutBearerProtocols(['v5.channel.k8s.io, base64url.bearer.authorization.k8s.io.c2VjcmV0', 'v4.channel.k8s.io'])).toEqual([
      'v5.channel.k8s.io, v4.channel.k8s.io',
    ]);
    expect(withoutBearerProtocols(['base64url.bearer.authorization.k8s.io.c2VjcmV0'])).toBeNull();
  });
});
