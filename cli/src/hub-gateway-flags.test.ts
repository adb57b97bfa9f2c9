// The hub's gateway flags: --oidc-* as kube-apiserver's, --gateway-authorization; one-line usage errors.
import { describe, expect, it } from 'vitest';
import { parseFlags } from './flags.js';
import { gatewayAccessFlags, hubFlags } from './hub.js';

const parse = (args: string[], gatewayOn = true): ReturnType<typeof gatewayAccessFlags> =>
  gatewayAccessFlags(parseFlags(args, hubFlags, {}).flags, gatewayOn);
const ISSUER = ['--oidc-issuer-url', 'https://idp.example/realms/x', '--oidc-client-id', 'gw'];

describe('hub gateway flags', () => {
  it('nothing given: no OIDC, the store decides the authorization mode', () => {
    expect(parse([])).toEqual({ config: {} });
    expect(parse([], false)).toEqual({ config: {} });
  });

  it("the OIDC flags as kube-apiserver's", () => {
    expect(
      parse([
        ...ISSUER,
        '--oidc-username-claim',
        'email',
        '--oidc-groups-claim',
        'groups',
        '--oidc-groups-prefix',
        'oidc:',
        '--oidc-required-claim',
        'tenant=blue',
        '--oidc-required-claim',
        'env=a=b',
        '--oidc-signing-algs',
        'RS256,ES256',
        '--oidc-ca-file',
        '/ca.pem',
        '--gateway-authorization',
        'scope',
      ]),
    ).toEqual({
      config: { authorization: 'scope' },
      oidc: {
        issuerUrl: 'https://idp.example/realms/x',
        clientId: 'gw',
        usernameClaim: 'email',
        groupsClaim: 'groups',
        groupsPrefix: 'oidc:',
        requiredClaims: { tenant: 'blue', env: 'a=b' },
        signingAlgs: ['RS256', 'ES256'],
      },
      oidcCaFile: '/ca.pem',
    });
    expect(parse([...ISSUER, '--oidc-username-prefix', '-']).oidc).toMatchObject({
      usernamePrefix: '-',
      usernameClaim: 'sub',
      signingAlgs: ['RS256'],
    });
  });

  it.each([
    [['--oidc-client-id', 'gw'], /^--oidc-client-id goes with --oidc-issuer-url$/],
    [['--oidc-issuer-url', 'http://idp', '--oidc-client-id', 'gw'], /must be an https:\/\/ URL/],
    [['--oidc-issuer-url', 'https://idp'], /--oidc-client-id is required with --oidc-issuer-url/],
    [[...ISSUER, '--oidc-signing-algs', 'none'], /"none" is not one of RS256/],
    [[...ISSUER, '--oidc-required-claim', 'x'], /must be KEY=VALUE/],
    [['--gateway-authorization', 'rbac'], /must be scope or subjectaccessreview, got "rbac"/],
    [['--gateway-authorization', 'subjectaccessreview'], /needs --store kubernetes/],
  ])('%j is refused', (args, why) => {
    expect(() => parse(args)).toThrow(why);
  });

  it('the gateway flags need the gateway', () => {
    expect(() => parse(ISSUER, false)).toThrow(/--oidc-issuer-url configures the HTTP gateway: it goes with --gateway-port/);
    expect(() => parse(['--gateway-authorization', 'scope'], false)).toThrow(/--gateway-authorization configures the HTTP gateway/);
    expect(parse(['--gateway-authorization', 'subjectaccessreview', '--store', 'kubernetes']).config).toEqual({
      authorization: 'subjectaccessreview',
    });
  });
});
