// The `ssh -R` baseline: a throwaway sshd on 127.0.0.1 (generated host and user keys in a temp dir,
// run in the foreground as the current user) and `ssh -N -R` clients that forward remote ports
// on the sshd side back to the targets, like an agent dialing out to a hub.
import { execFile } from 'node:child_process';
import { constants } from 'node:fs';
import { access, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { reapOnDeath, removeOnDeath } from './reaper.js';
import { spawnProcess, type ManagedProcess } from '../fixtures/index.js';
import type { LogFn } from './cleanup.js';
import { descendants, freePort, probeConnect } from './helpers.js';

const run = promisify(execFile);

export interface SshTools {
  sshd: string;
  ssh: string;
  keygen: string;
  /** `ssh -V`, e.g. "OpenSSH_9.2p1 Debian-2+deb12u10, OpenSSL 3.0.19 27 Jan 2026". */
  version: string;
  /** The client's preferred cipher (first of `ssh -G` ciphers), which sshd's defaults accept. */
  cipher: string;
}

export type SshToolsResult = { ok: true; tools: SshTools } | { ok: false; reason: string };

async function which(name: string): Promise<string | undefined> {
  const dirs = [...(process.env['PATH'] ?? '').split(':'), '/usr/sbin', '/sbin', '/usr/local/sbin'];
  for (const dir of dirs) {
    if (!dir) continue;
    const candidate = path.join(dir, name);
    try {
      await access(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

async function locate(): Promise<{ sshd?: string; ssh?: string; 'ssh-keygen'?: string }> {
  return { sshd: await which('sshd'), ssh: await which('ssh'), 'ssh-keygen': await which('ssh-keygen') };
}

async function aptInstall(log: LogFn): Promise<string | undefined> {
  if (process.getuid?.() !== 0) return 'not root, cannot apt-get install openssh-server';
  if ((await which('apt-get')) === undefined) return 'apt-get not available';
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  const install = () =>
    run('apt-get', ['install', '-y', 'openssh-server', 'openssh-client'], { env, timeout: 300_000, maxBuffer: 16 * 1024 * 1024 });
  log('ssh: sshd/ssh missing, trying apt-get install -y openssh-server openssh-client ...');
  try {
    await install();
    return undefined;
  } catch (first) {
    log(`ssh: apt-get install failed (${firstLine(first)}); running apt-get update and retrying ...`);
  }
  try {
    await run('apt-get', ['update'], { env, timeout: 300_000, maxBuffer: 16 * 1024 * 1024 });
    await install();
    return undefined;
  } catch (second) {
    return `apt-get install openssh-server openssh-client failed: ${firstLine(second)}`;
  }
}

function firstLine(err: unknown): string {
  const stderr = (err as { stderr?: unknown }).stderr;
  const text = typeof stderr === 'string' && stderr.trim() ? stderr : err instanceof Error ? err.message : String(err);
  return text.trim().split('\n').slice(-1)[0] ?? '';
}

/** Finds sshd, ssh and ssh-keygen, installing OpenSSH with apt-get if needed (and possible). */
export async function findSshTools(log: LogFn): Promise<SshToolsResult> {
  let found = await locate();
  if (!found.sshd || !found.ssh || !found['ssh-keygen']) {
    const failure = await aptInstall(log);
    found = await locate();
    if (!found.sshd || !found.ssh || !found['ssh-keygen']) {
      const missing = Object.entries(found)
        .filter(([, v]) => v === undefined)
        .map(([k]) => k)
        .join(', ');
      return { ok: false, reason: `${missing} not found${failure ? `; ${failure}` : ''}` };
    }
  }
  const { sshd, ssh, 'ssh-keygen': keygen } = found;
  const versionOut = await run(ssh, ['-V']).catch((err: unknown) => ({
    stdout: '',
    stderr: String((err as { stderr?: unknown }).stderr ?? ''),
  }));
  const version = (versionOut.stderr || versionOut.stdout).trim();
  const config = await run(ssh, ['-G', '-F', '/dev/null', '127.0.0.1']).catch(() => ({ stdout: '' }));
  const ciphers = /^ciphers (\S+)/m.exec(config.stdout)?.[1] ?? '';
  return { ok: true, tools: { sshd, ssh, keygen, version, cipher: ciphers.split(',')[0] ?? 'unknown' } };
}

export interface Sshd {
  port: number;
  user: string;
  /** The client's private key, authorized for `user`. */
  keyPath: string;
  proc: ManagedProcess;
  stop(): Promise<void>;
}

/** Starts sshd -D -e on 127.0.0.1:<free port>; `onStarted` registers its teardown at once. */
export async function startSshd(tools: SshTools, onStarted: (name: string, stop: () => Promise<void>) => void): Promise<Sshd> {
  // Privilege separation directory; sshd refuses to start without it.
  await mkdir('/run/sshd', { recursive: true, mode: 0o755 }).catch(() => {});
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cp-bench-sshd-'));
  removeOnDeath(dir);
  onStarted('sshd temp dir', () => rm(dir, { recursive: true, force: true }));
  const hostKey = path.join(dir, 'host_ed25519');
  const keyPath = path.join(dir, 'user_ed25519');
  await run(tools.keygen, ['-q', '-t', 'ed25519', '-N', '', '-C', 'bench-host', '-f', hostKey]);
  await run(tools.keygen, ['-q', '-t', 'ed25519', '-N', '', '-C', 'bench-user', '-f', keyPath]);
  const authorizedKeys = path.join(dir, 'authorized_keys');
  await writeFile(authorizedKeys, await readFile(`${keyPath}.pub`), { mode: 0o600 });
  const port = await freePort();
  const configPath = path.join(dir, 'sshd_config');
  await writeFile(
    configPath,
    [
      'ListenAddress 127.0.0.1',
      `Port ${port}`,
      `HostKey ${hostKey}`,
      `AuthorizedKeysFile ${authorizedKeys}`,
      'PermitRootLogin prohibit-password',
      'PubkeyAuthentication yes',
      'PasswordAuthentication no',
      'KbdInteractiveAuthentication no',
      'UsePAM no',
      'PidFile none',
      'StrictModes no',
      'AllowTcpForwarding yes',
      'GatewayPorts no',
      'X11Forwarding no',
      'PrintMotd no',
      'LogLevel INFO',
      '',
    ].join('\n'),
  );
  const proc = reapOnDeath(spawnProcess({ name: 'sshd', command: tools.sshd, args: ['-f', configPath, '-D', '-e'] }));
  onStarted('sshd', async () => void (await proc.stop(3000)));
  await proc.waitForLine((line) => line.includes('Server listening on'), 10_000);
  return { port, user: os.userInfo().username, keyPath, proc, stop: async () => void (await proc.stop(3000)) };
}

export interface SshTunnel {
  proc: ManagedProcess;
  /** Remote (sshd-side) port per forwarded target name. */
  remotePorts: Record<string, number>;
  /** The processes sshd forked for this connection (the session: they carry its channels). */
  sessionPids: number[];
  stop(): Promise<void>;
}

/**
 * Runs `ssh -N -R 127.0.0.1:R:127.0.0.1:T ...` against the sshd at 127.0.0.1:`sshPort` (sshd's
 * own port, or a relay in front of it) and waits until every remote port accepts.
 */
export async function startSshTunnel(
  tools: SshTools,
  sshd: Sshd,
  opts: { label: string; sshPort: number; targets: Record<string, number> },
  onStarted: (name: string, stop: () => Promise<void>) => void,
): Promise<SshTunnel> {
  const sshdPid = sshd.proc.pid;
  if (sshdPid === undefined) throw new Error('sshd has no pid');
  // Callers start tunnels one at a time, so what sshd forked meanwhile is this connection's session.
  const before = new Set(await descendants(sshdPid));
  const remotePorts: Record<string, number> = {};
  const forwards: string[] = [];
  for (const [name, targetPort] of Object.entries(opts.targets)) {
    const remote = await freePort();
    remotePorts[name] = remote;
    forwards.push('-R', `127.0.0.1:${remote}:127.0.0.1:${targetPort}`);
  }
  const proc = reapOnDeath(
    spawnProcess({
      name: `ssh-${opts.label}`,
      command: tools.ssh,
      args: [
        '-N',
        '-F',
        '/dev/null',
        '-o',
        'StrictHostKeyChecking=no',
        '-o',
        'UserKnownHostsFile=/dev/null',
        '-o',
        'BatchMode=yes',
        '-o',
        'IdentitiesOnly=yes',
        '-o',
        'ExitOnForwardFailure=yes',
        '-o',
        'LogLevel=ERROR',
        '-i',
        sshd.keyPath,
        '-p',
        String(opts.sshPort),
        ...forwards,
        `${sshd.user}@127.0.0.1`,
      ],
    }),
  );
  onStarted(`ssh-${opts.label}`, async () => void (await proc.stop(3000)));
  const deadline = performance.now() + 15_000;
  for (const [name, port] of Object.entries(remotePorts)) {
    for (;;) {
      if (!proc.isRunning())
        throw new Error(`ssh-${opts.label} exited before forwarding ${name}; output:\n${proc.lines().slice(-20).join('\n') || '(none)'}`);
      try {
        await probeConnect(port);
        break;
      } catch (err) {
        if (performance.now() > deadline)
          throw new Error(
            `ssh-${opts.label}: remote port ${port} (${name}) not accepting after 15 s: ${err instanceof Error ? err.message : String(err)}`,
          );
        await sleep(50);
      }
    }
  }
  // Once the remote ports accept, the session (and its privilege-separated child, if any) exists.
  const sessionPids = (await descendants(sshdPid)).filter((p) => !before.has(p));
  if (sessionPids.length === 0) {
    await proc.stop(3000);
    throw new Error(`ssh-${opts.label}: no sshd session process found`);
  }
  return { proc, remotePorts, sessionPids, stop: async () => void (await proc.stop(3000)) };
}
