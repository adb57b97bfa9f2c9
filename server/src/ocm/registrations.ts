// What the klusterlet may ask for on behalf of the addon agent (ManagedClusterAddOn.status.registrations)
// and the hub's review of the CSRs it then creates. One registration: the agent's tunnel certificate from
// our custom signer. Its subject is addon-framework's default form, bound to one cluster (the hub routes
// by it), plus OCM cluster-proxy's group as a second O (RBAC or tools keyed to that group keep matching)
// and OCM cluster-proxy's `signer-<hash>` OU, which changes with the signing CA so a CA rollover makes the
// klusterlet ask again. No kube-apiserver-client (hub kubeconfig) registration: our agent never talks to
// the hub's API server, so asking for one would claim permissions nobody uses.
//
// The review judges as OCM's approvers do (addon-framework pkg/addonmanager/controllers/certificate/
// csrapprove.go, pkg/utils/csr_helpers.go DefaultCSRApprover): a CSR is approved or left pending, never
// denied (a denied CSR leaves the klusterlet waiting on it for good); the requester is spec.username, or
// with OCM's gRPC registration driver the `open-cluster-management.io/csr-user` annotation.
import { createHash } from 'node:crypto';
import { ADDON_NAME, type AddonRegistration, type CertificateSigningRequest, type ManagedCluster } from '../store/objects.js';
import { agentSubject } from '../pki/agent-identity.js';
import { readCertificateRequest, CertificateRequestError } from './csr-signer.js';
import {
  ADDON_NAME_LABEL,
  CLUSTER_NAME_LABEL,
  CSR_USER_ANNOTATION,
  GRPC_REGISTRATION_SERVICE_ACCOUNT,
  OCM_CLUSTER_PROXY_GROUP,
  PROXY_AGENT_SIGNER,
} from './names.js';

/** The last CA and its OU: every addon's registrations name the same signer, hashed once rather than per addon. */
let lastSignerOu: { pem: string; ou: string } | null = null;

/** OCM cluster-proxy's OU: "signer-" + hex of the base64 of sha256(CA PEM). */
export function signerOrganizationalUnit(caCertPem: string): string {
  if (lastSignerOu?.pem === caCertPem) return lastSignerOu.ou;
  const b64 = createHash('sha256').update(caCertPem).digest('base64');
  lastSignerOu = { pem: caCertPem, ou: `signer-${Buffer.from(b64, 'utf8').toString('hex')}` };
  return lastSignerOu.ou;
}

export function addonRegistrations(cluster: string, signingCaPem: string): AddonRegistration[] {
  const tunnel = agentSubject(cluster);
  return [
    {
      signerName: PROXY_AGENT_SIGNER,
      subject: {
        user: tunnel.commonName,
        groups: [tunnel.organization, OCM_CLUSTER_PROXY_GROUP],
        organizationUnit: [signerOrganizationalUnit(signingCaPem)],
      },
    },
  ];
}

export type CsrReview =
  | { decision: 'ignore' }
  | { decision: 'approve'; cluster: string; sign: boolean }
  /** Not approvable (now): left pending, as OCM leaves it; `reason` is for the log only. */
  | { decision: 'pending'; cluster: string; reason: string; message: string };

export interface CsrReviewContext {
  cluster: ManagedCluster | null;
  /** Whether the cluster has the ManagedClusterAddOn `cluster-proxy`. */
  addonEnabled: boolean;
  signingCaPem: string;
}

const sameSet = (a: readonly string[], b: readonly string[]): boolean =>
  a.length === b.length && [...a].sort().join('\n') === [...b].sort().join('\n');
const TUNNEL_USAGES = new Set(['digital signature', 'key encipherment', 'client auth', 'server auth']);

/** Who asked for the CSR: the API server's spec.username, or the agent the gRPC registration driver names. */
export function csrRequester(csr: CertificateSigningRequest): string {
  const username = csr.spec.username ?? '';
  return username === GRPC_REGISTRATION_SERVICE_ACCOUNT ? (csr.metadata.annotations?.[CSR_USER_ANNOTATION] ?? '') : username;
}

/**
 * Whether the requester (spec.username, or the gRPC driver's annotation) and its groups are the klusterlet of
 * `cluster`, as each of OCM's registration drivers authenticates it on the hub:
 *   csr, grpc  "system:open-cluster-management:<cluster>:<agent>" (the identity of its bootstrap-issued
 *              certificate; addon-framework's DefaultCSRApprover takes this prefix);
 *   aws-irsa   the user "<cluster>" in group "open-cluster-management:<cluster>", the EKS access entry OCM's hub
 *              makes for the cluster's IAM role (ocm pkg/registration/register/aws_irsa/hub_driver.go).
 * OCM's cluster-proxy itself approves any CSR of an accepted cluster whoever asked; we bind it to the cluster
 * named, since the certificate is bound to that cluster (its subject names it).
 */
export function klusterletOf(cluster: string, requester: string, groups: readonly string[]): boolean {
  if (cluster === '') return false;
  if (requester.startsWith(`system:open-cluster-management:${cluster}:`)) return true;
  return requester === cluster && groups.includes(`open-cluster-management:${cluster}`);
}

/**
 * The hub's decision on one CSR. Only CSRs the klusterlet labelled for this addon are ours to judge;
 * every other CSR in the hub (kubelets', other addons') is left alone.
 */
export async function reviewCsr(csr: CertificateSigningRequest, ctx: CsrReviewContext): Promise<CsrReview> {
  const labels = csr.metadata.labels ?? {};
  if (labels[ADDON_NAME_LABEL] !== ADDON_NAME) return { decision: 'ignore' };
  const cluster = labels[CLUSTER_NAME_LABEL] ?? '';
  const pending = (reason: string, message: string): CsrReview => ({ decision: 'pending', cluster, reason, message });
  if (!ctx.cluster) return pending('ClusterNotFound', `managed cluster "${cluster}" does not exist`);
  if (!ctx.cluster.spec.hubAcceptsClient)
    return pending('ClusterNotAccepted', `managed cluster "${cluster}" is not accepted by the hub (hubAcceptsClient is false)`);
  if (!ctx.addonEnabled) return pending('AddonNotEnabled', `the cluster-proxy addon is not enabled for cluster "${cluster}"`);
  // The apiserver sets spec.username and spec.groups from who created the CSR: it must be that cluster's own
  // klusterlet, whichever registration driver it uses (klusterletOf). An empty one is nobody.
  const requester = csrRequester(csr);
  if (!klusterletOf(cluster, requester, csr.spec.groups ?? [])) {
    return pending('RequesterMismatch', `requested by ${JSON.stringify(requester)}, not by the klusterlet of cluster "${cluster}"`);
  }
  const registration = addonRegistrations(cluster, ctx.signingCaPem).find((r) => r.signerName === csr.spec.signerName);
  if (!registration) return pending('UnknownSigner', `the cluster-proxy addon has no registration for signer "${csr.spec.signerName}"`);
  let subject;
  try {
    subject = await readCertificateRequest(Buffer.from(csr.spec.request, 'base64').toString('utf8'));
  } catch (err) {
    if (err instanceof CertificateRequestError) return pending('BadRequest', err.message);
    throw err;
  }
  const want = registration.subject;
  if (subject.commonNames.length !== 1 || subject.commonNames[0] !== want.user) {
    return pending(
      'SubjectMismatch',
      `the request's common name ${JSON.stringify(subject.commonNames.join(','))} is not ${JSON.stringify(want.user)} (the registration of cluster "${cluster}")`,
    );
  }
  if (!sameSet(subject.organizations, want.groups ?? []))
    return pending(
      'SubjectMismatch',
      `the request's organizations [${subject.organizations.join(', ')}] are not [${(want.groups ?? []).join(', ')}]`,
    );
  if (!sameSet(subject.organizationalUnits, want.organizationUnit ?? [])) {
    return pending(
      'SubjectMismatch',
      "the request's organizational unit does not name the hub's current signing CA (the registration changed; the klusterlet asks again)",
    );
  }
  const bad = (csr.spec.usages ?? []).filter((u) => !TUNNEL_USAGES.has(u));
  if (bad.length > 0) return pending('BadUsages', `usages ${bad.join(', ')} are not allowed for ${PROXY_AGENT_SIGNER}`);
  return { decision: 'approve', cluster, sign: true };
}
