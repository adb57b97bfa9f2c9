/**
 * PEM files on disk: atomic writes with safe modes, reads with clear errors, and the hub's
 * create-once PKI directory. Nothing here ever logs or echoes key material.
 */
import { X509Certificate, createPrivateKey, randomBytes } from 'node:crypto';
import { mkdir, open, readFile, rename, stat, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { createCA, issueClientCert, issueServerCert, type PemPair } from './certificates.js';

const CERT_MODE = 0o644;
const KEY_MODE = 0o600;
const DIR_MODE = 0o700;

export const HUB_SERVER_COMMON_NAME = 'cluster-proxy-hub';
export const HUB_CLIENT_COMMON_NAME = 'cluster-proxy-admin';
export const HUB_CLIENT_ORGANIZATION = 'system:masters';
const DEFAULT_HOSTNAMES = ['localhost'];
const DEFAULT_IP_ADDRESSES = ['127.0.0.1', '::1'];

export interface HubPkiPaths {
  caCert: string;
  caKey: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
}

export interface HubPkiOptions {
  /** Extra DNS SANs for the hub serving certificate (localhost is always included). */
  hostnames?: string[];
  /** Extra IP SANs for the hub serving certificate (127.0.0.1 and ::1 are always included). */
  ipAddresses?: string[];
}

export function pemPairPaths(dir: string, baseName: string): { certPath: string; keyPath: string } {
  return { certPath: join(dir, `${baseName}.crt`), keyPath: join(dir, `${baseName}.key`) };
}

/**
 * Writes `<baseName>.crt` (0644) and `<baseName>.key` (0600) into `dir`, creating `dir` with
 * 0700 if missing. Each file is written to a temp file in the same directory and renamed into
 * place, so a reader never sees a half-written PEM. The key file is created with 0600 from the
 * start: a chmod afterwards would leave a window where the key is readable by others.
 * The key is written first so a present certificate implies its key is present too.
 */
export async function writePemPair(dir: string, baseName: string, pair: PemPair): Promise<{ certPath: string; keyPath: string }> {
  await mkdir(dir, { recursive: true, mode: DIR_MODE });
  const paths = pemPairPaths(dir, baseName);
  await writeFileAtomic(paths.keyPath, pair.keyPem, KEY_MODE);
  await writeFileAtomic(paths.certPath, pair.certPem, CERT_MODE);
  return paths;
}

export async function readPemPair(dir: string, baseName: string): Promise<PemPair> {
  const { certPath, keyPath } = pemPairPaths(dir, baseName);
  const certPem = await readPemFile(certPath, 'certificate');
  const keyPem = await readPemFile(keyPath, 'private key');
  return { certPem, keyPem };
}

/**
 * Makes sure `dir` holds the hub's PKI: `ca`, `server` (serving certificate for the hub
 * listeners) and `client` (an admin client certificate), creating only what is missing.
 * An existing pair is loaded and checked, never regenerated: agents and users already trust
 * the CA in it. If the CA itself has to be created, server and client are (re)issued from it,
 * since anything issued by a previous CA would no longer verify.
 */
export async function ensureHubPki(dir: string, opts: HubPkiOptions = {}): Promise<HubPkiPaths> {
  const ca = pemPairPaths(dir, 'ca');
  const server = pemPairPaths(dir, 'server');
  const client = pemPairPaths(dir, 'client');

  let caPair: PemPair;
  let caIsNew = false;
  if (await pairExists(dir, 'ca')) {
    caPair = await readPemPair(dir, 'ca');
  } else {
    caPair = createCA();
    await writePemPair(dir, 'ca', caPair);
    caIsNew = true;
  }

  if (caIsNew || !(await pairExists(dir, 'server'))) {
    const pair = issueServerCert(caPair, {
      commonName: HUB_SERVER_COMMON_NAME,
      dnsNames: unique([...DEFAULT_HOSTNAMES, ...(opts.hostnames ?? [])]),
      ipAddresses: unique([...DEFAULT_IP_ADDRESSES, ...(opts.ipAddresses ?? [])]),
    });
    await writePemPair(dir, 'server', pair);
  } else {
    await readPemPair(dir, 'server'); // fail now, with the file named, if it is damaged
  }

  if (caIsNew || !(await pairExists(dir, 'client'))) {
    const pair = issueClientCert(caPair, { commonName: HUB_CLIENT_COMMON_NAME, organization: [HUB_CLIENT_ORGANIZATION] });
    await writePemPair(dir, 'client', pair);
  } else {
    await readPemPair(dir, 'client');
  }

  return {
    caCert: ca.certPath,
    caKey: ca.keyPath,
    serverCert: server.certPath,
    serverKey: server.keyPath,
    clientCert: client.certPath,
    clientKey: client.keyPath,
  };
}

// --- internals ------------------------------------------------------------------------------

/**
 * True if both files of the pair exist, false if neither does. Exactly one of them existing is
 * an error rather than a reason to regenerate: silently replacing a CA would break every
 * agent that trusts it, so a human should look.
 */
async function pairExists(dir: string, baseName: string): Promise<boolean> {
  const { certPath, keyPath } = pemPairPaths(dir, baseName);
  const [hasCert, hasKey] = await Promise.all([fileExists(certPath), fileExists(keyPath)]);
  if (hasCert !== hasKey) {
    const missing = hasCert ? keyPath : certPath;
    throw new Error(`incomplete PKI pair "${baseName}" in ${dir}: ${missing} is missing; restore it or remove both files to regenerate`);
  }
  return hasCert;
}

async function fileExists(path: string): Promise<boolean> {
  let isFile: boolean;
  try {
    isFile = (await stat(path)).isFile();
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return false;
    throw new Error(`cannot read ${path}: ${errnoSummary(err)}`);
  }
  if (!isFile) throw new Error(`${path} is not a regular file`);
  return true;
}

async function readPemFile(path: string, kind: 'certificate' | 'private key'): Promise<string> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if (isErrno(err, 'ENOENT')) throw new Error(`PKI file ${path} not found`);
    throw new Error(`cannot read PKI file ${path}: ${errnoSummary(err)}`);
  }
  // Parse, not just look for a header, so a truncated or mangled file is caught here and not at
  // the first TLS handshake. Errors name the file but never include its content.
  try {
    if (kind === 'certificate') {
      if (!text.includes('-----BEGIN CERTIFICATE-----')) throw new Error('no PEM certificate block');
      new X509Certificate(text);
    } else {
      if (!/-----BEGIN (RSA |EC )?PRIVATE KEY-----/.test(text)) throw new Error('no PEM private key block');
      createPrivateKey({ key: text, format: 'pem' });
    }
  } catch {
    throw new Error(`PKI file ${path} is not a valid PEM ${kind}`);
  }
  return text;
}

async function writeFileAtomic(path: string, content: string, mode: number): Promise<void> {
  const tmpPath = `${path}.${randomBytes(6).toString('hex')}.tmp`;
  // 'wx': never follow or reuse an existing file at the temp path; mode applies at creation.
  const handle = await open(tmpPath, 'wx', mode);
  try {
    try {
      // A public file gets exactly its mode whatever the umask. A key keeps the mode it was
      // created with (umask can only make it tighter) and is never chmod'ed.
      if (mode !== KEY_MODE) await handle.chmod(mode);
      await handle.writeFile(content, 'utf8');
      await handle.sync();
    } finally {
      await handle.close();
    }
    await rename(tmpPath, path);
  } catch (err) {
    await unlink(tmpPath).catch(() => undefined);
    throw err;
  }
}

function unique(values: string[]): string[] {
  return [...new Set(values)];
}

function isErrno(err: unknown, code: string): boolean {
  return typeof err === 'object' && err !== null && (err as NodeJS.ErrnoException).code === code;
}

function errnoSummary(err: unknown): string {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  return code ?? (err instanceof Error ? err.message : String(err));
}
