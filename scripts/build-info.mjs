#!/usr/bin/env node
// Records what `cluster-proxy --version` reports beside the package version: the commit this build is of
// (cli/dist/build-info.json). Run by `pnpm build`; outside a git checkout the commit is "unknown".
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
let commit = 'unknown';
try {
  commit = execFileSync('git', ['rev-parse', '--short=12', 'HEAD'], {
    cwd: root,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'ignore'],
  }).trim();
  const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], {
    cwd: root,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'ignore'],
  }).trim();
  if (dirty !== '') commit += '-dirty';
} catch {
  // not a git checkout (an unpacked source tarball): the version alone
}
writeFileSync(path.join(root, 'cli', 'dist', 'build-info.json'), `${JSON.stringify({ commit })}\n`);
