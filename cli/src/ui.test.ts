// How printed commands name this CLI: `cluster-proxy` only when that word, typed in a shell with this
// PATH, runs this very file; otherwise `node /abs/path`, which works anywhere.
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { cliWords } from './ui.js';

const dir = mkdtempSync(path.join(os.tmpdir(), 'cp-cliwords-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const main = path.join(dir, 'checkout', 'main.js');
mkdirSync(path.dirname(main));
writeFileSync(main, '#!/usr/bin/env node\n');
chmodSync(main, 0o755);
const linked = path.join(dir, 'bin');
mkdirSync(linked);
symlinkSync(main, path.join(linked, 'cluster-proxy'));
const launching = path.join(dir, 'launcher-bin');
mkdirSync(launching);
writeFileSync(path.join(launching, 'cluster-proxy'), `#!/bin/sh\nexec '/opt/node/bin/node' '${main}' "$@"\n`);
chmodSync(path.join(launching, 'cluster-proxy'), 0o755);
const other = path.join(dir, 'other-bin');
mkdirSync(other);
writeFileSync(path.join(other, 'cluster-proxy'), '#!/bin/sh\n');
chmodSync(path.join(other, 'cluster-proxy'), 0o755);
const empty = path.join(dir, 'empty');
mkdirSync(empty);

describe('cliWords', () => {
  it('is `cluster-proxy` when the command on PATH is a link to this file (run as node main.js or through the link)', () => {
    expect(cliWords(main, [empty, linked].join(path.delimiter))).toEqual(['cluster-proxy']);
    expect(cliWords(path.join(linked, 'cluster-proxy'), linked)).toEqual(['cluster-proxy']);
  });

  it("is `cluster-proxy` when the command on PATH is install-cli.sh's launcher of this file", () => {
    expect(cliWords(main, launching)).toEqual(['cluster-proxy']);
  });

  it('is `/abs/node /abs/main.js` (this Node) when no cluster-proxy is on PATH, or the first one is another program', () => {
    expect(cliWords(main, empty)).toEqual([process.execPath, main]);
    expect(cliWords(main, [other, linked].join(path.delimiter))).toEqual([process.execPath, main]);
    expect(cliWords(path.join(linked, 'cluster-proxy'), '')).toEqual([process.execPath, path.join(linked, 'cluster-proxy')]);
  });
});
