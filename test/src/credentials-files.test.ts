// The agent's credentials directory after a crash in the middle of a certificate write: the new key is
// in place, the old certificate still beside it, the new certificate under its temporary name. The
// agent must finish the write and carry on, not throw its identity away (its bootstrap token is used).
import { generateKeyPairSync } from 'node:crypto';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterAll, describe, expect, it } from 'vitest';
import { CredentialsManager } from '@cluster-proxy/agent';
import { createCA, signAgentPublicKey } from '@cluster-proxy/server';

const ca = createCA({ commonName: 'credentials-files-test' });
const pair = () => {
  const k = generateKeyPairSync('rsa', {
    modulusLength: 2048,
    publicKeyEncoding: { type: 'spki', format: 'pem' },
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
  });
  return { key: k.privateKey, cert: signAgentPublicKey(ca, { cluster: 'c1', publicKeyPem: k.publicKey }) };
};

describe('agent credentials directory', () => {
  const dirs: string[] = [];
  afterAll(async () => {
    for (const d of dirs) await rm(d, { recursive: true, force: true });
  });
  const manager = async (): Promise<{ m: CredentialsManager; dir: string }> => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cp-creds-'));
    dirs.push(dir);
    // No bootstrap token: only what is on disk can make load() succeed.
    const m = new CredentialsManager({
      cluster: 'c1',
      dir,
      hub: { address: '127.0.0.1:1', caCert: Buffer.from(ca.certPem) },
      log: pino({ level: 'silent' }),
    });
    return { m, dir };
  };

  it('finishes a write interrupted between the key and the certificate rename', async () => {
    const { m, dir } = await manager();
    const old = pair();
    const next = pair();
    await writeFile(path.join(dir, 'agent.key'), next.key, { mode: 0o600 });
    await writeFile(path.join(dir, 'agent.crt'), old.cert);
    await writeFile(path.join(dir, 'agent.crt.next'), next.cert);
    const loaded = await m.load();
    m.stop();
    expect(loaded.cert.toString()).toBe(next.cert);
    expect(await readFile(path.join(dir, 'agent.crt'), 'utf8')).toBe(next.cert);
    await expect(stat(path.join(dir, 'agent.crt.next'))).rejects.toThrow(/ENOENT/);
  });

  it('a key and certificate that do not match, with nothing pending, are not used', async () => {
    const { m, dir } = await manager();
    await writeFile(path.join(dir, 'agent.key'), pair().key, { mode: 0o600 });
    await writeFile(path.join(dir, 'agent.crt'), pair().cert);
    await expect(m.load()).rejects.toThrow(/no valid certificate .* and no --bootstrap-token-file/);
    m.stop();
  });
});
