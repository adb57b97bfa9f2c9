// The embedded store's files: an append-only journal and a snapshot, both checksummed.
//
// Journal record (one per line): `<byte length of json> <crc32 of json, 8 hex> <json>\n`.
// A write is acknowledged only after its record is written and fdatasync'd; concurrent writes share
// one write + one fdatasync (group commit). Compaction writes the whole state to `snapshot.json`
// (tmp file, fsync, rename, fsync the directory) and then truncates the journal.
//
// At open, a bad record followed by nothing valid is a torn tail (a write the crash interrupted, never
// acknowledged): dropped with a warning. A bad record with valid records after it, or a bad snapshot,
// is corruption: the open fails naming the file and offset, nothing is half-loaded.
import { constants as fsConstants } from 'node:fs';
import { open, readFile, rename, unlink, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { KINDS, type HubObject, type Kind } from './objects.js';
import { UnavailableError } from './store.js';
import type { StoreMutation, StoreSnapshot } from './memory.js';

export const JOURNAL_FILE = 'journal.log';
export const SNAPSHOT_FILE = 'snapshot.json';
const SNAPSHOT_MAGIC = 'cluster-proxy-store-snapshot v1';
/** One batch (group commit) is at most this many bytes; the rest waits for the next fsync. */
const MAX_BATCH_BYTES = 4 << 20;

/** The data directory cannot be loaded: a corrupt journal record or snapshot. */
export class StoreCorruptError extends UnavailableError {
  constructor(message: string) {
    super(message);
    this.name = 'StoreCorruptError';
  }
}

export function encodeRecord(m: StoreMutation): Buffer {
  const json = Buffer.from(JSON.stringify({ rv: m.rv, op: m.op, kind: m.kind, object: m.object }), 'utf8');
  const head = Buffer.from(`${json.length} ${crc32(json).toString(16).padStart(8, '0')} `, 'ascii');
  return Buffer.concat([head, json, Buffer.from('\n')]);
}

type Parsed = { ok: true; m: StoreMutation; end: number } | { ok: false; reason: string };

function parseRecord(buf: Buffer, off: number): Parsed {
  const sp1 = buf.indexOf(0x20, off);
  if (sp1 < 0 || sp1 - off > 10) return { ok: false, reason: 'incomplete record header' };
  const lenText = buf.toString('ascii', off, sp1);
  if (!/^\d+$/.test(lenText)) return { ok: false, reason: 'bad record length' };
  const len = Number(lenText);
  const crcStart = sp1 + 1;
  if (buf.length < crcStart + 9) return { ok: false, reason: 'incomplete record header' };
  const crcText = buf.toString('ascii', crcStart, crcStart + 8);
  if (!/^[0-9a-f]{8}$/.test(crcText) || buf[crcStart + 8] !== 0x20) return { ok: false, reason: 'bad record checksum field' };
  const jsonStart = crcStart + 9;
  const end = jsonStart + len + 1;
  if (end > buf.length) return { ok: false, reason: `record of ${len} bytes runs past the end of the file` };
  if (buf[end - 1] !== 0x0a) return { ok: false, reason: 'record not terminated by a newline' };
  const json = buf.subarray(jsonStart, jsonStart + len);
  if (crc32(json) !== parseInt(crcText, 16)) return { ok: false, reason: 'checksum mismatch' };
  let v: unknown;
  try {
    v = JSON.parse(json.toString('utf8'));
  } catch {
    return { ok: false, reason: 'record is not JSON' };
  }
  const r = v as Partial<StoreMutation>;
  if (
    typeof r.rv !== 'number' ||
    (r.op !== 'put' && r.op !== 'delete') ||
    typeof r.kind !== 'string' ||
    !(r.kind in KINDS) ||
    !r.object ||
    typeof r.object !== 'object' ||
    typeof (r.object as HubObject).metadata?.name !== 'string'
  ) {
    return { ok: false, reason: 'record has an unexpected shape' };
  }
  return { ok: true, m: r as StoreMutation, end };
}

/** Whether any valid record starts after `off` (at a line start): decides torn tail vs corruption. */
function validRecordAfter(buf: Buffer, off: number): boolean {
  let nl = buf.indexOf(0x0a, off);
  while (nl >= 0 && nl + 1 < buf.length) {
    if (parseRecord(buf, nl + 1).ok) return true;
    nl = buf.indexOf(0x0a, nl + 1);
  }
  return false;
}

function keyOf(kind: string, obj: HubObject): string {
  return `${kind}\u0000${obj.metadata.namespace ?? ''}/${obj.metadata.name}`;
}

export async function readSnapshot(dir: string): Promise<StoreSnapshot> {
  const file = join(dir, SNAPSHOT_FILE);
  let buf: Buffer;
  try {
    buf = await readFile(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return { rv: 0, objects: [] };
    throw err;
  }
  const bad = (offset: number, why: string): never => {
    throw new StoreCorruptError(
      `store snapshot ${file} is corrupt at offset ${offset}: ${why}; refusing to start (restore the data directory from a backup)`,
    );
  };
  const nl = buf.indexOf(0x0a);
  if (nl < 0) bad(0, 'no header line');
  const head = buf.toString('utf8', 0, nl).split(' ');
  const crcText = head.pop() ?? '';
  const lenText = head.pop() ?? '';
  if (head.join(' ') !== SNAPSHOT_MAGIC) bad(0, 'not a cluster-proxy store snapshot');
  const json = buf.subarray(nl + 1);
  if (!/^\d+$/.test(lenText) || Number(lenText) !== json.length)
    bad(nl + 1, `length ${json.length} is not the ${lenText} the header gives`);
  if (crc32(json) !== parseInt(crcText, 16)) bad(nl + 1, 'checksum mismatch');
  try {
    const s = JSON.parse(json.toString('utf8')) as StoreSnapshot;
    if (typeof s.rv !== 'number' || !Array.isArray(s.objects)) bad(nl + 1, 'unexpected shape');
    return s;
  } catch (err) {
    if (err instanceof StoreCorruptError) throw err;
    return bad(nl + 1, 'not JSON');
  }
}

export interface LoadResult {
  snapshot: StoreSnapshot;
  /** Where valid records end: the journal is truncated here before appending. */
  validBytes: number;
  records: number;
  /** Set when a torn tail was dropped. */
  tornTail?: { offset: number; bytes: number; reason: string };
}

/** Snapshot + journal replayed. Records at or below the snapshot's version are already in it. */
export async function loadState(dir: string): Promise<LoadResult> {
  const base = await readSnapshot(dir);
  const file = join(dir, JOURNAL_FILE);
  let buf: Buffer;
  try {
    buf = await readFile(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    buf = Buffer.alloc(0);
  }
  const state = new Map<string, { kind: Kind; object: HubObject }>();
  for (const o of base.objects) state.set(keyOf(o.kind, o.object), o);
  let rv = base.rv;
  let off = 0;
  let records = 0;
  let lastRv = 0;
  let tornTail: LoadResult['tornTail'];
  while (off < buf.length) {
    const p = parseRecord(buf, off);
    if (!p.ok) {
      if (validRecordAfter(buf, off)) {
        throw new StoreCorruptError(
          `store journal ${file} is corrupt at offset ${off} (record ${records + 1}): ${p.reason}, and valid records follow; refusing to start (restore the data directory from a backup)`,
        );
      }
      tornTail = { offset: off, bytes: buf.length - off, reason: p.reason };
      break;
    }
    if (p.m.rv <= lastRv) {
      throw new StoreCorruptError(
        `store journal ${file} is corrupt at offset ${off} (record ${records + 1}): version ${p.m.rv} does not follow ${lastRv}; refusing to start`,
      );
    }
    lastRv = p.m.rv;
    records++;
    if (p.m.rv > base.rv) {
      const k = keyOf(p.m.kind, p.m.object);
      if (p.m.op === 'put') state.set(k, { kind: p.m.kind, object: p.m.object });
      else state.delete(k);
      rv = Math.max(rv, p.m.rv);
    }
    off = p.end;
  }
  return { snapshot: { rv, objects: [...state.values()] }, validBytes: off, records, ...(tornTail ? { tornTail } : {}) };
}

export async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, fsConstants.O_RDONLY);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

export interface JournalOptions {
  /** Compact (snapshot + truncate) once the journal holds this many bytes. Default 8 MiB. */
  compactBytes?: number;
  /** Compact on close (default true); tests turn it off to keep the journal as written. */
  compactOnClose?: boolean;
}

interface Waiter {
  buf: Buffer;
  resolve: () => void;
  reject: (err: Error) => void;
}

/** The open journal: appends with group commit, compaction. One writer loop, so no concurrent appends. */
export class Journal {
  private queue: Waiter[] = [];
  private running: Promise<void> | null = null;
  private bytes: number;
  private failure: Error | null = null;
  private closed = false;
  /** Supplies the full current state for compaction (set by the store). */
  snapshotSource: (() => StoreSnapshot) | null = null;

  private constructor(
    private readonly dir: string,
    private readonly fh: FileHandle,
    size: number,
    private readonly opts: JournalOptions,
  ) {
    this.bytes = size;
  }

  static async open(dir: string, validBytes: number, opts: JournalOptions = {}): Promise<Journal> {
    const file = join(dir, JOURNAL_FILE);
    const fh = await open(file, fsConstants.O_RDWR | fsConstants.O_CREAT | fsConstants.O_APPEND, 0o600);
    try {
      await fh.chmod(0o600);
      const { size } = await fh.stat();
      if (size !== validBytes) {
        await fh.truncate(validBytes);
        await fh.sync();
      }
      await fsyncDir(dir);
      return new Journal(dir, fh, validBytes, opts);
    } catch (err) {
      await fh.close();
      throw err;
    }
  }

  get error(): Error | null {
    return this.failure;
  }

  append(m: StoreMutation): Promise<void> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.closed) return Promise.reject(new UnavailableError('store journal is closed'));
    const buf = encodeRecord(m);
    return new Promise<void>((resolve, reject) => {
      this.queue.push({ buf, resolve, reject });
      this.running ??= this.run().finally(() => {
        this.running = null;
      });
    });
  }

  private async run(): Promise<void> {
    while (this.queue.length > 0) {
      const batch: Waiter[] = [];
      let size = 0;
      while (this.queue.length > 0 && (batch.length === 0 || size + (this.queue[0] as Waiter).buf.length <= MAX_BATCH_BYTES)) {
        const w = this.queue.shift() as Waiter;
        batch.push(w);
        size += w.buf.length;
      }
      try {
        if (this.failure) throw this.failure;
        const data = batch.length === 1 ? (batch[0] as Waiter).buf : Buffer.concat(batch.map((w) => w.buf));
        let written = 0;
        while (written < data.length) {
          const r = await this.fh.write(data, written, data.length - written);
          written += r.bytesWritten;
        }
        await this.fh.datasync();
        this.bytes += data.length;
        for (const w of batch) w.resolve();
      } catch (err) {
        this.failure ??= err instanceof Error ? err : new Error(String(err));
        for (const w of batch) w.reject(this.failure);
        for (const w of this.queue.splice(0)) w.reject(this.failure);
        return;
      }
      if (this.bytes >= (this.opts.compactBytes ?? 8 << 20)) {
        try {
          await this.compact();
        } catch (err) {
          // The journal is still complete; compaction is retried after the next batch.
          process.emitWarning(`store compaction in ${this.dir} failed: ${err instanceof Error ? err.message : String(err)}`);
        }
      }
    }
  }

  /** Writes the full state as the snapshot, then empties the journal (its records are all in it). */
  private async compact(): Promise<void> {
    if (!this.snapshotSource) return;
    // Taken synchronously: it may include writes still queued here; their records (at or below its
    // version) are skipped at load, so both orders of crash are consistent.
    const snap = this.snapshotSource();
    const json = Buffer.from(JSON.stringify(snap), 'utf8');
    const head = `${SNAPSHOT_MAGIC} ${json.length} ${crc32(json).toString(16).padStart(8, '0')}\n`;
    const tmp = join(this.dir, `${SNAPSHOT_FILE}.tmp`);
    const fh = await open(tmp, 'w', 0o600);
    try {
      await fh.writeFile(Buffer.concat([Buffer.from(head, 'utf8'), json]));
      await fh.sync();
    } finally {
      await fh.close();
    }
    await rename(tmp, join(this.dir, SNAPSHOT_FILE));
    await fsyncDir(this.dir);
    await this.fh.truncate(0);
    await this.fh.sync();
    this.bytes = 0;
  }

  /** Waits for queued writes, compacts if there is anything in the journal, closes the file. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    while (this.running) await this.running;
    try {
      if (!this.failure && this.bytes > 0 && this.opts.compactOnClose !== false) await this.compact();
    } finally {
      await this.fh.close();
    }
  }
}

export async function removeStaleTmp(dir: string): Promise<void> {
  await unlink(join(dir, `${SNAPSHOT_FILE}.tmp`)).catch((err: NodeJS.ErrnoException) => {
    if (err.code !== 'ENOENT') throw err;
  });
}
