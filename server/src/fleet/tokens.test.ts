import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { TokenStore, newTokenSecret, tokenAllowsCluster } from './tokens.js';

let dir: string;
let file: string;

beforeEach(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'cp-tokens-'));
  file = path.join(dir, 'state', 'tokens.json');
});

afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('TokenStore', () => {
  it('issues a 32-byte base64url secret, stores only its SHA-256 (file 0600), and verifies it', async () => {
    const store = await TokenStore.open(file);
    const t = await store.issue({ name: 'ci', clusters: ['cluster1'] });
    expect(t.token).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(Buffer.from(t.token, 'base64url')).toHaveLength(32);
    expect(t.id).toMatch(/^[0-9a-f]{16}$/);
    const text = await readFile(file, 'utf8');
    expect(text).not.toContain(t.token);
    expect(JSON.parse(text).tokens[0].sha256).toMatch(/^[0-9a-f]{64}$/);
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    expect(store.verify(t.token)).toEqual({ kind: 'token', id: t.id, name: 'ci', clusters: ['cluster1'], expiresAt: null });
  });

  it('never issues a secret starting with "-" (a command line would read `--token -x` as a flag): draws again', () => {
    const draws = [Buffer.alloc(32, 0xf8), Buffer.alloc(32, 0xfb), Buffer.alloc(32, 0x41)]; // 0xf8-0xfb encode as "-"
    let n = 0;
    const token = newTokenSecret((size) => {
      expect(size).toBe(32);
      return draws[n++]!;
    });
    expect(n).toBe(3);
    expect(token).toBe(Buffer.alloc(32, 0x41).toString('base64url'));
    expect(Buffer.alloc(32, 0xf8).toString('base64url').startsWith('-')).toBe(true);
  });

  it('rejects unknown and malformed tokens', async () => {
    const store = await TokenStore.open(file);
    const t = await store.issue({ name: 'a', clusters: '*' });
    const flipped = (t.token[0] === 'A' ? 'B' : 'A') + t.token.slice(1);
    for (const bad of [flipped, '', 'x', `${t.token}x`, t.token.slice(1), ` ${t.token}`, 42 as unknown as string])
      expect(store.verify(bad)).toBeNull();
  });

  it('persists across reopen; list() shows no secrets', async () => {
    const a = await TokenStore.open(file);
    const t1 = await a.issue({ name: 'one', clusters: ['c1', 'c2', 'c1'] });
    const t2 = await a.issue({ name: 'two', clusters: '*', ttlSeconds: 3600 });
    const b = await TokenStore.open(file);
    expect(b.verify(t1.token)?.clusters).toEqual(['c1', 'c2']);
    expect(b.verify(t2.token)?.name).toBe('two');
    const listed = b.list();
    expect(listed.map((l) => l.name)).toEqual(['one', 'two']);
    expect(JSON.stringify(listed)).not.toMatch(/sha256|token"/);
    expect(JSON.stringify(listed)).not.toContain(t1.token);
    expect(listed[1]!.expiresAt).not.toBeNull();
    expect(listed.every((l) => !l.expired)).toBe(true);
  });

  it('honours expiry', async () => {
    let now = Date.parse('2030-01-01T00:00:00Z');
    const store = await TokenStore.open(file, { now: () => now });
    const t = await store.issue({ name: 'short', clusters: '*', ttlSeconds: 60 });
    expect(store.verify(t.token)).not.toBeNull();
    now += 59_000;
    expect(store.verify(t.token)).not.toBeNull();
    now += 1_000;
    expect(store.verify(t.token)).toBeNull();
    expect(store.list()[0]!.expired).toBe(true);
  });

  it('revokes by id or by name', async () => {
    const store = await TokenStore.open(file);
    const a = await store.issue({ name: 'a', clusters: '*' });
    const b = await store.issue({ name: 'b', clusters: '*' });
    expect(await store.revoke(a.id)).toBe(true);
    expect(await store.revoke('b')).toBe(true);
    expect(await store.revoke('b')).toBe(false);
    expect(store.verify(a.token)).toBeNull();
    expect(store.verify(b.token)).toBeNull();
    expect(store.list()).toEqual([]);
  });

  it('sees a revocation written by another process (another store on the same file)', async () => {
    const hub = await TokenStore.open(file);
    const t = await hub.issue({ name: 'shared', clusters: '*' });
    expect(hub.verify(t.token)).not.toBeNull();
    const cli = await TokenStore.open(file);
    await cli.revoke('shared');
    expect(hub.verify(t.token)).toBeNull();
    // ...and an issue by the other process does not lose what this one wrote before.
    const t2 = await cli.issue({ name: 'from-cli', clusters: ['c9'] });
    const t3 = await hub.issue({ name: 'from-hub', clusters: ['c8'] });
    expect(hub.verify(t2.token)?.name).toBe('from-cli');
    expect(cli.verify(t3.token)?.name).toBe('from-hub');
  });

  it('serialises concurrent writes', async () => {
    const store = await TokenStore.open(file);
    const issued = await Promise.all(Array.from({ length: 20 }, (_, i) => store.issue({ name: `n${i}`, clusters: '*' })));
    const reopened = await TokenStore.open(file);
    for (const t of issued) expect(reopened.verify(t.token)?.id).toBe(t.id);
  });

  it('refuses bad input with a clear error', async () => {
    const store = await TokenStore.open(file);
    await store.issue({ name: 'dup', clusters: '*' });
    await expect(store.issue({ name: 'dup', clusters: '*' })).rejects.toThrow('a token named "dup" already exists; revoke it first');
    await expect(store.issue({ name: '', clusters: '*' })).rejects.toThrow(/invalid token name/);
    await expect(store.issue({ name: 'x y', clusters: '*' })).rejects.toThrow(/invalid token name/);
    await expect(store.issue({ name: '0123456789abcdef', clusters: '*' })).rejects.toThrow(/looks like a token id/);
    await expect(store.issue({ name: 'c', clusters: [] })).rejects.toThrow(/non-empty list/);
    await expect(store.issue({ name: 'c', clusters: ['Not_A_Cluster'] })).rejects.toThrow(/invalid cluster name "Not_A_Cluster"/);
    await expect(store.issue({ name: 'c', clusters: '*', ttlSeconds: 0 })).rejects.toThrow(/invalid token lifetime/);
    expect(store.list()).toHaveLength(1);
  });

  it('a corrupt file is a one-line error at load', async () => {
    const cases: [string, RegExp][] = [
      ['{not json', /is corrupt: not JSON/],
      ['[]', /expected an object/],
      ['{"version":2,"tokens":[]}', /unsupported version 2/],
      ['{"version":1,"tokens":{}}', /"tokens" is not an array/],
      [
        '{"version":1,"tokens":[{"id":"a","name":"n","clusters":"*","sha256":"zz","createdAt":"x","expiresAt":null}]}',
        /sha256 is not a hex SHA-256/,
      ],
      [
        '{"version":1,"tokens":[{"id":"a","name":"n","clusters":["BAD"],"sha256":"' +
          'a'.repeat(64) +
          '","createdAt":"x","expiresAt":null}]}',
        /clusters: invalid cluster name/,
      ],
    ];
    await writeFile(path.join(dir, 'x'), '');
    for (const [content, msg] of cases) {
      const f = path.join(dir, 'corrupt.json');
      await writeFile(f, content);
      const err = await TokenStore.open(f).catch((e: unknown) => e as Error);
      expect(err).toBeInstanceOf(Error);
      expect((err as Error).message).toMatch(msg);
      expect((err as Error).message).toContain(f);
      expect((err as Error).message).not.toContain('\n');
    }
  });

  it('fails closed when the file turns corrupt after load', async () => {
    const store = await TokenStore.open(file);
    const t = await store.issue({ name: 'a', clusters: '*' });
    await writeFile(file, '{broken');
    expect(store.verify(t.token)).toBeNull();
  });

  it('a missing file is an empty store, created on first write', async () => {
    const store = await TokenStore.open(file);
    expect(store.list()).toEqual([]);
    await expect(stat(file)).rejects.toThrow();
    await store.issue({ name: 'first', clusters: '*' });
    expect((await stat(path.dirname(file))).mode & 0o777).toBe(0o700);
  });

  it('tokenAllowsCluster', () => {
    expect(tokenAllowsCluster({ clusters: '*' }, 'x')).toBe(true);
    expect(tokenAllowsCluster({ clusters: ['a', 'b'] }, 'b')).toBe(true);
    expect(tokenAllowsCluster({ clusters: ['a'] }, 'b')).toBe(false);
  });
});
