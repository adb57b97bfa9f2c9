import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { UsageError, duration, envName, list, parseFlags, port, required, str, type FlagSpecs, type ParsedFlags } from './flags.js';

const specs: FlagSpecs = {
  cluster: { type: 'string', help: 'cluster' },
  'dial-timeout': { type: 'string', default: '5s', help: 'timeout' },
  allow: { type: 'string', multiple: true, help: 'allowed' },
  grant: { type: 'string', multiple: true, default: 'x=default-route', help: 'grants' },
  verbose: { type: 'boolean', help: 'chatty' },
  'health-port': { type: 'string', default: '8093', help: 'port' },
};

function usageError(fn: () => unknown): UsageError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(UsageError);
    return err as UsageError;
  }
  throw new Error('expected a UsageError');
}

describe('parseFlags', () => {
  it('applies defaults and leaves flags without one undefined', () => {
    const { flags, positionals } = parseFlags([], specs, {});
    expect(flags['dial-timeout']).toBe('5s');
    expect(flags['health-port']).toBe('8093');
    expect(flags['grant']).toEqual(['x=default-route']);
    expect(flags['cluster']).toBeUndefined();
    expect(flags['allow']).toBeUndefined();
    expect(flags['verbose']).toBeUndefined();
    expect(positionals).toEqual([]);
  });

  it('reads flags in both --flag value and --flag=value forms, with positionals', () => {
    const { flags, positionals } = parseFlags(['--cluster', 'c1', '--dial-timeout=2s', 'extra', '--verbose'], specs, {});
    expect(flags['cluster']).toBe('c1');
    expect(flags['dial-timeout']).toBe('2s');
    expect(flags['verbose']).toBe(true);
    expect(positionals).toEqual(['extra']);
  });

  it('collects repeatable flags in order, replacing the default', () => {
    const { flags } = parseFlags(['--allow', 'a:1', '--allow', 'b:*', '--grant', 'c1=cidr:10.0.0.0/8'], specs, {});
    expect(flags['allow']).toEqual(['a:1', 'b:*']);
    expect(flags['grant']).toEqual(['c1=cidr:10.0.0.0/8']);
  });

  it('falls back to CLUSTER_PROXY_* environment variables', () => {
    expect(envName('dial-timeout')).toBe('CLUSTER_PROXY_DIAL_TIMEOUT');
    expect(envName('cluster')).toBe('CLUSTER_PROXY_CLUSTER');
    const env = {
      CLUSTER_PROXY_CLUSTER: 'from-env',
      CLUSTER_PROXY_DIAL_TIMEOUT: '9s',
      CLUSTER_PROXY_ALLOW: 'a:1, b:2,,c:3 ',
      CLUSTER_PROXY_VERBOSE: 'true',
    };
    const { flags } = parseFlags([], specs, env);
    expect(flags['cluster']).toBe('from-env');
    expect(flags['dial-timeout']).toBe('9s');
    expect(flags['allow']).toEqual(['a:1', 'b:2', 'c:3']);
    expect(flags['verbose']).toBe(true);
  });

  it('prefers the command line over the environment, and the environment over the default', () => {
    const env = { CLUSTER_PROXY_DIAL_TIMEOUT: '9s', CLUSTER_PROXY_ALLOW: 'env:1', CLUSTER_PROXY_GRANT: 'c=default-route' };
    const { flags } = parseFlags(['--dial-timeout', '1s', '--allow', 'cli:1'], specs, env);
    expect(flags['dial-timeout']).toBe('1s');
    expect(flags['allow']).toEqual(['cli:1']);
    expect(flags['grant']).toEqual(['c=default-route']);
  });

  it('ignores empty environment variables (the default applies)', () => {
    const { flags } = parseFlags([], specs, { CLUSTER_PROXY_DIAL_TIMEOUT: '', CLUSTER_PROXY_CLUSTER: '' });
    expect(flags['dial-timeout']).toBe('5s');
    expect(flags['cluster']).toBeUndefined();
  });

  it('reads boolean environment variables as 1/true/yes', () => {
    for (const [v, want] of [['1', true], ['TRUE', true], ['yes', true], ['0', false], ['false', false], ['no', false]] as const) {
      expect(parseFlags([], specs, { CLUSTER_PROXY_VERBOSE: v }).flags['verbose'], v).toBe(want);
    }
  });

  it('does not read the environment of the process unless told to', () => {
    // The env parameter replaces process.env entirely.
    process.env['CLUSTER_PROXY_CLUSTER'] = 'leaked';
    try {
      expect(parseFlags([], specs, {}).flags['cluster']).toBeUndefined();
      expect(parseFlags([], specs).flags['cluster']).toBe('leaked');
    } finally {
      delete process.env['CLUSTER_PROXY_CLUSTER'];
    }
  });

  it('recognises --help', () => {
    expect(parseFlags(['--help'], specs, {}).flags['help']).toBe(true);
  });

  it('refuses an unknown flag with a one-line UsageError naming it', () => {
    const e = usageError(() => parseFlags(['--clutser', 'c1'], specs, {}));
    expect(e.message).toBe('unknown flag --clutser');
    const short = usageError(() => parseFlags(['-x'], specs, {}));
    expect(short.message).toContain('-x');
    expect(short.message).not.toContain('\n');
  });

  it('refuses a string flag without a value with a one-line UsageError', () => {
    const e = usageError(() => parseFlags(['--cluster'], specs, {}));
    expect(e.message).toContain('--cluster');
    expect(e.message).not.toContain('\n');
  });
});

describe('flag accessors', () => {
  const flags = (f: ParsedFlags): ParsedFlags => f;

  it('str/list/required', () => {
    const f = flags({ a: 'x', b: ['1', '2'], c: true, e: '' });
    expect(str(f, 'a')).toBe('x');
    expect(str(f, 'b')).toBeUndefined();
    expect(list(f, 'b')).toEqual(['1', '2']);
    expect(list(f, 'a')).toEqual(['x']);
    expect(list(f, 'nope')).toEqual([]);
    expect(required(f, 'a')).toBe('x');
    expect(usageError(() => required(f, 'missing')).message).toBe('--missing is required (or set CLUSTER_PROXY_MISSING)');
    expect(usageError(() => required(f, 'e')).message).toContain('--e is required');
  });

  it('duration() reads ms, s, m, h and plain milliseconds', () => {
    const d = (v: string): number => duration({ t: v }, 't');
    expect(d('500ms')).toBe(500);
    expect(d('10s')).toBe(10_000);
    expect(d('2m')).toBe(120_000);
    expect(d('1h')).toBe(3_600_000);
    expect(d('1.5s')).toBe(1500);
    expect(d('250')).toBe(250);
    expect(d('0')).toBe(0);
    expect(d(' 3s ')).toBe(3000);
  });

  it('duration() refuses anything else with a UsageError naming the flag and the value', () => {
    for (const bad of ['abc', '10x', '-1s', '1e3', 's', '1 s', '1.s', '10sec']) {
      const e = usageError(() => duration({ 'dial-timeout': bad }, 'dial-timeout'));
      expect(e.message, bad).toContain('--dial-timeout');
      expect(e.message).toContain(`"${bad}"`);
    }
    expect(usageError(() => duration({}, 'dial-timeout')).message).toContain('--dial-timeout is required');
  });

  it('port() accepts 0-65535 and refuses the rest', () => {
    expect(port({ p: '0' }, 'p')).toBe(0);
    expect(port({ p: '8091' }, 'p')).toBe(8091);
    expect(port({ p: '65535' }, 'p')).toBe(65535);
    for (const bad of ['65536', '-1', '80.5', 'http', '1e3', ' 80', '99999999']) {
      const e = usageError(() => port({ 'agent-port': bad }, 'agent-port'));
      expect(e.message, bad).toBe(`--agent-port must be a port number 0-65535, got "${bad}"`);
    }
  });
});

// ------------------------------------------------------------------ the built CLI

const CLI = fileURLToPath(new URL('../../dist/cli/main.js', import.meta.url));

interface RunResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

function runCli(args: string[], timeoutMs = 15_000): Promise<RunResult> {
  // No CLUSTER_PROXY_* from the developer's shell: every flag comes from `args`.
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('CLUSTER_PROXY_')));
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [CLI, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`cluster-proxy ${args.join(' ')} did not exit within ${timeoutMs} ms; stdout: ${stdout} stderr: ${stderr}`));
    }, timeoutMs);
    child.once('error', (err) => { clearTimeout(timer); reject(err); });
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

describe('cluster-proxy CLI', () => {
  it('is built', () => {
    expect(existsSync(CLI), `${CLI} missing: run pnpm build`).toBe(true);
  });

  it('prints usage and exits 2 without a command', async () => {
    const r = await runCli([]);
    expect(r.code).toBe(2);
    expect(r.stdout).toContain('Usage: cluster-proxy COMMAND');
    expect(r.stdout).toContain('hub');
    expect(r.stdout).toContain('agent');
  });

  it('`--help` prints usage and exits 0', async () => {
    const r = await runCli(['--help']);
    expect(r.code).toBe(0);
    expect(r.stdout).toContain('Usage: cluster-proxy COMMAND');
  });

  it('`hub --help` lists the hub\'s flags and their environment variables, exit 0', async () => {
    const r = await runCli(['hub', '--help']);
    expect(r.code).toBe(0);
    for (const f of ['--agent-port', '--frontend-port', '--health-port', '--admin-port', '--ca-cert', '--grant', '--dial-timeout']) expect(r.stdout).toContain(f);
    expect(r.stdout).toContain('CLUSTER_PROXY_AGENT_PORT');
    expect(r.stdout).toContain('default 8091');
    expect(r.stderr).toBe('');
  });

  it('`agent --help` lists the agent\'s flags, exit 0', async () => {
    const r = await runCli(['agent', '--help']);
    expect(r.code).toBe(0);
    for (const f of ['--cluster', '--hub', '--apiserver', '--allow', '--identifiers']) expect(r.stdout).toContain(f);
  });

  it('`agent` without --cluster: exit 2 and one line on stderr', async () => {
    const r = await runCli(['agent']);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe('cluster-proxy: --cluster is required (or set CLUSTER_PROXY_CLUSTER)\n');
  });

  it('`agent` with an unreadable --ca-cert: exit 2 naming the file', async () => {
    const r = await runCli(['agent', '--cluster', 'c', '--ca-cert', '/nonexistent/ca.pem', '--cert', '/nonexistent/a.pem', '--key', '/nonexistent/a.key', '--health-port', '0']);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/^cluster-proxy: cannot read --ca-cert \/nonexistent\/ca\.pem: ENOENT\n$/);
  });

  it('unknown command: exit 2 with one line', async () => {
    const r = await runCli(['frobnicate']);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe('cluster-proxy: unknown command "frobnicate"; run "cluster-proxy --help"\n');
  });

  it('unknown flag: exit 2 with one line naming it', async () => {
    const r = await runCli(['hub', '--bogus-flag']);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe('cluster-proxy: unknown flag --bogus-flag\n');
  });

  it('bad flag value: exit 2 with one line', async () => {
    // Any readable file passes for the PEM flags: the port is checked before they are parsed.
    const r = await runCli(['hub', '--agent-port', '99999', '--ca-cert', CLI, '--server-cert', CLI, '--server-key', CLI]);
    expect(r.code).toBe(2);
    expect(r.stderr.trimEnd().split('\n')).toHaveLength(1);
    expect(r.stderr).toContain('--agent-port');
  });
});
