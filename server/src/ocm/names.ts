// The names OCM's tooling (clusteradm, MCE, the Go hub components, OCM's own agents) relies on for the
// `cluster-proxy` addon when the hub installs agents through ManifestWorks (`--agent-install manifestwork`).

/** The custom signer of the agent's tunnel certificate (the klusterlet asks, the hub signs). */
export const PROXY_AGENT_SIGNER = 'open-cluster-management.io/proxy-agent-signer';
/** addon-framework's name for the addon's (only) deploy work. */
export const AGENT_WORK_NAME = 'addon-cluster-proxy-deploy-0';
/** Labels the klusterlet puts on an addon's CSRs (and addon-framework on its works). */
export const CLUSTER_NAME_LABEL = 'open-cluster-management.io/cluster-name';
export const ADDON_NAME_LABEL = 'open-cluster-management.io/addon-name';
export const LIFECYCLE_ANNOTATION = 'addon.open-cluster-management.io/lifecycle';
/** On the agent Deployment: the ManagedProxyConfiguration generation rendered (OCM's e2e reads it). */
export const CONFIGURATION_GENERATION_ANNOTATION = 'proxy.open-cluster-management.io/configuration-generation';
/** On the agent pod template: a hash of everything rendered, so any change rolls the agent. */
export const CONFIG_HASH_ANNOTATION = 'proxy.open-cluster-management.io/config-hash';
/** Hub-side Secrets existing clients read from the ManagedProxyConfiguration's proxyServer.namespace. */
export const PROXY_SERVER_CA_SECRET = 'proxy-server-ca';
export const PROXY_CLIENT_SECRET = 'proxy-client';
/** Subject of the `proxy-client` certificate (OCM's user for hub components). */
export const PROXY_CLIENT_COMMON_NAME = 'open-cluster-management:cluster-proxy:proxy-client';
export const PROXY_CLIENT_GROUP = 'open-cluster-management:cluster-proxy';
/**
 * On the work: the resolved configs' spec hashes, `{"<resource>.<group>/<ns>/<name>": hash}`, from the
 * addon's status.configReferences (addon-framework agentdeploy/utils.go configsToAnnotations); OCM's
 * addonprogressing controller compares it with the addon's to decide rollout.
 */
export const CONFIG_SPEC_HASH_ANNOTATION = 'open-cluster-management.io/config-spec-hash';
/** On an object in the work: leave it in the managed cluster when the work is deleted (addon-framework). */
export const DELETION_ORPHAN_ANNOTATION = 'addon.open-cluster-management.io/deletion-orphan';
/**
 * OCM's gRPC registration driver creates CSRs as its own service account and names the requesting agent
 * in this annotation (addon-framework pkg/utils/csr_helpers.go).
 */
export const CSR_USER_ANNOTATION = 'open-cluster-management.io/csr-user';
export const GRPC_REGISTRATION_SERVICE_ACCOUNT = 'system:serviceaccount:open-cluster-management-hub:grpc-server-sa';
/** OCM cluster-proxy's group for its agents (pkg/common/constants.go): an extra O on our agent certificates. */
export const OCM_CLUSTER_PROXY_GROUP = 'open-cluster-management:cluster-proxy';
/** Agent certificates the hub signs: 180 days, capped at the CA's own expiry (as OCM does). */
export const AGENT_CERT_DAYS = 180;
