import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import {
  UsageError,
  duration,
  envName,
  hostPort,
  list,
  parseFlags,
  port,
  required,
  str,
  type FlagSpecs,
  type ParsedFlags,
} from './flags.js';

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
    for (const [v, want] of [
      ['1', true],
      ['TRUE', true],
      ['yes', true],
      ['0', false],
      ['false', false],
      ['no', false],
    ] as const) {
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

const CLI = fileURLToPath(new URL('../dist/main.js', import.meta.url));

interface RunResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

function runCli(args: string[], timeoutMs = 15_000, extraEnv: Record<string, string> = {}): Promise<RunResult> {
  // No CLUSTER_PROXY_* from the developer's shell: every flag comes from `args` (and `extraEnv`).
  const env = { ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('CLUSTER_PROXY_'))), ...extraEnv };
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
    child.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
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

  it("`hub --help` lists the hub's flags and their environment variables, exit 0", async () => {
    const r = await runCli(['hub', '--help']);
    expect(r.code).toBe(0);
    for (const f of ['--agent-port', '--frontend-port', '--health-port', '--admin-port', '--ca-cert', '--grant', '--dial-timeout'])
      expect(r.stdout).toContain(f);
    expect(r.stdout).toContain('CLUSTER_PROXY_AGENT_PORT');
    expect(r.stdout).toContain('default 8091');
    expect(r.stderr).toBe('');
  });

  it("`agent --help` lists the agent's flags, exit 0", async () => {
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
    const r = await runCli([
      'agent',
      '--cluster',
      'c',
      '--ca-cert',
      '/nonexistent/ca.pem',
      '--cert',
      '/nonexistent/a.pem',
      '--key',
      '/nonexistent/a.key',
      '--health-port',
      '0',
    ]);
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

// ------------------------------------------------------------------ config files

describe('--config FILE', () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'cp-flags-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  let n = 0;
  const file = (text: string, ext = 'yaml'): string => {
    const f = path.join(dir, `c${++n}.${ext}`);
    writeFileSync(f, text);
    return f;
  };

  it('reads flags from a YAML file: scalars, quoted strings, lists in both styles, booleans, numbers', () => {
    const f = file(
      [
        '# hub settings',
        '---',
        'cluster: "c1"           # a comment',
        "dial-timeout: '2s'",
        'allow: [a:1, "b:2", \'c#3\']',
        'grant:',
        '  - x=cidr:10.0.0.0/8',
        '  - "y=host:api.example.com"   # quoted',
        'verbose: true',
        'health-port: 9093',
        '',
      ].join('\n'),
    );
    const { flags } = parseFlags(['--config', f], specs, {});
    expect(flags['cluster']).toBe('c1');
    expect(flags['dial-timeout']).toBe('2s');
    expect(flags['allow']).toEqual(['a:1', 'b:2', 'c#3']);
    expect(flags['grant']).toEqual(['x=cidr:10.0.0.0/8', 'y=host:api.example.com']);
    expect(flags['verbose']).toBe(true);
    expect(flags['health-port']).toBe('9093');
    expect(flags['config']).toBe(f);
  });

  it('reads a JSON object too', () => {
    const f = file(JSON.stringify({ cluster: 'j1', allow: ['x:1'], verbose: false, 'health-port': 1234 }), 'json');
    const { flags } = parseFlags(['--config', f], specs, {});
    expect(flags).toMatchObject({ cluster: 'j1', allow: ['x:1'], verbose: false, 'health-port': '1234', 'dial-timeout': '5s' });
  });

  it('precedence: command line > environment > config file > default', () => {
    const f = file('cluster: from-file\ndial-timeout: 7s\nhealth-port: "1111"\nallow: [file:1]\n');
    const env = { CLUSTER_PROXY_DIAL_TIMEOUT: '8s', CLUSTER_PROXY_ALLOW: 'env:1' };
    const { flags } = parseFlags(['--config', f, '--cluster', 'from-cli'], specs, env);
    expect(flags['cluster']).toBe('from-cli'); // flag beats file
    expect(flags['dial-timeout']).toBe('8s'); // env beats file
    expect(flags['allow']).toEqual(['env:1']);
    expect(flags['health-port']).toBe('1111'); // file beats default
    expect(flags['grant']).toEqual(['x=default-route']); // default when nobody sets it
  });

  it('takes the file from CLUSTER_PROXY_CONFIG when --config is not given', () => {
    const f = file('cluster: via-env-config\n');
    expect(parseFlags([], specs, { CLUSTER_PROXY_CONFIG: f }).flags['cluster']).toBe('via-env-config');
    const g = file('cluster: via-flag-config\n');
    expect(parseFlags(['--config', g], specs, { CLUSTER_PROXY_CONFIG: f }).flags['cluster']).toBe('via-flag-config');
  });

  it('an empty file or null values change nothing', () => {
    expect(parseFlags(['--config', file('# nothing\n')], specs, {}).flags['dial-timeout']).toBe('5s');
    const { flags } = parseFlags(['--config', file('dial-timeout:\ncluster: ~\n')], specs, {});
    expect(flags['dial-timeout']).toBe('5s');
    expect(flags['cluster']).toBeUndefined();
  });

  it('refuses unknown keys, wrong types and unsupported YAML with one line naming the file and the problem', () => {
    const cases: [string, RegExp][] = [
      ['clustr: c1\n', /"clustr" is not a flag of this command/],
      ['help: true\n', /"help" cannot be set in a config file/],
      ['config: other.yaml\n', /"config" cannot be set in a config file/],
      ['cluster: [a, b]\n', /"cluster" must be a single value/],
      ['verbose: maybe\n', /"verbose" must be true or false/],
      ['cluster:\n  name: c1\n', /line 2: nested values are not supported/],
      ['allow:\n  - a: 1\n', /line 2: nested values are not supported/],
      ['cluster: "open\n', /line 2: Missing closing "quote/],
      ['cluster: c1\ncluster: c2\n', /line 2: "cluster" appears twice/],
      ['just words\n', /line 1: expected "flag: value"/],
      ['cluster: |\n  x\n', /line 1: multi-line strings are not supported/],
      ['- a\n', /line 1: expected "flag: value" lines/],
      ['cluster: &a c1\n', /anchors, aliases and tags are not supported/],
      ['a: 1\n---\nb: 2\n', /line 2: only one YAML document is supported/],
      ['["a"]', /expected an object of flag: value/],
      // Keys are quoted with their control characters escaped (a fuzzer's find: a CR inside a key broke the line).
      ['cluster\r: c1\ncluster\r: c2\n', /line 2: "cluster\\u000d" appears twice/],
      ['"clu\\nstr": c1\n', /"clu\\u000astr" is not a flag of this command/],
      ['{"clu\\u2028str": "c1"}', /"clu\\u2028str" is not a flag of this command/],
      ['{"cluster": {"a": 1}}', /"cluster" must be a single value/],
    ];
    for (const [text, want] of cases) {
      const f = file(text, /^[[{]/.test(text) ? 'json' : 'yaml');
      const e = usageError(() => parseFlags(['--config', f], specs, {}));
      expect(e.message, text).toMatch(want);
      expect(e.message).toContain(f);
      expect(e.message).not.toMatch(/[\r\n\u2028\u2029]/);
    }
    const bad = file('{"cluster": ', 'json');
    expect(usageError(() => parseFlags(['--config', bad], specs, {})).message).toMatch(/^--config .*: /);
    expect(usageError(() => parseFlags(['--config', path.join(dir, 'missing.yaml')], specs, {})).message).toMatch(
      /^cannot read --config .*missing\.yaml: ENOENT$/,
    );
  });

  it('is not read for --help (a broken file must not hide the help)', () => {
    const f = file('nonsense\n');
    expect(parseFlags(['--help', '--config', f], specs, {}).flags['help']).toBe(true);
  });

  it('`hub --config` with the built CLI: a bad value in the file is one line and exit 2; help mentions --config', async () => {
    const f = file('agent-port: 99999\nca-cert: /nonexistent\nserver-cert: /nonexistent\nserver-key: /nonexistent\n');
    const r = await runCli(['hub', '--config', f]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe('cluster-proxy: --agent-port must be a port number 0-65535, got "99999"\n');
    const typo = await runCli(['agent', '--config', file('clustr: c1\n')]);
    expect(typo.code).toBe(2);
    expect(typo.stderr).toMatch(/^cluster-proxy: --config .*: "clustr" is not a flag of this command\n$/);
    const help = await runCli(['agent', '--help']);
    expect(help.stdout).toContain('--config FILE');
    expect(help.stdout).toContain('CLUSTER_PROXY_CONFIG');
  });

  it('with the built CLI: a value with line breaks, from the file or the environment, is still one line of error', async () => {
    const fromFile = await runCli(['hub', '--config', file('log-level: "de\\nbug\\u2028x"\n')]);
    expect(fromFile.code).toBe(2);
    expect(fromFile.stderr).toMatch(/^cluster-proxy: --log-level must be one of .*, got "de\\u000abug\\u2028x"\n$/);
    const fromEnv = await runCli(['hub'], 15_000, { CLUSTER_PROXY_LOG_LEVEL: 'forged\r\ncluster-proxy: ok' });
    expect(fromEnv.code).toBe(2);
    expect(fromEnv.stderr).toMatch(/^cluster-proxy: --log-level must be one of .*, got "forged\\u000d\\u000acluster-proxy: ok"\n$/);
  });
});

describe('duration() days and hostPort()', () => {
  it('reads days', () => {
    expect(duration({ t: '7d' }, 't')).toBe(7 * 86_400_000);
  });

  it('hostPort() splits HOST:PORT, IPv6 in brackets, and refuses the rest', () => {
    expect(hostPort({ a: '127.0.0.1:8095' }, 'a')).toEqual({ host: '127.0.0.1', port: 8095 });
    expect(hostPort({ a: '[::1]:8089' }, 'a')).toEqual({ host: '::1', port: 8089 });
    for (const bad of ['8095', 'host:', 'host:99999', 'a b:1'])
      expect(usageError(() => hostPort({ admin: bad }, 'admin')).message).toBe(`--admin "${bad}" is not HOST:PORT`);
  });
});
