// Bearer tokens for clients that cannot present a certificate (kubectl's proxy-url, most HTTP
// libraries) on the HTTP CONNECT frontend. Persisted as JSON in the hub's data directory:
//
//   { "version": 1, "tokens": [ { "id", "name", "clusters": ["c1"] | "*", "sha256", "createdAt", "expiresAt" } ] }
//
// The secret (32 random bytes, base64url) is returned once by issue() and never stored: the file
// holds only its SHA-256. Writes go to a temp file (0600) that is fsynced and renamed into place.
// verify() notices when another process (the CLI) rewrote the file, so a revocation takes effect
// on the next request. Nothing here logs a token.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import { mkdir, open, readFile, rename, stat, unlink } from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from 'pino';
import { isDns1123Subdomain } from '../pki/agent-identity.js';
import type { TokenPrincipal } from '../http/principal.js';

export type { TokenPrincipal };

const FILE_VERSION = 1;
const FILE_MODE = 0o600;
const DIR_MODE = 0o700;
const SECRET_BYTES = 32;
/** base64url of 32 bytes, no padding. */
const TOKEN_SHAPE = /^[A-Za-z0-9_-]{43}$/;
const NAME_SHAPE = /^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$/;
const ID_SHAPE = /^[0-9a-f]{16}$/;

/** A token as list() shows it: no secret, no hash. */
export interface TokenInfo {
  id: string;
  name: string;
  clusters: readonly string[] | '*';
  createdAt: string;
  expiresAt: string | null;
  expired: boolean;
}

export interface IssueTokenOptions {
  /** Unique among this store's tokens; revoke() accepts it as well as the id. */
  name: string;
  clusters: readonly string[] | '*';
  /** Lifetime; omitted = no expiry. */
  ttlSeconds?: number;
}

export interface IssuedToken {
  id: string;
  name: string;
  /** The secret. Shown once: only its SHA-256 is stored. */
  token: string;
  expiresAt: string | null;
}

export interface TokenStoreOptions {
  /** Reports a file that became unreadable/corrupt after load (the store then accepts no token). */
  log?: Logger;
  /** Clock for expiry, ms since the epoch (tests). */
  now?: () => number;
}

interface TokenRecord {
  id: string;
  name: string;
  clusters: string[] | '*';
  sha256: string;
  createdAt: string;
  expiresAt: string | null;
}

interface FileSignature {
  ino: number;
  size: number;
  mtimeMs: number;
}

/**
 * A new secret: SECRET_BYTES random bytes in base64url, never starting with "-". One in 64 would, and a
 * command line then reads `--token -abc...` as a flag (Node's parseArgs refuses it as ambiguous).
 */
export function newTokenSecret(draw: (size: number) => Buffer = randomBytes): string {
  for (;;) {
    const token = draw(SECRET_BYTES).toString('base64url');
    if (!token.startsWith('-')) return token;
  }
}

export class TokenStore {
  private records: TokenRecord[] = [];
  private hashes: Buffer[] = [];
  private signature: FileSignature | null = null;
  private queue: Promise<unknown> = Promise.resolve();
  private readonly now: () => number;

  private constructor(
    readonly file: string,
    private readonly opts: TokenStoreOptions,
  ) {
    this.now = opts.now ?? Date.now;
  }

  /** Loads `file` (a missing file is an empty store; it is created on the first issue()). A
   * corrupt file throws one line naming the file and what is wrong. */
  static async open(file: string, opts: TokenStoreOptions = {}): Promise<TokenStore> {
    const store = new TokenStore(path.resolve(file), opts);
    await store.loadAsync();
    return store;
  }

  /** Creates a token. Resolves once it is on disk. */
  issue(o: IssueTokenOptions): Promise<IssuedToken> {
    return this.mutate(() => {
      if (typeof o.name !== 'string' || !NAME_SHAPE.test(o.name)) {
        throw new Error(
          `invalid token name ${JSON.stringify(o.name)}: 1-128 characters, letters, digits and . _ @ : - (starting with a letter or digit)`,
        );
      }
      if (ID_SHAPE.test(o.name)) throw new Error(`invalid token name "${o.name}": it looks like a token id`);
      if (this.records.some((r) => r.name === o.name)) throw new Error(`a token named "${o.name}" already exists; revoke it first`);
      const clusters = checkClusters(o.clusters);
      let expiresAt: string | null = null;
      if (o.ttlSeconds !== undefined) {
        if (!Number.isFinite(o.ttlSeconds) || o.ttlSeconds <= 0)
          throw new Error(`invalid token lifetime ${o.ttlSeconds}: must be a positive number of seconds`);
        expiresAt = new Date(this.now() + o.ttlSeconds * 1000).toISOString();
      }
      let id: string;
      do id = randomBytes(8).toString('hex');
      while (this.records.some((r) => r.id === id));
      const token = newTokenSecret();
      const record: TokenRecord = {
        id,
        name: o.name,
        clusters,
        sha256: sha256Hex(token),
        createdAt: new Date(this.now()).toISOString(),
        expiresAt,
      };
      return { records: [...this.records, record], result: { id, name: o.name, token, expiresAt } };
    });
  }

  /** Removes the token with this id or name. Resolves to whether one was removed. */
  revoke(idOrName: string): Promise<boolean> {
    return this.mutate(() => {
      const keep = this.records.filter((r) => r.id !== idOrName && r.name !== idOrName);
      return { records: keep, result: keep.length !== this.records.length };
    });
  }

  /** Every token (expired ones too, marked), without secrets. */
  list(): TokenInfo[] {
    this.refresh();
    const now = this.now();
    return this.records.map((r) => ({
      id: r.id,
      name: r.name,
      clusters: r.clusters,
      createdAt: r.createdAt,
      expiresAt: r.expiresAt,
      expired: isExpired(r, now),
    }));
  }

  /** The principal a presented token stands for, or null (unknown, malformed, expired, revoked).
   * Compares SHA-256 digests in constant time against every stored token. */
  verify(token: string): TokenPrincipal | null {
    if (typeof token !== 'string' || !TOKEN_SHAPE.test(token)) return null;
    this.refresh();
    const digest = createHash('sha256').update(token, 'utf8').digest();
    let found: TokenRecord | null = null;
    for (let i = 0; i < this.records.length; i++) {
      // No early exit: the time taken does not depend on which (if any) record matched.
      if (timingSafeEqual(digest, this.hashes[i]!)) found = this.records[i]!;
    }
    if (!found || isExpired(found, this.now())) return null;
    return { kind: 'token', id: found.id, name: found.name, clusters: found.clusters, expiresAt: found.expiresAt };
  }

  // ------------------------------------------------------------ persistence

  /** Serialised read-modify-write: re-read the file (another process may have changed it),
   * apply, write atomically, then adopt the result. */
  private mutate<T>(change: () => { records: TokenRecord[]; result: T }): Promise<T> {
    const run = async (): Promise<T> => {
      await this.loadAsync();
      const { records, result } = change();
      await this.write(records);
      return result;
    };
    const p = this.queue.then(run, run);
    this.queue = p.catch(() => undefined);
    return p;
  }

  private async loadAsync(): Promise<void> {
    let text: string;
    let sig: FileSignature | null;
    try {
      [text, sig] = await Promise.all([readFile(this.file, 'utf8'), stat(this.file).then(signatureOf)]);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return this.adopt([], null);
      throw new Error(`cannot read token file ${this.file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    this.adopt(parseTokenFile(this.file, text), sig);
  }

  /** Cheap check (one stat) that the file is still what we loaded; reload it if not. A file that
   * became corrupt leaves the store empty (fail closed) until it is fixed. */
  private refresh(): void {
    let sig: FileSignature | null;
    try {
      sig = signatureOf(statSync(this.file));
    } catch {
      sig = null;
    }
    if (sameSignature(sig, this.signature)) return;
    if (sig === null) return this.adopt([], null);
    try {
      this.adopt(parseTokenFile(this.file, readFileSync(this.file, 'utf8')), sig);
    } catch (err) {
      this.opts.log?.error({ file: this.file }, `${(err as Error).message}; no token is accepted until it is fixed`);
      this.adopt([], sig);
    }
  }

  private adopt(records: TokenRecord[], sig: FileSignature | null): void {
    this.records = records;
    this.hashes = records.map((r) => Buffer.from(r.sha256, 'hex'));
    this.signature = sig;
  }

  private async write(records: TokenRecord[]): Promise<void> {
    await mkdir(path.dirname(this.file), { recursive: true, mode: DIR_MODE });
    const tmp = `${this.file}.${randomBytes(6).toString('hex')}.tmp`;
    const body = `${JSON.stringify({ version: FILE_VERSION, tokens: records }, null, 2)}\n`;
    const handle = await open(tmp, 'wx', FILE_MODE);
    try {
      try {
        await handle.chmod(FILE_MODE);
        await handle.writeFile(body, 'utf8');
        await handle.sync();
      } finally {
        await handle.close();
      }
      await rename(tmp, this.file);
    } catch (err) {
      await unlink(tmp).catch(() => undefined);
      throw new Error(`cannot write token file ${this.file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    await syncDir(path.dirname(this.file));
    this.adopt(records, signatureOf(await stat(this.file)));
  }
}

/** Whether a principal holding `clusters` may reach `cluster`. */
/** Whether a string has the shape of a hub token's secret (it may still be unknown or revoked). */
export function looksLikeHubToken(token: string): boolean {
  return TOKEN_SHAPE.test(token);
}

export function tokenAllowsCluster(p: Pick<TokenPrincipal, 'clusters'>, cluster: string): boolean {
  return p.clusters === '*' || p.clusters.includes(cluster);
}

// ------------------------------------------------------------ helpers

function parseTokenFile(file: string, text: string): TokenRecord[] {
  const bad = (why: string): Error => new Error(`token file ${file} is corrupt: ${why}`);
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw bad(`not JSON (${(err as Error).message.split('\n')[0]})`);
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) throw bad('expected an object with "version" and "tokens"');
  const { version, tokens } = doc as { version?: unknown; tokens?: unknown };
  if (version !== FILE_VERSION) throw bad(`unsupported version ${JSON.stringify(version)} (expected ${FILE_VERSION})`);
  if (!Array.isArray(tokens)) throw bad('"tokens" is not an array');
  const ids = new Set<string>();
  return tokens.map((t: unknown, i): TokenRecord => {
    if (typeof t !== 'object' || t === null) throw bad(`tokens[${i}] is not an object`);
    const r = t as Record<string, unknown>;
    const str = (k: string): string => {
      if (typeof r[k] !== 'string') throw bad(`tokens[${i}].${k} is not a string`);
      return r[k] as string;
    };
    const id = str('id');
    if (ids.has(id)) throw bad(`duplicate token id ${id}`);
    ids.add(id);
    const sha256 = str('sha256');
    if (!/^[0-9a-f]{64}$/.test(sha256)) throw bad(`tokens[${i}].sha256 is not a hex SHA-256`);
    const createdAt = str('createdAt');
    const expiresAt = r['expiresAt'] === null || r['expiresAt'] === undefined ? null : str('expiresAt');
    if (expiresAt !== null && Number.isNaN(Date.parse(expiresAt))) throw bad(`tokens[${i}].expiresAt is not a date`);
    let clusters: string[] | '*';
    try {
      clusters = checkClusters(r['clusters'] as string[] | '*');
    } catch (err) {
      throw bad(`tokens[${i}].clusters: ${(err as Error).message}`);
    }
    return { id, name: str('name'), clusters, sha256, createdAt, expiresAt };
  });
}

function checkClusters(clusters: readonly string[] | '*'): string[] | '*' {
  if (clusters === '*') return '*';
  if (!Array.isArray(clusters) || clusters.length === 0) throw new Error('clusters must be "*" or a non-empty list of cluster names');
  for (const c of clusters) {
    if (typeof c !== 'string' || !isDns1123Subdomain(c)) throw new Error(`invalid cluster name ${JSON.stringify(c)}`);
  }
  return [...new Set(clusters as string[])];
}

function isExpired(r: TokenRecord, now: number): boolean {
  return r.expiresAt !== null && Date.parse(r.expiresAt) <= now;
}

function sha256Hex(s: string): string {
  return createHash('sha256').update(s, 'utf8').digest('hex');
}

function signatureOf(s: { ino: number; size: number; mtimeMs: number }): FileSignature {
  return { ino: s.ino, size: s.size, mtimeMs: s.mtimeMs };
}

function sameSignature(a: FileSignature | null, b: FileSignature | null): boolean {
  if (a === null || b === null) return a === b;
  return a.ino === b.ino && a.size === b.size && a.mtimeMs === b.mtimeMs;
}

/** Makes the rename durable; best effort (some filesystems refuse to fsync a directory). */
async function syncDir(dir: string): Promise<void> {
  try {
    const h = await open(dir, 'r');
    try {
      await h.sync();
    } finally {
      await h.close();
    }
  } catch {
    // Durability of the directory entry is a bonus, not a requirement.
  }
}
