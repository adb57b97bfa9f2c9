// The fleet simulator: one real `cluster-proxy hub` process on the embedded store, N registered clusters
// (ManagedClusters written into its store before it starts), and their agents in a few child processes
// (agents-child.ts: the real Agent, LeaseRenewer and ReplicaSync, one identity per cluster, mux and gRPC
// mixed), every cluster's "apiserver" one echo server. The hub keeps its ports across restart(), so the
// agents come back to the same address. Used by the bench's `fleet` scenario and by a test at small N.
import { fork, type ChildProcess } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { Tunnel } from '@cluster-proxy/client';
import {
  embeddedStoreDir,
  openEmbeddedStore,
  type ManagedCluster,
  type ManagedClusterAddOn,
  type ManifestWork,
  type Store,
  type Watch,
} from '@cluster-proxy/server';
import { CLI, cliLaunchFlags, createPki, type TestPki } from '../harness.js';
import {
  CHART_CRDS_DIR,
  freeLoopbackPort,
  spawnProcess,
  startEchoServer,
  startFakeKubeApiServer,
  type FakeKubeApiServer,
  type ManagedProcess,
  type TcpTarget,
} from '../fixtures/index.js';
import { startOcmHub } from '../fixtures/real-ocm.js';
import type { ChildReply, ChildRequest, FleetChildJob } from './protocol.js';

export interface FleetOptions {
  clusters: number;
  /** Agent processes (default: one per 1,250 clusters, at least 1, at most 4). */
  processes?: number;
  /** Share of agents on gRPC (ANP's AgentService.Connect); the rest on mux. Default 0.2. */
  grpcShare?: number;
  /** The agent's defaults: lease 60 s, replica list every 10 s. */
  leaseDurationMs?: number;
  replicaSyncMs?: number;
  /** Agents started per second, all processes together (default 250). */
  startPerSecond?: number;
  /** Extra `cluster-proxy hub` flags. */
  hubArgs?: string[];
  /** Node flags for the hub (e.g. --cpu-prof). */
  hubNodeArgs?: string[];
  /**
   * The hub's store: 'embedded' (default) or 'kubernetes', the Kubernetes API fixture
   * (test/src/fixtures/kube-api-server.ts, in this process) with the ManagedClusters written into it.
   */
  store?: 'embedded' | 'kubernetes';
  /**
   * OCM mode (implies store 'kubernetes'): the hub runs `--agent-install manifestwork` over the clusters, each
   * with a ManagedClusterAddOn as OCM's addon-manager would create it, and a light klusterlet marks each agent
   * ManifestWork applied (the fleet's agents run from the simulator, not from the works; no CSR flow).
   */
  ocm?: boolean;
  /**
   * With `ocm`: the store is a real control plane (etcd, kube-apiserver, kube-controller-manager) running OCM's own
   * hub controllers (test/src/fixtures/real-ocm.ts); OCM's addon-manager owns and configures the addons (Configured,
   * config references), its registration controller accepts the clusters (their leases last an hour: no klusterlet
   * renews them here). The light klusterlet still reports the works applied.
   */
  realOcm?: boolean;
  /** Hub log level (default warn: logging would skew the figures). */
  hubLogLevel?: string;
  log?: (message: string) => void;
}

export interface FleetHub {
  readonly pid: number;
  readonly ports: { agent: number; frontend: number; admin: number; health: number };
  readonly proc: ManagedProcess;
}

/** `cluster-NNNNN`: sortable, DNS-1123. */
export const clusterName = (i: number): string => `cluster-${String(i).padStart(5, '0')}`;

// The built child, from src (vitest) or dist alike.
type WithoutId<T> = T extends unknown ? Omit<T, 'id'> : never;

const CHILD_SCRIPT = fileURLToPath(new URL('../../dist/fleet/agents-child.js', import.meta.url));
const REQUEST_TIMEOUT_MS = 30_000;

class ChildHandle {
  private nextID = 0;
  private readonly pending = new Map<number, { resolve: (r: ChildReply) => void; reject: (e: Error) => void; timer: NodeJS.Timeout }>();
  readonly ready: Promise<number>;

  constructor(
    readonly proc: ChildProcess,
    readonly clusters: readonly string[],
  ) {
    let onReady!: (s: number) => void;
    let onFail!: (e: Error) => void;
    this.ready = new Promise((resolve, reject) => {
      onReady = resolve;
      onFail = reject;
    });
    proc.on('message', (raw: unknown) => {
      const msg = raw as ChildReply;
      if (msg.type === 'ready') return onReady(msg.issuedSeconds);
      const p = this.pending.get(msg.id);
      if (!p) return;
      this.pending.delete(msg.id);
      clearTimeout(p.timer);
      p.resolve(msg);
    });
    proc.once('exit', (code, signal) => {
      const err = new Error(`fleet agent process exited (${code ?? signal})`);
      onFail(err);
      for (const p of this.pending.values()) {
        clearTimeout(p.timer);
        p.reject(err);
      }
      this.pending.clear();
    });
  }

  request<T extends ChildReply['type']>(req: WithoutId<ChildRequest>, want: T): Promise<Extract<ChildReply, { type: T }>> {
    const id = ++this.nextID;
    return new Promise((resolve, reject) => {
      if (!this.proc.connected) return reject(new Error('fleet agent process is gone'));
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`fleet agent process did not answer ${req.type} within ${REQUEST_TIMEOUT_MS} ms`));
      }, REQUEST_TIMEOUT_MS);
      this.pending.set(id, {
        resolve: (r) => (r.type === want ? resolve(r as Extract<ChildReply, { type: T }>) : reject(new Error(`unexpected ${r.type}`))),
        reject,
        timer,
      });
      this.proc.send({ ...req, id } as ChildRequest);
    });
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => this.proc.once('exit', () => resolve()));
    await this.request({ type: 'stop' }, 'stopped').catch(() => undefined);
    const timer = setTimeout(() => this.proc.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
  }
}

export class Fleet {
  private hubProc: ManagedProcess | null = null;
  private children: ChildHandle[] = [];
  private tunnel: Tunnel | null = null;
  private caKeyPath = '';
  private dataDir = '';
  /** The Kubernetes API fixture the hub keeps its store in (store: 'kubernetes'). */
  private kube: { store: Store; close(): Promise<void> } | null = null;
  private kubeconfig = '';
  /** OCM mode: the light klusterlet's watch of the agent ManifestWorks. */
  private workWatch: Watch | null = null;

  private constructor(
    readonly opts: FleetOptions,
    readonly pki: TestPki,
    readonly echo: TcpTarget,
    readonly ports: FleetHub['ports'],
    readonly clusters: readonly string[],
  ) {}

  /** Writes the PKI and the store, starts the hub and the echo target; agents come with startAgents(). */
  static async create(opts: FleetOptions): Promise<Fleet> {
    const pki = await createPki();
    const echo = await startEchoServer();
    const ports = {
      agent: await freeLoopbackPort(),
      frontend: await freeLoopbackPort(),
      admin: await freeLoopbackPort(),
      health: await freeLoopbackPort(),
    };
    const clusters = Array.from({ length: opts.clusters }, (_, i) => clusterName(i));
    const fleet = new Fleet(opts, pki, echo, ports, clusters);
    try {
      fleet.caKeyPath = path.join(pki.dir, 'ca-signing.key');
      await writeFile(fleet.caKeyPath, pki.ca.keyPem, { mode: 0o600 });
      fleet.dataDir = await mkdtemp(path.join(pki.dir, 'hub-'));
      fleet.kubeconfig = path.join(pki.dir, 'hub-kubeconfig');
      if (opts.ocm && opts.realOcm) {
        const ocm = await startOcmHub();
        fleet.kube = { store: await ocm.kube.client('fleet-admin', ['system:masters']), close: () => ocm.stop() };
        // What our chart adds beside OCM's CRDs (Helm leaves existing CRDs alone).
        await ocm.kube.applyCrdFiles([path.join(CHART_CRDS_DIR, 'managedproxyconfigurations.crd.yaml')]);
        await ocm.kube.writeKubeconfig(fleet.kubeconfig);
      } else if (opts.store === 'kubernetes' || opts.ocm) {
        const api: FakeKubeApiServer = await startFakeKubeApiServer();
        fleet.kube = { store: api.store, close: () => api.close() };
        await api.writeKubeconfig(fleet.kubeconfig);
      }
      await fleet.registerClusters();
      if (opts.ocm) fleet.applyWorks();
      await fleet.startHub();
    } catch (err) {
      await fleet.stop();
      throw err;
    }
    return fleet;
  }

  private log(message: string): void {
    this.opts.log?.(message);
  }

  /** The ManagedClusters, written straight into the hub's (not yet running) store. */
  private async registerClusters(): Promise<void> {
    const store = this.kube?.store ?? (await openEmbeddedStore(embeddedStoreDir(this.dataDir)));
    try {
      for (const name of this.clusters) {
        const mc: ManagedCluster = {
          apiVersion: 'cluster.open-cluster-management.io/v1',
          kind: 'ManagedCluster',
          metadata: { name },
          spec: { hubAcceptsClient: true, ...(this.opts.realOcm ? { leaseDurationSeconds: 3600 } : {}) },
        };
        await store.create('ManagedCluster', mc);
        if (!this.opts.ocm) continue;
        // As OCM's addon-manager does for an enabled addon (installStrategy Manual: an admin enabled it).
        await store.ensureNamespace(name);
        const addon: ManagedClusterAddOn = {
          apiVersion: 'addon.open-cluster-management.io/v1alpha1',
          kind: 'ManagedClusterAddOn',
          metadata: { name: 'cluster-proxy', namespace: name },
          spec: {},
        };
        const created = await store.create('ManagedClusterAddOn', addon);
        if (this.opts.realOcm) continue; // OCM's addon-manager resolves its configs.
        // Its configs resolved (none but the defaults): the hub builds no work before that.
        await store.updateStatus('ManagedClusterAddOn', {
          ...created,
          status: {
            conditions: [
              {
                type: 'Configured',
                status: 'True',
                reason: 'ConfigurationsConfigured',
                message: 'Configurations configured',
                lastTransitionTime: new Date().toISOString(),
              },
            ],
          },
        });
      }
    } finally {
      if (!this.kube) await store.close();
    }
  }

  /** The light klusterlet: every agent ManifestWork the hub writes is reported applied (its current generation). */
  private applyWorks(): void {
    const store = this.kube!.store;
    this.workWatch = store.watch(
      'ManifestWork',
      {},
      {
        onEvent: (e) => {
          const w: ManifestWork = e.object;
          if (
            e.type === 'DELETED' ||
            w.status?.conditions?.some((c) => c.type === 'Applied' && c.observedGeneration === w.metadata.generation)
          )
            return;
          const at = new Date().toISOString();
          const done = (type: string, reason: string): NonNullable<NonNullable<ManifestWork['status']>['conditions']>[number] => ({
            type,
            status: 'True',
            reason,
            message: `${type} by the fleet's light klusterlet`,
            lastTransitionTime: at,
            observedGeneration: w.metadata.generation,
          });
          // A conflict (the hub rewrote the work meanwhile) comes back as another event.
          void store
            .updateStatus('ManifestWork', {
              ...w,
              status: {
                ...w.status,
                conditions: [done('Applied', 'AppliedManifestWorkComplete'), done('Available', 'ResourcesAvailable')],
              },
            })
            .catch(() => undefined);
        },
        onError: (err) => this.log(`light klusterlet: ManifestWork watch ended: ${err.message}`),
      },
    );
  }

  get hub(): FleetHub {
    if (!this.hubProc?.pid) throw new Error('the fleet hub is not running');
    return { pid: this.hubProc.pid, ports: this.ports, proc: this.hubProc };
  }

  /** Starts the hub on the fleet's ports and data directory; resolves once /readyz answers 200. */
  async startHub(): Promise<void> {
    const p = this.ports;
    const args = [
      ...cliLaunchFlags(),
      ...(this.opts.hubNodeArgs ?? []),
      CLI,
      'hub',
      '--data-dir',
      this.dataDir,
      '--bind-address',
      '127.0.0.1',
      '--agent-port',
      String(p.agent),
      '--frontend-port',
      String(p.frontend),
      '--admin-port',
      String(p.admin),
      '--health-port',
      String(p.health),
      '--connect-port',
      'off',
      '--ca-cert',
      this.pki.caPath,
      '--server-cert',
      this.pki.server.certPath,
      '--server-key',
      this.pki.server.keyPath,
      '--log-level',
      this.opts.hubLogLevel ?? 'warn',
      ...(this.kube ? ['--store', 'kubernetes', '--kubeconfig', this.kubeconfig] : []),
      ...(this.opts.ocm ? ['--agent-install', 'manifestwork', '--ca-key', this.caKeyPath] : []),
      ...(this.opts.hubArgs ?? []),
    ];
    this.hubProc = spawnProcess({ name: 'fleet-hub', command: process.execPath, args });
    const deadline = performance.now() + 60_000;
    for (;;) {
      if (!this.hubProc.isRunning()) throw new Error(`fleet hub exited at start:\n${this.hubProc.lines().slice(-20).join('\n')}`);
      const status = await fetch(`http://127.0.0.1:${p.health}/readyz`, { signal: AbortSignal.timeout(2000) }).then(
        (r) => r.status,
        () => 0,
      );
      if (status === 200) return;
      if (performance.now() > deadline) throw new Error(`fleet hub not ready within 60 s:\n${this.hubProc.lines().slice(-10).join('\n')}`);
      await sleep(100);
    }
  }

  /** SIGTERM (the hub's graceful stop); resolves once it exited. */
  async stopHub(): Promise<void> {
    this.tunnel?.close();
    this.tunnel = null;
    await this.hubProc?.stop(15_000);
    this.hubProc = null;
  }

  /** Forks the agent processes; resolves once every agent is created (certificates issued), not connected. */
  async startAgents(): Promise<{ issuedSeconds: number }> {
    const n = this.clusters.length;
    const procs = this.opts.processes ?? Math.min(4, Math.max(1, Math.ceil(n / 1250)));
    const grpcShare = this.opts.grpcShare ?? 0.2;
    const perSecond = this.opts.startPerSecond ?? 250;
    for (let k = 0; k < procs; k++) {
      const mine = this.clusters.filter((_, i) => i % procs === k);
      // Every 1/grpcShare-th agent speaks gRPC.
      const grpc = grpcShare > 0 ? mine.map((_, i) => i).filter((i) => (i + 1) % Math.round(1 / grpcShare) === 0) : [];
      const job: FleetChildJob = {
        index: k,
        hubAddress: `127.0.0.1:${this.ports.agent}`,
        caCertPath: this.pki.caPath,
        caKeyPath: this.caKeyPath,
        clusters: mine,
        grpc,
        apiserver: `127.0.0.1:${this.echo.port}`,
        leaseDurationMs: this.opts.leaseDurationMs ?? 60_000,
        replicaSyncMs: this.opts.replicaSyncMs ?? 10_000,
        startPerSecond: perSecond / procs,
        certValidityDays: 30,
        logLevel: 'error',
      };
      const proc = fork(CHILD_SCRIPT, [JSON.stringify(job)], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
      this.children.push(new ChildHandle(proc, mine));
    }
    const issued = await Promise.all(this.children.map((c) => c.ready));
    return { issuedSeconds: Math.max(...issued) };
  }

  /** Agents (as their processes see them) holding a tunnel now. */
  async connectedAgents(): Promise<{ connected: number; total: number; childRssKiB: number }> {
    const all = await Promise.all(this.children.map((c) => c.request({ type: 'status' }, 'status')));
    return {
      connected: all.reduce((a, s) => a + s.connected, 0),
      total: all.reduce((a, s) => a + s.total, 0),
      childRssKiB: all.reduce((a, s) => a + s.rssKiB, 0),
    };
  }

  /** Waits until `want` agents hold a tunnel (as the agents see it) and the hub counts as many; throws after timeoutMs. */
  async waitConnected(want: number, timeoutMs: number): Promise<number> {
    const began = performance.now();
    let last = { agents: 0, hub: 0 };
    while (performance.now() - began < timeoutMs) {
      const agents = (await this.connectedAgents()).connected;
      const hub = agents >= want ? await this.hubAgents() : 0;
      last = { agents, hub };
      if (agents >= want && hub >= want) return (performance.now() - began) / 1000;
      await sleep(250);
    }
    throw new Error(`only ${last.agents} agents (hub: ${last.hub}) of ${want} connected after ${timeoutMs / 1000} s`);
  }

  /** When each live agent last came up, if after `since` (ms since the epoch); null for the others. */
  async upTimes(since: number): Promise<(number | null)[]> {
    const all = await Promise.all(this.children.map((c) => c.request({ type: 'up-times', since }, 'up-times')));
    return all.flatMap((r) => r.times);
  }

  /** Stops one cluster's agent as a killed pod would go: its tunnels close, its lease stops. */
  async killAgent(cluster: string): Promise<void> {
    const child = this.children.find((c) => c.clusters.includes(cluster));
    if (!child) throw new Error(`no agent for ${cluster}`);
    await child.request({ type: 'kill', cluster }, 'killed');
  }

  /** One of the hub's Prometheus series (summed over labels), from the admin port. */
  async hubMetric(name: string, labels: Record<string, string> = {}): Promise<number> {
    const text = await (await fetch(`http://127.0.0.1:${this.ports.admin}/metrics`, { signal: AbortSignal.timeout(10_000) })).text();
    let sum = 0;
    for (const line of text.split('\n')) {
      if (!line.startsWith(name) || (line[name.length] !== ' ' && line[name.length] !== '{')) continue;
      if (!Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) continue;
      sum += Number(line.slice(line.lastIndexOf(' ') + 1));
    }
    return sum;
  }

  /** Agents connected to the hub, by its own gauge. */
  hubAgents(): Promise<number> {
    return this.hubMetric('konnectivity_network_proxy_server_ready_backend_connections');
  }

  /** `cluster-proxy get managedclusteraddons -A` as the CLI asks it (the admin API). */
  /**
   * OCM mode: how many addons have settled, read from the store as OCM sees them: Available and ManifestApplied
   * True, and, on OCM itself, the rollout Completed (OCM's addon-manager is done with them).
   */
  async settledAddons(): Promise<number> {
    if (!this.kube || !this.opts.ocm) throw new Error('settledAddons() is for OCM mode');
    const is = (a: ManagedClusterAddOn, type: string, status: string, reason?: string): boolean =>
      a.status?.conditions?.some((c) => c.type === type && c.status === status && (reason === undefined || c.reason === reason)) ?? false;
    const { items } = await this.kube.store.list('ManagedClusterAddOn');
    return items.filter(
      (a) =>
        is(a, 'Available', 'True') &&
        is(a, 'ManifestApplied', 'True') &&
        (!this.opts.realOcm || is(a, 'Progressing', 'False', 'Completed')),
    ).length;
  }

  async addons(): Promise<{ cluster: string; available: string | undefined }[]> {
    const res = await fetch(`http://127.0.0.1:${this.ports.admin}/v1/managedclusteraddons`, { signal: AbortSignal.timeout(60_000) });
    if (res.status !== 200) throw new Error(`GET /v1/managedclusteraddons: HTTP ${res.status}`);
    const body = (await res.json()) as {
      items: { metadata: { namespace?: string }; status?: { conditions?: { type: string; status: string }[] } }[];
    };
    return body.items.map((a) => ({
      cluster: a.metadata.namespace ?? '',
      available: a.status?.conditions?.find((c) => c.type === 'Available')?.status,
    }));
  }

  /** One dial to `cluster`'s apiserver (the echo server), 64 bytes echoed; resolves with the milliseconds it took. */
  async dial(cluster: string, timeoutMs = 10_000): Promise<number> {
    const began = performance.now();
    const socket = await this.clientTunnel().dial(`${cluster}:443`, { timeoutMs });
    try {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error(`no echo from ${cluster} within ${timeoutMs} ms`)), timeoutMs);
        let got = 0;
        socket.on('data', (c: Buffer) => {
          got += c.length;
          if (got >= 64) {
            clearTimeout(timer);
            resolve();
          }
        });
        socket.once('error', (err: Error) => {
          clearTimeout(timer);
          reject(err);
        });
        socket.write(Buffer.alloc(64, 7));
      });
    } finally {
      socket.destroy();
    }
    return performance.now() - began;
  }

  private clientTunnel(): Tunnel {
    return (this.tunnel ??= this.newTunnel());
  }

  private newTunnel(): Tunnel {
    return new Tunnel({
      address: `127.0.0.1:${this.ports.frontend}`,
      serverName: 'localhost',
      caCert: Buffer.from(this.pki.ca.certPem),
      cert: this.clientCert.cert,
      key: this.clientCert.key,
      transport: 'mux',
    });
  }

  private clientCertCache: { cert: Buffer; key: Buffer } | null = null;
  private get clientCert(): { cert: Buffer; key: Buffer } {
    if (!this.clientCertCache) throw new Error('client certificate not loaded');
    return this.clientCertCache;
  }

  /** Loads the hub user's certificate (for dials). */
  async loadClient(): Promise<void> {
    this.clientCertCache = { cert: await readFile(this.pki.client.certPath), key: await readFile(this.pki.client.keyPath) };
  }

  /** Stops everything: agents, client, hub, echo server, files. */
  async stop(): Promise<void> {
    await Promise.all(this.children.map((c) => c.stop().catch(() => undefined)));
    this.children = [];
    await this.stopHub().catch(() => undefined);
    this.workWatch?.stop();
    this.workWatch = null;
    await this.kube?.close().catch(() => undefined);
    this.kube = null;
    await this.echo.close().catch(() => undefined);
    await rm(this.pki.dir, { recursive: true, force: true }).catch(() => undefined);
  }
}
