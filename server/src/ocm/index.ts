// The OCM install mode (`--agent-install manifestwork`), for tests and tools. Not re-exported from the
// package root: it loads @peculiar/x509 and its reflect-metadata polyfill, which only this mode needs.
export * from './names.js';
export { OcmInstaller, workConditions, clusterManagementAddOn, type OcmInstallerOptions } from './installer.js';
export { renderAgentWork, installNamespaceOf, type AgentWorkInput } from './agent-work.js';
export { addonRegistrations, reviewCsr, signerOrganizationalUnit, type CsrReview } from './registrations.js';
export { readCertificateRequest, signCertificateRequest, CertificateRequestError } from './csr-signer.js';
export {
  ClusterProfileWriter,
  accessProviderOf,
  withAccessProvider,
  isOcmProfile,
  ACCESS_PROVIDER_NAME,
  CLUSTER_MANAGER_LABEL,
  OCM_CLUSTER_MANAGER,
  type ClusterProfileOptions,
} from './cluster-profiles.js';
export { configSpecHash, goJson } from './config-hashes.js';
