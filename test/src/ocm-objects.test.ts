// What the hub writes into an OCM hub in `--agent-install manifestwork` mode, against OCM's own CRD
// schemas (structure of open-cluster-management-io/api, pruning included) and Kubernetes' CSR schema:
// a field OCM's apiserver would drop or refuse fails here, not on a customer's hub.
import { describe, expect, it } from 'vitest';
import {
  createCA,
  mergeConditions,
  type CertificateSigningRequest,
  type ManagedCluster,
  type ManagedClusterAddOn,
} from '@cluster-proxy/server';
import { addonRegistrations, clusterManagementAddOn, renderAgentWork, workConditions } from '@cluster-proxy/server/ocm';
import { validateKubeObject } from './kube-schemas.js';

const ca = createCA({ commonName: 'schema-test-ca' });
const cluster: ManagedCluster = {
  apiVersion: 'cluster.open-cluster-management.io/v1',
  kind: 'ManagedCluster',
  metadata: { name: 'c1' },
  spec: { hubAcceptsClient: true },
};
const addon: ManagedClusterAddOn = {
  apiVersion: 'addon.open-cluster-management.io/v1alpha1',
  kind: 'ManagedClusterAddOn',
  metadata: { name: 'cluster-proxy', namespace: 'c1', uid: '5d1c0b8e-0000-4000-8000-000000000001' },
  spec: {},
};

describe('objects the OCM install mode writes', () => {
  it("the ManifestWork (with every ADC/MPC setting used) matches OCM's ManifestWork schema, and each manifest Kubernetes' own", () => {
    const work = renderAgentWork({
      addon,
      cluster,
      caBundle: ca.certPem,
      agentEntrypoint: 'hub.example.com:8091',
      defaultInstallNamespace: 'agents',
      mpc: {
        apiVersion: 'proxy.open-cluster-management.io/v1alpha1',
        kind: 'ManagedProxyConfiguration',
        metadata: { name: 'cluster-proxy', generation: 3 },
        spec: { proxyServer: {}, proxyAgent: { replicas: 2, imagePullSecrets: ['regcred'] } },
      },
      adc: {
        apiVersion: 'addon.open-cluster-management.io/v1alpha1',
        kind: 'AddOnDeploymentConfig',
        metadata: { name: 'a', namespace: 'c1' },
        spec: {
          proxyConfig: { httpsProxy: 'http://proxy:3128', noProxy: '.corp' },
          nodePlacement: { nodeSelector: { infra: 'true' }, tolerations: [{ key: 'infra', operator: 'Exists', effect: 'NoSchedule' }] },
        },
      },
    });
    validateKubeObject(work);
    for (const m of work.spec.workload.manifests) validateKubeObject(m as never);
  });

  it("the ClusterManagementAddOn matches OCM's schema", () => {
    validateKubeObject(clusterManagementAddOn());
    const placements = {
      ...clusterManagementAddOn(),
      spec: {
        ...clusterManagementAddOn().spec,
        installStrategy: { type: 'Placements' as const, placements: [{ name: 'p', namespace: 'default' }] },
      },
    };
    validateKubeObject(placements);
  });

  it("the ManagedClusterAddOn status (registrations and every condition) matches OCM's schema", () => {
    const specs = [
      ...workConditions(null),
      { type: 'RegistrationApplied', status: 'True' as const, reason: 'SetPermissionApplied', message: 'ok' },
    ];
    const { conditions } = mergeConditions(undefined, specs, new Date());
    const withStatus: ManagedClusterAddOn = {
      ...addon,
      status: { conditions, registrations: addonRegistrations('c1', ca.certPem), namespace: 'agents', healthCheck: { mode: 'Customized' } },
    };
    validateKubeObject(withStatus);
  });

  it("an approved and signed CSR matches Kubernetes' schema; a schema violation is caught", () => {
    const csr: CertificateSigningRequest = {
      apiVersion: 'certificates.k8s.io/v1',
      kind: 'CertificateSigningRequest',
      metadata: { name: 'addon-c1-cluster-proxy-x', labels: { 'open-cluster-management.io/cluster-name': 'c1' } },
      spec: {
        request: Buffer.from('req').toString('base64'),
        signerName: 'open-cluster-management.io/proxy-agent-signer',
        usages: ['client auth'],
      },
      status: {
        conditions: [
          { type: 'Approved', status: 'True', reason: 'ClusterProxyAddonApproved', message: 'm', lastUpdateTime: '2026-11-25T00:00:00Z' },
        ],
        certificate: Buffer.from('cert').toString('base64'),
      },
    };
    validateKubeObject(csr);
    expect(() => validateKubeObject({ ...clusterManagementAddOn(), spec: { installStrategy: { type: 'Sometimes' } } } as never)).toThrow(
      /not in/,
    );
  });
});
