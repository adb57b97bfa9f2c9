#!/usr/bin/env node
// Packs the CLI into one installable tarball, every dependency inside it:
//   node scripts/pack.mjs [OUT_DIR]        (after `pnpm build`; default OUT_DIR .cluster-proxy/pack)
//   npm install -g OUT_DIR/cluster-proxy-VERSION.tgz
// The workspace packages use `workspace:*` links that only pnpm understands, so the tarball carries them
// (and their npm dependencies, at the exact versions the tests ran with) as bundled dependencies: the
// install needs neither pnpm nor the registry. npm does the bundling; this script only lays out the folder.
import { execFileSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const out = path.resolve(process.argv[2] ?? path.join(root, '.cluster-proxy', 'pack'));
const WORKSPACE = ['proto', 'server', 'agent', 'client', 'cli'];
/** The file each package's build must have produced. */
const BUILT = { proto: 'index.js', server: 'index.js', agent: 'index.js', client: 'index.js', cli: 'main.js' };
const readJson = (file) => JSON.parse(readFileSync(file, 'utf8'));

for (const pkg of WORKSPACE) {
  if (!existsSync(path.join(root, pkg, 'dist', BUILT[pkg]))) {
    console.error(`pack: ${pkg}/dist is missing; run "pnpm build" first`);
    process.exit(1);
  }
}

const cli = readJson(path.join(root, 'cli', 'package.json'));
const version = cli.version;

// Every npm dependency of the workspace packages, at the version installed here (what the tests ran).
const external = {};
for (const pkg of WORKSPACE) {
  const manifest = readJson(path.join(root, pkg, 'package.json'));
  for (const name of Object.keys(manifest.dependencies ?? {})) {
    if (name.startsWith('@cluster-proxy/')) continue;
    const installed = readJson(path.join(root, pkg, 'node_modules', name, 'package.json')).version;
    if (external[name] !== undefined && external[name] !== installed) {
      console.error(`pack: ${name} is ${external[name]} in one package and ${installed} in ${pkg}; align them first`);
      process.exit(1);
    }
    external[name] = installed;
  }
}

const stage = mkdtempSync(path.join(os.tmpdir(), 'cluster-proxy-pack-'));
try {
  const manifest = {
    name: 'cluster-proxy',
    version,
    description: 'Reverse-tunnel connectivity for fleets of Kubernetes clusters: hub, agent and CLI (ANP/konnectivity wire-compatible)',
    type: 'module',
    bin: { 'cluster-proxy': 'bin/cluster-proxy.js' },
    engines: { node: '>=20' },
    license: 'Apache-2.0',
    dependencies: { ...external },
  };
  writeFileSync(path.join(stage, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  console.log(`==> npm install ${Object.keys(external).length} dependencies into the staging folder`);
  execFileSync('npm', ['install', '--omit=dev', '--no-audit', '--no-fund', '--ignore-scripts', '--no-package-lock', '--loglevel=error'], {
    cwd: stage,
    stdio: 'inherit',
  });

  // The workspace packages, as npm would see them: built files only, `workspace:*` replaced by the version.
  for (const pkg of WORKSPACE) {
    const src = path.join(root, pkg);
    const pkgJson = readJson(path.join(src, 'package.json'));
    const dest = path.join(stage, 'node_modules', pkgJson.name);
    mkdirSync(dest, { recursive: true });
    cpSync(path.join(src, 'dist'), path.join(dest, 'dist'), { recursive: true, filter: (f) => !/\.test\.(js|d\.ts)(\.map)?$/.test(f) });
    for (const f of readdirSync(src)) if (f.endsWith('.proto') || f === 'README.md') cpSync(path.join(src, f), path.join(dest, f));
    delete pkgJson.private;
    delete pkgJson.devDependencies;
    delete pkgJson.scripts;
    delete pkgJson.bin;
    for (const name of Object.keys(pkgJson.dependencies ?? {})) {
      if (pkgJson.dependencies[name].startsWith('workspace:')) pkgJson.dependencies[name] = version;
    }
    writeFileSync(path.join(dest, 'package.json'), `${JSON.stringify(pkgJson, null, 2)}\n`);
    manifest.dependencies[pkgJson.name] = version;
  }
  manifest.bundleDependencies = Object.keys(manifest.dependencies);
  writeFileSync(path.join(stage, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);
  mkdirSync(path.join(stage, 'bin'));
  // The command's first line starts node with the product's launch flags (cli/src/memory/gc-tuning.ts).
  const { LAUNCH_FLAGS } = await import(pathToFileURL(path.join(root, 'cli', 'dist', 'memory', 'gc-tuning.js')).href);
  writeFileSync(
    path.join(stage, 'bin', 'cluster-proxy.js'),
    `#!/usr/bin/env -S node ${LAUNCH_FLAGS.join(' ')}\nimport '@cluster-proxy/cli';\n`,
    { mode: 0o755 },
  );
  cpSync(path.join(root, 'README.md'), path.join(stage, 'README.md'));

  mkdirSync(out, { recursive: true });
  const name = execFileSync('npm', ['pack', '--pack-destination', out, '--loglevel=error'], { cwd: stage, encoding: 'utf8' })
    .trim()
    .split('\n')
    .pop();
  console.log(`==> ${path.join(out, name)}`);
  console.log(`install: npm install -g ${path.relative(process.cwd(), path.join(out, name)) || name}`);
} finally {
  rmSync(stage, { recursive: true, force: true });
}
