// Which in-cluster Services the gateway's proxy-service form may reach: default deny. OCM's user-server
// once proxied to any Service of any cluster for whoever could reach it, and later added an allowlist
// for every cluster at once; ours is a file (`--gateway-services`, YAML or JSON), scoped per cluster if
// an entry says so, re-read when it changes. A file that no longer parses keeps the last good list
// (logged); a deleted file denies everything.
//
//   - namespace: monitoring        # required
//     service: prometheus          # required
//     port: 9090                   # optional: any port
//     protocol: http               # optional: http or https, any if omitted
//     clusters: [c1, c2]           # optional: every cluster
//     caFile: /etc/svc-ca.crt      # optional, https: the CA of the Service's certificate
import { readFileSync } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import type { Logger } from 'pino';
import type { ServiceTarget } from './paths.js';
import { yamlLib } from '../kube-yaml.js';

export interface AllowedService {
  namespace: string;
  service: string;
  port?: number;
  protocol?: 'http' | 'https';
  clusters?: string[];
  /** PEM of the CA the Service's certificate must chain to (https). */
  ca?: Buffer;
}

export class ServiceAllowlistError extends Error {
  override name = 'ServiceAllowlistError';
}

const KEYS = new Set(['namespace', 'service', 'port', 'protocol', 'clusters', 'caFile']);

/** Parses the file's text; `readCa` reads a caFile (relative paths are relative to the list's file). */
export function parseServiceAllowlist(text: string, readCa: (file: string) => Buffer): AllowedService[] {
  let doc: unknown;
  try {
    doc = yamlLib().parse(text);
  } catch (err) {
    throw new ServiceAllowlistError(`not YAML or JSON: ${(err as Error).message.split('\n')[0]}`);
  }
  if (doc === null || doc === undefined) return [];
  if (!Array.isArray(doc)) throw new ServiceAllowlistError('must be a list of {namespace, service, port?, protocol?, clusters?, caFile?}');
  return doc.map((raw: unknown, i) => {
    const at = `entry ${i + 1}`;
    if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new ServiceAllowlistError(`${at}: must be a mapping`);
    const e = raw as Record<string, unknown>;
    const unknown = Object.keys(e).find((k) => !KEYS.has(k));
    if (unknown) throw new ServiceAllowlistError(`${at}: unknown field "${unknown}"`);
    if (typeof e['namespace'] !== 'string' || e['namespace'] === '') throw new ServiceAllowlistError(`${at}: namespace is required`);
    if (typeof e['service'] !== 'string' || e['service'] === '') throw new ServiceAllowlistError(`${at}: service is required`);
    const entry: AllowedService = { namespace: e['namespace'], service: e['service'] };
    if (e['port'] !== undefined) {
      const port = typeof e['port'] === 'string' && /^\d+$/.test(e['port']) ? Number(e['port']) : e['port'];
      if (typeof port !== 'number' || !Number.isInteger(port) || port < 1 || port > 65535)
        throw new ServiceAllowlistError(`${at}: port must be a number from 1 to 65535`);
      entry.port = port;
    }
    if (e['protocol'] !== undefined) {
      if (e['protocol'] !== 'http' && e['protocol'] !== 'https') throw new ServiceAllowlistError(`${at}: protocol must be http or https`);
      entry.protocol = e['protocol'];
    }
    if (e['clusters'] !== undefined) {
      const c = e['clusters'];
      if (!Array.isArray(c) || c.length === 0 || !c.every((x) => typeof x === 'string' && x !== ''))
        throw new ServiceAllowlistError(`${at}: clusters must be a non-empty list of cluster names`);
      entry.clusters = c as string[];
    }
    if (e['caFile'] !== undefined) {
      if (typeof e['caFile'] !== 'string' || e['caFile'] === '') throw new ServiceAllowlistError(`${at}: caFile must be a path`);
      try {
        entry.ca = readCa(e['caFile']);
      } catch (err) {
        throw new ServiceAllowlistError(
          `${at}: cannot read caFile ${e['caFile']}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
        );
      }
      if (!entry.ca.toString('latin1').includes('-----BEGIN CERTIFICATE-----'))
        throw new ServiceAllowlistError(`${at}: caFile ${e['caFile']} holds no PEM certificate`);
    }
    return entry;
  });
}

/** The entry allowing `service` in `cluster`, or null (default deny). */
export function allowedEntry(list: readonly AllowedService[], cluster: string, service: ServiceTarget): AllowedService | null {
  return (
    list.find(
      (e) =>
        e.namespace === service.namespace &&
        e.service === service.name &&
        (e.port === undefined || e.port === service.port) &&
        (e.protocol === undefined || e.protocol === service.protocol) &&
        (e.clusters === undefined || e.clusters.includes(cluster)),
    ) ?? null
  );
}

export interface ServiceAllowlistOptions {
  file: string;
  intervalMs?: number;
  log: Logger;
}

/** The list from `file`, re-read when its size or mtime changes. */
export class ServiceAllowlist {
  private entries: AllowedService[] = [];
  private stamp = '';
  private lastProblem = '';
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;

  private constructor(private readonly opts: ServiceAllowlistOptions) {}

  /** Loads the file now: a missing or broken file at start is the operator's error, said in one line. */
  static async open(opts: ServiceAllowlistOptions): Promise<ServiceAllowlist> {
    const list = new ServiceAllowlist(opts);
    let text: string;
    try {
      list.stamp = await list.stampOf();
      text = await readFile(opts.file, 'utf8');
    } catch (err) {
      throw new ServiceAllowlistError(
        `--gateway-services ${opts.file}: ${(err as NodeJS.ErrnoException).code === 'ENOENT' ? 'no such file' : (err as Error).message}`,
      );
    }
    try {
      list.entries = list.parse(text);
    } catch (err) {
      throw new ServiceAllowlistError(`--gateway-services ${opts.file}: ${(err as Error).message}`);
    }
    opts.log.info({ file: opts.file, services: list.entries.length }, 'gateway service allowlist loaded');
    list.schedule();
    return list;
  }

  allowed(cluster: string, service: ServiceTarget): AllowedService | null {
    return allowedEntry(this.entries, cluster, service);
  }

  get size(): number {
    return this.entries.length;
  }

  close(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  /** One check now (also what the timer runs). */
  async check(): Promise<void> {
    const stamp = await this.stampOf().catch((err: NodeJS.ErrnoException) => (err.code === 'ENOENT' ? 'gone' : this.stamp));
    if (stamp === this.stamp) return;
    if (stamp === 'gone') {
      this.stamp = stamp;
      this.entries = [];
      this.opts.log.warn({ file: this.opts.file }, 'gateway service allowlist file removed: no Service is reachable through the gateway');
      return;
    }
    try {
      const entries = this.parse(await readFile(this.opts.file, 'utf8'));
      this.stamp = stamp;
      this.entries = entries;
      this.lastProblem = '';
      this.opts.log.info({ file: this.opts.file, services: entries.length }, 'gateway service allowlist reloaded');
    } catch (err) {
      const msg = `gateway service allowlist ${this.opts.file} changed but cannot be used (the last good list stays): ${(err as Error).message}`;
      if (msg !== this.lastProblem) this.opts.log.error(msg);
      this.lastProblem = msg;
      this.stamp = stamp; // tried once; the next change is tried again
    }
  }

  private parse(text: string): AllowedService[] {
    const dir = this.opts.file.replace(/[^/]*$/, '');
    return parseServiceAllowlist(text, (f) => readFileSync(f.startsWith('/') ? f : `${dir}${f}`));
  }

  private async stampOf(): Promise<string> {
    const s = await stat(this.opts.file);
    return `${s.size}:${s.mtimeMs}:${s.ino}`;
  }

  private schedule(): void {
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.check().finally(() => {
        if (!this.stopped) this.schedule();
      });
    }, this.opts.intervalMs ?? 5_000);
    this.timer.unref();
  }
}
