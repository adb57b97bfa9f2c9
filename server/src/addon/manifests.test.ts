// Behaviour of the agent install manifests (schema validation against Kubernetes' own OpenAPI models
// lives in test/src/manifests.test.ts, where kubernetes-models is installed).
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { createCA } from '../pki/certificates.js';
import { ManifestInputError, renderAgentInstall, toYaml, type AgentInstallInput, type KubeManifest } from './manifests.js';

const hubCa = createCA({ commonName: 'hub-ca' }).certPem;
const proxyCa = createCA({ commonName: 'proxy-ca' }).certPem;
const TOKEN = 'k3xq9z.Zp0c4b1d2e3f4a5b';
const PROXY_PASSWORD = 's3cr3t-pw';

const base: AgentInstallInput = {
  cluster: 'cluster1',
  installNamespace: 'open-cluster-management-agent-addon',
  agentEntrypoint: 'proxy.hub.example.com:8091',
  caBundle: hubCa,
  bootstrapToken: TOKEN,
  agentReplicas: 2,
  image: 'registry.example.com/cluster-proxy:1.2.3',
};
const facts = {
  podCidrs: ['10.244.0.0/16', 'fd00:10:244::/56'],
  serviceCidrs: ['10.96.0.0/12'],
  clusterDomain: 'corp.local',
  apiserverIp: '10.96.0.1',
};
const httpsProxy: AgentInstallInput = {
  ...base,
  facts,
  proxyConfig: {
    httpsProxy: `https://agent:${PROXY_PASSWORD}@proxy.corp.example:3129`,
    httpProxy: 'http://proxy.corp.example:3128',
    noProxy: '.corp.example',
    caBundle: proxyCa,
  },
};
const httpProxy: AgentInstallInput = {
  ...httpsProxy,
  proxyConfig: { ...httpsProxy.proxyConfig, httpsProxy: 'http://proxy.corp.example:3128' },
};

interface Container {
  name: string;
  args: string[];
  env: { name: string; value: string }[];
}
interface PodSpec {
  containers: Container[];
  initContainers?: Container[];
  nodeSelector?: Record<string, string>;
  tolerations?: unknown[];
  imagePullSecrets?: { name: string }[];
  securityContext: Record<string, unknown>;
}
const find = (objs: KubeManifest[], kind: string, name?: string): KubeManifest => {
  const o = objs.find((x) => x.kind === kind && (name === undefined || x.metadata.name === name));
  if (!o) throw new Error(`no ${kind} ${name ?? ''}`);
  return o;
};
const podSpec = (objs: KubeManifest[]): PodSpec =>
  (find(objs, 'Deployment') as unknown as { spec: { template: { spec: PodSpec } } }).spec.template.spec;
const allContainers = (objs: KubeManifest[]): Container[] => [...podSpec(objs).containers, ...(podSpec(objs).initContainers ?? [])];
const envOf = (c: Container): Record<string, string> => Object.fromEntries(c.env.map((e) => [e.name, e.value]));
const secretData = (objs: KubeManifest[], name: string, key: string): string =>
  Buffer.from((find(objs, 'Secret', name) as unknown as { data: Record<string, string> }).data[key]!, 'base64').toString('utf8');
const flat = (pem: string): string => pem.replace(/-----[A-Z ]+-----|\s+/g, '');

describe('renderAgentInstall', () => {
  it("renders OCM's names in apply order, every namespaced object in the install namespace", () => {
    const objs = renderAgentInstall(base);
    expect(objs.map((o) => `${o.kind}/${o.metadata.name}`)).toEqual([
      'Namespace/open-cluster-management-agent-addon',
      'ServiceAccount/cluster-proxy',
      'Role/cluster-proxy',
      'RoleBinding/cluster-proxy',
      'Secret/cluster-proxy-hub-ca',
      'Secret/cluster-proxy-bootstrap',
      'Deployment/cluster-proxy-proxy-agent',
      'Service/cluster1',
    ]);
    for (const o of objs) {
      if (o.kind === 'Namespace') expect(o.metadata.namespace).toBeUndefined();
      else expect(o.metadata.namespace, `${o.kind}/${o.metadata.name}`).toBe('open-cluster-management-agent-addon');
    }
    const other = renderAgentInstall({ ...base, installNamespace: 'agents' });
    for (const o of other) expect(o.kind === 'Namespace' ? o.metadata.name : o.metadata.namespace).toBe('agents');
    expect((find(other, 'RoleBinding') as unknown as { subjects: { namespace: string }[] }).subjects[0]!.namespace).toBe('agents');
  });

  it('the Role allows get/update on its Lease and its credentials Secret (and create, which RBAC cannot limit by name), nothing else', () => {
    const role = find(renderAgentInstall(base), 'Role') as unknown as {
      rules: { apiGroups: string[]; resources: string[]; resourceNames?: string[]; verbs: string[] }[];
    };
    expect(role.rules).toEqual([
      { apiGroups: ['coordination.k8s.io'], resources: ['leases'], verbs: ['create'] },
      { apiGroups: ['coordination.k8s.io'], resources: ['leases'], resourceNames: ['cluster-proxy'], verbs: ['get', 'update', 'patch'] },
      { apiGroups: [''], resources: ['secrets'], verbs: ['create'] },
      { apiGroups: [''], resources: ['secrets'], resourceNames: ['cluster-proxy-agent-credentials'], verbs: ['get', 'update', 'patch'] },
    ]);
  });

  it('a hub with the HTTP gateway: the agent may impersonate users, groups, uids and user extras cluster-wide, nothing more; without it, no such right', () => {
    expect(renderAgentInstall(base).some((o) => o.kind.startsWith('ClusterRole'))).toBe(false);
    const objs = renderAgentInstall({ ...base, installNamespace: 'agents', gateway: true });
    const role = find(objs, 'ClusterRole', 'cluster-proxy-gateway-impersonator') as unknown as {
      metadata: { namespace?: string };
      rules: unknown[];
    };
    expect(role.metadata.namespace).toBeUndefined();
    expect(role.rules).toEqual([
      { apiGroups: [''], resources: ['users', 'groups'], verbs: ['impersonate'] },
      { apiGroups: ['authentication.k8s.io'], resources: ['*'], verbs: ['impersonate'] },
    ]);
    const binding = find(objs, 'ClusterRoleBinding', 'cluster-proxy-gateway-impersonator') as unknown as {
      roleRef: unknown;
      subjects: unknown[];
    };
    expect(binding.roleRef).toEqual({
      apiGroup: 'rbac.authorization.k8s.io',
      kind: 'ClusterRole',
      name: 'cluster-proxy-gateway-impersonator',
    });
    expect(binding.subjects).toEqual([{ kind: 'ServiceAccount', name: 'cluster-proxy', namespace: 'agents' }]);
    // Applied after the ServiceAccount it binds, before the Deployment that uses it.
    const order = objs.map((o) => o.kind);
    expect(order.indexOf('ClusterRoleBinding')).toBeGreaterThan(order.indexOf('ServiceAccount'));
    expect(order.indexOf('ClusterRoleBinding')).toBeLessThan(order.indexOf('Deployment'));
  });

  it('the agent Deployment: image, replicas, args, probes on 8093, locked-down security context, the ExternalName Service', () => {
    const objs = renderAgentInstall({ ...base, serverName: 'hub.internal' });
    const dep = find(objs, 'Deployment') as unknown as { spec: { replicas: number } };
    expect(dep.spec.replicas).toBe(2);
    const [c] = podSpec(objs).containers as [Container & Record<string, unknown>];
    expect(c.image).toBe('registry.example.com/cluster-proxy:1.2.3');
    expect(c.args).toEqual([
      'agent',
      '--cluster=cluster1',
      '--namespace=open-cluster-management-agent-addon',
      '--hub=proxy.hub.example.com:8091',
      '--server-name=hub.internal',
      '--ca-cert=/etc/cluster-proxy/hub-ca/ca.crt',
      '--bootstrap-token-file=/etc/cluster-proxy/bootstrap/token',
      '--credentials-dir=/var/lib/cluster-proxy/credentials',
      '--credentials-secret=cluster-proxy-agent-credentials',
      '--apiserver=kubernetes.default.svc:443',
      '--health-port=8093',
      '--memory-budget=64Mi',
    ]);
    expect(c['livenessProbe']).toMatchObject({ httpGet: { path: '/healthz', port: 8093 } });
    expect(c['readinessProbe']).toMatchObject({ httpGet: { path: '/readyz', port: 8093 } });
    expect(c['resources']).toMatchObject({
      requests: { cpu: expect.any(String), memory: expect.any(String) },
      limits: { memory: expect.any(String) },
    });
    expect(c['securityContext']).toEqual({
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      runAsNonRoot: true,
      capabilities: { drop: ['ALL'] },
    });
    expect(podSpec(objs).securityContext).toMatchObject({ runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } });
    expect(find(objs, 'Service', 'cluster1')).toMatchObject({
      spec: { type: 'ExternalName', externalName: 'kubernetes.default.svc.cluster.local' },
    });
    expect(find(renderAgentInstall({ ...base, facts }), 'Service', 'cluster1')).toMatchObject({
      spec: { externalName: 'kubernetes.default.svc.corp.local' },
    });
    expect(renderAgentInstall({ ...base, persistCredentials: false }).length).toBe(objs.length);
    expect(podSpec(renderAgentInstall({ ...base, persistCredentials: false })).containers[0]!.args).not.toContain(
      '--credentials-secret=cluster-proxy-agent-credentials',
    );
  });

  it('no proxy configured: no proxy env, the hub CA alone in the trust bundle', () => {
    const objs = renderAgentInstall({ ...base, facts });
    for (const c of allContainers(objs)) expect(c.env).toEqual([]);
    expect(secretData(objs, 'cluster-proxy-hub-ca', 'ca.crt')).toBe(hubCa);
  });

  for (const [name, input, scheme] of [
    ['https', httpsProxy, 'https'],
    ['http', httpProxy, 'http'],
  ] as const) {
    it(`${name} proxy: upper- and lower-case env on every container, NO_PROXY with the cluster ranges and the apiserver`, () => {
      const objs = renderAgentInstall(input);
      const containers = allContainers(objs);
      expect(containers.length).toBeGreaterThan(0);
      for (const c of containers) {
        const env = envOf(c);
        for (const v of ['HTTP_PROXY', 'HTTPS_PROXY', 'NO_PROXY']) {
          expect(env[v], `${c.name} ${v}`).toBeDefined();
          expect(env[v.toLowerCase()], `${c.name} ${v.toLowerCase()}`).toBe(env[v]);
        }
        expect(env['HTTPS_PROXY']!.startsWith(`${scheme}://`)).toBe(true);
        const noProxy = env['NO_PROXY']!.split(',');
        for (const entry of [
          '.corp.example',
          '10.244.0.0/16',
          'fd00:10:244::/56',
          '10.96.0.0/12',
          '10.96.0.1',
          '.svc',
          '.corp.local',
          '169.254.169.254',
        ])
          expect(noProxy).toContain(entry);
        expect(new Set(noProxy).size).toBe(noProxy.length);
      }
    });
  }

  it('https proxy: its caBundle joins the hub CA in the trust bundle and --proxy-ca points at it; an http proxy leaves the bundle alone', () => {
    const objs = renderAgentInstall(httpsProxy);
    const bundle = secretData(objs, 'cluster-proxy-hub-ca', 'ca.crt');
    expect(flat(bundle)).toContain(flat(hubCa));
    expect(flat(bundle)).toContain(flat(proxyCa));
    expect(podSpec(objs).containers[0]!.args).toContain('--proxy-ca=/etc/cluster-proxy/hub-ca/ca.crt');
    const plain = renderAgentInstall(httpProxy);
    expect(secretData(plain, 'cluster-proxy-hub-ca', 'ca.crt')).toBe(hubCa);
    expect(podSpec(plain).containers[0]!.args.some((a) => a.startsWith('--proxy-ca'))).toBe(false);
  });

  it('the bootstrap token is only in its Secret; no secret value in any label or annotation', () => {
    const objs = renderAgentInstall(httpsProxy);
    const tokenB64 = Buffer.from(TOKEN).toString('base64');
    const holders = objs.filter((o) => JSON.stringify(o).includes(TOKEN) || JSON.stringify(o).includes(tokenB64));
    expect(holders.map((o) => `${o.kind}/${o.metadata.name}`)).toEqual(['Secret/cluster-proxy-bootstrap']);
    expect(secretData(objs, 'cluster-proxy-bootstrap', 'token')).toBe(TOKEN);
    const metas: unknown[] = [];
    for (const o of objs) {
      metas.push(o.metadata.labels, o.metadata.annotations);
      const tpl = (o as { spec?: { template?: { metadata?: { labels?: unknown; annotations?: unknown } } } }).spec?.template?.metadata;
      metas.push(tpl?.labels, tpl?.annotations);
    }
    const text = JSON.stringify(metas);
    for (const secret of [TOKEN, tokenB64, PROXY_PASSWORD, flat(hubCa).slice(0, 40)]) expect(text).not.toContain(secret);
  });

  it('is deterministic: same input, same objects and YAML; nodeSelector order does not matter', () => {
    const placed = (sel: Record<string, string>): AgentInstallInput => ({ ...httpsProxy, nodePlacement: { nodeSelector: sel } });
    const a = toYaml(renderAgentInstall(placed({ 'node-role.kubernetes.io/infra': '', zone: 'a' })));
    const b = toYaml(renderAgentInstall(placed({ zone: 'a', 'node-role.kubernetes.io/infra': '' })));
    expect(a).toBe(b);
    expect(toYaml(renderAgentInstall(base))).toBe(toYaml(renderAgentInstall(structuredClone(base))));
  });

  it('toYaml: multi-document YAML that parses back to the same objects', () => {
    const objs = renderAgentInstall(httpsProxy);
    const text = toYaml(objs);
    expect(text.match(/^---$/gm)?.length).toBe(objs.length);
    expect(parseAllDocuments(text).map((d) => d.toJSON() as unknown)).toEqual(objs);
  });

  it('node placement, pull secrets and resources reach the pod', () => {
    const objs = renderAgentInstall({
      ...base,
      nodePlacement: {
        nodeSelector: { 'kubernetes.io/os': 'linux' },
        tolerations: [{ key: 'node-role.kubernetes.io/infra', operator: 'Exists', effect: 'NoSchedule' }],
      },
      imagePullSecrets: ['regcred'],
      resources: { requests: { memory: '32Mi', cpu: '10m' }, limits: { memory: '128Mi' } },
    });
    const spec = podSpec(objs);
    expect(spec.nodeSelector).toEqual({ 'kubernetes.io/os': 'linux' });
    expect(spec.tolerations).toEqual([{ key: 'node-role.kubernetes.io/infra', operator: 'Exists', effect: 'NoSchedule' }]);
    expect(spec.imagePullSecrets).toEqual([{ name: 'regcred' }]);
    expect((spec.containers[0] as unknown as { resources: unknown }).resources).toEqual({
      requests: { cpu: '10m', memory: '32Mi' },
      limits: { memory: '128Mi' },
    });
    expect(podSpec(renderAgentInstall(base)).nodeSelector).toBeUndefined();
  });

  it('the agent memory budget follows from its memory limit (the default limit gives the default budget)', () => {
    const budgetArg = (resources?: AgentInstallInput['resources']): string | undefined =>
      (podSpec(renderAgentInstall({ ...base, resources })).containers[0] as unknown as { args: string[] }).args.find((a) =>
        a.startsWith('--memory-budget='),
      );
    expect(budgetArg()).toBe('--memory-budget=64Mi');
    expect(
      (podSpec(renderAgentInstall(base)).containers[0] as unknown as { resources: { limits: { memory: string } } }).resources.limits.memory,
    ).toBe('256Mi');
    expect(budgetArg({ limits: { memory: '512Mi' } })).toBe('--memory-budget=166Mi');
    expect(budgetArg({ limits: { memory: '1Gi' } })).toBe('--memory-budget=371Mi');
    expect(budgetArg({ limits: { memory: '268435456' } })).toBe('--memory-budget=64Mi');
    expect(budgetArg({ limits: { memory: '192Mi' } })).toBe('--memory-budget=38Mi');
    expect(budgetArg({ limits: { memory: '64Mi' } })).toBe('--memory-budget=8Mi'); // a floor, not zero
    expect(budgetArg({ requests: { memory: '32Mi' } })).toBe('--memory-budget=64Mi'); // no limit: the default
  });

  describe('bad input fails with the field named, before anything is rendered', () => {
    const cases: [string, Partial<AgentInstallInput>, RegExp][] = [
      ['cluster with a capital', { cluster: 'Cluster1' }, /^cluster: "Cluster1" cannot be installed/],
      ['cluster with a dot (not a Service name)', { cluster: 'c1.prod' }, /^cluster: .*DNS label/],
      ['cluster starting with a digit', { cluster: '1c' }, /^cluster: /],
      ['empty cluster', { cluster: '' }, /^cluster: is required/],
      ['bad namespace', { installNamespace: 'Agents_NS' }, /^installNamespace: /],
      ['hub without a port', { agentEntrypoint: 'proxy.hub.example.com' }, /^agentEntrypoint: "proxy.hub.example.com" is not HOST:PORT/],
      ['hub port out of range', { agentEntrypoint: 'hub:70000' }, /^agentEntrypoint: .*out of range/],
      ['hub with a scheme', { agentEntrypoint: 'https://hub:8091' }, /^agentEntrypoint: /],
      ['hub host with a space', { agentEntrypoint: 'hub x:8091' }, /^agentEntrypoint: /],
      ['bad server name', { serverName: 'not a name' }, /^serverName: /],
      ['no CA', { caBundle: '' }, /^caBundle: is required/],
      // The PEM markers are built at run time: no key-looking literal in the repository.
      [
        'a key instead of a CA',
        { caBundle: `${['-----BEGIN', 'PRIVATE', 'KEY-----'].join(' ')}\nAAAA\n${['-----END', 'PRIVATE', 'KEY-----'].join(' ')}\n` },
        /^caBundle: the hub CA bundle is not usable: .*PRIVATE KEY/,
      ],
      ['zero replicas', { agentReplicas: 0 }, /^agentReplicas: 0 is not a whole number/],
      ['fractional replicas', { agentReplicas: 1.5 }, /^agentReplicas: /],
      ['image with a space', { image: 'quay.io/x y' }, /^image: /],
      ['proxy with an unsupported scheme', { proxyConfig: { httpsProxy: 'socks5://proxy:1080' } }, /^proxyConfig\.httpsProxy: .*socks5/],
      ['proxy CA that is not PEM', { proxyConfig: { httpsProxy: 'https://proxy:3129', caBundle: 'garbage' } }, /^proxyConfig\.caBundle: /],
      ['pod CIDR that is not one', { facts: { podCidrs: ['10.244.0.0/33'] } }, /^facts\.podCidrs: /],
      ['apiserver IP that is not one', { apiserverIp: 'kubernetes' }, /^facts\.apiserverIp: /],
      ['cluster domain', { facts: { clusterDomain: 'bad domain' } }, /^facts\.clusterDomain: /],
      ['node selector value', { nodePlacement: { nodeSelector: { zone: 'a b' } } }, /^nodePlacement\.nodeSelector: /],
      [
        'toleration operator',
        { nodePlacement: { tolerations: [{ key: 'k', operator: 'Maybe' }] } },
        /^nodePlacement\.tolerations\[0\]\.operator: /,
      ],
      [
        'toleration with an unknown field',
        { nodePlacement: { tolerations: [{ key: 'k', colour: 'red' }] } },
        /^nodePlacement\.tolerations\[0\]: unknown field "colour"/,
      ],
      ['pull secret name', { imagePullSecrets: ['Reg Cred'] }, /^imagePullSecrets: /],
      ['resource quantity', { resources: { limits: { memory: 'lots' } } }, /^resources\.limits\.memory: /],
    ];
    for (const [name, patch, message] of cases) {
      it(name, () => {
        let err: unknown;
        try {
          renderAgentInstall({ ...base, ...patch });
        } catch (e) {
          err = e;
        }
        expect(err).toBeInstanceOf(ManifestInputError);
        expect((err as Error).message).toMatch(message);
        expect((err as Error).message).not.toContain('\n');
      });
    }

    it('a bad token is refused without echoing it; a proxy password never appears in an error', () => {
      const badToken = 'tok en-with-space';
      expect(() => renderAgentInstall({ ...base, bootstrapToken: badToken })).toThrow(/^bootstrapToken: /);
      try {
        renderAgentInstall({ ...base, bootstrapToken: badToken });
      } catch (e) {
        expect((e as Error).message).not.toContain('tok en');
      }
      try {
        renderAgentInstall({ ...base, proxyConfig: { httpsProxy: `ftp://u:${PROXY_PASSWORD}@proxy:21` } });
        expect.unreachable();
      } catch (e) {
        expect((e as Error).message).toMatch(/^proxyConfig\.httpsProxy: /);
        expect((e as Error).message).not.toContain(PROXY_PASSWORD);
      }
    });

    it('accepts IPv6 and IP entrypoints', () => {
      expect(() => renderAgentInstall({ ...base, agentEntrypoint: '[fd00::1]:8091' })).not.toThrow();
      expect(() => renderAgentInstall({ ...base, agentEntrypoint: '192.0.2.10:443' })).not.toThrow();
      expect(() => renderAgentInstall({ ...base, agentEntrypoint: '[not-v6]:443' })).toThrow(/^agentEntrypoint: /);
    });
  });
});
