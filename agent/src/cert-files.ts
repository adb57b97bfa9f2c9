// Re-reads the agent's --cert/--key files and hands a renewed pair to the agent. Under OCM the klusterlet
// renews the certificate (OCM's CSR flow) and rewrites the Secret; the kubelet swaps the mounted files.
// Polling, not fs.watch: a Secret volume changes by an atomic symlink swap that inotify on the file
// itself does not see. A half-written or mismatched pair is skipped (the tunnels keep the old one)
// and tried again on the next poll.
import { readFile } from 'node:fs/promises';
import { createSecureContext } from 'node:tls';
import type { Logger } from 'pino';

export interface CertFilesOptions {
  cert: string;
  key: string;
  intervalMs: number;
  /** The pair in use now, so the first poll does not report it as new. */
  current: { cert: Buffer; key: Buffer };
  onChange(pair: { cert: Buffer; key: Buffer }): void;
  log: Logger;
}

export class CertFilesWatcher {
  private timer: NodeJS.Timeout | null = null;
  private current: { cert: Buffer; key: Buffer };
  private lastProblem = '';
  private polling = false;

  constructor(private readonly opts: CertFilesOptions) {
    this.current = opts.current;
  }

  start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => void this.poll(), this.opts.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  /** One check now; resolves true when a new pair was handed over. */
  async poll(): Promise<boolean> {
    if (this.polling) return false;
    this.polling = true;
    try {
      const [cert, key] = await Promise.all([readFile(this.opts.cert), readFile(this.opts.key)]);
      if (cert.equals(this.current.cert) && key.equals(this.current.key)) return false;
      // Throws on a key that does not match the certificate (a swap caught half-way).
      createSecureContext({ cert, key });
      this.current = { cert, key };
      this.lastProblem = '';
      this.opts.log.info('the agent certificate files changed; new tunnels and hub calls use the new certificate');
      this.opts.onChange({ cert, key });
      return true;
    } catch (err) {
      const problem = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
      if (problem !== this.lastProblem)
        this.opts.log.warn({ err: problem }, 'cannot use the agent certificate files yet; keeping the current certificate');
      this.lastProblem = problem;
      return false;
    } finally {
      this.polling = false;
    }
  }
}
