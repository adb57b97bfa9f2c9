// ClusterProfiles (SIG-Multicluster's Cluster Inventory API, multicluster.x-k8s.io/v1alpha1) as OCM's
// cluster-proxy writes them when its ClusterProfile feature is on
// (pkg/proxyserver/controllers/clusterprofile_controller.go @ 8165e8e): for each ClusterProfile that
// OCM manages (label x-k8s.io/cluster-manager=open-cluster-management) of a managed cluster (label
// open-cluster-management.io/cluster-name), status.accessProviders holds an entry named
// "open-cluster-management" whose kubeconfig `cluster` reaches that cluster through the hub's HTTP gateway:
//   server                      <gateway URL>/<profile name>
//   certificate-authority-data  the CA the gateway's certificate chains to (OCM: the user-server's tls.crt)
//   extensions                  client.authentication.k8s.io/exec: {"clusterName": "<profile name>"}
// A consumer (a multicluster controller using the Cluster Inventory API) builds its client from that and
// its own credentials, which the gateway authenticates. Other providers' entries are left as they are.
// Run by the addon manager's leader as part of the OCM install pass; written only when it differs, with
// the object's resourceVersion (a conflict is retried next pass).
import type { Logger } from 'pino';
import type { ClusterProfile, KubeconfigCluster } from '../store/objects.js';
import { sameJson } from '../store/same-json.js';
import { ConflictError, NotFoundError, type Store } from '../store/store.js';
import { CLUSTER_NAME_LABEL } from './names.js';

export const CLUSTER_MANAGER_LABEL = 'x-k8s.io/cluster-manager';
export const OCM_CLUSTER_MANAGER = 'open-cluster-management';
export const ACCESS_PROVIDER_NAME = 'open-cluster-management';
const EXEC_EXTENSION = 'client.authentication.k8s.io/exec';

export interface ClusterProfileOptions {
  /** Where consumers reach the gateway, e.g. https://cluster-proxy.ns.svc:9092 (no trailing slash). */
  gatewayUrl: string;
  /** PEM CA bundle the gateway's certificate chains to (two CAs during a rollover). */
  caBundle: () => string;
}

/** Whether OCM manages this profile and it names its managed cluster (OCM's predicate). */
export function isOcmProfile(p: ClusterProfile): boolean {
  const labels = p.metadata.labels ?? {};
  return labels[CLUSTER_MANAGER_LABEL] === OCM_CLUSTER_MANAGER && CLUSTER_NAME_LABEL in labels;
}

/** Our access provider for `p`. */
export function accessProviderOf(p: ClusterProfile, opts: ClusterProfileOptions): { name: string; cluster: KubeconfigCluster } {
  const name = p.metadata.name;
  return {
    name: ACCESS_PROVIDER_NAME,
    cluster: {
      server: `${opts.gatewayUrl.replace(/\/+$/, '')}/${name}`,
      'certificate-authority-data': Buffer.from(opts.caBundle()).toString('base64'),
      extensions: [{ name: EXEC_EXTENSION, extension: { clusterName: name } }],
    },
  };
}

/** `p`'s status with our provider upserted (others kept, in place), or null when it already holds it. */
export function withAccessProvider(p: ClusterProfile, opts: ClusterProfileOptions): ClusterProfile['status'] | null {
  const ours = accessProviderOf(p, opts);
  const providers = [...(p.status?.accessProviders ?? [])];
  const i = providers.findIndex((a) => a.name === ACCESS_PROVIDER_NAME);
  if (i >= 0 && sameJson(providers[i], ours)) return null;
  if (i >= 0) providers[i] = ours;
  else providers.push(ours);
  // OCM sets an empty list rather than none (its controller: "to avoid validation errors").
  return { ...p.status, accessProviders: providers, conditions: p.status?.conditions ?? [] };
}

export class ClusterProfileWriter {
  private unavailable = '';

  constructor(
    private readonly store: Store,
    private readonly log: Logger,
    private readonly opts: ClusterProfileOptions,
  ) {}

  /** One pass over every ClusterProfile; returns how many were written. */
  async sync(): Promise<number> {
    let profiles: ClusterProfile[];
    try {
      profiles = (await this.store.list('ClusterProfile')).items;
    } catch (err) {
      // The Cluster Inventory CRD is not installed (yet): say so once, try again next pass.
      const msg =
        err instanceof NotFoundError
          ? 'the ClusterProfile API (multicluster.x-k8s.io/v1alpha1) is not served by this hub; install its CRD'
          : (err as Error).message;
      if (msg !== this.unavailable) this.log.warn({ err: msg }, 'cannot list ClusterProfiles; access providers are not written');
      this.unavailable = msg;
      return 0;
    }
    this.unavailable = '';
    let written = 0;
    for (const p of profiles) {
      if (!isOcmProfile(p)) continue;
      const status = withAccessProvider(p, this.opts);
      if (!status) continue;
      try {
        await this.store.updateStatus('ClusterProfile', { ...p, status });
        written++;
        this.log.info({ namespace: p.metadata.namespace, clusterProfile: p.metadata.name }, 'ClusterProfile access provider written');
      } catch (err) {
        // Changed or deleted meanwhile: the next pass reads it again.
        if (!(err instanceof ConflictError) && !(err instanceof NotFoundError)) throw err;
      }
    }
    return written;
  }
}
