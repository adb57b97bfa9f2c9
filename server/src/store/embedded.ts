// The embedded store: MemoryStore in front, a crash-safe journal + snapshot behind (journal.ts), one
// process per data directory (lock file with the holder's pid).
import { constants as fsConstants } from 'node:fs';
import { chmod, mkdir, open, readFile, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { Journal, fsyncDir, loadState, removeStaleTmp, type JournalOptions } from './journal.js';
import { MemoryStore, type StoreSnapshot } from './memory.js';
import { UnavailableError } from './store.js';

export const LOCK_FILE = 'store.lock';

/** Another live process holds the data directory. */
export class StoreLockedError extends UnavailableError {
  constructor(
    message: string,
    readonly holderPid: number,
  ) {
    super(message);
    this.name = 'StoreLockedError';
  }
}

export interface EmbeddedStoreOptions extends JournalOptions {
  /** Where warnings go (torn tail dropped, stale lock taken over). Default process.emitWarning. */
  warn?: (message: string) => void;
  /** Watch resume window (events). Default 1000. */
  historySize?: number;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Takes the directory's lock file (O_EXCL); a lock left by a dead process is taken over. */
async function acquireLock(dir: string, warn: (m: string) => void): Promise<string> {
  const file = join(dir, LOCK_FILE);
  for (let attempt = 0; ; attempt++) {
    try {
      const fh = await open(file, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL, 0o600);
      try {
        await fh.writeFile(`${process.pid}\n`);
        await fh.sync();
      } finally {
        await fh.close();
      }
      return file;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST' || attempt > 0) {
        if ((err as NodeJS.ErrnoException).code === 'EEXIST') {
          throw new StoreLockedError(`store data directory ${dir} is locked by another process that just took it (lock file ${file})`, -1);
        }
        throw err;
      }
      const text = await readFile(file, 'utf8').catch(() => '');
      const pid = Number.parseInt(text.trim(), 10);
      if (Number.isInteger(pid) && pid > 0 && alive(pid)) {
        throw new StoreLockedError(
          `store data directory ${dir} is in use by process ${pid} (lock file ${file}); stop that hub first, or remove the file if no such process is a hub`,
          pid,
        );
      }
      warn(`store: taking over stale lock ${file} (holder ${Number.isInteger(pid) ? `pid ${pid} is gone` : 'unreadable'})`);
      await unlink(file).catch(() => undefined);
    }
  }
}

export class EmbeddedStore extends MemoryStore {
  private closing: Promise<void> | null = null;

  /** Use openEmbeddedStore(). */
  constructor(
    readonly dataDir: string,
    private readonly journal: Journal,
    private readonly lockFile: string,
    snapshot: StoreSnapshot,
    historySize?: number,
  ) {
    super({ kind: 'embedded', persist: (m) => journal.append(m), ...(historySize !== undefined ? { historySize } : {}) }, snapshot);
    journal.snapshotSource = () => this.snapshot();
  }

  override async ping(): Promise<void> {
    await super.ping();
    const err = this.journal.error;
    if (err) throw new UnavailableError(`store journal in ${this.dataDir} failed: ${err.message}`);
  }

  override close(): Promise<void> {
    this.closing ??= (async () => {
      try {
        await super.close();
        await this.journal.close();
      } finally {
        await unlink(this.lockFile).catch(() => undefined);
      }
    })();
    return this.closing;
  }
}

/**
 * Opens (creating if needed, mode 0700) the store in `dir`: takes the lock, loads the snapshot and
 * replays the journal. Throws StoreLockedError, StoreCorruptError (journal.ts) with one-line messages.
 */
export async function openEmbeddedStore(dir: string, opts: EmbeddedStoreOptions = {}): Promise<EmbeddedStore> {
  const warn = opts.warn ?? ((m: string) => process.emitWarning(m));
  await mkdir(dir, { recursive: true, mode: 0o700 });
  await chmod(dir, 0o700);
  const lockFile = await acquireLock(dir, warn);
  try {
    await removeStaleTmp(dir);
    const loaded = await loadState(dir);
    if (loaded.tornTail) {
      warn(
        `store: dropped a torn record at the end of ${join(dir, 'journal.log')} (offset ${loaded.tornTail.offset}, ${loaded.tornTail.bytes} bytes: ${loaded.tornTail.reason}); it was never acknowledged`,
      );
    }
    const journal = await Journal.open(dir, loaded.validBytes, opts);
    await fsyncDir(dir);
    return new EmbeddedStore(dir, journal, lockFile, loaded.snapshot, opts.historySize);
  } catch (err) {
    await unlink(lockFile).catch(() => undefined);
    throw err;
  }
}
