// The CLI's output is whole through a pipe (`cluster-proxy get managedclusters -o json | jq`), not only
// to a terminal or file: a real hub whose embedded store holds 5,000 registered clusters, and the real
// CLI with its stdout a pipe, as a shell pipeline gives it. Node writes to a pipe asynchronously; a CLI
// that exits right after its last write loses everything past the pipe's 64 KiB.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { openStore, type ManagedCluster } from '@cluster-proxy/server';
import { killAllSpawned, runCommand, waitFor } from '../src/fixtures/index.js';
import { CLI, createPki, getJson, startHub, type HubProcess, type TestPki } from '../src/harness.js';

const CLUSTERS = 5000;
const PIPE_CAPACITY = 64 * 1024;

const clusterName = (i: number): string => `pipe-${String(i).padStart(5, '0')}`;

describe(`CLI output through a pipe, ${CLUSTERS} registered clusters`, () => {
  let pki: TestPki;
  let hub: HubProcess;
  const cli = async (args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> =>
    runCommand(process.execPath, [CLI, ...args, '--admin', `127.0.0.1:${hub.ports.admin}`], { timeoutMs: 60_000 });

  beforeAll(async () => {
    pki = await createPki();
    // Registered straight into the hub's store before it starts: 5,000 joins would take minutes.
    const dataDir = await mkdtemp(path.join(pki.dir, 'hub-'));
    const store = await openStore({ type: 'embedded', dataDir });
    try {
      await Promise.all(
        Array.from(
          { length: CLUSTERS },
          (_, i): Promise<ManagedCluster> =>
            store.create('ManagedCluster', {
              apiVersion: 'cluster.open-cluster-management.io/v1',
              kind: 'ManagedCluster',
              metadata: { name: clusterName(i), labels: { 'cluster.open-cluster-management.io/clusterset': 'default' } },
              spec: { hubAcceptsClient: true, leaseDurationSeconds: 60 },
            }),
        ),
      );
    } finally {
      await store.close();
    }
    hub = await startHub(pki, [], { dataDir });
  }, 120_000);

  afterAll(async () => {
    await hub?.stop();
    await killAllSpawned();
    await pki?.cleanup();
  });

  it('get managedclusters -o json: the whole list, parsed in one piece', async () => {
    const r = await cli(['get', 'managedclusters', '-o', 'json']);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.length).toBeGreaterThan(16 * PIPE_CAPACITY);
    const list = JSON.parse(r.stdout) as { kind: string; items: ManagedCluster[] };
    expect(list.kind).toBe('List');
    expect(list.items).toHaveLength(CLUSTERS);
    expect(new Set(list.items.map((m) => m.metadata.name))).toEqual(new Set(Array.from({ length: CLUSTERS }, (_, i) => clusterName(i))));
  }, 60_000);

  it('get managedclusters -o yaml and the table: every cluster', async () => {
    const y = await cli(['get', 'managedclusters', '-o', 'yaml']);
    expect(y.code, y.stderr).toBe(0);
    expect(y.stdout.length).toBeGreaterThan(PIPE_CAPACITY);
    expect((parseYaml(y.stdout) as { items: unknown[] }).items).toHaveLength(CLUSTERS);
    const t = await cli(['get', 'managedclusters', '--no-headers']);
    expect(t.code, t.stderr).toBe(0);
    expect(t.stdout.length).toBeGreaterThan(PIPE_CAPACITY);
    const rows = t.stdout.split('\n').filter((l) => l !== '');
    expect(rows).toHaveLength(CLUSTERS);
    expect(rows.at(-1)).toMatch(new RegExp(`^${clusterName(CLUSTERS - 1)}\\s+true\\s`));
  }, 60_000);

  it('get managedclusteraddons -A -o json: one addon per cluster, all of them', async () => {
    // The hub's addon manager creates each cluster's addon after the hub listens.
    await waitFor(
      async () => ((await getJson(hub.ports.admin, '/v1/managedclusteraddons')) as { items: unknown[] }).items.length === CLUSTERS,
      { timeoutMs: 60_000, intervalMs: 500, message: `${CLUSTERS} ManagedClusterAddOns` },
    );
    const r = await cli(['get', 'managedclusteraddons', '-A', '-o', 'json']);
    expect(r.code, r.stderr).toBe(0);
    const list = JSON.parse(r.stdout) as { items: { metadata: { namespace: string } }[] };
    expect(list.items).toHaveLength(CLUSTERS);
  }, 120_000);

  it('a reader that stops early (`| head -c 100`): the CLI exits 0 without a stack trace', async () => {
    const child = spawn(process.execPath, [CLI, 'get', 'managedclusters', '-o', 'json', '--admin', `127.0.0.1:${hub.ports.admin}`], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
    const first = await new Promise<Buffer>((resolve) => child.stdout.once('data', resolve));
    expect(first.subarray(0, 1).toString()).toBe('{');
    child.stdout.destroy();
    const [code] = (await once(child, 'close')) as [number | null];
    expect(stderr).toBe('');
    expect(code).toBe(0);
  }, 60_000);

  it('a failing command still prints its one-line error through the pipe and exits 1', async () => {
    const r = await cli(['get', 'managedclusters', 'no-such-cluster']);
    expect(r.code).toBe(1);
    expect(r.stderr).toBe('cluster-proxy: managedcluster "no-such-cluster" not found\n');
    expect(r.stdout).toBe('');
  });
});
