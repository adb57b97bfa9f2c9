// The hub process and its store: a corrupt or locked data directory stops start-up with one line
// (exit 2) and changes nothing; with --store kubernetes, /readyz names the store and fails while the
// API cannot be reached.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore } from '@cluster-proxy/server';
import { killAllSpawned, runCommand, startFakeKubeApiServer, waitFor, type FakeKubeApiServer } from '../src/fixtures/index.js';
import { CLI, createPki, getStatus, startHub, type TestPki } from '../src/harness.js';

describe('hub store at start-up and in /readyz', () => {
  let pki: TestPki;
  beforeAll(async () => {
    pki = await createPki();
  });
  afterAll(async () => {
    await killAllSpawned();
    await pki?.cleanup();
  });

  const hubArgs = (dataDir: string, extra: string[] = []): string[] => [
    CLI,
    'hub',
    '--data-dir',
    dataDir,
    '--bind-address',
    '127.0.0.1',
    '--agent-port',
    '0',
    '--frontend-port',
    '0',
    '--health-port',
    '0',
    '--admin-port',
    '0',
    '--connect-port',
    'off',
    '--ca-cert',
    pki.caPath,
    '--server-cert',
    pki.server.certPath,
    '--server-key',
    pki.server.keyPath,
    ...extra,
  ];

  it('a corrupt journal record (with records after it) refuses to start: exit 2, one line naming the file, file untouched', async () => {
    const dataDir = await mkdtemp(path.join(pki.dir, 'corrupt-'));
    const store = await openStore({ type: 'embedded', dataDir, compactOnClose: false });
    for (const name of ['c1', 'c2'])
      await store.create('ManagedCluster', {
        apiVersion: 'cluster.open-cluster-management.io/v1',
        kind: 'ManagedCluster',
        metadata: { name },
        spec: { hubAcceptsClient: true },
      });
    await store.close();
    const journal = path.join(dataDir, 'store', 'journal.log');
    const original = await readFile(journal, 'utf8');
    // Damage the first record's payload; the second record follows, so this is not a torn tail.
    const damaged = original.replace('"c1"', '"cX"');
    expect(damaged).not.toBe(original);
    await writeFile(journal, damaged);
    const r = await runCommand(process.execPath, hubArgs(dataDir), { timeoutMs: 20_000 });
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toContain(`cannot open the hub store: store journal ${journal} is corrupt`);
    expect(await readFile(journal, 'utf8')).toBe(damaged);
  });

  it('a second hub on the same data directory is refused, naming the process that holds it', async () => {
    const hub = await startHub(pki);
    try {
      const r = await runCommand(process.execPath, hubArgs(hub.dataDir), { timeoutMs: 20_000 });
      expect(r.code).toBe(2);
      expect(r.stderr).toMatch(new RegExp(`in use by process ${hub.proc.pid}`));
    } finally {
      await hub.stop();
    }
  });

  it('--store kubernetes: /readyz checks the API and fails while it is gone', async () => {
    let api: FakeKubeApiServer | null = await startFakeKubeApiServer();
    const dir = await mkdtemp(path.join(pki.dir, 'kube-'));
    const kubeconfig = path.join(dir, 'kubeconfig');
    await api.writeKubeconfig(kubeconfig);
    const hub = await startHub(pki, ['--store', 'kubernetes', '--kubeconfig', kubeconfig]);
    try {
      expect(await getStatus(hub.ports.health, '/readyz?verbose')).toMatchObject({
        status: 200,
        body: expect.stringContaining('[+]store ok'),
      });
      await api.close();
      api = null;
      const r = await waitFor(
        async () => {
          // The hub must keep running without its store: say so plainly if it did not.
          if (!hub.proc.isRunning()) throw new Error(`the hub exited after the API went away:\n${hub.proc.lines().slice(-20).join('\n')}`);
          const s = await getStatus(hub.ports.health, '/readyz?verbose');
          return s.status === 503 ? s : undefined;
        },
        { timeoutMs: 10_000, message: 'readyz 503' },
      );
      expect(r.body).toMatch(/\[-\]store failed: /);
    } finally {
      await hub.stop();
      await api?.close();
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("--store must be embedded or kubernetes; --kubeconfig needs --store kubernetes; --agent-install manifestwork needs it too; the gateway's flags go together", async () => {
    const dir = await mkdtemp(path.join(pki.dir, 'bad-'));
    for (const [extra, want] of [
      [['--store', 'etcd'], /--store must be embedded or kubernetes/],
      [['--kubeconfig', 'x'], /go with --store kubernetes/],
      [
        ['--agent-install', 'manifestwork'],
        /--agent-install manifestwork needs --store kubernetes .*embedded store installs agents with "cluster-proxy join" only/,
      ],
      [['--agent-install', 'helm'], /--agent-install must be manual or manifestwork, got "helm"/],
      [
        ['--store', 'kubernetes', '--agent-install', 'manifestwork', '--agent-install-namespace', 'Bad_NS'],
        /--agent-install-namespace "Bad_NS" is not a namespace name/,
      ],
      [
        ['--gateway-port', '0', '--cluster-profiles-gateway-url', 'https://gw:9092'],
        /--cluster-profiles-gateway-url needs --agent-install manifestwork/,
      ],
      [
        ['--store', 'kubernetes', '--agent-install', 'manifestwork', '--cluster-profiles-gateway-url', 'https://gw:9092'],
        /--cluster-profiles-gateway-url needs --gateway-port/,
      ],
      [
        [
          '--store',
          'kubernetes',
          '--agent-install',
          'manifestwork',
          '--gateway-port',
          '0',
          '--cluster-profiles-gateway-url',
          'http://gw:9092',
        ],
        /must be https:\/\/HOST\[:PORT\]/,
      ],
      [
        [
          '--store',
          'kubernetes',
          '--agent-install',
          'manifestwork',
          '--gateway-port',
          '0',
          '--cluster-profiles-gateway-url',
          'https://gw:9092/c1',
        ],
        /must be https:\/\/HOST\[:PORT\]/,
      ],
      [['--gateway-services', 'services.yaml'], /--gateway-services needs --gateway-port/],
      [['--gateway-identity-prefix', 'hub:'], /--gateway-identity-prefix needs --gateway-port/],
      [
        ['--gateway-port', '0', '--gateway-identity-prefix', 'hub: x'],
        /--gateway-identity-prefix must be a non-empty string without spaces/,
      ],
      [
        ['--gateway-port', '0', '--gateway-services', '/nonexistent/services.yaml'],
        /--gateway-services \/nonexistent\/services.yaml: no such file/,
      ],
    ] as const) {
      const r = await runCommand(process.execPath, hubArgs(dir, [...extra]), { timeoutMs: 20_000 });
      expect(r.code).toBe(2);
      expect(r.stderr).toMatch(want);
    }
  });
});
