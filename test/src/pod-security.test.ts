// The agent pod, as `join` and the OCM ManifestWork render it, against Kubernetes' `restricted` Pod Security
// Standard and OpenShift's `restricted-v2` SCC (pod-security.ts), plus a check that the rules do refuse
// what they must (a fixed UID outside the namespace's range is what restricted-v2 refused before).
import { describe, expect, it } from 'vitest';
import { createCA, renderAgentInstall, type KubeManifest, type ManifestWork } from '@cluster-proxy/server';
import { renderAgentWork } from '@cluster-proxy/server/ocm';
import { restrictedProblems, restrictedV2Problems, type PodSpecLike } from './pod-security.js';

const ca = createCA({ commonName: 'hub-ca' }).certPem;
const podOf = (objs: readonly KubeManifest[] | Record<string, unknown>[]): PodSpecLike =>
  ((objs as KubeManifest[]).find((o) => o.kind === 'Deployment') as unknown as { spec: { template: { spec: PodSpecLike } } }).spec.template
    .spec;

const joinPod = podOf(
  renderAgentInstall({
    cluster: 'c1',
    installNamespace: 'agents',
    agentEntrypoint: 'hub.example.com:8091',
    caBundle: ca,
    bootstrapToken: 'abcdef.0123456789abcdef',
    agentReplicas: 1,
  }),
);
const work: ManifestWork = renderAgentWork({
  addon: {
    apiVersion: 'addon.open-cluster-management.io/v1alpha1',
    kind: 'ManagedClusterAddOn',
    metadata: { name: 'cluster-proxy', namespace: 'c1', uid: 'u' },
    spec: {},
  },
  cluster: {
    apiVersion: 'cluster.open-cluster-management.io/v1',
    kind: 'ManagedCluster',
    metadata: { name: 'c1' },
    spec: { hubAcceptsClient: true },
  },
  mpc: null,
  adc: null,
  caBundle: ca,
  agentEntrypoint: 'hub.example.com:8091',
  defaultInstallNamespace: 'open-cluster-management-cluster-proxy',
});
const ocmPod = podOf(work.spec.workload.manifests);

describe('agent pod admission', () => {
  it.each([
    ['join', joinPod],
    ['OCM ManifestWork', ocmPod],
  ] as const)('the %s agent pod passes restricted and restricted-v2 with no fixed UID', (_what, pod) => {
    expect(restrictedProblems(pod)).toEqual([]);
    expect(restrictedV2Problems(pod)).toEqual([]);
    expect(pod.securityContext?.runAsUser).toBeUndefined();
    expect(pod.securityContext?.fsGroup).toBeUndefined();
  });

  it('the rules refuse what the admission controllers refuse', () => {
    const fixed: PodSpecLike = { ...ocmPod, securityContext: { ...ocmPod.securityContext, runAsUser: 65532, fsGroup: 65532 } };
    expect(restrictedProblems(fixed)).toEqual([]);
    expect(restrictedV2Problems(fixed)).toEqual([
      "pod runAsUser 65532 is not in the namespace's range 1000770000-1000779999",
      "pod fsGroup 65532 is not in the namespace's range",
    ]);
    const c = ocmPod.containers[0]!;
    const loose: PodSpecLike = {
      ...ocmPod,
      securityContext: {},
      hostNetwork: true,
      volumes: [{ name: 'h', hostPath: { path: '/' } }],
      containers: [{ ...c, securityContext: { capabilities: { add: ['NET_ADMIN'] } } }],
    };
    expect(restrictedProblems(loose)).toEqual(
      expect.arrayContaining([
        'host namespaces',
        'volume h: type hostPath not allowed',
        `container ${c.name}: allowPrivilegeEscalation must be false`,
        `container ${c.name}: runAsNonRoot must be true`,
        `container ${c.name}: seccompProfile must be RuntimeDefault or Localhost`,
        `container ${c.name}: capabilities must drop ALL`,
        `container ${c.name}: capability NET_ADMIN added`,
      ]),
    );
    expect(restrictedV2Problems(loose)).toEqual(
      expect.arrayContaining([`container ${c.name}: readOnlyRootFilesystem must be true (ours)`]),
    );
  });
});
