// What the klusterlet may ask for on behalf of the addon agent (ManagedClusterAddOn.status.registrations)
// and the hub's review of the CSRs it then creates. The tunnel certificate's subject is addon-framework's
// default form, bound to one cluster (the hub routes by it), plus OCM cluster-proxy's `signer-<hash>` OU,
// which changes with the signing CA so a CA rollover makes the klusterlet ask again.
import { createHash } from 'node:crypto';
import { ADDON_NAME, type AddonRegistration, type CertificateSigningRequest, type ManagedCluster } from '../store/objects.js';
import { agentGroup, agentSubject } from '../pki/agent-identity.js';
import { readCertificateRequest, CertificateRequestError } from './csr-signer.js';
import { ADDON_NAME_LABEL, CLUSTER_NAME_LABEL, KUBE_CLIENT_AGENT_NAME, KUBE_CLIENT_SIGNER, PROXY_AGENT_SIGNER } from './names.js';

/** OCM cluster-proxy's OU: "signer-" + hex of the base64 of sha256(CA PEM). */
export function signerOrganizationalUnit(caCertPem: string): string {
  const b64 = createHash('sha256').update(caCertPem).digest('base64');
  return `signer-${Buffer.from(b64, 'utf8').toString('hex')}`;
}

export function addonRegistrations(cluster: string, signingCaPem: string): AddonRegistration[] {
  const tunnel = agentSubject(cluster);
  return [
    { signerName: KUBE_CLIENT_SIGNER, subject: { user: `${agentGroup(cluster)}:agent:${KUBE_CLIENT_AGENT_NAME}`, groups: [agentGroup(cluster), `system:open-cluster-management:addon:${ADDON_NAME}`] } },
    { signerName: PROXY_AGENT_SIGNER, subject: { user: tunnel.commonName, groups: [tunnel.organization], organizationUnit: [signerOrganizationalUnit(signingCaPem)] } },
  ];
}

export type CsrReview =
  | { decision: 'ignore' }
  | { decision: 'approve'; cluster: string; sign: boolean }
  | { decision: 'deny'; cluster: string; reason: string; message: string };

export interface CsrReviewContext {
  cluster: ManagedCluster | null;
  /** Whether the cluster has the ManagedClusterAddOn `cluster-proxy`. */
  addonEnabled: boolean;
  signingCaPem: string;
}

const sameSet = (a: readonly string[], b: readonly string[]): boolean => a.length === b.length && [...a].sort().join('\n') === [...b].sort().join('\n');
const TUNNEL_USAGES = new Set(['digital signature', 'key encipherment', 'client auth', 'server auth']);

/**
 * The hub's decision on one CSR. Only CSRs the klusterlet labelled for this addon are ours to judge;
 * every other CSR in the hub (kubelets', other addons') is left alone.
 */
export async function reviewCsr(csr: CertificateSigningRequest, ctx: CsrReviewContext): Promise<CsrReview> {
  const labels = csr.metadata.labels ?? {};
  if (labels[ADDON_NAME_LABEL] !== ADDON_NAME) return { decision: 'ignore' };
  const cluster = labels[CLUSTER_NAME_LABEL] ?? '';
  const deny = (reason: string, message: string): CsrReview => ({ decision: 'deny', cluster, reason, message });
  if (!ctx.cluster) return deny('ClusterNotFound', `managed cluster "${cluster}" does not exist`);
  if (!ctx.cluster.spec.hubAcceptsClient) return deny('ClusterNotAccepted', `managed cluster "${cluster}" is not accepted by the hub (hubAcceptsClient is false)`);
  if (!ctx.addonEnabled) return deny('AddonNotEnabled', `the cluster-proxy addon is not enabled for cluster "${cluster}"`);
  // The apiserver sets spec.username from who created the CSR: it must be that cluster's own klusterlet.
  const requester = csr.spec.username ?? '';
  if (requester !== '' && !requester.startsWith(`system:open-cluster-management:${cluster}:`)) {
    return deny('RequesterMismatch', `requested by "${requester}", not by the klusterlet of cluster "${cluster}"`);
  }
  const registration = addonRegistrations(cluster, ctx.signingCaPem).find((r) => r.signerName === csr.spec.signerName);
  if (!registration) return deny('UnknownSigner', `the cluster-proxy addon has no registration for signer "${csr.spec.signerName}"`);
  let subject;
  try {
    subject = await readCertificateRequest(Buffer.from(csr.spec.request, 'base64').toString('utf8'));
  } catch (err) {
    if (err instanceof CertificateRequestError) return deny('BadRequest', err.message);
    throw err;
  }
  const want = registration.subject;
  if (subject.commonNames.length !== 1 || subject.commonNames[0] !== want.user) {
    return deny('SubjectMismatch', `the request's common name ${JSON.stringify(subject.commonNames.join(','))} is not ${JSON.stringify(want.user)} (the registration of cluster "${cluster}")`);
  }
  if (!sameSet(subject.organizations, want.groups ?? [])) return deny('SubjectMismatch', `the request's organizations [${subject.organizations.join(', ')}] are not [${(want.groups ?? []).join(', ')}]`);
  if (!sameSet(subject.organizationalUnits, want.organizationUnit ?? [])) {
    return deny('SubjectMismatch', 'the request\'s organizational unit does not name the hub\'s current signing CA (the registration changed; ask again)');
  }
  if (registration.signerName === PROXY_AGENT_SIGNER) {
    const bad = (csr.spec.usages ?? []).filter((u) => !TUNNEL_USAGES.has(u));
    if (bad.length > 0) return deny('BadUsages', `usages ${bad.join(', ')} are not allowed for ${PROXY_AGENT_SIGNER}`);
  }
  // kube-apiserver-client certificates are signed by the hub's kube-controller-manager; we only approve.
  return { decision: 'approve', cluster, sign: registration.signerName === PROXY_AGENT_SIGNER };
}
