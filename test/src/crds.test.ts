// The chart's CRDs against the hub's object model (server/src/store/objects.ts): OCM's group, version,
// kind, plural and scope as the Kubernetes store addresses them (KINDS), status subresources where the
// store writes status, structural schemas (what the apiserver requires of a v1 CRD), and objects of
// every kind with every field we use set survive the apiserver's pruning and validation unchanged. A
// field missing from a schema would be silently dropped by a real apiserver: that is what this guards.
import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import {
  KINDS,
  type AddOnDeploymentConfig,
  type ManagedCluster,
  type ManagedClusterAddOn,
  type ManagedProxyConfiguration,
} from '@cluster-proxy/server';
import { validateKubeObject } from './kube-schemas.js';
import { objectProblems, structuralProblems, type Schema } from './crd-schema.js';

const DIR = fileURLToPath(new URL('../../deploy/charts/cluster-proxy/crds/', import.meta.url));

interface Crd {
  apiVersion: string;
  kind: string;
  metadata: { name: string };
  spec: {
    group: string;
    scope: 'Namespaced' | 'Cluster';
    names: { kind: string; plural: string; singular: string; listKind: string };
    versions: {
      name: string;
      served: boolean;
      storage: boolean;
      schema: { openAPIV3Schema: Schema };
      subresources?: { status?: object };
    }[];
  };
}

function loadCrds(): Crd[] {
  const out: Crd[] = [];
  for (const file of readdirSync(DIR)
    .filter((f) => f.endsWith('.yaml'))
    .sort()) {
    for (const doc of parseAllDocuments(readFileSync(DIR + file, 'utf8'))) {
      // Duplicate keys and other YAML errors: kubectl and the apiserver refuse them.
      expect(
        doc.errors.map((e) => e.message),
        file,
      ).toEqual([]);
      out.push(doc.toJSON() as Crd);
    }
  }
  return out;
}

const now = '2026-11-23T07:00:00Z';
const cond = (type: string) => ({
  type,
  status: 'True' as const,
  reason: 'R',
  message: 'm',
  lastTransitionTime: now,
  observedGeneration: 1,
});
const meta = (name: string, namespace?: string) => ({
  name,
  ...(namespace ? { namespace } : {}),
  labels: { a: 'b' },
  annotations: { c: 'd' },
  resourceVersion: '7',
  uid: 'u',
  creationTimestamp: now,
});

// One object per CRD kind with every field objects.ts has (typed, so a field renamed there fails to compile here).
const samples = {
  ManagedCluster: {
    apiVersion: 'cluster.open-cluster-management.io/v1',
    kind: 'ManagedCluster',
    metadata: meta('c1'),
    spec: {
      hubAcceptsClient: true,
      leaseDurationSeconds: 60,
      managedClusterClientConfigs: [{ url: 'https://c1.example:6443', caBundle: Buffer.from('pem').toString('base64') }],
    },
    status: { conditions: [cond('ManagedClusterConditionAvailable')], version: { kubernetes: 'v1.33.0' } },
  } satisfies ManagedCluster,
  ManagedClusterAddOn: {
    apiVersion: 'addon.open-cluster-management.io/v1alpha1',
    kind: 'ManagedClusterAddOn',
    metadata: meta('cluster-proxy', 'c1'),
    spec: {
      installNamespace: 'open-cluster-management-agent-addon',
      configs: [
        {
          group: 'addon.open-cluster-management.io',
          resource: 'addondeploymentconfigs',
          name: 'cluster-proxy',
          namespace: 'open-cluster-management-cluster-proxy',
        },
      ],
    },
    status: {
      conditions: [cond('Available'), cond('Degraded'), cond('Progressing')],
      healthCheck: { mode: 'Lease' },
      namespace: 'open-cluster-management-agent-addon',
    },
  } satisfies ManagedClusterAddOn,
  ManagedProxyConfiguration: {
    apiVersion: 'proxy.open-cluster-management.io/v1alpha1',
    kind: 'ManagedProxyConfiguration',
    metadata: meta('cluster-proxy'),
    spec: {
      authentication: { signer: { type: 'SelfSigned' }, dump: { secrets: { signingProxyServerSecretName: 'proxy-server' } } },
      proxyServer: {
        image: 'i',
        replicas: 3,
        namespace: 'open-cluster-management-cluster-proxy',
        entrypoint: { type: 'Hostname', hostname: { value: 'hub.example.com' }, port: 8091 },
      },
      proxyAgent: { image: 'i', replicas: 1, imagePullSecrets: ['regcred'] },
    },
    status: { conditions: [cond('ProxyServerDeployed')], lastObservedGeneration: 2 },
  } satisfies ManagedProxyConfiguration,
  AddOnDeploymentConfig: {
    apiVersion: 'addon.open-cluster-management.io/v1alpha1',
    kind: 'AddOnDeploymentConfig',
    metadata: meta('cluster-proxy', 'open-cluster-management-cluster-proxy'),
    spec: {
      customizedVariables: [{ name: 'serviceDomain', value: 'svc.cluster.local' }],
      nodePlacement: { nodeSelector: { 'kubernetes.io/os': 'linux' }, tolerations: [{ operator: 'Exists' }] },
      agentInstallNamespace: 'open-cluster-management-agent-addon',
      proxyConfig: {
        httpProxy: 'http://p:3128',
        httpsProxy: 'https://p:3129',
        noProxy: '.corp',
        caBundle: Buffer.from('pem').toString('base64'),
      },
    },
  } satisfies AddOnDeploymentConfig,
};
type CrdKind = keyof typeof samples;

describe('chart CRDs', () => {
  const crds = loadCrds();
  const byKind = new Map(crds.map((c) => [c.spec.names.kind, c]));

  it('one valid CRD per OCM kind the store keeps as a custom resource, named as the store addresses it', () => {
    expect([...byKind.keys()].sort()).toEqual(Object.keys(samples).sort());
    for (const kind of Object.keys(samples) as CrdKind[]) {
      const crd = byKind.get(kind)!;
      const info = KINDS[kind];
      validateKubeObject(crd);
      expect(crd.metadata.name).toBe(`${info.plural}.${info.group}`);
      expect(crd.spec).toMatchObject({
        group: info.group,
        scope: info.namespaced ? 'Namespaced' : 'Cluster',
        names: { kind, plural: info.plural, listKind: `${kind}List` },
      });
      expect(crd.spec.versions.map((v) => [v.name, v.served, v.storage])).toEqual([[info.version, true, true]]);
      expect(crd.spec.versions[0]!.subresources?.status !== undefined, `${kind} status subresource`).toBe(info.hasStatus);
    }
  });

  it('schemas are structural', () => {
    for (const crd of crds) expect(structuralProblems(crd.spec.versions[0]!.schema.openAPIV3Schema, crd.spec.names.kind)).toEqual([]);
  });

  it('an object with every field the hub uses passes validation and loses nothing to pruning', () => {
    for (const [kind, obj] of Object.entries(samples)) {
      expect(objectProblems(byKind.get(kind)!.spec.versions[0]!.schema.openAPIV3Schema, obj, ''), kind).toEqual([]);
    }
  });

  it('fields OCM has and we do not model are kept (preserve-unknown), and wrong types are caught', () => {
    const schema = (k: CrdKind) => byKind.get(k)!.spec.versions[0]!.schema.openAPIV3Schema;
    const mca = {
      ...samples.ManagedClusterAddOn,
      status: { ...samples.ManagedClusterAddOn.status, relatedObjects: [{ group: '', resource: 'x', name: 'y' }], supportedConfigs: [] },
    };
    expect(objectProblems(schema('ManagedClusterAddOn'), mca, '')).toEqual([]);
    const mpc = structuredClone(samples.ManagedProxyConfiguration) as unknown as {
      spec: { proxyServer: { entrypoint: Record<string, unknown> }; deploy: unknown };
    };
    mpc.spec.proxyServer.entrypoint['loadBalancerService'] = { name: 'proxy-agent-entrypoint', annotations: [{ key: 'k', value: 'v' }] };
    mpc.spec.deploy = { ports: { proxyServer: 8090 } };
    expect(objectProblems(schema('ManagedProxyConfiguration'), mpc, '')).toEqual([]);
    const bad = { ...samples.ManagedCluster, spec: { ...samples.ManagedCluster.spec, hubAcceptsClient: 'yes' } };
    expect(objectProblems(schema('ManagedCluster'), bad, '')).toEqual(['.spec.hubAcceptsClient: not a boolean']);
    const badCond = { ...samples.ManagedClusterAddOn, status: { conditions: [{ ...cond('Available'), status: 'Maybe' }] } };
    expect(objectProblems(schema('ManagedClusterAddOn'), badCond, '')).toEqual([
      '.status.conditions[0].status: "Maybe" not in ["True","False","Unknown"]',
    ]);
  });

  it("kubectl get managedclusteraddons shows OCM's columns", () => {
    const cols = (
      byKind.get('ManagedClusterAddOn')!.spec.versions[0] as unknown as { additionalPrinterColumns: { name: string }[] }
    ).additionalPrinterColumns.map((c) => c.name);
    expect(cols.slice(0, 3)).toEqual(['Available', 'Degraded', 'Progressing']);
  });
});
