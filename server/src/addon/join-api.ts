// The admin API's registration contract (`POST /v1/clusters`, `DELETE /v1/clusters/NAME`,
// `GET /v1/proxy-config/NAME` on the hub's loopback admin port), shared by the hub and `cluster-proxy
// join`/`delete`/`proxy-config render --cluster`.

export interface JoinRequest {
  cluster: string;
  /** Agent install namespace (default open-cluster-management-agent-addon). */
  installNamespace?: string;
  /** Bootstrap token lifetime (default 1 h). */
  tokenTtlSeconds?: number;
  /** HOST:PORT agents dial (default: the hub's --agent-entrypoint). */
  agentEntrypoint?: string;
  /** TLS name agents verify on the hub certificate, when it differs from the entrypoint host. */
  serverName?: string;
  image?: string;
  agentReplicas?: number;
  /** Cluster-specific NO_PROXY facts (contract §8). */
  podCidr?: string;
  serviceCidr?: string;
  clusterDomain?: string;
  apiserverIp?: string;
}

export interface JoinResponse {
  cluster: string;
  /** True when the cluster already existed (a new bootstrap token was issued for it). */
  existed: boolean;
  bootstrapToken: string;
  tokenExpiresAt: string;
  agentEntrypoint: string;
  serverName?: string;
  caBundle: string;
  installNamespace: string;
  /** Multi-document YAML: the agent's install manifests. */
  manifests: string;
}

/** `GET /v1/proxy-config/NAME`: what `proxy-config render --cluster NAME` renders from. */
export interface ClusterProxyConfigResponse {
  cluster: string;
  /** The install-wide settings: AddOnDeploymentConfig `cluster-proxy` `spec.proxyConfig` (empty when unset). */
  proxyConfig: { httpProxy?: string; httpsProxy?: string; noProxy?: string; caBundle?: string };
  /** The cluster's facts as its latest `join` recorded them (absent fields were not given). */
  facts: { podCidrs?: string[]; serviceCidrs?: string[]; clusterDomain?: string; apiserverIp?: string };
  /** HOST:PORT the cluster's agents dial (the hub, which NO_PROXY must not match). */
  agentEntrypoint: string;
}
