// The hub's objects, with OCM's group/version/kind names and the fields we use (contract §6). Both stores
// hold exactly these shapes, so a `kubectl get -o yaml` of the Kubernetes store and a
// `cluster-proxy get -o yaml` of the embedded one look the same.

export interface ObjectMeta {
  name: string;
  /** Absent for cluster-scoped kinds (ManagedCluster, ManagedProxyConfiguration). */
  namespace?: string;
  /** Opaque; set by the store on every write. An update carrying a stale one is a ConflictError. */
  resourceVersion?: string;
  uid?: string;
  /** RFC 3339, set by the store on create. */
  creationTimestamp?: string;
  /** Set by the store: 1 on create, +1 on every update that changes more than metadata and status. */
  generation?: number;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  /** Set by the store when a delete was asked for while finalizers remain (Kubernetes semantics). */
  deletionTimestamp?: string;
  finalizers?: string[];
  /** Who owns the object (Kubernetes garbage-collects it with its owner; the hub also deletes it itself). */
  ownerReferences?: OwnerReference[];
}

export interface OwnerReference {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

/** metav1.Condition. */
export interface Condition {
  type: string;
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message: string;
  lastTransitionTime: string;
  observedGeneration?: number;
}

export interface KubeObject {
  apiVersion: string;
  kind: string;
  metadata: ObjectMeta;
}

// cluster.open-cluster-management.io/v1
export interface ManagedCluster extends KubeObject {
  apiVersion: 'cluster.open-cluster-management.io/v1';
  kind: 'ManagedCluster';
  spec: {
    hubAcceptsClient: boolean;
    leaseDurationSeconds?: number;
    managedClusterClientConfigs?: { url: string; caBundle?: string }[];
  };
  status?: { conditions?: Condition[]; version?: { kubernetes?: string } };
}

// addon.open-cluster-management.io/v1alpha1, name `cluster-proxy`, namespace = cluster name
export interface ManagedClusterAddOn extends KubeObject {
  apiVersion: 'addon.open-cluster-management.io/v1alpha1';
  kind: 'ManagedClusterAddOn';
  spec: {
    installNamespace?: string;
    configs?: { group: string; resource: string; name: string; namespace?: string }[];
  };
  status?: {
    conditions?: Condition[];
    /** Extension fields (ignored by OCM tools) for `get -o wide`. */
    healthCheck?: { mode: 'Lease' | 'Customized' };
    namespace?: string;
    /** OCM: the certificates the klusterlet requests for the addon agent (`--agent-install manifestwork`). */
    registrations?: AddonRegistration[];
    /** Written by the addon (its half of the addon-framework contract): the config kinds it reads. */
    supportedConfigs?: { group: string; resource: string }[];
    /** Written by OCM's hub addon-manager (never by us): the resolved configs, with spec hashes. */
    configReferences?: ConfigReference[];
  };
}

/** ManagedClusterAddOn.status.configReferences[] (OCM's addon-manager resolves them; the addon reads them). */
export interface ConfigReference {
  group: string;
  resource: string;
  /** Deprecated flat form OCM still fills (the desired config's name). */
  name?: string;
  namespace?: string;
  desiredConfig?: { name: string; namespace?: string; specHash: string };
  lastAppliedConfig?: { name: string; namespace?: string; specHash: string };
  lastObservedGeneration?: number;
}

/** ManagedClusterAddOn.status.registrations[]: what the klusterlet's CSR for the addon must ask for. */
export interface AddonRegistration {
  signerName: string;
  subject: { user: string; groups?: string[]; organizationUnit?: string[] };
}

// proxy.open-cluster-management.io/v1alpha1, singleton `cluster-proxy`
export interface ManagedProxyConfiguration extends KubeObject {
  apiVersion: 'proxy.open-cluster-management.io/v1alpha1';
  kind: 'ManagedProxyConfiguration';
  spec: {
    authentication?: { signer?: { type: 'SelfSigned' | 'Custom' }; dump?: { secrets?: Record<string, string> } };
    proxyServer: {
      image?: string;
      replicas?: number;
      namespace?: string;
      entrypoint?: { type: 'Hostname' | 'LoadBalancerService' | 'PortForward'; hostname?: { value: string }; port?: number };
    };
    proxyAgent: { image?: string; replicas?: number; imagePullSecrets?: string[] };
  };
  status?: { conditions?: Condition[]; lastObservedGeneration?: number };
}

// addon.open-cluster-management.io/v1alpha1
export interface AddOnDeploymentConfig extends KubeObject {
  apiVersion: 'addon.open-cluster-management.io/v1alpha1';
  kind: 'AddOnDeploymentConfig';
  spec: {
    customizedVariables?: { name: string; value: string }[];
    nodePlacement?: { nodeSelector?: Record<string, string>; tolerations?: unknown[] };
    agentInstallNamespace?: string;
    proxyConfig?: { httpProxy?: string; httpsProxy?: string; noProxy?: string; caBundle?: string };
    /** Image mirrors: an image starting with `source` is pulled from `mirror` instead. */
    registries?: { source: string; mirror: string }[];
    /** Per-container resources; containerID `deployments:<name>:<container>`, `*` matches any part. */
    resourceRequirements?: { containerID: string; resources: { requests?: Record<string, string>; limits?: Record<string, string> } }[];
  };
}

// coordination.k8s.io/v1
export interface Lease extends KubeObject {
  apiVersion: 'coordination.k8s.io/v1';
  kind: 'Lease';
  spec: {
    holderIdentity?: string;
    leaseDurationSeconds?: number;
    /** RFC 3339 with microseconds (MicroTime). */
    acquireTime?: string;
    renewTime?: string;
    leaseTransitions?: number;
  };
}

// v1 Secret: bootstrap tokens (namespace = cluster name). `data` values are base64, as in Kubernetes.
export interface Secret extends KubeObject {
  apiVersion: 'v1';
  kind: 'Secret';
  type?: string;
  data?: Record<string, string>;
}

// addon.open-cluster-management.io/v1alpha1, cluster-scoped, name `cluster-proxy`
export interface ClusterManagementAddOn extends KubeObject {
  apiVersion: 'addon.open-cluster-management.io/v1alpha1';
  kind: 'ClusterManagementAddOn';
  spec: {
    addOnMeta?: { displayName?: string; description?: string };
    supportedConfigs?: { group: string; resource: string; defaultConfig?: { name: string; namespace?: string } }[];
    installStrategy?: { type: 'Manual' | 'Placements'; placements?: { name: string; namespace: string }[] };
  };
  status?: Record<string, unknown>;
}

// work.open-cluster-management.io/v1: what OCM's work agent applies in the managed cluster.
export interface ManifestWork extends KubeObject {
  apiVersion: 'work.open-cluster-management.io/v1';
  kind: 'ManifestWork';
  spec: { workload: { manifests: Record<string, unknown>[] }; deleteOption?: ManifestWorkDeleteOption };
  /** Written by the work agent: Applied, Available, Degraded, Progressing. */
  status?: { conditions?: Condition[]; resourceStatus?: Record<string, unknown> };
}

/** What the work agent leaves in the managed cluster when the work is deleted. */
export interface ManifestWorkDeleteOption {
  propagationPolicy: 'Foreground' | 'Orphan' | 'SelectivelyOrphan';
  selectivelyOrphans?: { orphaningRules?: { group: string; resource: string; name: string; namespace?: string }[] };
}

// cluster.open-cluster-management.io/v1beta1: the hub reads Placements' decisions, never writes them.
export interface Placement extends KubeObject {
  apiVersion: 'cluster.open-cluster-management.io/v1beta1';
  kind: 'Placement';
  spec: Record<string, unknown>;
  status?: { numberOfSelectedClusters?: number; conditions?: Condition[] };
}

/** Labelled `cluster.open-cluster-management.io/placement: <placement name>`, in the Placement's namespace. */
export interface PlacementDecision extends KubeObject {
  apiVersion: 'cluster.open-cluster-management.io/v1beta1';
  kind: 'PlacementDecision';
  status?: { decisions: { clusterName: string; reason: string }[] };
}

/** certificates.k8s.io/v1 CertificateSigningRequest conditions (not metav1.Condition). */
export interface CsrCondition {
  type: 'Approved' | 'Denied' | 'Failed';
  status: 'True' | 'False' | 'Unknown';
  reason?: string;
  message?: string;
  lastUpdateTime?: string;
  lastTransitionTime?: string;
}

// certificates.k8s.io/v1, cluster-scoped. Approval goes through the `approval` subresource, the signed
// certificate through `status` (Kubernetes keeps the two apart; so do the stores).
export interface CertificateSigningRequest extends KubeObject {
  apiVersion: 'certificates.k8s.io/v1';
  kind: 'CertificateSigningRequest';
  spec: {
    /** base64 of the PEM CERTIFICATE REQUEST. */
    request: string;
    signerName: string;
    usages?: string[];
    expirationSeconds?: number;
    /** Set by the apiserver from the requester's identity. */
    username?: string;
    groups?: string[];
  };
  status?: { conditions?: CsrCondition[]; certificate?: string };
}

/** A kubeconfig `cluster` (clientcmd v1 field names), as an access provider hands it out. */
export interface KubeconfigCluster {
  server: string;
  'certificate-authority-data'?: string;
  'tls-server-name'?: string;
  'proxy-url'?: string;
  extensions?: { name: string; extension: Record<string, unknown> }[];
}

// multicluster.x-k8s.io/v1alpha1 (SIG-Multicluster's Cluster Inventory API), namespaced: how consumers find
// a cluster and how to reach it. A cluster manager (OCM) creates them; access providers fill in
// status.accessProviders.
export interface ClusterProfile extends KubeObject {
  apiVersion: 'multicluster.x-k8s.io/v1alpha1';
  kind: 'ClusterProfile';
  spec: { clusterManager: { name: string }; displayName?: string };
  status?: {
    accessProviders?: { name: string; cluster?: KubeconfigCluster }[];
    conditions?: Condition[];
    [field: string]: unknown;
  };
}

export type HubObject =
  | ManagedCluster
  | ManagedClusterAddOn
  | ManagedProxyConfiguration
  | AddOnDeploymentConfig
  | Lease
  | Secret
  | ClusterManagementAddOn
  | ManifestWork
  | Placement
  | PlacementDecision
  | CertificateSigningRequest
  | ClusterProfile;

/** The kinds a store holds, keyed by `kind`, with what the Kubernetes API needs to address them. */
export interface KindInfo {
  apiVersion: HubObject['apiVersion'];
  group: string;
  version: string;
  /** Plural resource name in API paths. */
  plural: string;
  namespaced: boolean;
  /** Whether the kind has a status subresource (updateStatus writes only `.status`). */
  hasStatus: boolean;
}

export const KINDS = {
  ManagedCluster: {
    apiVersion: 'cluster.open-cluster-management.io/v1',
    group: 'cluster.open-cluster-management.io',
    version: 'v1',
    plural: 'managedclusters',
    namespaced: false,
    hasStatus: true,
  },
  ManagedClusterAddOn: {
    apiVersion: 'addon.open-cluster-management.io/v1alpha1',
    group: 'addon.open-cluster-management.io',
    version: 'v1alpha1',
    plural: 'managedclusteraddons',
    namespaced: true,
    hasStatus: true,
  },
  ManagedProxyConfiguration: {
    apiVersion: 'proxy.open-cluster-management.io/v1alpha1',
    group: 'proxy.open-cluster-management.io',
    version: 'v1alpha1',
    plural: 'managedproxyconfigurations',
    namespaced: false,
    hasStatus: true,
  },
  AddOnDeploymentConfig: {
    apiVersion: 'addon.open-cluster-management.io/v1alpha1',
    group: 'addon.open-cluster-management.io',
    version: 'v1alpha1',
    plural: 'addondeploymentconfigs',
    namespaced: true,
    hasStatus: false,
  },
  Lease: {
    apiVersion: 'coordination.k8s.io/v1',
    group: 'coordination.k8s.io',
    version: 'v1',
    plural: 'leases',
    namespaced: true,
    hasStatus: false,
  },
  /** Core group: API path /api/v1/... */
  Secret: { apiVersion: 'v1', group: '', version: 'v1', plural: 'secrets', namespaced: true, hasStatus: false },
  ClusterManagementAddOn: {
    apiVersion: 'addon.open-cluster-management.io/v1alpha1',
    group: 'addon.open-cluster-management.io',
    version: 'v1alpha1',
    plural: 'clustermanagementaddons',
    namespaced: false,
    hasStatus: true,
  },
  ManifestWork: {
    apiVersion: 'work.open-cluster-management.io/v1',
    group: 'work.open-cluster-management.io',
    version: 'v1',
    plural: 'manifestworks',
    namespaced: true,
    hasStatus: true,
  },
  Placement: {
    apiVersion: 'cluster.open-cluster-management.io/v1beta1',
    group: 'cluster.open-cluster-management.io',
    version: 'v1beta1',
    plural: 'placements',
    namespaced: true,
    hasStatus: true,
  },
  PlacementDecision: {
    apiVersion: 'cluster.open-cluster-management.io/v1beta1',
    group: 'cluster.open-cluster-management.io',
    version: 'v1beta1',
    plural: 'placementdecisions',
    namespaced: true,
    hasStatus: true,
  },
  CertificateSigningRequest: {
    apiVersion: 'certificates.k8s.io/v1',
    group: 'certificates.k8s.io',
    version: 'v1',
    plural: 'certificatesigningrequests',
    namespaced: false,
    hasStatus: true,
  },
  ClusterProfile: {
    apiVersion: 'multicluster.x-k8s.io/v1alpha1',
    group: 'multicluster.x-k8s.io',
    version: 'v1alpha1',
    plural: 'clusterprofiles',
    namespaced: true,
    hasStatus: true,
  },
} as const satisfies Record<HubObject['kind'], KindInfo>;

export type Kind = keyof typeof KINDS;

/**
 * Kinds Kubernetes keeps no `metadata.generation` for (built-in kinds whose strategy does not track one); every
 * custom resource has one. Both stores do the same, so the objects look alike.
 */
export const KINDS_WITHOUT_GENERATION: ReadonlySet<Kind> = new Set<Kind>(['Lease', 'Secret', 'CertificateSigningRequest']);
export type ObjectOfKind<K extends Kind> = Extract<HubObject, { kind: K }>;

/** Names the addon uses everywhere (OCM's). */
export const ADDON_NAME = 'cluster-proxy';
export const PROXY_CONFIGURATION_NAME = 'cluster-proxy';
