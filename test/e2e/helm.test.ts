// The hub chart with the real helm (v4, from the npm layer package): `helm lint`, `helm template` with
// default and HA values, every rendered object (CRDs included) valid against Kubernetes' schemas, and
// the HA settings where they belong.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments, stringify } from 'yaml';
import { runCommand } from '../src/fixtures/index.js';
import { validateKubeObject } from '../src/kube-schemas.js';
import { restrictedProblems, restrictedV2Problems, type PodSpecLike } from '../src/pod-security.js';
import { createCA, parseServiceAllowlist, renderAgentInstall, toYaml } from '@cluster-proxy/server';
import { helmBinary, kubectlBinary, kubectlUnsupported } from './kubectl-binary.js';

const CHART = fileURLToPath(new URL('../../deploy/charts/cluster-proxy', import.meta.url));
type Obj = { apiVersion: string; kind: string; metadata: { name: string }; spec?: Record<string, unknown> };

// The packaged helm is linux/amd64 only; elsewhere there is nothing to run.
describe.skipIf(kubectlUnsupported() !== null)('hub Helm chart', () => {
  let helm = '';
  let dir = '';
  beforeAll(async () => {
    helm = await helmBinary();
    dir = await mkdtemp(path.join(os.tmpdir(), 'cp-helm-'));
  });
  afterAll(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  // helm keeps its cache/config under HOME; give it a throwaway one.
  const run = (args: string[]) =>
    runCommand(helm, args, {
      env: {
        ...process.env,
        HOME: dir,
        HELM_CACHE_HOME: path.join(dir, 'cache'),
        HELM_CONFIG_HOME: path.join(dir, 'config'),
        HELM_DATA_HOME: path.join(dir, 'data'),
      },
      timeoutMs: 60_000,
    });

  async function template(values: string): Promise<Obj[]> {
    const file = path.join(dir, `values-${Math.random().toString(36).slice(2)}.yaml`);
    await writeFile(file, values);
    const r = await run(['template', 'cp', CHART, '--namespace', 'open-cluster-management-cluster-proxy', '--include-crds', '-f', file]);
    expect(r.code, r.stderr).toBe(0);
    const docs = parseAllDocuments(r.stdout);
    // Duplicate keys or broken indentation: kubectl and the apiserver refuse what a lenient parser takes.
    expect(docs.flatMap((d) => d.errors.map((e) => e.message))).toEqual([]);
    return docs.map((d) => d.toJSON() as Obj).filter((o) => o !== null);
  }

  it('helm lint passes (default values and HA values)', async () => {
    const r = await run(['lint', CHART, '--strict']);
    expect(r.code, `${r.stdout}\n${r.stderr}`).toBe(0);
    const ha = path.join(dir, 'ha-lint.yaml');
    await writeFile(ha, 'replicas: 3\nantiAffinity:\n  mode: required\n');
    const r2 = await run(['lint', CHART, '--strict', '-f', ha]);
    expect(r2.code, `${r2.stdout}\n${r2.stderr}`).toBe(0);
  });

  it('default values: one replica, no PDB; every object (CRDs too) valid against Kubernetes schemas', async () => {
    const objs = await template('');
    for (const o of objs) validateKubeObject(o);
    expect(
      objs
        .filter((o) => o.kind === 'CustomResourceDefinition')
        .map((o) => o.metadata.name)
        .sort(),
    ).toEqual([
      'addondeploymentconfigs.addon.open-cluster-management.io',
      'managedclusteraddons.addon.open-cluster-management.io',
      'managedclusters.cluster.open-cluster-management.io',
      'managedproxyconfigurations.proxy.open-cluster-management.io',
    ]);
    expect(objs.some((o) => o.kind === 'PodDisruptionBudget')).toBe(false);
    const dep = objs.find((o) => o.kind === 'Deployment') as unknown as {
      spec: { replicas: number; template: { spec: { containers: { args: string[] }[]; affinity?: unknown } } };
    };
    expect(dep.spec.replicas).toBe(1);
    expect(dep.spec.template.spec.affinity).toBeUndefined();
    expect(dep.spec.template.spec.containers[0]!.args).toEqual(
      expect.arrayContaining(['hub', '--store=kubernetes', '--server-count=1', '--require-registration']),
    );
  });

  it('HA values: 3 replicas, required anti-affinity, a PDB, --server-count 3, the agent entrypoint in args and the serving certificate', async () => {
    const objs = await template('replicas: 3\nantiAffinity:\n  mode: required\nagentEntrypoint:\n  address: proxy.hub.example.com:8091\n');
    for (const o of objs) validateKubeObject(o);
    const dep = objs.find((o) => o.kind === 'Deployment') as unknown as {
      spec: {
        replicas: number;
        template: {
          spec: {
            containers: { args: string[] }[];
            affinity: { podAntiAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { topologyKey: string }[] } };
          };
        };
      };
    };
    expect(dep.spec.replicas).toBe(3);
    expect(dep.spec.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]!.topologyKey).toBe(
      'kubernetes.io/hostname',
    );
    expect(dep.spec.template.spec.containers[0]!.args).toEqual(
      expect.arrayContaining(['--server-count=3', '--agent-entrypoint=proxy.hub.example.com:8091']),
    );
    const pdb = objs.find((o) => o.kind === 'PodDisruptionBudget') as unknown as {
      spec: { maxUnavailable: number; minAvailable?: number; selector: { matchLabels: Record<string, string> } };
    };
    expect(pdb.spec.maxUnavailable).toBe(1);
    expect(pdb.spec.minAvailable).toBeUndefined();
    expect(pdb.spec.selector.matchLabels).toEqual(
      (dep as unknown as { spec: { selector: { matchLabels: Record<string, string> } } }).spec.selector.matchLabels,
    );
    const svc = objs.find((o) => o.kind === 'Service' && o.metadata.name === 'cluster-proxy-agent') as unknown as {
      spec: { type: string; ports: { port: number }[] };
    };
    expect(svc.spec).toMatchObject({ type: 'LoadBalancer', sessionAffinity: 'None', ports: [{ port: 8091 }] });
    const server = objs.find((o) => o.kind === 'Secret' && o.metadata.name === 'cluster-proxy-server') as unknown as {
      data: Record<string, string>;
    };
    const { X509Certificate } = await import('node:crypto');
    const cert = new X509Certificate(Buffer.from(server.data['tls.crt']!, 'base64'));
    expect(cert.subjectAltName).toContain('DNS:proxy.hub.example.com');
    expect(cert.checkIssued(new X509Certificate(Buffer.from(server.data['ca.crt']!, 'base64')))).toBe(true);
  });

  it('PDB with minAvailable instead; a ClusterIP agent entrypoint behind your own L4 balancer; LB source ranges', async () => {
    const objs = await template(
      'replicas: 3\npodDisruptionBudget:\n  maxUnavailable: null\n  minAvailable: 2\nagentEntrypoint:\n  service:\n    type: ClusterIP\n  address: hub.example.com:443\n',
    );
    for (const o of objs) validateKubeObject(o);
    const pdb = objs.find((o) => o.kind === 'PodDisruptionBudget') as unknown as { spec: Record<string, unknown> };
    expect(pdb.spec['minAvailable']).toBe(2);
    expect(pdb.spec['maxUnavailable']).toBeUndefined();
    const svc = objs.find((o) => o.kind === 'Service' && o.metadata.name === 'cluster-proxy-agent') as unknown as {
      spec: Record<string, unknown>;
    };
    expect(svc.spec).toMatchObject({ type: 'ClusterIP', ports: [{ port: 8091, targetPort: 'agent', protocol: 'TCP' }] });
    expect(svc.spec['externalTrafficPolicy']).toBeUndefined();
    const lb = await template(
      'agentEntrypoint:\n  service:\n    loadBalancerSourceRanges: [203.0.113.0/24]\n    externalTrafficPolicy: Local\n',
    );
    for (const o of lb) validateKubeObject(o);
    const lbSvc = lb.find((o) => o.kind === 'Service' && o.metadata.name === 'cluster-proxy-agent') as unknown as {
      spec: Record<string, unknown>;
    };
    expect(lbSvc.spec).toMatchObject({
      type: 'LoadBalancer',
      loadBalancerSourceRanges: ['203.0.113.0/24'],
      externalTrafficPolicy: 'Local',
    });
  });

  it('the server Deployment: ports, probes on 8092, security context, resources, frontend Service', async () => {
    const objs = await template('');
    type C = {
      args: string[];
      ports: { name: string; containerPort: number }[];
      livenessProbe: { httpGet: { path: string; port: string } };
      readinessProbe: { httpGet: { path: string; port: string } };
      securityContext: Record<string, unknown>;
      resources: Record<string, unknown>;
    };
    const dep = objs.find((o) => o.kind === 'Deployment') as unknown as {
      spec: { template: { spec: { securityContext: Record<string, unknown>; containers: C[] } } };
    };
    const c = dep.spec.template.spec.containers[0]!;
    const ports = Object.fromEntries(c.ports.map((p) => [p.name, p.containerPort]));
    expect(ports).toEqual({ frontend: 8090, agent: 8091, health: 8092, connect: 8089, gateway: 9092 });
    expect(c.args).toContain('--gateway-port=9092');
    // The Service allowlist: an empty list by default (deny all), mounted as a directory so edits reach the hub.
    expect(c.args).toContain('--gateway-services=/etc/cluster-proxy/gateway/services.yaml');
    const mounts = (c as unknown as { volumeMounts: { name: string; mountPath: string; subPath?: string }[] }).volumeMounts;
    expect(mounts.find((m) => m.name === 'gateway-services')).toEqual({
      name: 'gateway-services',
      mountPath: '/etc/cluster-proxy/gateway',
      readOnly: true,
    });
    const servicesCm = objs.find((o) => o.kind === 'ConfigMap' && o.metadata.name === 'cluster-proxy-gateway-services') as unknown as {
      data: Record<string, string>;
    };
    expect(parseServiceAllowlist(servicesCm.data['services.yaml']!, () => Buffer.alloc(0))).toEqual([]);
    expect(ports[c.livenessProbe.httpGet.port]).toBe(8092);
    expect(c.livenessProbe.httpGet.path).toBe('/healthz');
    expect(c.readinessProbe.httpGet).toEqual({ path: '/readyz?exclude=store', port: 'health' });
    expect(c.securityContext).toMatchObject({
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ['ALL'] },
    });
    expect(dep.spec.template.spec.securityContext).toMatchObject({ runAsNonRoot: true });
    // Admitted under Kubernetes' restricted Pod Security Standard and OpenShift's restricted-v2 (no fixed UID).
    const pod = dep.spec.template.spec as unknown as PodSpecLike;
    expect(restrictedProblems(pod)).toEqual([]);
    expect(restrictedV2Problems(pod)).toEqual([]);
    expect(c.resources).toHaveProperty('requests');
    const front = objs.find((o) => o.kind === 'Service' && o.metadata.name === 'cluster-proxy') as unknown as {
      spec: { ports: { port: number }[] };
    };
    expect(front.spec.ports.map((p) => p.port)).toEqual([8090, 8089, 9092]);
    // Listed Services and their CAs: the hub's own parser takes the rendered list, caFile names a key beside it.
    const ca = createCA({ commonName: 'svc-ca' }).certPem;
    const listed = await template(
      stringify({
        gateway: {
          services: [
            { namespace: 'monitoring', service: 'prometheus', port: 9090, protocol: 'http', clusters: ['c1'] },
            { namespace: 'pay', service: 'api', protocol: 'https', caFile: 'pay-ca.crt' },
          ],
          serviceCAs: { 'pay-ca.crt': ca },
        },
      }),
    );
    for (const o of listed) validateKubeObject(o);
    const cm = (
      listed.find((o) => o.kind === 'ConfigMap' && o.metadata.name === 'cluster-proxy-gateway-services') as unknown as {
        data: Record<string, string>;
      }
    ).data;
    const entries = parseServiceAllowlist(cm['services.yaml']!, (f) => Buffer.from(cm[f]!));
    expect(entries.map(({ ca: _ca, ...e }) => e)).toEqual([
      { namespace: 'monitoring', service: 'prometheus', port: 9090, protocol: 'http', clusters: ['c1'] },
      { namespace: 'pay', service: 'api', protocol: 'https' },
    ]);
    expect(entries[1]!.ca?.toString().replace(/\r/g, '').trim()).toBe(ca.replace(/\r/g, '').trim());
    // The gateway off: no flag, no port.
    const off = await template('frontend:\n  service:\n    gatewayPort: 0\n');
    expect(off.some((o) => o.kind === 'ConfigMap' && o.metadata.name === 'cluster-proxy-gateway-services')).toBe(false);
    const offDep = off.find((o) => o.kind === 'Deployment') as unknown as { spec: { template: { spec: { containers: C[] } } } };
    expect(offDep.spec.template.spec.containers[0]!.args.some((a) => a.startsWith('--gateway-port'))).toBe(false);
    expect(offDep.spec.template.spec.containers[0]!.ports.map((p) => p.name)).not.toContain('gateway');
    expect(
      (
        off.find((o) => o.kind === 'Service' && o.metadata.name === 'cluster-proxy') as unknown as { spec: { ports: { port: number }[] } }
      ).spec.ports.map((p) => p.port),
    ).toEqual([8090, 8089]);
    const role = objs.find((o) => o.kind === 'ClusterRole') as unknown as { rules: { resources: string[] }[] };
    const resources = role.rules.flatMap((r) => r.resources);
    for (const r of [
      'managedclusters',
      'managedclusteraddons/status',
      'addondeploymentconfigs',
      'managedproxyconfigurations/status',
      'leases',
      'secrets',
      'namespaces',
    ])
      expect(resources).toContain(r);
    // The gateway's reviews on the hub's API server, only with the gateway.
    for (const r of ['tokenreviews', 'subjectaccessreviews']) expect(resources).toContain(r);
    expect(
      (off.find((o) => o.kind === 'ClusterRole') as unknown as { rules: { resources: string[] }[] }).rules.flatMap((r) => r.resources),
    ).not.toContain('tokenreviews');
    // The store reads a namespace before creating it (RBAC is checked before existence).
    expect((role.rules as { resources: string[]; verbs: string[] }[]).find((r) => r.resources.includes('namespaces'))!.verbs).toEqual(
      expect.arrayContaining(['get', 'create']),
    );
    // SIGTERM grace: the pod outlives the hub's own grace period.
    expect(c.args).toEqual(expect.arrayContaining(['--shutdown-grace=20s', '--shutdown-delay=5s']));
    expect((dep.spec.template.spec as unknown as { terminationGracePeriodSeconds: number }).terminationGracePeriodSeconds).toBe(40);
  });

  it("manifestwork mode: OCM addon objects, proxy-entrypoint, RBAC for works, placements and CSRs (signing only its own signer); all valid against Kubernetes' and OCM's schemas", async () => {
    const manual = await template('');
    expect(manual.some((o) => ['ClusterManagementAddOn', 'Placement'].includes(o.kind) || o.metadata.name === 'proxy-entrypoint')).toBe(
      false,
    );
    const objs = await template('agentInstall:\n  mode: manifestwork\n  installStrategy: Placements\n');
    for (const o of objs) validateKubeObject(o);
    const dep = objs.find((o) => o.kind === 'Deployment') as unknown as {
      spec: { template: { spec: { containers: { args: string[] }[] } } };
    };
    expect(dep.spec.template.spec.containers[0]!.args).toEqual(
      expect.arrayContaining(['--agent-install=manifestwork', '--agent-install-namespace=open-cluster-management-cluster-proxy']),
    );
    const cma = objs.find((o) => o.kind === 'ClusterManagementAddOn') as unknown as {
      metadata: { annotations: Record<string, string> };
      spec: { installStrategy: unknown };
    };
    expect(cma.metadata.annotations['addon.open-cluster-management.io/lifecycle']).toBe('addon-manager');
    // `helm uninstall` keeps it (OCM's addon-manager makes it every addon's controller owner).
    expect(cma.metadata.annotations['helm.sh/resource-policy']).toBe('keep');
    expect(cma.spec.installStrategy).toEqual({
      type: 'Placements',
      placements: [{ name: 'cluster-proxy-placement', namespace: 'open-cluster-management-cluster-proxy' }],
    });
    expect(objs.find((o) => o.kind === 'Placement')?.spec).toEqual({ clusterSets: ['global'] });
    expect(objs.find((o) => o.kind === 'ManagedClusterSetBinding')?.spec).toEqual({ clusterSet: 'global' });
    const svc = objs.find((o) => o.kind === 'Service' && o.metadata.name === 'proxy-entrypoint') as unknown as {
      spec: { ports: { port: number; targetPort: string }[] };
    };
    expect(svc.spec.ports.map((p) => [p.port, p.targetPort])).toEqual([
      [8090, 'frontend'],
      [8091, 'agent'],
    ]);
    type Rule = { apiGroups: string[]; resources: string[]; resourceNames?: string[]; verbs: string[] };
    const rules = (objs.find((o) => o.kind === 'ClusterRole') as unknown as { rules: Rule[] }).rules;
    const verbs = (resource: string, name?: string) =>
      rules
        .filter((r) => r.resources.includes(resource) && (name === undefined || r.resourceNames?.includes(name)))
        .flatMap((r) => r.verbs);
    expect(verbs('manifestworks')).toEqual(expect.arrayContaining(['create', 'update', 'delete', 'watch']));
    expect(verbs('certificatesigningrequests/approval')).toEqual(['update']);
    expect(verbs('signers', 'open-cluster-management.io/proxy-agent-signer')).toEqual(['approve', 'sign']);
    // No hub kubeconfig registration (nothing to approve for kube-apiserver-client); no Placement reads (OCM's
    // addon-manager installs from them); ManagedClusters and addons read, only the addon's status written.
    expect(verbs('signers', 'kubernetes.io/kube-apiserver-client')).toEqual([]);
    expect(rules.some((r) => r.resources.includes('signers') && !r.resourceNames)).toBe(false);
    expect(verbs('placementdecisions')).toEqual([]);
    expect(verbs('managedclusters')).toEqual(['get', 'list', 'watch']);
    expect(verbs('managedclusteraddons')).toEqual(['get', 'list', 'watch']);
    expect(verbs('managedclusteraddons/status')).toEqual(['update']);
    // ClusterProfiles off by default; on: the gateway's in-cluster URL (a name the serving certificate has) and status-only RBAC.
    expect(verbs('clusterprofiles')).toEqual([]);
    expect(dep.spec.template.spec.containers[0]!.args.some((a) => a.startsWith('--cluster-profiles'))).toBe(false);
    const profiles = await template('agentInstall:\n  mode: manifestwork\n  clusterProfiles: true\n');
    const pRules = (profiles.find((o) => o.kind === 'ClusterRole') as unknown as { rules: Rule[] }).rules;
    expect(pRules.filter((r) => r.resources.includes('clusterprofiles')).flatMap((r) => r.verbs)).toEqual(['get', 'list', 'watch']);
    expect(pRules.filter((r) => r.resources.includes('clusterprofiles/status')).flatMap((r) => r.verbs)).toEqual(['update']);
    const pArgs = (
      profiles.find((o) => o.kind === 'Deployment') as unknown as { spec: { template: { spec: { containers: { args: string[] }[] } } } }
    ).spec.template.spec.containers[0]!.args;
    expect(pArgs).toContain('--cluster-profiles-gateway-url=https://cluster-proxy.open-cluster-management-cluster-proxy.svc:9092');
    const manualStrategy = await template('agentInstall:\n  mode: manifestwork\n');
    expect(
      (manualStrategy.find((o) => o.kind === 'ClusterManagementAddOn') as unknown as { spec: { installStrategy: unknown } }).spec
        .installStrategy,
    ).toEqual({ type: 'Manual' });
    expect(manualStrategy.some((o) => o.kind === 'Placement')).toBe(false);
  });

  it('bad values are refused with the value named', async () => {
    const bad = async (values: string, message: RegExp): Promise<void> => {
      const file = path.join(dir, `bad-${Math.random().toString(36).slice(2)}.yaml`);
      await writeFile(file, values);
      const r = await run(['template', 'cp', CHART, '-f', file]);
      expect(r.code, values).not.toBe(0);
      expect(r.stderr).toMatch(message);
    };
    await bad('replicas: 0\n', /replicas/);
    await bad('antiAffinity:\n  mode: sometimes\n', /antiAffinity\/mode/);
    await bad('agentEntrypoint:\n  address: https://hub.example.com:8091\n', /agentEntrypoint\/address/);
    await bad('replicas: 3\npodDisruptionBudget:\n  minAvailable: 2\n', /set minAvailable or maxUnavailable, not both/);
    await bad('agentInstall:\n  mode: helm\n', /agentInstall\/mode/);
    await bad('agentInstall:\n  installStrategy: Sometimes\n', /agentInstall\/installStrategy/);
    await bad('gateway:\n  services:\n    - { service: prometheus }\n', /gateway\/services\/0.*namespace/);
    await bad('gateway:\n  services:\n    - { namespace: m, service: p, protocol: tcp }\n', /gateway\/services\/0\/protocol/);
  });

  it('preferred anti-affinity by default when replicated', async () => {
    const objs = await template('replicas: 2\n');
    const dep = objs.find((o) => o.kind === 'Deployment') as unknown as {
      spec: { template: { spec: { affinity: { podAntiAffinity: Record<string, unknown> } } } };
    };
    expect(Object.keys(dep.spec.template.spec.affinity.podAntiAffinity)).toEqual(['preferredDuringSchedulingIgnoredDuringExecution']);
  });
});

// The agent install manifests once more, through helm's neighbour in the same layer: the real kubectl
// decodes every object offline (`--local`: no cluster) into its typed Go structs.
describe.skipIf(kubectlUnsupported() !== null)('agent install manifests through the real kubectl', () => {
  let dir = '';
  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'cp-kubectl-'));
  });
  afterAll(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('kubectl reads every object, and sees the proxy env on the agent container', async () => {
    const kubectl = await kubectlBinary();
    const file = path.join(dir, 'manifests.yaml');
    await writeFile(
      file,
      toYaml(
        renderAgentInstall({
          cluster: 'cluster1',
          installNamespace: 'open-cluster-management-agent-addon',
          agentEntrypoint: 'proxy.hub.example.com:8091',
          caBundle: createCA({ commonName: 'hub-ca' }).certPem,
          bootstrapToken: 'abcdef.0123456789abcdef',
          agentReplicas: 2,
          facts: { podCidrs: ['10.244.0.0/16'], serviceCidrs: ['10.96.0.0/12'], apiserverIp: '10.96.0.1' },
          proxyConfig: { httpsProxy: 'http://proxy.corp.example:3128' },
          nodePlacement: { tolerations: [{ operator: 'Exists' }] },
        }),
      ),
    );
    const env = { ...process.env, HOME: dir, KUBECONFIG: path.join(dir, 'none') };
    const names = await runCommand(kubectl, ['label', '--local', '-f', file, 'checked=yes', '-o', 'name'], { env, timeoutMs: 30_000 });
    expect(names.code, names.stderr).toBe(0);
    expect(names.stdout.trim().split('\n')).toEqual([
      'namespace/open-cluster-management-agent-addon',
      'serviceaccount/cluster-proxy',
      'role.rbac.authorization.k8s.io/cluster-proxy',
      'rolebinding.rbac.authorization.k8s.io/cluster-proxy',
      'secret/cluster-proxy-hub-ca',
      'secret/cluster-proxy-bootstrap',
      'deployment.apps/cluster-proxy-proxy-agent',
      'service/cluster1',
    ]);
    const listed = await runCommand(kubectl, ['set', 'env', '--local', '-f', file, '--list'], { env, timeoutMs: 30_000 });
    expect(listed.code, listed.stderr).toBe(0);
    expect(listed.stdout).toContain('# Deployment cluster-proxy-proxy-agent, container proxy-agent');
    expect(listed.stdout).toContain('HTTPS_PROXY=http://proxy.corp.example:3128');
    expect(listed.stdout).toMatch(/^no_proxy=.*10\.244\.0\.0\/16.*10\.96\.0\.1/m);
    // The typed decode is strict about types: a broken copy is refused.
    const broken = path.join(dir, 'broken.yaml');
    await writeFile(broken, (await readFile(file, 'utf8')).replace('containerPort: 8093', 'containerPort: "health"'));
    const refused = await runCommand(kubectl, ['set', 'env', '--local', '-f', broken, '--list'], { env, timeoutMs: 30_000 });
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toMatch(/containerPort/);
  });
});
