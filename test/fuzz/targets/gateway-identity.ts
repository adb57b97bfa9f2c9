// The identity the agent believes: the hub-signed assertion and its signer (Identity and signer headers of a
// gateway request), read by verifyIdentity. Inputs are real assertions, mutated. Whatever verifies must be
// exactly what the hub signed (a changed byte that still verifies would let someone else choose the user),
// and everything else is a one-line refusal.
import { isDeepStrictEqual } from 'node:util';
import { certificatesOf, requestLine, signIdentity, verifyIdentity } from '@cluster-proxy/proto';
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
/** Assertions signed now, with this run's hub CA, for cluster c1 and REQUEST, as `assertion\nsigner` (the corpus's were signed by another run's CA: refusals). */
export function signedInputs(): Buffer[] {
  return SIGNED.map((who) => {
    const a = signIdentity(who, 'c1', REQUEST, serving.certPem, serving.keyPem);
    return Buffer.from(`${a.assertion}\n${a.signer}`);
  });
}

export const gatewayIdentityTarget: FuzzTarget = {
  name: 'gateway-identity',
  about:
    'the hub-signed identity the agent believes (verifyIdentity on a mutated assertion and signer): what verifies is exactly an identity the hub signed, anything else a one-line refusal',
  generate: fc.constantFrom(...signedInputs()),
  seeds: signedInputs,
  run(input) {
    const text = input.toString('latin1');
    const nl = text.indexOf('\n');
    const assertion = nl < 0 ? text : text.slice(0, nl);
    const signer = nl < 0 ? '' : text.slice(nl + 1);
    // The corpus was signed at some time: judge it as of then (the payload's own iat), so it does not expire.
    let now = Date.now();
    try {
      const iat = (JSON.parse(Buffer.from(assertion.split('.')[0] ?? '', 'base64url').toString('utf8')) as { iat?: unknown }).iat;
      if (typeof iat === 'number' && Number.isFinite(iat)) now = iat + 1000;
    } catch {
      // not JSON: verifyIdentity says so
    }
    const r = verifyIdentity(assertion, signer, trust, 'c1', REQUEST, now);
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
