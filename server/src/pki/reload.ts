// Watches the hub's TLS files (CA bundle, serving certificate and key, CA key) and hands a checked,
// consistent set to the listeners when any of them changes — a renewed serving certificate or a CA
// rollover stage — without touching open connections. With the data-dir PKI it also renews the
// serving certificate at 80 % of its lifetime. A half-written or mismatched set is logged and skipped.
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { readFile, stat } from 'node:fs/promises';
import type { Logger } from 'pino';
import { renewServingCertIfDue } from './rotation.js';

export interface TlsMaterial {
  caCert: Buffer;
  cert: Buffer;
  key: Buffer;
  /** The signing CA key, when the hub signs (first certificate of caCert). */
  caKey?: Buffer;
}

export interface TlsReloaderOptions {
  files: { ca: string; cert: string; key: string; caKey?: string };
  /** The data-dir PKI directory: the hub renews its own serving certificate there. */
  managedPkiDir?: string;
  intervalMs: number;
  onChange(m: TlsMaterial): void;
  log: Logger;
}

export class TlsReloader {
  private timer: NodeJS.Timeout | null = null;
  private stamp = '';
  private lastProblem = '';

  constructor(private readonly opts: TlsReloaderOptions) {}

  async start(): Promise<void> {
    this.stamp = await this.stamps();
    this.schedule();
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  /** One check now (also what the timer runs). */
  async check(): Promise<void> {
    if (this.opts.managedPkiDir) {
      try {
        if (await renewServingCertIfDue(this.opts.managedPkiDir))
          this.opts.log.info('hub serving certificate renewed (80 % of its lifetime had passed)');
      } catch (err) {
        this.problem(`cannot renew the hub serving certificate: ${(err as Error).message}`);
      }
    }
    const stamp = await this.stamps().catch(() => this.stamp);
    if (stamp === this.stamp) return;
    try {
      const m = await this.read();
      this.stamp = stamp;
      this.lastProblem = '';
      this.opts.onChange(m);
    } catch (err) {
      // Maybe mid-update (certificate written, key not yet): try again next round.
      this.problem(`TLS files changed but cannot be used yet: ${(err as Error).message}`);
    }
  }

  private schedule(): void {
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.check().finally(() => this.schedule());
    }, this.opts.intervalMs);
    this.timer.unref();
  }

  private problem(msg: string): void {
    if (msg !== this.lastProblem) this.opts.log.error(msg);
    this.lastProblem = msg;
  }

  private async stamps(): Promise<string> {
    const f = this.opts.files;
    const all = await Promise.all([f.ca, f.cert, f.key, f.caKey].filter((x): x is string => !!x).map((p) => stat(p)));
    return all.map((s) => `${s.mtimeMs}:${s.size}`).join(' ');
  }

  private async read(): Promise<TlsMaterial> {
    const f = this.opts.files;
    const [caCert, cert, key, caKey] = await Promise.all([
      readFile(f.ca),
      readFile(f.cert),
      readFile(f.key),
      f.caKey ? readFile(f.caKey) : Promise.resolve(undefined),
    ]);
    const x = new X509Certificate(cert);
    if (!x.checkPrivateKey(createPrivateKey(key))) throw new Error(`${f.key} does not match ${f.cert}`);
    const first = new X509Certificate(caCert);
    if (caKey && !first.checkPrivateKey(createPrivateKey(caKey)))
      throw new Error(`${f.caKey} does not match the first certificate of ${f.ca}`);
    return { caCert, cert, key, ...(caKey ? { caKey } : {}) };
  }
}
