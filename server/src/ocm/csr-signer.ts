// Reads and signs PKCS#10 certificate requests for OCM's CSR flow. OCM's klusterlet makes ECDSA P-256
// keys, which node-forge (RSA only) cannot carry, so this uses @peculiar/x509 over WebCrypto; it needs
// the reflect-metadata polyfill, loaded here only (this module loads only with `--agent-install manifestwork`).
import 'reflect-metadata';
import { createPrivateKey, randomBytes, webcrypto } from 'node:crypto';
import * as x509 from '@peculiar/x509';
import type { PemPair } from '../pki/certificates.js';

x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

/** A request that cannot be read or whose signature does not verify. */
export class CertificateRequestError extends Error {
  override name = 'CertificateRequestError';
}

export interface RequestSubject {
  commonNames: string[];
  organizations: string[];
  organizationalUnits: string[];
}

const MAX_REQUEST_BYTES = 16 * 1024;
const CLOCK_SKEW_MS = 5 * 60 * 1000;
const SIGNING = { name: 'RSASSA-PKCS1-v1_5', hash: 'SHA-256' } as const;

function parse(pem: string): x509.Pkcs10CertificateRequest {
  if (pem.length > MAX_REQUEST_BYTES) throw new CertificateRequestError(`the request is over ${MAX_REQUEST_BYTES} bytes`);
  try {
    return new x509.Pkcs10CertificateRequest(pem);
  } catch (err) {
    throw new CertificateRequestError(`the request is not a PEM CERTIFICATE REQUEST: ${(err as Error).message}`);
  }
}

/** The request's subject, after checking it is signed by the key it carries. */
export async function readCertificateRequest(pem: string): Promise<RequestSubject> {
  const req = parse(pem);
  let ok = false;
  try {
    ok = await req.verify();
  } catch (err) {
    throw new CertificateRequestError(`the request's signature cannot be checked: ${(err as Error).message}`);
  }
  if (!ok) throw new CertificateRequestError('the request is not signed by the key it carries');
  const n = req.subjectName;
  return { commonNames: n.getField('CN'), organizations: n.getField('O'), organizationalUnits: n.getField('OU') };
}

/**
 * A certificate for the request's key and subject, signed by `ca`: server and client auth (as OCM's
 * proxy-agent signer issues), valid from now (backdated a little for clock skew) until `notAfter`;
 * `uris` become URI SANs (the hub binds an agent certificate to its ManagedCluster's uid that way).
 */
export async function signCertificateRequest(
  ca: PemPair,
  pem: string,
  notAfter: Date,
  now = new Date(),
  uris: readonly string[] = [],
): Promise<string> {
  const req = parse(pem);
  const caCert = new x509.X509Certificate(ca.certPem);
  const der = createPrivateKey(ca.keyPem).export({ type: 'pkcs8', format: 'der' });
  const signingKey = await webcrypto.subtle.importKey('pkcs8', der, SIGNING, false, ['sign']);
  const serial = randomBytes(16);
  serial[0] = serial[0]! & 0x7f; // a positive INTEGER
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial.toString('hex'),
    subject: req.subjectName,
    issuer: caCert.subjectName,
    notBefore: new Date(now.getTime() - CLOCK_SKEW_MS),
    notAfter,
    signingAlgorithm: SIGNING,
    publicKey: req.publicKey,
    signingKey: signingKey as unknown as x509.X509CertificateCreateWithKeyParams['signingKey'],
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature | x509.KeyUsageFlags.keyEncipherment, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth, x509.ExtendedKeyUsage.clientAuth]),
      await x509.SubjectKeyIdentifierExtension.create(req.publicKey),
      await x509.AuthorityKeyIdentifierExtension.create(caCert),
      ...(uris.length > 0 ? [new x509.SubjectAlternativeNameExtension(uris.map((value) => ({ type: 'url' as const, value })))] : []),
    ],
  });
  return cert.toString('pem');
}
