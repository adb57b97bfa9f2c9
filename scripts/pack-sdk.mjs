#!/usr/bin/env node
// Packs the SDK alone (@cluster-proxy/client, what a program that dials through the hub needs) into one
// tarball that installs without pnpm and without the registry:
//   node scripts/pack-sdk.mjs [OUT_DIR]        (after `pnpm build`; default OUT_DIR .cluster-proxy/pack)
//   npm install OUT_DIR/cluster-proxy-client-VERSION.tgz
// The SDK's only dependency is the workspace package @cluster-proxy/proto (the wire format), which has
// none of its own; it travels inside the tarball as a bundled dependency. The hub, the agent and the CLI
// are not in it (the CLI is scripts/pack.mjs's tarball).
import { execFileSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const out = path.resolve(process.argv[2] ?? path.join(root, '.cluster-proxy', 'pack'));
const readJson = (file) => JSON.parse(readFileSync(file, 'utf8'));

for (const pkg of ['proto', 'client']) {
  if (!existsSync(path.join(root, pkg, 'dist', 'index.js'))) {
    console.error(`pack-sdk: ${pkg}/dist is missing; run "pnpm build" first`);
    process.exit(1);
  }
}

/**
 * Built files only: no tests, no source maps (the sources are not shipped), and only the output of a source
 * that still exists (tsc -b never removes the output of a moved or deleted file from dist/).
 */
const shipped = (pkg) => (f) => {
  if (/\.test\.(js|d\.ts)(\.map)?$/.test(f) || f.endsWith('.map')) return false;
  const rel = path.relative(path.join(root, pkg, 'dist'), f);
  if (!/\.(js|d\.ts)$/.test(rel)) return true; // a directory
  return existsSync(path.join(root, pkg, 'src', rel.replace(/\.(js|d\.ts)$/, '.ts')));
};

/** The package.json npm should see: no workspace links, no dev or private fields. */
function publishedManifest(manifest, version) {
  const m = { ...manifest };
  delete m.private;
  delete m.devDependencies;
  delete m.scripts;
  delete m.bin;
  for (const [name, range] of Object.entries(m.dependencies ?? {})) {
    if (range.startsWith('workspace:')) m.dependencies[name] = version;
  }
  return { ...m, engines: { node: '>=20' }, license: 'Apache-2.0' };
}

const client = readJson(path.join(root, 'client', 'package.json'));
const proto = readJson(path.join(root, 'proto', 'package.json'));
const external = Object.keys(client.dependencies ?? {}).filter((n) => n !== proto.name);
if (external.length > 0 || Object.keys(proto.dependencies ?? {}).length > 0) {
  console.error(
    `pack-sdk: the SDK must depend on ${proto.name} alone (found ${[...external, ...Object.keys(proto.dependencies ?? {})].join(', ')})`,
  );
  process.exit(1);
}

const stage = mkdtempSync(path.join(os.tmpdir(), 'cluster-proxy-pack-sdk-'));
try {
  cpSync(path.join(root, 'client', 'dist'), path.join(stage, 'dist'), { recursive: true, filter: shipped('client') });
  cpSync(path.join(root, 'client', 'README.md'), path.join(stage, 'README.md'));
  const manifest = publishedManifest(client, client.version);
  // The SDK's API is its main entry; the workspace's other subpaths (./mux-session) serve our own tests.
  manifest.exports = { '.': client.exports['.'] };
  manifest.bundleDependencies = [proto.name];
  writeFileSync(path.join(stage, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);

  const protoDest = path.join(stage, 'node_modules', ...proto.name.split('/'));
  mkdirSync(protoDest, { recursive: true });
  cpSync(path.join(root, 'proto', 'dist'), path.join(protoDest, 'dist'), { recursive: true, filter: shipped('proto') });
  cpSync(path.join(root, 'proto', 'README.md'), path.join(protoDest, 'README.md'));
  writeFileSync(path.join(protoDest, 'package.json'), `${JSON.stringify(publishedManifest(proto, client.version), null, 2)}\n`);

  mkdirSync(out, { recursive: true });
  const name = execFileSync('npm', ['pack', '--pack-destination', out, '--loglevel=error'], { cwd: stage, encoding: 'utf8' })
    .trim()
    .split('\n')
    .pop();
  console.log(`==> ${path.join(out, name)}`);
  console.log(`install: npm install ${path.relative(process.cwd(), path.join(out, name)) || name}`);
} finally {
  rmSync(stage, { recursive: true, force: true });
}
