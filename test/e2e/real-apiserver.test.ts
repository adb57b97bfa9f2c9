// The hub on a real kube-apiserver (test/src/fixtures/real-kube.ts: etcd, kube-apiserver and
// kube-controller-manager built from their pinned Go modules), not on our API stand-in: what the stand-in
// cannot show because it answers the way we expect. The hub runs `--store kubernetes` against it, once with
// agents of its own (`join` mode) and once as an OCM hub (`--agent-install manifestwork`, beside the
// klusterlet and addon-manager stand-ins, which use the real apiserver too). Once every addon is Available,
// the hub must write nothing more over several status passes: the apiserver's audit log names each writer and
// its metrics count the writes, and the passes are counted by the hub's renewals of its leader Lease.
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ManagedCluster, ManagedClusterAddOn, Store } from '@cluster-proxy/server';
import {
  CHART_CRDS_DIR,
  killAllSpawned,
  runCommand,
  startEchoServer,
  startRealKube,
  waitFor,
  type RealKube,
  type TcpTarget,
} from '../src/fixtures/index.js';
import { writesOver } from '../src/fixtures/hub-writes.js';
import { KlusterletStandIn } from '../src/fixtures/klusterlet.js';
import { OcmAddonManagerStandIn } from '../src/fixtures/ocm-addon-manager.js';
import { CLI, createPki, startAgent, startHub, type AgentProcess, type HubProcess, type TestPki } from '../src/harness.js';

/** The hub's identity towards the apiserver (as the chart's service account). */
const HUB_USER = 'system:serviceaccount:open-cluster-management-cluster-proxy:cluster-proxy';
/** The first start may build the binaries (the script prints its progress); later starts take seconds. */
const START_TIMEOUT_MS = 45 * 60_000;
const PASSES = 8;
/** Where the ClusterProfiles are (a ClusterSet's namespace, as OCM's registration puts them). */
const PROFILES_NS = 'clusterset-a';

const cond = (a: ManagedClusterAddOn | null, type: string) => a?.status?.conditions?.find((c) => c.type === type);

describe('the hub on a real kube-apiserver', () => {
  let pki: TestPki;
  let echo: TcpTarget;
  beforeAll(async () => {
    pki = await createPki();
    echo = await startEchoServer();
  });
  afterAll(async () => {
    await killAllSpawned();
    await echo?.close();
    await pki?.cleanup();
  });

  describe('--store kubernetes, agents of its own', () => {
    let kube: RealKube;
    let hub: HubProcess;
    const agents: AgentProcess[] = [];
    beforeAll(async () => {
      kube = await startRealKube({ crdFiles: await chartCrds() });
      const kubeconfig = path.join(pki.dir, 'join-mode.kubeconfig');
      await kube.writeKubeconfig(kubeconfig, HUB_USER);
      hub = await startHub(pki, [
        '--store',
        'kubernetes',
        '--kubeconfig',
        kubeconfig,
        '--ca-key',
        path.join(pki.dir, 'ca.key'),
        '--tunnel-loss-window',
        '2s',
      ]);
    }, START_TIMEOUT_MS);
    afterAll(async () => {
      await Promise.all(agents.map((a) => a.stop()));
      await hub?.stop();
      await kube?.stop();
    });

    it('writes no addon status once the addons are Available, over several status passes', async () => {
      for (const c of ['c1', 'c2']) {
        // What an administrator runs: the ManagedCluster, its namespace and addon.
        const r = await runCommand(
          process.execPath,
          [CLI, 'join', c, '--out', path.join(pki.dir, `${c}-bundle`), '--admin', `127.0.0.1:${hub.ports.admin}`],
          { timeoutMs: 20_000 },
        );
        expect(r.code, r.stderr).toBe(0);
        agents.push(await startAgent(pki, hub, { cluster: c, apiserver: `127.0.0.1:${echo.port}` }));
      }
      for (const c of ['c1', 'c2']) {
        await waitFor(
          async () => {
            const a = await kube.store.get('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: c });
            return (
              cond(a, 'Available')?.status === 'True' &&
              cond(a, 'Degraded')?.status === 'False' &&
              cond(a, 'Progressing')?.status === 'False' &&
              (await kube.store.get('Lease', { name: 'cluster-proxy', namespace: c })) !== null
            );
          },
          { timeoutMs: 30_000, intervalMs: 200, message: `addon of ${c} Available, not Degraded, not Progressing` },
        ).catch(async (err: Error) => {
          const a = await kube.store.get('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: c });
          throw new Error(`${err.message}: ${JSON.stringify(a?.status)}\nhub: ${hub.proc.lines().slice(-20).join('\n')}`);
        });
      }
      const w = await writesOver(kube, HUB_USER, PASSES);
      console.log(
        `join mode, ${PASSES} passes after convergence: hub writes ${w.hub.length}, apiserver counted ${w.metrics.addons} addon writes`,
      );
      expect(w.hub).toEqual([]);
      expect(w.metrics.addons).toBe(0);
    }, 180_000);
  });

  describe('--agent-install manifestwork (OCM hub)', () => {
    let kube: RealKube;
    let hub: HubProcess;
    let ocm: OcmAddonManagerStandIn;
    const klusterlets = new Map<string, KlusterletStandIn>();
    const store = (): Store => kube.store;
    beforeAll(async () => {
      // OCM's own CRDs, as an OCM hub has them.
      kube = await startRealKube();
      await kube.applyOcmCrds();
      const kubeconfig = path.join(pki.dir, 'ocm-mode.kubeconfig');
      await kube.writeKubeconfig(kubeconfig, HUB_USER);
      ocm = new OcmAddonManagerStandIn(kube);
      await ocm.start();
      hub = await startHub(pki, [
        '--store',
        'kubernetes',
        '--kubeconfig',
        kubeconfig,
        '--agent-install',
        'manifestwork',
        '--ca-key',
        path.join(pki.dir, 'ca.key'),
        '--require-registration',
        '--tunnel-loss-window',
        '2s',
        '--server-id',
        'hub-a',
        // The ClusterProfile access provider too: another status the hub compares with what it would write.
        '--gateway-port',
        '0',
        '--cluster-profiles-gateway-url',
        'https://cluster-proxy.open-cluster-management-cluster-proxy.svc:9092/',
      ]);
    }, START_TIMEOUT_MS);
    afterAll(async () => {
      for (const k of klusterlets.values()) await k.stop();
      await ocm?.stop();
      await hub?.stop();
      await kube?.stop();
    });

    it('writes no addon status, work or ClusterProfile once the addons are Available, over several status passes', async () => {
      await store().ensureNamespace(PROFILES_NS);
      for (const c of ['c1', 'c2']) {
        await store().ensureNamespace(c);
        const mc: ManagedCluster = {
          apiVersion: 'cluster.open-cluster-management.io/v1',
          kind: 'ManagedCluster',
          metadata: { name: c },
          spec: { hubAcceptsClient: true, leaseDurationSeconds: 60 },
        };
        await store().create('ManagedCluster', mc);
        const k = new KlusterletStandIn({
          cluster: c,
          api: kube,
          cli: CLI,
          apiserver: `127.0.0.1:${echo.port}`,
          runsImage: (image) => !image.startsWith('quay.io/open-cluster-management/'),
        });
        await k.start();
        klusterlets.set(c, k);
        await store().create('ManagedClusterAddOn', {
          apiVersion: 'addon.open-cluster-management.io/v1alpha1',
          kind: 'ManagedClusterAddOn',
          metadata: { name: 'cluster-proxy', namespace: c },
          spec: {},
        });
        // As OCM's registration makes a cluster's profile.
        await store().create('ClusterProfile', {
          apiVersion: 'multicluster.x-k8s.io/v1alpha1',
          kind: 'ClusterProfile',
          metadata: {
            name: c,
            namespace: PROFILES_NS,
            labels: { 'x-k8s.io/cluster-manager': 'open-cluster-management', 'open-cluster-management.io/cluster-name': c },
          },
          spec: { clusterManager: { name: 'open-cluster-management' } },
        });
      }
      for (const c of ['c1', 'c2']) {
        await waitFor(
          async () => {
            const a = await store().get('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: c });
            // Degraded too: it turns False with the agent's first report, a write of its own just after Available.
            return (
              cond(a, 'Available')?.status === 'True' &&
              cond(a, 'Degraded')?.status === 'False' &&
              cond(a, 'ManifestApplied')?.status === 'True' &&
              cond(a, 'Progressing')?.reason === 'Completed' &&
              (await store().get('Lease', { name: 'cluster-proxy', namespace: c })) !== null
            );
          },
          { timeoutMs: 60_000, intervalMs: 200, message: `addon of ${c} Available, not Degraded, ManifestApplied, Completed` },
        ).catch(async (err: Error) => {
          const a = await store().get('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: c });
          const k = klusterlets.get(c);
          throw new Error(
            `${err.message}: ${JSON.stringify(a?.status)} klusterlet errors: ${k?.errors.join('; ')} stuck: ${k?.stuck().join('; ')} addon-manager errors: ${ocm.errors.join('; ')}`,
          );
        });
        await waitFor(
          async () =>
            (await store().get('ClusterProfile', { name: c, namespace: PROFILES_NS }))?.status?.accessProviders?.some(
              (a) => a.name === 'open-cluster-management',
            ),
          { timeoutMs: 30_000, intervalMs: 200, message: `the gateway in ${c}'s ClusterProfile` },
        );
      }
      const w = await writesOver(kube, HUB_USER, PASSES);
      console.log(
        `OCM mode, ${PASSES} passes after convergence: hub writes ${w.hub.length}, apiserver counted ${w.metrics.addons} addon and ${w.metrics.works} work writes (all writers)`,
      );
      // On a failure, what the hub said it wrote, and the addons as they are now.
      const why = async (): Promise<string> =>
        `${hub.proc
          .lines()
          .filter((l) => l.includes('addon status updated'))
          .slice(-6)
          .join('\n')}\n${JSON.stringify(
          await Promise.all(
            ['c1', 'c2'].map((c) =>
              store()
                .get('ManagedClusterAddOn', { name: 'cluster-proxy', namespace: c })
                .then((a) => a?.status),
            ),
          ),
        )}`;
      expect(w.hub, w.hub.length > 0 ? await why() : '').toEqual([]);
      // Nor did OCM's stand-ins (their writes are counted too).
      expect(w.metrics).toEqual({ addons: 0, works: 0 });

      // The installer's pass (works, CSRs, hub Secrets, ClusterProfiles) runs on a change it watches, else every
      // minute: a label on the ClusterManagementAddOn starts one, seen as the hub reading the ClusterManagementAddOn
      // (only the installer's pass does; works, addons and clusters it reads from watch-fed mirrors).
      const installer = await writesOver(kube, HUB_USER, PASSES, {
        during: async () => {
          const cma = (await store().get('ClusterManagementAddOn', { name: 'cluster-proxy' }))!;
          await store().update('ClusterManagementAddOn', {
            ...cma,
            metadata: { ...cma.metadata, labels: { ...cma.metadata.labels, 'example.com/touched': 'yes' } },
          });
        },
        until: (events) =>
          events.some((e) => e.user.username === HUB_USER && e.verb === 'get' && e.objectRef?.resource === 'clustermanagementaddons'),
      });
      console.log(`OCM mode, an installer pass and ${PASSES} status passes: hub writes ${installer.hub.length}`);
      expect(installer.hub).toEqual([]);
    }, 180_000);
  });
});

/** Our chart's CRDs. */
async function chartCrds(): Promise<string[]> {
  return (await readdir(CHART_CRDS_DIR)).filter((f) => f.endsWith('.yaml')).map((f) => path.join(CHART_CRDS_DIR, f));
}
