// Validates Kubernetes objects against the upstream OpenAPI schemas shipped in `kubernetes-models`
// (one model class per apiVersion/kind). Used for the agent install manifests and the Helm chart.
import { ConfigMap, Namespace, Secret, Service, ServiceAccount } from 'kubernetes-models/v1';
import { Deployment } from 'kubernetes-models/apps/v1';
import { ClusterRole, ClusterRoleBinding, Role, RoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { CustomResourceDefinition } from 'kubernetes-models/apiextensions.k8s.io/v1';
import { CertificateSigningRequest } from 'kubernetes-models/certificates.k8s.io/v1';
import { readFileSync } from 'node:fs';
import { objectProblems, type Schema } from './crd-schema.js';

type Model = new (data: never) => { validate(): void };

const MODELS: Record<string, Model> = {
  'v1/ConfigMap': ConfigMap as unknown as Model,
  'v1/Namespace': Namespace as unknown as Model,
  'v1/Secret': Secret as unknown as Model,
  'v1/Service': Service as unknown as Model,
  'v1/ServiceAccount': ServiceAccount as unknown as Model,
  'apps/v1/Deployment': Deployment as unknown as Model,
  'rbac.authorization.k8s.io/v1/Role': Role as unknown as Model,
  'rbac.authorization.k8s.io/v1/RoleBinding': RoleBinding as unknown as Model,
  'rbac.authorization.k8s.io/v1/ClusterRole': ClusterRole as unknown as Model,
  'rbac.authorization.k8s.io/v1/ClusterRoleBinding': ClusterRoleBinding as unknown as Model,
  'policy/v1/PodDisruptionBudget': PodDisruptionBudget as unknown as Model,
  'apiextensions.k8s.io/v1/CustomResourceDefinition': CustomResourceDefinition as unknown as Model,
  'certificates.k8s.io/v1/CertificateSigningRequest': CertificateSigningRequest as unknown as Model,
};

/**
 * OCM's own kinds (ClusterManagementAddOn, ManagedClusterAddOn, Placement, PlacementDecision,
 * ManagedClusterSetBinding, ManifestWork): the structure of OCM's CRD schemas (fixtures/schemas), checked
 * as the apiserver would, pruning included.
 */
const OCM = JSON.parse(readFileSync(new URL('../src/fixtures/schemas/ocm-hub-kinds.schema.json', import.meta.url), 'utf8')) as {
  kinds: Record<string, { schema: Schema }>;
};

/** Throws, naming the object, when it does not match its kind's schema or its kind is not known here. */
export function validateKubeObject(obj: { apiVersion?: string; kind?: string; metadata?: { name?: string } }): void {
  const key = `${obj.apiVersion}/${obj.kind}`;
  const ocm = OCM.kinds[key];
  if (ocm) {
    const problems = objectProblems(ocm.schema, obj, '');
    if (problems.length > 0) throw new Error(`${key} ${obj.metadata?.name ?? ''} does not match OCM's CRD schema: ${problems.join('; ')}`);
    return;
  }
  const model = MODELS[key];
  if (!model) throw new Error(`no schema for ${key} (${obj.metadata?.name ?? 'unnamed'})`);
  try {
    new model(obj as never).validate();
  } catch (err) {
    throw new Error(`${key} ${obj.metadata?.name ?? ''} does not match the Kubernetes schema: ${(err as Error).message}`);
  }
}
