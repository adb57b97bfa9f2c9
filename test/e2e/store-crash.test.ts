// Crash safety of the embedded store: a child process writes continuously and is SIGKILLed at random
// moments; every acknowledged write must be there after reopening. Plus the start-up checks: a corrupt
// journal record or snapshot refuses to load (file and offset named), a torn tail is dropped with a
// warning, a second process cannot open a directory in use.
import { spawn, type ChildProcess } from 'node:child_process';
import { appendFile, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { StoreCorruptError, StoreLockedError, openEmbeddedStore } from '@cluster-proxy/server';
import { snapshotHandles, waitForHandlesAtMost } from '../src/fixtures/index.js';

const WRITER = fileURLToPath(new URL('../dist/store-crash-writer.js', import.meta.url));

interface Writer {
  child: ChildProcess;
  lines: string[];
  exited: Promise<void>;
}

const children = new Set<ChildProcess>();
const dirs: string[] = [];
let handles: Map<string, number>;
beforeAll(() => {
  handles = snapshotHandles();
});
afterEach(async () => {
  for (const c of children) c.kill('SIGKILL');
  children.clear();
  for (const d of dirs.splice(0)) await rm(d, { recursive: true, force: true });
});
afterAll(async () => {
  await waitForHandlesAtMost(handles, 5000);
});

async function tempDir(): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), 'store-crash-'));
  dirs.push(d);
  return d;
}

/** Starts the writer and resolves once it has opened the store. */
async function startWriter(dir: string, round: number, compactBytes: number): Promise<Writer> {
  const child = spawn(process.execPath, [WRITER, dir, String(round), String(compactBytes)], { stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  const lines: string[] = [];
  let buf = '';
  let stderr = '';
  child.stdout?.on('data', (d: Buffer) => {
    buf += d.toString();
    const parts = buf.split('\n');
    buf = parts.pop() ?? '';
    lines.push(...parts);
  });
  child.stderr?.on('data', (d: Buffer) => {
    stderr += d.toString();
  });
  const exited = new Promise<void>((resolve) =>
    child.once('close', () => {
      children.delete(child);
      resolve();
    }),
  );
  await new Promise<void>((resolve, reject) => {
    const t = setInterval(() => {
      if (lines.some((l) => l.startsWith('ready '))) {
        clearInterval(t);
        resolve();
      } else if (child.exitCode !== null) {
        clearInterval(t);
        reject(new Error(`writer exited: ${stderr}`));
      }
    }, 10);
  });
  return { child, lines, exited };
}

async function killAt(w: Writer, ms: number): Promise<void> {
  await new Promise((r) => setTimeout(r, ms));
  w.child.kill('SIGKILL');
  await w.exited;
}

type State = number | null; // leaseDurationSeconds, or absent

describe('embedded store crash safety', () => {
  it('every acknowledged write survives SIGKILL at random moments (8 rounds)', async () => {
    const dir = await tempDir();
    const expected = new Map<string, State>();
    let acks = 0;
    let maxRv = 0;
    for (let round = 0; round < 8; round++) {
      const w = await startWriter(dir, round, 16 << 10);
      await killAt(w, 100 + Math.floor(Math.random() * 400));
      // This round: last acknowledged state per name, and the write in flight (if any) as an alternative.
      const alt = new Map<string, State>();
      for (const line of w.lines) {
        const m = /^([AB]) (.*)$/.exec(line);
        if (!m) continue;
        const rec = JSON.parse(m[2] as string) as { op: string; name: string; v: number; rv?: string };
        const result: State = rec.op === 'delete' ? null : rec.v;
        if (m[1] === 'B') alt.set(rec.name, result);
        else {
          alt.delete(rec.name);
          expected.set(rec.name, result);
          acks++;
          if (rec.rv) maxRv = Math.max(maxRv, Number(rec.rv));
        }
      }
      const warnings: string[] = [];
      const store = await openEmbeddedStore(dir, { warn: (m) => warnings.push(m) });
      const list = await store.list('ManagedCluster');
      await store.close();
      expect(Number(list.resourceVersion)).toBeGreaterThanOrEqual(maxRv);
      const actual = new Map(list.items.map((o) => [o.metadata.name, o.spec.leaseDurationSeconds ?? -1] as const));
      for (const [name, want] of expected) {
        const got = actual.get(name) ?? null;
        if (got !== want && !(alt.has(name) && alt.get(name) === got)) {
          throw new Error(`round ${round}: ${name} is ${String(got)}, acknowledged ${String(want)} (in flight: ${String(alt.get(name))})`);
        }
      }
      for (const [name, got] of actual) {
        if (!expected.has(name) && !(alt.has(name) && alt.get(name) === got)) throw new Error(`round ${round}: ${name} was never written`);
      }
      // The in-flight writes that landed are now part of the truth for later rounds.
      for (const name of alt.keys()) expected.set(name, actual.get(name) ?? null);
      expect(warnings.filter((m) => !/stale lock|torn record/.test(m))).toEqual([]);
    }
    expect(acks).toBeGreaterThan(100);
  });

  it('a corrupt record in the middle of the journal refuses to start, naming file and offset; nothing is changed', async () => {
    const dir = await tempDir();
    await killAt(await startWriter(dir, 0, 1 << 30), 300);
    const file = join(dir, 'journal.log');
    const buf = await readFile(file);
    const mid = buf.indexOf('"name"', Math.floor(buf.length / 2));
    const recordStart = buf.lastIndexOf('\n', mid) + 1;
    buf[mid + 1] = 'N'.charCodeAt(0);
    await writeFile(file, buf);
    const err = await openEmbeddedStore(dir, { warn: () => {} }).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(StoreCorruptError);
    expect((err as Error).message).toContain(`store journal ${file} is corrupt at offset ${recordStart}`);
    expect((err as Error).message).not.toContain('\n');
    expect((await stat(file)).size).toBe(buf.length);
  });

  it('a torn tail is dropped with a warning naming file and offset; the rest loads', async () => {
    const dir = await tempDir();
    await killAt(await startWriter(dir, 0, 1 << 30), 300);
    const s1 = await openEmbeddedStore(dir, { warn: () => {}, compactOnClose: false });
    const before = await s1.list('ManagedCluster');
    await s1.close();
    const file = join(dir, 'journal.log');
    const size = (await stat(file)).size;
    const firstLine = (await readFile(file, 'utf8')).split('\n')[0] ?? '';
    await appendFile(file, firstLine.slice(0, Math.floor(firstLine.length / 2)));
    const warnings: string[] = [];
    const s2 = await openEmbeddedStore(dir, { warn: (m) => warnings.push(m) });
    expect(await s2.list('ManagedCluster')).toEqual(before);
    await s2.close();
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain(`dropped a torn record at the end of ${file} (offset ${size}`);
    expect(before.items.length).toBeGreaterThan(0);
  });

  it('a corrupt snapshot refuses to start, naming the file', async () => {
    const dir = await tempDir();
    await killAt(await startWriter(dir, 0, 1 << 30), 200);
    const s = await openEmbeddedStore(dir, { warn: () => {} });
    await s.close(); // compacts into snapshot.json
    const file = join(dir, 'snapshot.json');
    const buf = await readFile(file);
    buf[buf.length - 10] ^= 0x01;
    await writeFile(file, buf);
    await expect(openEmbeddedStore(dir)).rejects.toThrow(
      new RegExp(`^store snapshot ${file} is corrupt at offset \\d+: checksum mismatch`),
    );
  });

  it('a second process cannot open a directory in use; the lock names the holder', async () => {
    const dir = await tempDir();
    const w = await startWriter(dir, 0, 1 << 30);
    const err = await openEmbeddedStore(dir).then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(StoreLockedError);
    expect((err as StoreLockedError).holderPid).toBe(w.child.pid);
    expect((err as Error).message).toContain(`in use by process ${String(w.child.pid)}`);
    await killAt(w, 0);
    // Its lock is stale now: taken over, with a warning.
    const warnings: string[] = [];
    const s = await openEmbeddedStore(dir, { warn: (m) => warnings.push(m) });
    await s.close();
    expect(warnings.some((m) => m.includes(`pid ${String(w.child.pid)} is gone`))).toBe(true);
  });
});
