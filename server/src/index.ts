export { ProxyServer, type ProxyServerOptions, type BoundPorts, type TlsFiles } from './proxy-server.js';
export { ProxyCore } from './dataplane/proxy-core.js';
export { RoutingTable, isValidCidr, cidrContains } from './dataplane/routing.js';
export { checkIdentifiers, IdentityError, type Grant } from './dataplane/agent-listener.js';
export * from './pki/index.js';
export { avoidPeerCertificateLeak } from './http/peer-certificate-leak.js';
export {
  startConnectFrontend,
  DIAL_FAILURE_STATUS,
  type ConnectFrontend,
  type ConnectFrontendOptions,
  type Principal,
} from './connect/frontend.js';
export { TokenStore, tokenAllowsCluster, type TokenPrincipal, type TokenInfo, type IssuedToken } from './fleet/tokens.js';
export * from './egress/proxy-settings.js';
export * from './egress/proxy-config-render.js';
export { toYaml as toKubectlYaml, type YamlValue } from './kube-yaml.js';
export * from './store/index.js';
export {
  HubApi,
  HubApiError,
  HUB_API_ALPN,
  MAX_HUB_API_BODY_BYTES,
  type HubApiCaller,
  type HubApiRequest,
  type HubApiResponse,
  type HubApiHandler,
} from './fleet/hub-api.js';
export * from './addon/join-api.js';
export {
  ServerMetrics,
  grpcCodeName,
  packetTypeLabel,
  type ServerDialFailure,
  type ServerGaugeSource,
  type Segment,
} from './dataplane/metrics.js';
export {
  registerJoinRoutes,
  parseJoinRequest,
  DEFAULT_INSTALL_NAMESPACE,
  OCM_DEFAULT_INSTALL_NAMESPACE,
  CLUSTER_FACT_ANNOTATIONS,
  type JoinDeps,
  type ManifestInput,
} from './addon/join.js';
export {
  createBootstrapToken,
  revokeBootstrapTokens,
  consumeBootstrapToken,
  registerRegistrationRoutes,
  ClusterRegistry,
  bootstrapSecretName,
  BOOTSTRAP_TOKEN_TYPE,
  type RegistrationOptions,
} from './fleet/registration.js';
export { AddonManager, type AddonManagerOptions, type AddonWideInfo } from './addon/manager.js';
export {
  addonConditions,
  mergeConditions,
  LEASE_GRACE_FACTOR,
  type AgentReport,
  type ClusterHealthInput,
  type ConditionSpec,
} from './addon/conditions.js';
export {
  renderAgentInstall,
  toYaml,
  manifestsToYaml,
  ManifestInputError,
  AGENT_DEPLOYMENT_NAME,
  AGENT_SERVICE_ACCOUNT,
  AGENT_ROLE,
  AGENT_LEASE,
  AGENT_HEALTH_PORT,
  HUB_CA_SECRET,
  BOOTSTRAP_SECRET,
  CREDENTIALS_SECRET,
  DEFAULT_AGENT_IMAGE,
  type KubeManifest,
  type AgentInstallInput,
  type NodePlacement,
  type Toleration,
  type ResourceRequirements,
} from './addon/manifests.js';
export { Hub, HUB_NAMESPACE, type HubOptions } from './hub.js';
export { ReplicaRegistry, REPLICA_LEASE_PREFIX, REPLICA_LABEL, type ReplicaRegistryOptions } from './fleet/replicas.js';
export { startGateway, type Gateway, type GatewayOptions } from './gateway/server.js';
export {
  authenticate,
  certificateSource,
  hubTokenSource,
  oidcSource,
  tokenReviewSource,
  type AuthSource,
  type AuthOutcome,
  type AuthFailure,
  type GatewayCaller,
} from './gateway/auth.js';
export { buildGatewayAccess, type GatewayAccess, type GatewayAccessConfig } from './gateway/access.js';
export {
  AUTHORIZATION_MODES,
  PROXY_ACCESS,
  scopeAuthorizer,
  subjectAccessReviewAuthorizer,
  type AuthorizationMode,
  type Decision,
  type GatewayAuthorizer,
} from './gateway/authorization.js';
export {
  OIDC_SIGNING_ALGS,
  OidcVerifier,
  checkOidcConfig,
  peekJwt,
  usernamePrefixOf,
  type OidcConfig,
  type OidcIdentity,
  type OidcResult,
  type OidcRuntimeOptions,
} from './gateway/oidc.js';
export { TokenReviewer } from './gateway/token-review.js';
export { hubName, HUB_IDENTITY_PREFIX } from './gateway/hub-names.js';
export type {
  HubReviews,
  SubjectAccessReviewSpec,
  SubjectAccessReviewStatus,
  TokenReviewStatus,
  ReviewedUser,
} from './gateway/kube-reviews.js';
export { parseGatewayTarget, type GatewayTarget, type ServiceTarget } from './gateway/paths.js';
export { parseServiceAllowlist, allowedEntry, ServiceAllowlistError, type AllowedService } from './gateway/service-allowlist.js';
