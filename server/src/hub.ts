// The hub process as one object: the proxy server, the hub store, the cluster registry (who may
// connect), registration (tokens → certificates), and the addon manager (addons, leases, health).
// `cluster-proxy hub` and `cluster-proxy quickstart` both run this.
import { X509Certificate } from 'node:crypto';
import type { Logger } from 'pino';
import { OCM_DEFAULT_INSTALL_NAMESPACE, registerJoinRoutes } from './addon/join.js';
import { AddonManager } from './addon/manager.js';
import { DEFAULT_AGENT_IMAGE, manifestsToYaml, renderAgentInstall } from './addon/manifests.js';
import type { PemPair } from './pki/certificates.js';
import { TlsReloader } from './pki/reload.js';
import { splitBundle } from './pki/rotation.js';
import { ProxyServer, type BoundPorts, type ProxyServerOptions } from './proxy-server.js';
import { ClusterRegistry, createBootstrapToken, registerRegistrationRoutes, revokeBootstrapTokens } from './fleet/registration.js';
import { ReplicaRegistry } from './fleet/replicas.js';
import type { AddOnDeploymentConfig } from './store/objects.js';
import type { Store } from './store/store.js';
import { countingStore } from './store/counting.js';
import { Counter } from './dataplane/prom.js';

import { DEPLOYMENT_CONFIG, HUB_NAMESPACE } from './addon/hub-namespace.js';

export { HUB_NAMESPACE };

export interface HubOptions {
  server: Omit<ProxyServerOptions, 'log' | 'readinessChecks'>;
  store: Store;
  /** The CA that signs agent certificates; without it the hub cannot register clusters (join, bootstrap). */
  signer?: PemPair;
  /** Refuse agents of clusters that are not registered, even with a certificate from the hub CA. */
  requireRegistration?: boolean;
  /** HOST:PORT agents dial, for rendered install manifests (default 127.0.0.1:<agent port>). */
  agentEntrypoint?: string;
  serverName?: string;
  agentImage?: string;
  healthMode?: 'tunnel' | 'lease';
  tunnelLossWindowMs?: number;
  /** Agent certificate lifetime in days (default 180). */
  agentCertValidityDays?: number;
  /** Where the TLS material came from: watched and reloaded when it changes (renewal, CA rollover). */
  tlsFiles?: { ca: string; cert: string; key: string; caKey?: string };
  /** The data-dir PKI: the hub renews its own serving certificate there. */
  managedPkiDir?: string;
  /** How often the TLS files are checked (default 30 s). */
  tlsReloadIntervalMs?: number;
  /**
   * 'manual' (default): admins install agents from `join` bundles. 'manifestwork': the hub is OCM's
   * addon manager and installs agents itself through ManifestWorks and OCM's CSR flow (Kubernetes store).
   */
  agentInstall?: 'manual' | 'manifestwork';
  /** Agent namespace when no AddOnDeploymentConfig names one (manifestwork mode). */
  agentInstallNamespace?: string;
  /** Manifestwork mode with the gateway: write it as an access provider into OCM's ClusterProfiles, at this URL. */
  clusterProfilesGatewayUrl?: string;
  /** A replica that stops renewing its lease for this long counts as gone (default 30 s). */
  replicaLeaseDurationMs?: number;
  log: Logger;
}

export class Hub {
  readonly server: ProxyServer;
  readonly manager: AddonManager;
  private readonly registry: ClusterRegistry;
  private signer: PemPair | undefined;
  private signingX509: { pem: string; x509: X509Certificate } | null = null;
  private readonly reloader: TlsReloader | null;
  readonly replicas: ReplicaRegistry;

  private readonly opts: HubOptions;

  constructor(options: HubOptions) {
    // Every store request of the hub is counted (cluster_proxy_server_store_requests_total): what a fleet costs the store.
    const storeRequests = new Counter({
      name: 'cluster_proxy_server_store_requests_total',
      help: 'Requests this hub made of its store, by verb and kind',
      labelNames: ['verb', 'kind'],
      registers: [],
    });
    const opts: HubOptions = { ...options, store: countingStore(options.store, (verb, kind) => storeRequests.inc({ verb, kind })) };
    this.opts = opts;
    this.server = new ProxyServer({ ...opts.server, log: opts.log, readinessChecks: [{ name: 'store', check: () => opts.store.ping() }] });
    this.server.metrics.registry.registerMetric(storeRequests);
    this.replicas = new ReplicaRegistry({
      store: opts.store,
      namespace: HUB_NAMESPACE,
      serverID: this.server.serverID,
      leaseDurationMs: opts.replicaLeaseDurationMs,
      log: opts.log,
      tunnelClusters: () => this.server.core.routes.backends().map((b) => b.cluster),
      fleetSize: () => this.manager?.fleetSize ?? 0,
      onLeaseList: (seconds, code, reason) => this.server.metrics.leaseList(seconds, code, reason),
    });
    this.replicas.registerRoutes(this.server.hubApi);
    // A dial for a cluster that other replicas reach waits for its agent here (a restart, a reconnect).
    this.server.core.agentWaits.setAgentsElsewhere(() => this.replicas.clustersElsewhere);
    const configured = opts.server.serverCount ?? 1;
    // The live replicas once known; the configured count (--server-count) until the first read.
    this.server.setServerCount(() => (this.replicas.known ? this.replicas.count : configured));
    this.registry = new ClusterRegistry(opts.store, this.server.core, opts.log, opts.requireRegistration ?? false);
    this.server.setAgentRegistry(this.registry);
    // The gateway tells a registered cluster without an agent (503) from an unknown name (404).
    this.server.clusterKnown = async (cluster) => (await opts.store.get('ManagedCluster', { name: cluster })) !== null;
    // TokenReview and SubjectAccessReview for the gateway: the hub's own API server, on --store kubernetes only
    // (the client module loads only then).
    // The store itself, not its counting wrapper: the reviews use its Kubernetes client.
    if (options.store.kind === 'kubernetes')
      this.server.hubReviews = async () => (await import('./gateway/kube-reviews.js')).hubReviewsOf(options.store);
    this.signer = opts.signer;
    this.manager = new AddonManager({
      store: opts.store,
      core: this.server.core,
      log: opts.log,
      serverID: this.server.serverID,
      healthMode: opts.healthMode,
      tunnelLossWindowMs: opts.tunnelLossWindowMs,
      certificates: () => ({
        servingCertExpiry: expiry(this.server.tls.cert),
        signerExpiry: this.signer ? expiry(Buffer.from(this.signer.certPem)) : null,
      }),
      caBundle: () => this.caBundle(),
      replicaList: () => this.replicas.answer(),
      agentImage: opts.agentImage ?? DEFAULT_AGENT_IMAGE,
      // After a CA rollover's "promote", agents still on the old CA get new certificates before "finish".
      shouldRenew: (cert) => {
        if (!this.signer) return false;
        // Asked on every lease renewal: the signer is parsed once per signer, not per renewal.
        if (this.signingX509?.pem !== this.signer.certPem)
          this.signingX509 = { pem: this.signer.certPem, x509: new X509Certificate(this.signer.certPem) };
        return cert.fingerprint256 !== '' && !!cert.raw && !new X509Certificate(cert.raw).checkIssued(this.signingX509.x509);
      },
    });
    this.reloader = opts.tlsFiles
      ? new TlsReloader({
          files: opts.tlsFiles,
          managedPkiDir: opts.managedPkiDir,
          intervalMs: opts.tlsReloadIntervalMs ?? 30_000,
          log: opts.log,
          onChange: (m) => {
            this.server.reloadTls({ caCert: m.caCert, cert: m.cert, key: m.key });
            if (m.caKey) this.signer = { certPem: splitBundle(m.caCert.toString('utf8'))[0]!, keyPem: m.caKey.toString('utf8') };
            // The installer renders the CA bundle and the signer into the agents' works and registrations.
            this.manager.installerInputsChanged();
          },
        })
      : null;
    this.manager.registerRoutes(this.server.hubApi, this.server.adminApi);
    if (opts.signer) this.registerRegistration(opts.signer);
    else opts.log.warn('no CA key: cluster registration (join, bootstrap tokens) is off; agents need certificates issued from the hub CA');
  }

  private registerRegistration(initial: PemPair): void {
    const { store } = this.opts;
    const caBundle = (): string => this.caBundle();
    registerRegistrationRoutes(this.server.hubApi, {
      store,
      signer: () => this.signer ?? initial,
      caBundle,
      certValidityDays: this.opts.agentCertValidityDays,
      log: this.opts.log,
    });
    registerJoinRoutes(this.server.adminApi, {
      store,
      issueBootstrapToken: (cluster, ttl) => createBootstrapToken(store, cluster, ttl),
      revokeBootstrapTokens: (cluster) => revokeBootstrapTokens(store, cluster),
      renderManifests: async (input) => {
        const config = await store.get('AddOnDeploymentConfig', DEPLOYMENT_CONFIG);
        return manifestsToYaml(
          renderAgentInstall({
            ...input,
            proxyConfig: proxyConfigOf(config),
            nodePlacement: config?.spec.nodePlacement,
            gateway: this.opts.server.gatewayPort != null,
          }),
        );
      },
      caBundle,
      defaults: () => ({ agentEntrypoint: this.agentEntrypoint(), serverName: this.opts.serverName, image: this.opts.agentImage }),
    });
  }

  get store(): Store {
    return this.opts.store;
  }

  async start(): Promise<BoundPorts> {
    await this.opts.store.ensureNamespace(HUB_NAMESPACE);
    await this.registry.start();
    // Our replica lease first: other replicas list us before any agent holds a tunnel to us.
    await this.replicas.start();
    const ports = await this.server.start();
    if (this.opts.agentInstall === 'manifestwork') await this.useOcmInstaller();
    await this.startManager();
    await this.reloader?.start();
    return ports;
  }

  /** The CA bundle agents trust (two CAs during a rollover). */
  private caBundle(): string {
    return this.server.tls.caCert.toString('utf8');
  }

  /** HOST:PORT agents dial: --agent-entrypoint, else our agent port (known once we listen). */
  private agentEntrypoint(): string {
    return this.opts.agentEntrypoint ?? `127.0.0.1:${this.server.ports?.agent ?? 8091}`;
  }

  /** Loaded only in this mode: it brings the X.509 library OCM's ECDSA CSRs need. */
  private async useOcmInstaller(): Promise<void> {
    const { OcmInstaller } = await import('./ocm/installer.js');
    this.manager.setInstaller(
      new OcmInstaller({
        store: this.opts.store,
        log: this.opts.log,
        signer: () => this.signer,
        caBundle: () => this.caBundle(),
        agentEntrypoint: () => this.agentEntrypoint(),
        serverName: this.opts.serverName,
        agentImage: this.opts.agentImage ?? DEFAULT_AGENT_IMAGE,
        defaultInstallNamespace: this.opts.agentInstallNamespace ?? OCM_DEFAULT_INSTALL_NAMESPACE,
        gateway: this.opts.server.gatewayPort != null,
        ...(this.opts.clusterProfilesGatewayUrl
          ? { clusterProfiles: { gatewayUrl: this.opts.clusterProfilesGatewayUrl, caBundle: () => this.caBundle() } }
          : {}),
      }),
    );
  }

  private managerRetry: NodeJS.Timeout | null = null;

  /** The tunnels serve without the store; the addon manager starts as soon as the store answers. */
  private async startManager(): Promise<void> {
    try {
      await this.manager.start();
    } catch (err) {
      this.opts.log.warn({ err: (err as Error).message }, 'addon manager cannot start yet (store unreachable?); retrying in 5 s');
      this.managerRetry = setTimeout(() => {
        this.managerRetry = null;
        void this.startManager();
      }, 5000);
    }
  }

  /** Readiness off (then `delayMs` still serving), agents told (DRAIN), our replica lease deleted, open connections get `graceMs`. */
  async stop(graceMs = 5000, delayMs = 0): Promise<void> {
    if (this.managerRetry) clearTimeout(this.managerRetry);
    this.managerRetry = null;
    this.reloader?.stop();
    // Kept-alive hub API connections must not hold this replica up (load balancers, drain).
    this.server.hubApi.drain();
    const serverStopped = this.server.stop(graceMs, delayMs);
    await this.replicas.stop();
    await this.manager.stop();
    this.registry.stop();
    await serverStopped;
  }
}

function expiry(pem: Buffer): Date | null {
  try {
    return new Date(new X509Certificate(pem).validTo);
  } catch {
    return null;
  }
}

function proxyConfigOf(config: AddOnDeploymentConfig | null): AddOnDeploymentConfig['spec']['proxyConfig'] {
  return config?.spec.proxyConfig;
}
