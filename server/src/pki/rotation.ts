// Certificate lifecycle on the hub's data-dir PKI: renewing the serving certificate at 80 % of its
// lifetime (same names), and the CA rollover in three stages so nobody loses trust on the way:
//   add     — a new CA joins ca.crt as trusted; the old one still signs (ca.key unchanged).
//   promote — the new CA signs (first in ca.crt, its key in ca.key); server and client certificates
//             are re-issued from it; the old CA stays trusted, so agents it signed still connect.
//   finish  — the old CA is dropped from ca.crt.
// The hub reloads these files by itself (reload.ts) and hands the bundle to agents with every lease
// renewal, so connected agents trust the new CA before it starts signing.
import { X509Certificate } from 'node:crypto';
import { readFile, rm } from 'node:fs/promises';
import { createCA, issueClientCert, issueServerCert, type PemPair } from './certificates.js';
import {
  HUB_CLIENT_COMMON_NAME,
  HUB_CLIENT_ORGANIZATION,
  HUB_SERVER_COMMON_NAME,
  pemPairPaths,
  readPemPair,
  writePemPair,
} from './files.js';

const PEM_CERT = /-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----\r?\n?/g;

export function splitBundle(pem: string): string[] {
  return [...pem.matchAll(PEM_CERT)].map((m) => (m[0].endsWith('\n') ? m[0] : `${m[0]}\n`));
}

/** True once `share` (default 0.8) of the certificate's lifetime has passed. */
export function renewalDue(certPem: string | Buffer, now = Date.now(), share = 0.8): boolean {
  const x = new X509Certificate(certPem);
  const from = Date.parse(x.validFrom);
  const to = Date.parse(x.validTo);
  return now >= from + (to - from) * share;
}

function sans(certPem: string): { dnsNames: string[]; ipAddresses: string[] } {
  const out = { dnsNames: [] as string[], ipAddresses: [] as string[] };
  for (const part of (new X509Certificate(certPem).subjectAltName ?? '').split(/,\s*/)) {
    if (part.startsWith('DNS:')) out.dnsNames.push(part.slice(4));
    else if (part.startsWith('IP Address:')) out.ipAddresses.push(part.slice(11));
  }
  return out;
}

/** The signing pair: ca.key with the first certificate of ca.crt. */
async function signer(dir: string): Promise<PemPair & { bundle: string[] }> {
  const { certPem, keyPem } = await readPemPair(dir, 'ca');
  const bundle = splitBundle(certPem);
  if (bundle.length === 0) throw new Error(`${pemPairPaths(dir, 'ca').certPath} holds no certificate`);
  return { certPem: bundle[0]!, keyPem, bundle };
}

/** Re-issues server.crt (same names) when 80 % of its lifetime has passed. Returns whether it did. */
export async function renewServingCertIfDue(dir: string, now = Date.now()): Promise<boolean> {
  const current = await readPemPair(dir, 'server');
  if (!renewalDue(current.certPem, now)) return false;
  const ca = await signer(dir);
  await writePemPair(dir, 'server', issueServerCert(ca, { commonName: HUB_SERVER_COMMON_NAME, ...sans(current.certPem) }));
  return true;
}

export type RotationStage = 'add' | 'promote' | 'finish';

/** One stage of the CA rollover (see the top of this file). Returns a one-line summary. */
export async function rotateCa(dir: string, stage: RotationStage): Promise<string> {
  const next = pemPairPaths(dir, 'ca-next');
  const hasNext = await readFile(next.certPath).then(
    () => true,
    () => false,
  );
  const ca = await signer(dir);
  if (stage === 'add') {
    if (hasNext) throw new Error('a new CA was added already; run "promote" next');
    const fresh = createCA({ commonName: `cluster-proxy-ca-${new Date().toISOString().slice(0, 10)}` });
    await writePemPair(dir, 'ca-next', fresh);
    await writePemPair(dir, 'ca', { certPem: [...ca.bundle, fresh.certPem].join(''), keyPem: ca.keyPem });
    return `added CA ${new X509Certificate(fresh.certPem).subject.replace(/\n/g, ', ')} to ca.crt (trusted, not signing yet); agents receive it with their next lease renewal`;
  }
  if (stage === 'promote') {
    if (!hasNext) throw new Error('no new CA to promote; run "add" first');
    const fresh = await readPemPair(dir, 'ca-next');
    const others = ca.bundle.filter((c) => c.replace(/\s/g, '') !== fresh.certPem.replace(/\s/g, ''));
    await writePemPair(dir, 'ca', { certPem: [fresh.certPem, ...others].join(''), keyPem: fresh.keyPem });
    const server = await readPemPair(dir, 'server');
    await writePemPair(dir, 'server', issueServerCert(fresh, { commonName: HUB_SERVER_COMMON_NAME, ...sans(server.certPem) }));
    await writePemPair(
      dir,
      'client',
      issueClientCert(fresh, { commonName: HUB_CLIENT_COMMON_NAME, organization: [HUB_CLIENT_ORGANIZATION] }),
    );
    await rm(next.certPath, { force: true });
    await rm(next.keyPath, { force: true });
    return 'the new CA now signs; server and client certificates re-issued; the old CA stays trusted until "finish"';
  }
  if (hasNext) throw new Error('a new CA was added but not promoted; run "promote" first');
  if (ca.bundle.length === 1) throw new Error('ca.crt holds one CA only; nothing to finish');
  await writePemPair(dir, 'ca', { certPem: ca.bundle[0]!, keyPem: ca.keyPem });
  return `dropped ${ca.bundle.length - 1} old CA(s) from ca.crt; certificates they signed are no longer accepted`;
}
