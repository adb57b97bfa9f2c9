import { describe, expect, it } from 'vitest';
import { UsageError } from './flags.js';
import { noProxyCommand, NoProxyCheckFailed, runNoProxy } from './noproxy.js';

async function run(args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ code: number; out: string }> {
  let out = '';
  const code = await noProxyCommand(args, (t) => (out += t), env);
  return { code, out };
}

const FACTS = [
  '--pod-cidr',
  '10.244.0.0/16',
  '--service-cidr',
  '10.96.0.0/12',
  '--apiserver-ip',
  '10.96.0.1',
  '--hub',
  'hub.corp.example:8091',
];
const GOOD = 'localhost,127.0.0.1,10.244.0.0/16,10.96.0.0/12,.svc,.cluster.local,169.254.169.254,metadata.google.internal';

describe('cluster-proxy noproxy check', () => {
  it('exits 1 with the problems listed, fixes and a suggested value', async () => {
    const { code, out } = await run(['check', '--no-proxy', 'localhost,127.0.0.1,10.96.0.0/12,.svc', ...FACTS]);
    expect(code).toBe(1);
    expect(out).toContain('PROBLEM  pod CIDR 10.244.0.0/16 is not in NO_PROXY');
    expect(out).toContain('fix: add 10.244.0.0/16');
    expect(out).toContain('2 problems, 3 warnings.');
    expect(out).toContain(
      'suggested NO_PROXY=localhost,127.0.0.1,10.96.0.0/12,.svc,10.244.0.0/16,.cluster.local,169.254.169.254,metadata.google.internal',
    );
  });

  it('exits 0 when only warnings remain; pod/service CIDRs may be comma-separated or repeated', async () => {
    const { code, out } = await run([
      'check',
      '--no-proxy',
      `${GOOD},fd00::/8`,
      '--pod-cidr',
      '10.244.0.0/16,fd00:10:244::/56',
      '--service-cidr',
      '10.96.0.0/12',
      '--hub',
      'hub:8091',
    ]);
    expect(code).toBe(0);
    expect(out).toContain('0 problems, 1 warning.');
  });

  it('flags the hub matched by NO_PROXY', async () => {
    const { code, out } = await run(['check', '--no-proxy', `${GOOD},.corp.example`, ...FACTS]);
    expect(code).toBe(1);
    expect(out).toContain('PROBLEM  hub hub.corp.example:8091 matches NO_PROXY entry ".corp.example"');
  });

  it('reads NO_PROXY, then no_proxy, when --no-proxy is not given, and says so', async () => {
    const { out } = await run(['check', ...FACTS], { NO_PROXY: GOOD, no_proxy: 'other' });
    expect(out).toMatch(/^\(NO_PROXY read from \$NO_PROXY\)\n/);
    const lower = await run(['check', ...FACTS], { no_proxy: GOOD });
    expect(lower.out).toMatch(/^\(NO_PROXY read from \$no_proxy\)\n/);
    await expect(run(['check', ...FACTS], {})).rejects.toThrow(/--no-proxy is required/);
  });

  it('--json prints the report', async () => {
    const { out } = await run(['check', '--json', '--no-proxy', '', ...FACTS]);
    const report = JSON.parse(out) as { problems: number; findings: Array<{ code: string }>; source: string };
    expect(report.source).toBe('--no-proxy');
    expect(report.problems).toBe(4);
    expect(report.findings[0]!.code).toBe('pod-cidr-proxied');
  });

  it('bad facts are usage errors', async () => {
    await expect(run(['check', '--no-proxy', '', '--pod-cidr', '10.244.0.0'])).rejects.toThrow(UsageError);
    await expect(run(['check', '--no-proxy', '', '--hub', 'hub:http'])).rejects.toThrow(/--hub "hub:http" must be HOST:PORT/);
    await expect(run(['check', '--no-proxy', '', 'extra'])).rejects.toThrow(/takes no arguments/);
    await expect(run(['check', '--bogus'])).rejects.toThrow(/unknown flag --bogus/);
  });
});

describe('cluster-proxy noproxy explain', () => {
  it('prints the decision and the deciding entry', async () => {
    expect((await run(['explain', '--no-proxy', '.corp.example,10.0.0.0/8', 'hub.corp.example:8091'])).out).toBe(
      'direct (entry ".corp.example")\n  hub.corp.example ends with NO_PROXY entry ".corp.example"\n',
    );
    const proxied = await run(['explain', '--no-proxy', '10.0.0.0/8', 'db.internal:5432']);
    expect(proxied.out.split('\n')[0]).toBe('proxy');
    expect(proxied.code).toBe(0);
    const json = JSON.parse((await run(['explain', '--json', '--no-proxy', '10.0.0.0/8', '[::1]:443'])).out) as {
      decision: string;
      target: string;
    };
    expect(json).toMatchObject({ decision: 'direct', target: '[::1]:443' });
  });

  it('needs exactly one target', async () => {
    await expect(run(['explain', '--no-proxy', 'a'])).rejects.toThrow(/exactly one HOST\[:PORT\]/);
    await expect(run(['explain', '--no-proxy', 'a', 'b', 'c'])).rejects.toThrow(UsageError);
  });
});

describe('cluster-proxy noproxy help', () => {
  it('--help everywhere', async () => {
    expect((await run(['--help'])).out).toContain('Usage: cluster-proxy noproxy check|explain');
    expect((await run(['check', '--help'])).out).toContain('--pod-cidr VALUE');
    expect((await run(['explain', '--help'])).out).toContain('cluster-proxy noproxy explain --no-proxy VALUE HOST[:PORT]');
    await expect(run([])).rejects.toThrow(/needs a command/);
    await expect(run(['frobnicate'])).rejects.toThrow(/unknown noproxy command "frobnicate"/);
  });

  it('runNoProxy turns a failed check into an error (exit 1 in main)', async () => {
    const write = process.stdout.write;
    process.stdout.write = (() => true) as typeof process.stdout.write;
    try {
      await expect(runNoProxy(['check', '--no-proxy', ''])).rejects.toBeInstanceOf(NoProxyCheckFailed);
      await expect(runNoProxy(['explain', '--no-proxy', '', 'a'])).resolves.toBeUndefined();
    } finally {
      process.stdout.write = write;
    }
  });
});
