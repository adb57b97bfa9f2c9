// The OCM install mode's pure parts: registrations and the signer OU, the CSR review (every refusal and
// the approval, on real ECDSA requests as OCM's klusterlet makes them), signing, the rendered work, and
// the addon conditions read from the work's status.
import 'reflect-metadata';
import { createHash, webcrypto, X509Certificate } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import * as x509 from '@peculiar/x509';
import { createCA } from '../pki/certificates.js';
import type { CertificateSigningRequest, ManagedCluster, ManagedClusterAddOn, ManifestWork } from '../store/objects.js';
import { keepingDeploymentSelectors, releasingNamespaces, renderAgentWork, type AgentWorkInput } from './agent-work.js';
import { signCertificateRequest, CertificateRequestError, readCertificateRequest } from './csr-signer.js';
import { workConditions } from './installer.js';
import { addonRegistrations, reviewCsr, signerOrganizationalUnit } from './registrations.js';

const ca = createCA({ commonName: 'ocm-test-ca' });
const alg = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' };

async function request(name: string): Promise<string> {
  const keys = (await webcrypto.subtle.generateKey(alg, true, ['sign', 'verify'])) as webcrypto.CryptoKeyPair;
  const csr = await x509.Pkcs10CertificateRequestGenerator.create({ name, keys: keys as never, signingAlgorithm: alg });
  return csr.toString('pem');
}

function subjectOf(cluster: string, signer = ca.certPem): string {
  const reg = addonRegistrations(cluster, signer)[0]!;
  return `${reg.subject.groups!.map((g) => `O=${g}`).join(', ')}, OU=${reg.subject.organizationUnit![0]}, CN=${reg.subject.user}`;
}

const cluster = (name: string, accepted = true): ManagedCluster => ({
  apiVersion: 'cluster.open-cluster-management.io/v1',
  kind: 'ManagedCluster',
  metadata: { name },
  spec: { hubAcceptsClient: accepted },
});

async function csr(
  opts: {
    cluster?: string;
    subject?: string;
    signerName?: string;
    username?: string;
    groups?: string[];
    usages?: string[];
    addon?: string;
    request?: string;
    csrUser?: string;
  } = {},
): Promise<CertificateSigningRequest> {
  const c = opts.cluster ?? 'c1';
  return {
    apiVersion: 'certificates.k8s.io/v1',
    kind: 'CertificateSigningRequest',
    metadata: {
      name: 'x',
      labels: { 'open-cluster-management.io/cluster-name': c, 'open-cluster-management.io/addon-name': opts.addon ?? 'cluster-proxy' },
      ...(opts.csrUser !== undefined ? { annotations: { 'open-cluster-management.io/csr-user': opts.csrUser } } : {}),
    },
    spec: {
      request: Buffer.from(opts.request ?? (await request(opts.subject ?? subjectOf(c)))).toString('base64'),
      signerName: opts.signerName ?? 'open-cluster-management.io/proxy-agent-signer',
      usages: opts.usages ?? ['digital signature', 'key encipherment', 'client auth'],
      username: opts.username ?? `system:open-cluster-management:${c}:agent-x`,
      ...(opts.groups ? { groups: opts.groups } : {}),
    },
  };
}

describe('registrations', () => {
  it('OU is OCM cluster-proxy\'s: "signer-" + hex of base64(sha256(CA PEM)); it changes with the CA', () => {
    const want = `signer-${Buffer.from(createHash('sha256').update(ca.certPem).digest('base64')).toString('hex')}`;
    expect(signerOrganizationalUnit(ca.certPem)).toBe(want);
    expect(signerOrganizationalUnit(createCA().certPem)).not.toBe(want);
  });

  it("one registration: the cluster-bound tunnel identity with OCM cluster-proxy's group (no hub kubeconfig nobody uses)", () => {
    const regs = addonRegistrations('c1', ca.certPem);
    expect(regs.map((r) => r.signerName)).toEqual(['open-cluster-management.io/proxy-agent-signer']);
    expect(regs[0]!.subject).toEqual({
      user: 'system:open-cluster-management:cluster:c1:addon:cluster-proxy:agent:proxy-agent',
      groups: ['system:open-cluster-management:cluster:c1:addon:cluster-proxy', 'open-cluster-management:cluster-proxy'],
      organizationUnit: [signerOrganizationalUnit(ca.certPem)],
    });
  });
});

describe('CSR review', () => {
  const ctx = { cluster: cluster('c1'), addonEnabled: true, signingCaPem: ca.certPem };

  it("approves the registration's own request and says to sign it", async () => {
    expect(await reviewCsr(await csr(), ctx)).toEqual({ decision: 'approve', cluster: 'c1', sign: true });
  });

  // OCM's gRPC registration driver creates the CSR as its service account and names the agent in an
  // annotation (addon-framework pkg/utils/csr_helpers.go DefaultCSRApprover).
  it("with OCM's gRPC registration driver, judges the requester named in open-cluster-management.io/csr-user", async () => {
    const grpc = 'system:serviceaccount:open-cluster-management-hub:grpc-server-sa';
    expect(await reviewCsr(await csr({ username: grpc, csrUser: 'system:open-cluster-management:c1:agent-x' }), ctx)).toMatchObject({
      decision: 'approve',
    });
    expect(await reviewCsr(await csr({ username: grpc, csrUser: 'system:open-cluster-management:c2:agent-x' }), ctx)).toMatchObject({
      decision: 'pending',
      reason: 'RequesterMismatch',
    });
    expect(await reviewCsr(await csr({ username: grpc }), ctx)).toMatchObject({ decision: 'pending', reason: 'RequesterMismatch' });
    // The annotation counts only when the gRPC driver made the CSR: anyone else could set it.
    expect(
      await reviewCsr(
        await csr({ username: 'system:open-cluster-management:c2:agent', csrUser: 'system:open-cluster-management:c1:agent-x' }),
        ctx,
      ),
    ).toMatchObject({ decision: 'pending', reason: 'RequesterMismatch' });
  });

  // OCM's AWS IRSA driver: the klusterlet reaches the hub as the EKS access entry OCM made for its IAM role,
  // user "<cluster>" in group "open-cluster-management:<cluster>" (ocm pkg/registration/register/aws_irsa/hub_driver.go).
  it("with OCM's AWS IRSA registration driver, judges the access entry's user and group", async () => {
    expect(
      await reviewCsr(await csr({ username: 'c1', groups: ['open-cluster-management:c1', 'system:authenticated'] }), ctx),
    ).toMatchObject({ decision: 'approve' });
    // Another cluster's role, or a user merely named like the cluster without the cluster's group, is not c1's klusterlet.
    expect(await reviewCsr(await csr({ username: 'c2', groups: ['open-cluster-management:c2'] }), ctx)).toMatchObject({
      decision: 'pending',
      reason: 'RequesterMismatch',
    });
    expect(await reviewCsr(await csr({ username: 'c1', groups: ['system:authenticated'] }), ctx)).toMatchObject({
      decision: 'pending',
      reason: 'RequesterMismatch',
    });
    expect(await reviewCsr(await csr({ username: 'c1', groups: ['open-cluster-management:c2'] }), ctx)).toMatchObject({
      decision: 'pending',
      reason: 'RequesterMismatch',
    });
  });

  it("leaves other addons' CSRs alone", async () => {
    expect(await reviewCsr(await csr({ addon: 'other' }), ctx)).toEqual({ decision: 'ignore' });
  });

  it.each([
    ["another cluster's identity", { subject: subjectOf('c2') }, {}, 'SubjectMismatch'],
    ["an old signer's OU", { subject: subjectOf('c1', createCA().certPem) }, {}, 'SubjectMismatch'],
    ['another signer', { signerName: 'example.com/x' }, {}, 'UnknownSigner'],
    ['the hub kubeconfig signer (no such registration)', { signerName: 'kubernetes.io/kube-apiserver-client' }, {}, 'UnknownSigner'],
    ['another klusterlet', { username: 'system:open-cluster-management:c2:agent' }, {}, 'RequesterMismatch'],
    ['no requester at all', { username: '' }, {}, 'RequesterMismatch'],
    ['a cluster that is gone', {}, { cluster: null }, 'ClusterNotFound'],
    ['a cluster not accepted', {}, { cluster: cluster('c1', false) }, 'ClusterNotAccepted'],
    ['the addon not enabled', {}, { addonEnabled: false }, 'AddonNotEnabled'],
    ['a usage not allowed', { usages: ['client auth', 'code signing'] }, {}, 'BadUsages'],
    ['garbage', { request: 'not a request' }, {}, 'BadRequest'],
  ] as const)('leaves pending (never denies, as OCM) %s', async (_what, c, over, reason) => {
    const r = await reviewCsr(await csr(c), { ...ctx, ...over });
    expect(r).toMatchObject({ decision: 'pending', reason });
    expect((r as { message: string }).message).not.toContain('\n');
  });
});

describe('signing', () => {
  it("issues for the request's key and subject, server+client auth, within notAfter, verifiable with the CA", async () => {
    const pem = await request(subjectOf('c1'));
    const notAfter = new Date(Date.now() + 3 * 86_400_000);
    const cert = new X509Certificate(await signCertificateRequest(ca, pem, notAfter));
    const caCert = new X509Certificate(ca.certPem);
    expect(cert.checkIssued(caCert)).toBe(true);
    expect(cert.verify(caCert.publicKey)).toBe(true);
    expect(cert.subject).toContain('CN=system:open-cluster-management:cluster:c1:addon:cluster-proxy:agent:proxy-agent');
    expect(Math.abs(Date.parse(cert.validTo) - notAfter.getTime())).toBeLessThan(1000);
    expect(cert.keyUsage).toEqual(expect.arrayContaining(['1.3.6.1.5.5.7.3.1', '1.3.6.1.5.5.7.3.2']));
    expect(cert.ca).toBe(false);
  });

  it('a tampered request is refused', async () => {
    const pem = await request(subjectOf('c1'));
    const der = Buffer.from(pem.replace(/-----[^-]+-----|\s/g, ''), 'base64');
    der[der.length - 5] ^= 0xff; // inside the signature
    const bad = `-----BEGIN CERTIFICATE REQUEST-----\n${der.toString('base64')}\n-----END CERTIFICATE REQUEST-----\n`;
    await expect(readCertificateRequest(bad)).rejects.toBeInstanceOf(CertificateRequestError);
  });
});

describe('agent work', () => {
  const addon: ManagedClusterAddOn = {
    apiVersion: 'addon.open-cluster-management.io/v1alpha1',
    kind: 'ManagedClusterAddOn',
    metadata: { name: 'cluster-proxy', namespace: 'c1', uid: 'u-1' },
    spec: {},
  };
  const base: AgentWorkInput = {
    addon,
    cluster: cluster('c1'),
    mpc: null,
    adc: null,
    caBundle: ca.certPem,
    agentEntrypoint: 'hub.example.com:8091',
    defaultInstallNamespace: 'agents',
  };
  const dep = (w: ManifestWork) =>
    w.spec.workload.manifests.find((m) => m['kind'] === 'Deployment') as unknown as {
      metadata: { annotations: Record<string, string> };
      spec: {
        template: {
          metadata: { annotations: Record<string, string> };
          spec: { containers: { image: string; args: string[]; resources: unknown }[] };
        };
      };
    };

  it("is deterministic, owned by the addon, with OCM's names and no bootstrap token", () => {
    const w = renderAgentWork(base);
    expect(renderAgentWork(base)).toEqual(w);
    expect(w.metadata).toMatchObject({
      name: 'addon-cluster-proxy-deploy-0',
      namespace: 'c1',
      ownerReferences: [{ kind: 'ManagedClusterAddOn', uid: 'u-1', controller: true }],
    });
    const names = w.spec.workload.manifests.map((m) => `${String(m['kind'])}/${(m['metadata'] as { name: string }).name}`);
    expect(names).toEqual([
      'Namespace/agents',
      'ServiceAccount/cluster-proxy',
      'Role/cluster-proxy',
      'RoleBinding/cluster-proxy',
      'Secret/cluster-proxy-ca',
      'Deployment/cluster-proxy-proxy-agent',
      'Service/c1',
    ]);
    expect(JSON.stringify(w)).not.toMatch(/bootstrap|secrets/);
    expect(dep(w).spec.template.spec.containers[0]!.args).toContain('--hub=hub.example.com:8091');
  });

  // addon-framework agentdeploy/utils.go BuildDeployWorks + getDeletionOrphaningRule: an object annotated
  // deletion-orphan becomes an orphaning rule; without it OCM's work agent deletes the namespace with the work.
  it('orphans the install namespace on delete (SelectivelyOrphan), as addon-framework turns deletion-orphan into a rule', () => {
    expect(renderAgentWork(base).spec.deleteOption).toEqual({
      propagationPolicy: 'SelectivelyOrphan',
      selectivelyOrphans: { orphaningRules: [{ group: '', resource: 'namespaces', name: 'agents' }] },
    });
  });

  // addon-framework agentdeploy/utils.go configsToAnnotations, read by OCM's addonprogressing controller.
  it("carries the config-spec-hash annotation of the addon's resolved configs (Go's sorted-key JSON)", () => {
    expect(renderAgentWork(base).metadata.annotations).toBeUndefined();
    const refs = [
      {
        group: 'proxy.open-cluster-management.io',
        resource: 'managedproxyconfigurations',
        desiredConfig: { name: 'cluster-proxy', specHash: 'h1' },
      },
      {
        group: 'addon.open-cluster-management.io',
        resource: 'addondeploymentconfigs',
        desiredConfig: { name: 'd', namespace: 'c1', specHash: 'h2' },
      },
      { group: 'addon.open-cluster-management.io', resource: 'addondeploymentconfigs' },
    ];
    const w = renderAgentWork({ ...base, addon: { ...addon, status: { configReferences: refs } } });
    expect(w.metadata.annotations?.['open-cluster-management.io/config-spec-hash']).toBe(
      '{"addondeploymentconfigs.addon.open-cluster-management.io/c1/d":"h2","managedproxyconfigurations.proxy.open-cluster-management.io//cluster-proxy":"h1"}',
    );
  });

  // A Deployment's selector is immutable (apps/v1): the work agent cannot update one in place to another.
  it("an upgrade that keeps the install namespace keeps the selector the old work's Deployment has, and rolls in place", () => {
    const depOf = (w: ManifestWork) =>
      w.spec.workload.manifests.find((m) => m['kind'] === 'Deployment') as unknown as {
        metadata: { namespace: string };
        spec: {
          selector: { matchLabels: Record<string, string> };
          template: { metadata: { labels: Record<string, string>; annotations?: Record<string, string> } };
        };
      };
    const desired = renderAgentWork(base);
    expect(keepingDeploymentSelectors(desired, null)).toBe(desired);
    expect(keepingDeploymentSelectors(desired, desired)).toBe(desired);
    // What an earlier layout of ours wrote: the same Deployment, selected by app.kubernetes.io/name only.
    const legacySelector = { matchLabels: { 'app.kubernetes.io/name': 'cluster-proxy-agent' } };
    const old = renderAgentWork({ ...base, gateway: true });
    const oldDep = depOf(old);
    const legacy: ManifestWork = {
      ...old,
      spec: {
        workload: {
          manifests: old.spec.workload.manifests.map((m) =>
            m === (oldDep as unknown) ? { ...m, spec: { ...oldDep.spec, selector: legacySelector } } : m,
          ),
        },
      },
    };
    const next = keepingDeploymentSelectors(desired, legacy);
    expect(depOf(next).spec.selector).toEqual(legacySelector);
    // The pods still carry OCM's labels (its tools select by them) and the old selector's.
    expect(depOf(next).spec.template.metadata.labels).toMatchObject({
      ...legacySelector.matchLabels,
      'open-cluster-management.io/addon': 'cluster-proxy',
      'proxy.open-cluster-management.io/component-name': 'proxy-agent',
    });
    // Everything else is the new rendering (the pod template rolls).
    expect(depOf(next).spec.template.metadata.annotations).toEqual(depOf(desired).spec.template.metadata.annotations);
    // A namespace move is a new Deployment: OCM's selector.
    const moved = renderAgentWork({ ...base, defaultInstallNamespace: 'elsewhere' });
    expect(depOf(keepingDeploymentSelectors(moved, legacy)).spec.selector).toEqual(depOf(moved).spec.selector);
  });

  // OCM's work agent owns or orphans an object when it applies it (pkg/work/spoke/controllers/manifestcontroller/
  // manifestwork_reconciler.go manageOwnerRef) and deletes an owned object that leaves the work.
  it('a namespace the old work holds is released (kept, orphaned) before it is dropped, once the work agent applied that', () => {
    const nsNames = (w: ManifestWork) =>
      w.spec.workload.manifests.filter((m) => m['kind'] === 'Namespace').map((m) => (m['metadata'] as { name: string }).name);
    const desired = renderAgentWork(base);
    expect(releasingNamespaces(desired, null)).toBe(desired);
    // A work our earlier version wrote: the shared namespace, no deleteOption (so the work agent owns it).
    const old = renderAgentWork({ ...base, defaultInstallNamespace: 'open-cluster-management-agent-addon' });
    const legacy: ManifestWork = { ...old, metadata: { ...old.metadata, generation: 3 }, spec: { workload: old.spec.workload } };
    const step1 = releasingNamespaces(desired, legacy);
    expect(nsNames(step1)).toEqual(['open-cluster-management-agent-addon', 'agents']);
    expect(step1.spec.deleteOption?.selectivelyOrphans?.orphaningRules?.map((r) => r.name)).toEqual([
      'agents',
      'open-cluster-management-agent-addon',
    ]);
    // Written, not yet applied by the work agent: still kept.
    const written: ManifestWork = { ...step1, metadata: { ...step1.metadata, generation: 4 } };
    expect(nsNames(releasingNamespaces(desired, written))).toEqual(['open-cluster-management-agent-addon', 'agents']);
    // Applied at its generation (the work agent took its owner reference off): now dropped.
    const applied: ManifestWork = {
      ...written,
      status: {
        conditions: [{ type: 'Applied', status: 'True', reason: 'r', message: '', lastTransitionTime: 't', observedGeneration: 4 }],
      },
    };
    expect(releasingNamespaces(desired, applied)).toBe(desired);
  });

  it('runs our image only, whatever image the MPC names (mirrors still apply)', () => {
    const mpcImage = {
      apiVersion: 'proxy.open-cluster-management.io/v1alpha1' as const,
      kind: 'ManagedProxyConfiguration' as const,
      metadata: { name: 'cluster-proxy' },
      spec: {
        proxyServer: { image: 'quay.io/open-cluster-management/cluster-proxy:v0.7' },
        proxyAgent: { image: 'quay.io/open-cluster-management/cluster-proxy:v0.7' },
      },
    };
    const d = dep(renderAgentWork({ ...base, image: 'quay.io/ours/cp:1', mpc: mpcImage }));
    expect(d.spec.template.spec.containers[0]!.image).toBe('quay.io/ours/cp:1');
  });

  it.each(['PortForward', 'LoadBalancerService'] as const)(
    'refuses the %s entrypoint with an error naming the field (no work rendered)',
    (type) => {
      const mpc = {
        apiVersion: 'proxy.open-cluster-management.io/v1alpha1' as const,
        kind: 'ManagedProxyConfiguration' as const,
        metadata: { name: 'cluster-proxy' },
        spec: { proxyServer: { image: 'x', entrypoint: { type } }, proxyAgent: { image: 'x' } },
      };
      expect(() => renderAgentWork({ ...base, mpc })).toThrow(new RegExp(`entrypoint.type: "${type}" is not supported`));
    },
  );

  it('takes the MPC Hostname entrypoint and generation; ADC namespace, mirrors and resources', () => {
    const w = renderAgentWork({
      ...base,
      image: 'quay.io/org/cp:1',
      mpc: {
        apiVersion: 'proxy.open-cluster-management.io/v1alpha1',
        kind: 'ManagedProxyConfiguration',
        metadata: { name: 'cluster-proxy', generation: 7 },
        spec: {
          proxyServer: { entrypoint: { type: 'Hostname', hostname: { value: 'proxy.hub.example.com' }, port: 443 } },
          proxyAgent: { image: 'quay.io/org/cp:1' },
        },
      },
      adc: {
        apiVersion: 'addon.open-cluster-management.io/v1alpha1',
        kind: 'AddOnDeploymentConfig',
        metadata: { name: 'a', namespace: 'c1' },
        spec: {
          agentInstallNamespace: 'cp',
          registries: [{ source: 'quay.io/org', mirror: 'mirror.corp/org' }],
          resourceRequirements: [{ containerID: 'deployments:*:proxy-agent', resources: { limits: { memory: '300Mi' } } }],
        },
      },
    });
    const d = dep(w);
    expect(d.spec.template.spec.containers[0]!.args).toContain('--hub=proxy.hub.example.com:443');
    expect(d.spec.template.spec.containers[0]!.image).toBe('mirror.corp/org/cp:1');
    expect(d.spec.template.spec.containers[0]!.resources).toEqual({ limits: { memory: '300Mi' } });
    expect(d.metadata.annotations['proxy.open-cluster-management.io/configuration-generation']).toBe('7');
    expect(w.spec.workload.manifests[0]).toMatchObject({
      kind: 'Namespace',
      metadata: { name: 'cp', annotations: { 'addon.open-cluster-management.io/deletion-orphan': '' } },
    });
  });

  it('any change of what is rendered changes the pod template hash (so the agent rolls)', () => {
    const h = (w: ManifestWork) => dep(w).spec.template.metadata.annotations['proxy.open-cluster-management.io/config-hash'];
    const a = h(renderAgentWork(base));
    expect(h(renderAgentWork({ ...base, caBundle: ca.certPem + createCA().certPem }))).not.toBe(a);
    expect(h(renderAgentWork({ ...base, agentEntrypoint: 'other:8091' }))).not.toBe(a);
    expect(h(renderAgentWork({ ...base }))).toBe(a);
  });
});

describe("addon conditions from the work (addon-framework agentdeploy applyWork; Progressing is OCM's)", () => {
  const w = (conds: [string, string, number?, string?][], generation = 2): ManifestWork => ({
    apiVersion: 'work.open-cluster-management.io/v1',
    kind: 'ManifestWork',
    metadata: { name: 'w', namespace: 'c1', generation },
    spec: { workload: { manifests: [] } },
    status: {
      conditions: conds.map(([type, status, g, message]) => ({
        type,
        status: status as 'True',
        reason: 'r',
        message: message ?? '',
        lastTransitionTime: 't',
        ...(g !== undefined ? { observedGeneration: g } : {}),
      })),
    },
  });
  const pick = (c: ReturnType<typeof workConditions>) => c.map((x) => [x.type, x.status, x.reason]);

  it('Applied True: ManifestApplied True; never a Progressing condition', () => {
    expect(
      pick(
        workConditions(
          w([
            ['Applied', 'True', 2],
            ['Available', 'True', 2],
          ]),
        ),
      ),
    ).toEqual([['ManifestApplied', 'True', 'AddonManifestApplied']]);
    expect(pick(workConditions(w([['Applied', 'True', 1]])))).toEqual([['ManifestApplied', 'True', 'AddonManifestApplied']]);
  });
  it('no Applied condition yet (or no work): nothing said', () => {
    expect(workConditions(null)).toEqual([]);
    expect(workConditions(w([]))).toEqual([]);
  });
  it("Applied False: ManifestApplied False with addon-framework's reason", () => {
    expect(pick(workConditions(w([['Applied', 'False', 2, 'unsupported kind X']])))).toEqual([
      ['ManifestApplied', 'False', 'AddonManifestAppliedFailed'],
    ]);
  });
});
