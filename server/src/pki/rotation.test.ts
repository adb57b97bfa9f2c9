import { X509Certificate } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { ensureHubPki, readPemPair } from './files.js';
import { renewServingCertIfDue, renewalDue, rotateCa, splitBundle } from './rotation.js';

describe('hub certificate lifecycle on the data-dir PKI', () => {
  it('renews the serving certificate only after 80 % of its lifetime, keeping its names', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cp-rot-'));
    try {
      await ensureHubPki(dir, { hostnames: ['hub.example.net'] });
      const before = new X509Certificate((await readPemPair(dir, 'server')).certPem);
      const from = Date.parse(before.validFrom);
      const to = Date.parse(before.validTo);
      expect(await renewServingCertIfDue(dir, from + (to - from) * 0.79)).toBe(false);
      expect(renewalDue(before.toString(), from + (to - from) * 0.8)).toBe(true);
      expect(await renewServingCertIfDue(dir, from + (to - from) * 0.81)).toBe(true);
      const after = new X509Certificate((await readPemPair(dir, 'server')).certPem);
      expect(after.serialNumber).not.toBe(before.serialNumber);
      expect(after.subjectAltName).toBe(before.subjectAltName);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('rotates the CA in three stages, refusing them out of order', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'cp-rot-'));
    try {
      await ensureHubPki(dir);
      const original = splitBundle((await readPemPair(dir, 'ca')).certPem);
      await expect(rotateCa(dir, 'promote')).rejects.toThrow(/run "add" first/);
      await expect(rotateCa(dir, 'finish')).rejects.toThrow(/one CA only/);
      await rotateCa(dir, 'add');
      await expect(rotateCa(dir, 'add')).rejects.toThrow(/added already/);
      await expect(rotateCa(dir, 'finish')).rejects.toThrow(/promote/);
      const added = splitBundle((await readPemPair(dir, 'ca')).certPem);
      expect(added).toHaveLength(2);
      expect(added[0]).toBe(original[0]); // the old CA still signs
      await rotateCa(dir, 'promote');
      const promoted = splitBundle((await readPemPair(dir, 'ca')).certPem);
      expect(promoted[0]).toBe(added[1]);
      const server = new X509Certificate((await readPemPair(dir, 'server')).certPem);
      expect(server.checkIssued(new X509Certificate(promoted[0]!))).toBe(true);
      await rotateCa(dir, 'finish');
      expect(splitBundle((await readPemPair(dir, 'ca')).certPem)).toEqual([promoted[0]]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
