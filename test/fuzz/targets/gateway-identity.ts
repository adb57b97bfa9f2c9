// The identity the agent believes, in both forms: the hub-signed assertion and its signer (Identity and
// signer headers of a gateway request), read by verifyIdentity, and the assertion authenticated by the
// link's key (the MAC header: `mac:` then the assertion), read by verifyLinkIdentity. Inputs are real
// assertions, mutated. Whatever verifies must be exactly what the hub authenticated (a changed byte that
// still verifies would let someone else choose the user), and everything else is a one-line refusal.
import { createSecretKey, randomBytes } from 'node:crypto';
import { isDeepStrictEqual } from 'node:util';
import {
  certificatesOf,
  identityPayload,
  macPayload,
  requestLine,
  signIdentity,
  verifyIdentity,
  verifyLinkIdentity,
} from '@cluster-proxy/proto';
import { createCA, issueServerCert } from '@cluster-proxy/server/pki';
import { check, checkOneLine, fc, type FuzzTarget } from '../engine.js';

const ca = createCA({ commonName: 'fuzz-identity-ca' });
const serving = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'] });
const trust = certificatesOf(ca.certPem);
const REQUEST = requestLine('GET', '/api/v1/namespaces/default/pods');
const SIGNED = [
  { user: 'alice', groups: ['team-a'], uid: 'u1' },
  { user: 'bob', groups: [], extra: { scopes: ['view'] } },
  { user: 'system:serviceaccount:ns:sa', groups: ['system:authenticated'] },
];
/** This run's link key (the corpus's MACs were made with another run's: refusals). */
const LINK_KEY = createSecretKey(randomBytes(32));
const MAC_PREFIX = 'mac:';
/**
 * Assertions made now for cluster c1 and REQUEST: signed with this run's hub CA, as `assertion\nsigner`, and
 * authenticated with this run's link key, as `mac:assertion` (the corpus's were made in another run: refusals).
 */
export function signedInputs(): Buffer[] {
  return SIGNED.flatMap((who) => {
    const a = signIdentity(who, 'c1', REQUEST, serving.certPem, serving.keyPem);
    return [
      Buffer.from(`${a.assertion}\n${a.signer}`),
      Buffer.from(`${MAC_PREFIX}${macPayload(identityPayload(who, 'c1', REQUEST), LINK_KEY)}`),
    ];
  });
}

export const gatewayIdentityTarget: FuzzTarget = {
  name: 'gateway-identity',
  about:
    "the identity the agent believes (verifyIdentity on a mutated assertion and signer, verifyLinkIdentity on a mutated MAC assertion): what verifies is exactly an identity the hub signed or authenticated with the link's key, anything else a one-line refusal",
  generate: fc.constantFrom(...signedInputs()),
  seeds: signedInputs,
  run(input) {
    const text = input.toString('latin1');
    const isMac = text.startsWith(MAC_PREFIX);
    const nl = isMac ? -1 : text.indexOf('\n');
    const assertion = isMac ? text.slice(MAC_PREFIX.length) : nl < 0 ? text : text.slice(0, nl);
    const signer = nl < 0 ? '' : text.slice(nl + 1);
    // The corpus was signed at some time: judge it as of then (the payload's own iat), so it does not expire.
    let now = Date.now();
    try {
      const iat = (JSON.parse(Buffer.from(assertion.split('.')[0] ?? '', 'base64url').toString('utf8')) as { iat?: unknown }).iat;
      if (typeof iat === 'number' && Number.isFinite(iat)) now = iat + 1000;
    } catch {
      // not JSON: verifyIdentity says so
    }
    const r = isMac
      ? verifyLinkIdentity(assertion, LINK_KEY, 'c1', REQUEST, now)
      : verifyIdentity(assertion, signer, trust, 'c1', REQUEST, now);
    if ('error' in r) {
      checkOneLine(r.error, 'identity refusal');
      return;
    }
    check(
      SIGNED.some((who) => isDeepStrictEqual(JSON.parse(JSON.stringify(r)), who)),
      `a changed assertion verified as ${JSON.stringify(r)}`,
    );
  },
};
