/**
 * Issuing the certificates cluster-proxy needs: a self-signed CA, serving certificates for the
 * hub listeners, client certificates for hub users, and agent client certificates bound to one
 * managed cluster. node-forge builds and signs the X.509 structures; Node's crypto generates the
 * RSA keys because its native generator is far faster than forge's pure-JS one.
 */
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { lazyRequire } from '@cluster-proxy/proto';
import type forge from 'node-forge';
import { agentSubject, DEFAULT_AGENT_NAME } from './agent-identity.js';
import { ipToBytes } from './ip-address.js';

/** node-forge, loaded at the first certificate made or read here: a hub given its files starts without it (~2 MiB of RSS). */
const forgeLib = lazyRequire<typeof forge>('node-forge', import.meta.url);

export interface PemPair {
  certPem: string;
  keyPem: string;
}

/** When a certificate is valid. `notBefore`/`notAfter` win over `validityDays` when given. */
export interface ValidityOptions {
  validityDays?: number;
  notBefore?: Date;
  notAfter?: Date;
}

export interface CAOptions extends ValidityOptions {
  commonName?: string;
}

export interface ServerCertOptions extends ValidityOptions {
  commonName: string;
  dnsNames?: string[];
  ipAddresses?: string[];
}

export interface ClientCertOptions extends ValidityOptions {
  commonName: string;
  organization?: string[];
}

export interface AgentCertOptions extends ValidityOptions {
  cluster: string;
  agentName?: string;
}

export const DEFAULT_CA_COMMON_NAME = 'cluster-proxy-ca';
export const DEFAULT_CA_VALIDITY_DAYS = 3650;
export const DEFAULT_LEAF_VALIDITY_DAYS = 180;
const RSA_BITS = 2048;
// Backdate default notBefore so a peer whose clock is a little behind ours still accepts a
// certificate we just issued.
const CLOCK_SKEW_MS = 5 * 60 * 1000;
const DAY_MS = 24 * 60 * 60 * 1000;
// GeneralName tags in subjectAltName (RFC 5280 4.2.1.6).
const SAN_DNS = 2;
const SAN_URI = 6;
const SAN_IP = 7;
/** URI SAN that binds an agent certificate to one incarnation (metadata.uid) of its ManagedCluster. */
export const CLUSTER_UID_URI_PREFIX = 'urn:cluster-proxy:cluster-uid:';
/** Agents bring their own key; anything weaker than this is refused. */
export const MIN_AGENT_RSA_BITS = 2048;

type SubjectAttribute = { shortName: string; value: string };

/** ASN.1 PrintableString's characters (forge's default string type for a name's attributes). */
const PRINTABLE = /^[A-Za-z0-9 '()+,\-./:=?]*$/;
/** ASN.1 UTF8String's tag. */
const UTF8_STRING = 12;

/**
 * A subject as forge will encode it: a value that is not a PrintableString (`josé`, `開発`, `a@b`) as a
 * UTF8String, which forge writes as UTF-8 (as a PrintableString it wrote the code units as bytes: invalid for
 * Go's parser, and a broken PEM for characters beyond U+00FF). Printable values keep their encoding.
 */
function encodedSubject(subject: SubjectAttribute[]): (SubjectAttribute & { valueTagClass?: number })[] {
  return subject.map((a) => (PRINTABLE.test(a.value) ? a : { ...a, valueTagClass: UTF8_STRING }));
}

export function createCA(opts: CAOptions = {}): PemPair {
  const commonName = opts.commonName ?? DEFAULT_CA_COMMON_NAME;
  assertNonEmpty(commonName, 'CA common name');
  // Validate everything before generating a key: key generation is the slow part.
  const window = validityWindow(opts, DEFAULT_CA_VALIDITY_DAYS);
  const keys = generateRsaKeys();
  const cert = newCertificate(keys.publicKey, window);
  const subject = encodedSubject([{ shortName: 'CN', value: commonName }]);
  cert.setSubject(subject);
  cert.setIssuer(subject);
  cert.setExtensions([
    { name: 'basicConstraints', cA: true, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, critical: true },
    { name: 'subjectKeyIdentifier' },
  ]);
  cert.sign(forgeLib().pki.privateKeyFromPem(keys.keyPem), forgeLib().md.sha256.create());
  return { certPem: forgeLib().pki.certificateToPem(cert), keyPem: keys.keyPem };
}

export function issueServerCert(ca: PemPair, opts: ServerCertOptions): PemPair {
  assertNonEmpty(opts.commonName, 'server common name');
  const dnsNames = opts.dnsNames ?? [];
  const ipAddresses = opts.ipAddresses ?? [];
  for (const name of dnsNames) assertNonEmpty(name, 'DNS name');
  // Converting the IPs also validates them, before any key is generated.
  const altNames = [
    ...dnsNames.map((value) => ({ type: SAN_DNS, value })),
    ...ipAddresses.map((ip) => ({ type: SAN_IP, value: bytesToBinaryString(ipToBytes(ip)) })),
  ];
  // serverAuth for the listeners; clientAuth too so the same identity can dial a peer hub.
  return issueLeaf(ca, [{ shortName: 'CN', value: opts.commonName }], opts, {
    extKeyUsage: { serverAuth: true, clientAuth: true },
    altNames,
  });
}

export function issueClientCert(ca: PemPair, opts: ClientCertOptions): PemPair {
  assertNonEmpty(opts.commonName, 'client common name');
  const organization = opts.organization ?? [];
  for (const o of organization) assertNonEmpty(o, 'organization');
  // Kubernetes reads O as groups and CN as the user name; keep O before CN like kubeadm does.
  const subject: SubjectAttribute[] = [
    ...organization.map((value) => ({ shortName: 'O', value })),
    { shortName: 'CN', value: opts.commonName },
  ];
  return issueLeaf(ca, subject, opts, { extKeyUsage: { clientAuth: true }, altNames: [] });
}

export function issueAgentCert(ca: PemPair, opts: AgentCertOptions): PemPair {
  // agentSubject validates both names (DNS-1123), so a bad cluster name never reaches a cert.
  const { commonName, organization } = agentSubject(opts.cluster, opts.agentName ?? DEFAULT_AGENT_NAME);
  return issueClientCert(ca, {
    commonName,
    organization: [organization],
    validityDays: opts.validityDays,
    notBefore: opts.notBefore,
    notAfter: opts.notAfter,
  });
}

export interface AgentKeyCertOptions extends ValidityOptions {
  cluster: string;
  /** The agent's own public key (SPKI PEM, RSA ≥ 2048 bits): its private key never leaves the agent. */
  publicKeyPem: string;
  /** The ManagedCluster's metadata.uid, written as a URI SAN so a re-created cluster does not admit old certificates. */
  clusterUid?: string;
  agentName?: string;
}

/** Signs an agent certificate for a key the agent generated (bootstrap and renewal). Returns the certificate PEM. */
export function signAgentPublicKey(ca: PemPair, opts: AgentKeyCertOptions): string {
  const { commonName, organization } = agentSubject(opts.cluster, opts.agentName ?? DEFAULT_AGENT_NAME);
  let publicKey: forge.pki.rsa.PublicKey;
  try {
    publicKey = forgeLib().pki.publicKeyFromPem(opts.publicKeyPem) as forge.pki.rsa.PublicKey;
  } catch {
    throw new Error('agent public key is not a PEM RSA public key (SPKI)');
  }
  if (!publicKey.n || publicKey.n.bitLength() < MIN_AGENT_RSA_BITS)
    throw new Error(`agent public key must be RSA with at least ${MIN_AGENT_RSA_BITS} bits`);
  if (opts.clusterUid !== undefined && !/^[A-Za-z0-9-]{1,64}$/.test(opts.clusterUid)) throw new Error('cluster uid is not a UID');
  const subject: SubjectAttribute[] = [
    { shortName: 'O', value: organization },
    { shortName: 'CN', value: commonName },
  ];
  const altNames = opts.clusterUid ? [{ type: SAN_URI, value: `${CLUSTER_UID_URI_PREFIX}${opts.clusterUid}` }] : [];
  return issueLeaf(ca, subject, opts, { extKeyUsage: { clientAuth: true }, altNames }, publicKey).certPem;
}

/** The cluster uid an agent certificate was bound to (from Node's `subjectaltname` text), or null. */
export function clusterUidFromAltNames(subjectaltname: string | undefined): string | null {
  for (const part of (subjectaltname ?? '').split(/,\s*/)) {
    if (part.startsWith(`URI:${CLUSTER_UID_URI_PREFIX}`)) return part.slice(`URI:${CLUSTER_UID_URI_PREFIX}`.length);
  }
  return null;
}

// --- internals ------------------------------------------------------------------------------

interface LeafProfile {
  extKeyUsage: { serverAuth?: boolean; clientAuth?: boolean };
  altNames: { type: number; value: string }[];
}

/** Issues a leaf for a new key pair, or for `publicKey` when the holder made its own (keyPem is then ''). */
function issueLeaf(
  ca: PemPair,
  subject: SubjectAttribute[],
  validity: ValidityOptions,
  profile: LeafProfile,
  publicKey?: forge.pki.rsa.PublicKey,
): PemPair {
  const window = validityWindow(validity, DEFAULT_LEAF_VALIDITY_DAYS);
  const issuer = loadIssuer(ca);
  const keys = publicKey ? { publicKey, keyPem: '' } : generateRsaKeys();
  const cert = newCertificate(keys.publicKey, window);
  cert.setSubject(encodedSubject(subject));
  // Copy the CA's subject as parsed so the issuer name matches it byte for byte. forge gives a UTF8String's
  // value as its UTF-8 bytes and would encode them again: decoded first.
  cert.setIssuer(
    issuer.cert.subject.attributes.map((a) =>
      // (@types/node-forge types valueTagClass as a tag class; forge keeps the value's tag there.)
      (a.valueTagClass as number | undefined) === UTF8_STRING && typeof a.value === 'string'
        ? { ...a, value: forgeLib().util.decodeUtf8(a.value) }
        : a,
    ),
  );
  const extensions: object[] = [
    { name: 'basicConstraints', cA: false, critical: true },
    { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
    { name: 'extKeyUsage', ...profile.extKeyUsage },
    { name: 'subjectKeyIdentifier' },
    { name: 'authorityKeyIdentifier', keyIdentifier: issuer.keyIdentifier },
  ];
  if (profile.altNames.length > 0) extensions.push({ name: 'subjectAltName', altNames: profile.altNames });
  cert.setExtensions(extensions);
  cert.sign(issuer.key, forgeLib().md.sha256.create());
  return { certPem: forgeLib().pki.certificateToPem(cert), keyPem: keys.keyPem };
}

interface Issuer {
  cert: forge.pki.Certificate;
  key: forge.pki.rsa.PrivateKey;
  keyIdentifier: string; // binary string, as forge wants it
}

// Check the CA pair up front: signing with a key that does not match the CA certificate would
// produce leaves nobody can verify, and the failure would only show up at handshake time.
function loadIssuer(ca: PemPair): Issuer {
  let cert: forge.pki.Certificate;
  let key: forge.pki.rsa.PrivateKey;
  try {
    cert = forgeLib().pki.certificateFromPem(ca.certPem);
  } catch (err) {
    throw new Error(`CA certificate is not a PEM RSA certificate: ${errorMessage(err)}`);
  }
  try {
    key = forgeLib().pki.privateKeyFromPem(ca.keyPem);
  } catch {
    // forge's message can quote key material in some paths; keep the key out of errors.
    throw new Error('CA key is not an unencrypted PEM RSA private key');
  }
  const basicConstraints = cert.getExtension('basicConstraints') as { cA?: boolean } | undefined;
  if (!basicConstraints?.cA) throw new Error('CA certificate is not a CA (basicConstraints cA is not true)');
  const publicKey = cert.publicKey as forge.pki.rsa.PublicKey;
  if (publicKey.n.compareTo(key.n) !== 0 || publicKey.e.compareTo(key.e) !== 0) {
    throw new Error('CA key does not match the CA certificate');
  }
  // Prefer the CA's own subjectKeyIdentifier so authorityKeyIdentifier matches it even for CAs
  // made elsewhere with a different key-id method.
  const ski = cert.getExtension('subjectKeyIdentifier') as { subjectKeyIdentifier?: string } | undefined;
  const keyIdentifier = ski?.subjectKeyIdentifier
    ? forgeLib().util.hexToBytes(ski.subjectKeyIdentifier)
    : cert.generateSubjectKeyIdentifier().getBytes();
  return { cert, key, keyIdentifier };
}

function newCertificate(publicKey: forge.pki.rsa.PublicKey, { notBefore, notAfter }: ValidityWindow): forge.pki.Certificate {
  const cert = forgeLib().pki.createCertificate();
  cert.publicKey = publicKey;
  cert.serialNumber = randomSerialHex();
  cert.validity.notBefore = notBefore;
  cert.validity.notAfter = notAfter;
  return cert;
}

interface ValidityWindow {
  notBefore: Date;
  notAfter: Date;
}

function validityWindow(opts: ValidityOptions, defaultDays: number): ValidityWindow {
  const days = opts.validityDays ?? defaultDays;
  if (!Number.isFinite(days) || days <= 0) throw new Error(`invalid validityDays ${days}: must be a positive number`);
  for (const [name, date] of [
    ['notBefore', opts.notBefore],
    ['notAfter', opts.notAfter],
  ] as const) {
    if (date !== undefined && !(date instanceof Date && Number.isFinite(date.getTime()))) {
      throw new Error(`invalid ${name}: not a valid Date`);
    }
  }
  const now = Date.now();
  const notBefore = opts.notBefore ?? new Date(now - CLOCK_SKEW_MS);
  // validityDays counts from the explicit start if one was given, else from now.
  const notAfter = opts.notAfter ?? new Date((opts.notBefore?.getTime() ?? now) + days * DAY_MS);
  if (notAfter.getTime() <= notBefore.getTime()) {
    throw new Error(`invalid validity: notAfter (${notAfter.toISOString()}) is not after notBefore (${notBefore.toISOString()})`);
  }
  return { notBefore, notAfter };
}

function generateRsaKeys(): { publicKey: forge.pki.rsa.PublicKey; keyPem: string } {
  const { publicKey, privateKey } = generateKeyPairSync('rsa', {
    modulusLength: RSA_BITS,
    publicKeyEncoding: { type: 'spki', format: 'pem' },
    // PKCS#8 (PEM label "PRIVATE KEY"): what Node, Go's tls.LoadX509KeyPair and kubectl all read.
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
  });
  return { publicKey: forgeLib().pki.publicKeyFromPem(publicKey) as forge.pki.rsa.PublicKey, keyPem: privateKey };
}

// 128 random bits with the top bit cleared (serials must be positive) and a non-zero first byte
// (DER integers must be minimally encoded; OpenSSL rejects a leading 0x00 before a byte < 0x80).
function randomSerialHex(): string {
  const bytes = randomBytes(16);
  bytes.writeUInt8(bytes.readUInt8(0) & 0x7f || 0x01, 0);
  return bytes.toString('hex');
}

function bytesToBinaryString(bytes: Uint8Array): string {
  return String.fromCharCode(...bytes);
}

function assertNonEmpty(value: string, what: string): void {
  if (typeof value !== 'string' || value.trim() === '') throw new Error(`invalid ${what}: must be a non-empty string`);
}

function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
