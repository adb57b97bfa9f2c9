/** Public API of the PKI module: certificate issuing, agent identity, and PEM files on disk. */
export {
  createCA,
  issueServerCert,
  issueClientCert,
  issueAgentCert,
  signAgentPublicKey,
  clusterUidFromAltNames,
  CLUSTER_UID_URI_PREFIX,
  DEFAULT_CA_COMMON_NAME,
  DEFAULT_CA_VALIDITY_DAYS,
  DEFAULT_LEAF_VALIDITY_DAYS,
} from './certificates.js';
export type {
  PemPair,
  ValidityOptions,
  CAOptions,
  ServerCertOptions,
  ClientCertOptions,
  AgentCertOptions,
  AgentKeyCertOptions,
} from './certificates.js';
export {
  AGENT_ADDON_NAME,
  DEFAULT_AGENT_NAME,
  agentGroup,
  agentSubject,
  clusterFromSubject,
  isAgentSubject,
  isDns1123Subdomain,
} from './agent-identity.js';
export type { AgentIdentity, SubjectLike } from './agent-identity.js';
export {
  writePemPair,
  readPemPair,
  ensureHubPki,
  pemPairPaths,
  HUB_SERVER_COMMON_NAME,
  HUB_CLIENT_COMMON_NAME,
  HUB_CLIENT_ORGANIZATION,
} from './files.js';
export type { HubPkiPaths, HubPkiOptions } from './files.js';
export { renewServingCertIfDue, rotateCa, renewalDue, splitBundle, type RotationStage } from './rotation.js';
export { TlsReloader, type TlsMaterial, type TlsReloaderOptions } from './reload.js';
