// The agent's identity on disk: `agent.key` (made here, 0600, never sent anywhere), `agent.crt`
// (signed by the hub) and `hub-ca.crt` (a CA bundle the hub handed out during a rollover). Without a
// valid certificate the agent bootstraps: it makes a key, signs a proof with it and trades its
// single-use bootstrap token for a certificate (POST /v1/bootstrap).
// Later it renews at 80 % of the certificate's lifetime (POST /v1/renew, authenticated by the
// current certificate); new tunnels use the new certificate, open ones keep going.
import { X509Certificate, createPrivateKey, generateKeyPairSync, sign } from 'node:crypto';
import { mkdir, open, readFile, rename } from 'node:fs/promises';
import path from 'node:path';
import { bootstrapProofMessage, renewProofMessage } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import type { CredentialsMirror } from './credentials-secret.js';
import { HubRequestError, hubRequest, type HubClientOptions } from './hub-client.js';

export interface Credentials {
  cert: Buffer;
  key: Buffer;
}

export interface CredentialsOptions {
  cluster: string;
  dir: string;
  /** File holding the `<id>.<secret>` token from `cluster-proxy join` (read at each attempt). */
  bootstrapTokenFile?: string;
  hub: Omit<HubClientOptions, 'cert' | 'key'>;
  log: Logger;
  /** Renew when this share of the lifetime has passed (default 0.8). */
  renewAt?: number;
  /** Also keep key and certificate there (a Secret): read when the directory has none, written after each change. */
  mirror?: CredentialsMirror;
}

/** The token is wrong for good (used, expired, foreign, unknown): retrying the same token cannot help. */
export class BootstrapRefused extends Error {
  override name = 'BootstrapRefused';
}

/** The hub's CA bundle as last received from the hub (a CA rollover), beside the agent's credentials. */
export const HUB_CA_FILE = 'hub-ca.crt';
const KEY_FILE = 'agent.key';
const CERT_FILE = 'agent.crt';
/** Suffix of a file being written (see write()). */
const NEXT = '.next';

export class CredentialsManager {
  private current: Credentials | null = null;
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  private readonly listeners = new Set<(c: Credentials) => void>();

  constructor(private readonly opts: CredentialsOptions) {}

  get credentials(): Credentials {
    if (!this.current) throw new Error('credentials not loaded yet');
    return this.current;
  }

  /** Called with every renewed certificate. */
  onRenewed(listener: (c: Credentials) => void): void {
    this.listeners.add(listener);
  }

  /** Loads a valid certificate from the directory, or bootstraps one. Throws BootstrapRefused or a transport error. */
  async load(): Promise<Credentials> {
    await mkdir(this.opts.dir, { recursive: true, mode: 0o700 });
    const existing = (await this.readValid()) ?? (await this.restoreFromMirror());
    if (existing) {
      this.current = existing;
    } else {
      this.current = await this.bootstrap();
    }
    this.scheduleRenewal();
    return this.current;
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private async readValid(): Promise<Credentials | null> {
    let cert: Buffer;
    let key: Buffer;
    try {
      [cert, key] = await Promise.all([readFile(path.join(this.opts.dir, CERT_FILE)), readFile(path.join(this.opts.dir, KEY_FILE))]);
    } catch {
      return null;
    }
    try {
      let x = new X509Certificate(cert);
      if (!x.checkPrivateKey(createPrivateKey(key))) {
        // A crash between the two renames of write() leaves the new key beside the old certificate,
        // with the new certificate still waiting under its temporary name: finish the write.
        const pending = await readFile(path.join(this.opts.dir, `${CERT_FILE}${NEXT}`)).catch(() => null);
        const next = pending ? new X509Certificate(pending) : null;
        if (!pending || !next?.checkPrivateKey(createPrivateKey(key))) {
          this.opts.log.warn({ dir: this.opts.dir }, 'agent certificate does not match agent.key; bootstrapping again');
          return null;
        }
        await rename(path.join(this.opts.dir, `${CERT_FILE}${NEXT}`), path.join(this.opts.dir, CERT_FILE));
        this.opts.log.info({ dir: this.opts.dir }, 'completed a certificate write that was interrupted');
        cert = pending;
        x = next;
      }
      if (Date.parse(x.validTo) <= Date.now()) {
        this.opts.log.warn(
          { dir: this.opts.dir },
          `agent certificate expired on ${new Date(x.validTo).toISOString()}; bootstrapping again`,
        );
        return null;
      }
    } catch (err) {
      this.opts.log.warn({ dir: this.opts.dir }, `agent credentials unreadable (${(err as Error).message}); bootstrapping again`);
      return null;
    }
    return { cert, key };
  }

  private async bootstrap(): Promise<Credentials> {
    const file = this.opts.bootstrapTokenFile;
    if (!file) throw new BootstrapRefused(`no valid certificate in ${this.opts.dir} and no --bootstrap-token-file to get one`);
    let token: string;
    try {
      token = (await readFile(file, 'utf8')).trim();
    } catch (err) {
      throw new BootstrapRefused(
        `cannot read bootstrap token file ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
      );
    }
    const { publicKey, privateKey } = generateKeyPairSync('rsa', {
      modulusLength: 2048,
      publicKeyEncoding: { type: 'spki', format: 'pem' },
      privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
    });
    const tokenId = token.split('.')[0] ?? '';
    const proof = sign('sha256', bootstrapProofMessage(this.opts.cluster, tokenId), privateKey).toString('base64');
    let answer: unknown;
    try {
      answer = await hubRequest(this.opts.hub, 'POST', '/v1/bootstrap', { cluster: this.opts.cluster, token, publicKey, proof });
    } catch (err) {
      if (err instanceof HubRequestError && err.status >= 400 && err.status < 500) {
        // Another replica (sharing this directory, or the mirror) may have won the single-use token meanwhile.
        const winner = (await this.readValid()) ?? (await this.restoreFromMirror());
        if (winner) return winner;
        throw new BootstrapRefused(err.message);
      }
      throw err;
    }
    const creds = { cert: Buffer.from(certificateOf(answer)), key: Buffer.from(privateKey) };
    await this.write(creds);
    this.opts.log.info(
      { cluster: this.opts.cluster, dir: this.opts.dir },
      'bootstrapped: the hub issued our certificate (our key stays in the credentials directory)',
    );
    return creds;
  }

  private scheduleRenewal(): void {
    if (this.stopped || !this.current) return;
    const x = new X509Certificate(this.current.cert);
    const from = Date.parse(x.validFrom);
    const to = Date.parse(x.validTo);
    const at = from + (to - from) * (this.opts.renewAt ?? 0.8);
    // setTimeout caps at ~24.8 days; re-arm until the moment comes.
    const delay = Math.min(Math.max(at - Date.now(), 1000), 2 ** 31 - 1);
    this.timer = setTimeout(() => {
      this.timer = null;
      if (Date.now() < at) return this.scheduleRenewal();
      void this.renew();
    }, delay);
    this.timer.unref();
  }

  /** Renews at once (the hub asked: its signing CA changed). Ignored while a renewal is under way. */
  renewNow(): void {
    if (this.renewing || this.stopped || !this.current) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    void this.renew();
  }

  private renewing = false;

  /** The certificate is due (80 % passed, or the hub asked) and not renewed yet: the hub shows Progressing. */
  private due = false;

  get isRenewing(): boolean {
    return this.due || this.renewing;
  }

  private async renew(): Promise<void> {
    if (this.stopped || !this.current || this.renewing) return;
    this.due = true;
    this.renewing = true;
    try {
      await this.renewOnce();
    } finally {
      this.renewing = false;
    }
  }

  private async renewOnce(): Promise<void> {
    const current = this.current;
    if (!current) return;
    const { publicKey, privateKey } = generateKeyPairSync('rsa', {
      modulusLength: 2048,
      publicKeyEncoding: { type: 'spki', format: 'pem' },
      privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
    });
    const proof = sign('sha256', renewProofMessage(this.opts.cluster), privateKey).toString('base64');
    try {
      const answer = await hubRequest({ ...this.opts.hub, cert: current.cert, key: current.key }, 'POST', '/v1/renew', {
        publicKey,
        proof,
      });
      const creds = { cert: Buffer.from(certificateOf(answer)), key: Buffer.from(privateKey) };
      await this.write(creds);
      this.current = creds;
      this.due = false;
      this.opts.log.info(
        { validTo: new X509Certificate(creds.cert).validTo },
        'agent certificate renewed; new tunnels use it, open ones continue',
      );
      for (const l of this.listeners) l(creds);
    } catch (err) {
      this.opts.log.warn(`cannot renew the agent certificate: ${(err as Error).message}; retrying in 30 s`);
      if (!this.stopped) {
        this.timer = setTimeout(() => {
          this.timer = null;
          void this.renew();
        }, 30_000);
        this.timer.unref();
      }
      return;
    }
    this.scheduleRenewal();
  }

  /** Into the directory, then the mirror. */
  private async write(c: Credentials): Promise<void> {
    await this.writeLocal(c);
    const { mirror } = this.opts;
    if (mirror) {
      // The directory copy is in use already; a mirror that cannot be written is retried with the next change.
      await mirror
        .save(
          new Map([
            [KEY_FILE, c.key],
            [CERT_FILE, c.cert],
          ]),
        )
        .catch((err: Error) => this.opts.log.warn(`credentials not saved to ${mirror.description}: ${err.message}`));
    }
  }

  /**
   * Both files are written and synced under temporary names, then renamed key first. A crash between
   * the renames leaves `agent.crt.next` matching the new key, and readValid() completes the write.
   */
  private async writeLocal(c: Credentials): Promise<void> {
    const files = [
      [KEY_FILE, c.key, 0o600],
      [CERT_FILE, c.cert, 0o644],
    ] as const;
    for (const [name, data, mode] of files) await writeSynced(path.join(this.opts.dir, `${name}${NEXT}`), data, mode);
    for (const [name] of files) await rename(path.join(this.opts.dir, `${name}${NEXT}`), path.join(this.opts.dir, name));
  }

  /**
   * Keeps a CA bundle the hub handed out (rollover) in the directory (temp file and rename: a crash
   * must not leave a torn bundle the next start would trust) and the mirror. Failures are logged.
   */
  async saveTrust(bundle: Buffer): Promise<void> {
    const file = path.join(this.opts.dir, HUB_CA_FILE);
    await writeSynced(`${file}${NEXT}`, bundle, 0o644)
      .then(() => rename(`${file}${NEXT}`, file))
      .catch((err: Error) => this.opts.log.warn(`cannot save the hub CA bundle: ${err.message}`));
    const { mirror } = this.opts;
    await mirror
      ?.save(new Map([[HUB_CA_FILE, bundle]]))
      .catch((err: Error) => this.opts.log.warn(`hub CA bundle not saved to ${mirror.description}: ${err.message}`));
  }

  /** The bundle saveTrust() kept (the directory's, else the mirror's, copied back), or null: then the install bundle's CA applies. */
  async savedTrust(): Promise<Buffer | null> {
    const file = path.join(this.opts.dir, HUB_CA_FILE);
    const local = await readFile(file).catch(() => null);
    const { mirror } = this.opts;
    if (local || !mirror) return local;
    try {
      const bundle = (await mirror.load())?.get(HUB_CA_FILE);
      if (!bundle) return null;
      await mkdir(this.opts.dir, { recursive: true, mode: 0o700 });
      await writeSynced(file, bundle, 0o644);
      this.opts.log.info(`hub CA bundle restored from ${mirror.description}`);
      return bundle;
    } catch (err) {
      this.opts.log.warn(`cannot read the hub CA bundle from ${mirror.description}: ${(err as Error).message}`);
      return null;
    }
  }

  /** Key and certificate from the mirror into the directory, if the mirror has a valid pair. */
  private async restoreFromMirror(): Promise<Credentials | null> {
    const { mirror } = this.opts;
    if (!mirror) return null;
    let files: Map<string, Buffer> | null;
    try {
      files = await mirror.load();
    } catch (err) {
      this.opts.log.warn(`cannot read the credentials from ${mirror.description}: ${(err as Error).message}`);
      return null;
    }
    const key = files?.get(KEY_FILE);
    const cert = files?.get(CERT_FILE);
    if (!key || !cert) return null;
    try {
      const x = new X509Certificate(cert);
      if (!x.checkPrivateKey(createPrivateKey(key)) || Date.parse(x.validTo) <= Date.now()) return null;
    } catch {
      return null;
    }
    await this.writeLocal({ key, cert });
    this.opts.log.info({ dir: this.opts.dir }, `agent credentials restored from ${mirror.description}`);
    return { key, cert };
  }
}

/** Writes and fsyncs one file. */
async function writeSynced(file: string, data: Buffer, mode: number): Promise<void> {
  const fh = await open(file, 'w', mode);
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
}

function certificateOf(answer: unknown): string {
  const cert = (answer as { certificate?: unknown } | null)?.certificate;
  if (typeof cert !== 'string' || !cert.includes('BEGIN CERTIFICATE')) throw new Error('hub answered without a certificate');
  return cert;
}
