// The agent install manifests: every object valid against Kubernetes' schemas, and the behaviour the
// issue asks for (proxy env on every container, NO_PROXY with the cluster's ranges, https proxy CA in
// the trust bundle, the token only in its Secret, OCM names).
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { createCA, manifestsToYaml, renderAgentInstall, type AgentInstallInput, type KubeManifest } from '@cluster-proxy/server';
import { runCommand } from './fixtures/index.js';
import { CLI } from './harness.js';
import { validateKubeObject } from './kube-schemas.js';

const hubCa = createCA({ commonName: 'hub-ca' }).certPem;
const proxyCa = createCA({ commonName: 'proxy-ca' }).certPem;
const TOKEN = 'abcdef.0123456789abcdef';
const base: AgentInstallInput = {
  cluster: 'cluster1',
  installNamespace: 'open-cluster-management-agent-addon',
  agentEntrypoint: 'proxy.hub.example.com:8091',
  caBundle: hubCa,
  bootstrapToken: TOKEN,
  agentReplicas: 2,
};
const withProxy: AgentInstallInput = {
  ...base,
  podCidr: '10.244.0.0/16',
  serviceCidr: '10.96.0.0/12',
  apiserverIp: '10.96.0.1',
  proxyConfig: {
    httpsProxy: 'https://proxy.corp.example:3129',
    httpProxy: 'http://proxy.corp.example:3128',
    noProxy: '.corp.example',
    caBundle: proxyCa,
  },
};
const variants: [string, AgentInstallInput][] = [
  ['without a proxy', base],
  ['with an https proxy', withProxy],
  ['with an http proxy', { ...withProxy, proxyConfig: { ...withProxy.proxyConfig, httpsProxy: 'http://proxy.corp.example:3128' } }],
  ['with the HTTP gateway (the right to impersonate)', { ...base, gateway: true }],
  [
    'with node placement, pull secrets, an IPv6 hub and a server name',
    {
      ...base,
      agentEntrypoint: '[fd00::10]:8091',
      serverName: 'hub.internal',
      imagePullSecrets: ['regcred'],
      nodePlacement: {
        nodeSelector: { 'kubernetes.io/os': 'linux' },
        tolerations: [
          { key: 'node-role.kubernetes.io/infra', operator: 'Exists', effect: 'NoSchedule' },
          { operator: 'Exists', effect: 'NoExecute', tolerationSeconds: 30 },
        ],
      },
    },
  ],
];
const find = (objs: KubeManifest[], kind: string, name?: string) =>
  objs.find((o) => o.kind === kind && (name === undefined || o.metadata.name === name))!;
const container = (objs: KubeManifest[]) =>
  (
    find(objs, 'Deployment') as unknown as {
      spec: { template: { spec: { containers: { env: { name: string; value: string }[]; args: string[] }[] } } };
    }
  ).spec.template.spec.containers;

describe('agent install manifests', () => {
  for (const [name, input] of variants) {
    it(`validate against Kubernetes schemas (${name}), and survive YAML`, () => {
      const objs = renderAgentInstall(input);
      for (const o of objs) validateKubeObject(o);
      const docs = parseAllDocuments(manifestsToYaml(objs)).map((d) => d.toJSON() as KubeManifest);
      expect(docs).toEqual(objs);
      const clusterScoped = new Set(['Namespace', 'ClusterRole', 'ClusterRoleBinding']);
      for (const o of objs)
        if (!clusterScoped.has(o.kind)) expect(o.metadata.namespace, `${o.kind} ${o.metadata.name}`).toBe(input.installNamespace);
    });
  }

  it('every flag rendered into the Deployment is one the real agent CLI accepts', async () => {
    for (const [name, input] of variants) {
      const args = container(renderAgentInstall(input))[0]!.args;
      expect(args[0]).toBe('agent');
      // --help after the flags: the parser rejects an unknown flag (exit 2) before printing help (exit 0).
      const r = await runCommand(process.execPath, [CLI, ...args, '--help'], { timeoutMs: 20_000 });
      expect(r.code, `${name}: ${r.stderr}`).toBe(0);
    }
  });

  it('the schema check catches a broken object', () => {
    const objs = renderAgentInstall(base);
    const bad = structuredClone(find(objs, 'Deployment')) as KubeManifest & { spec: { replicas: unknown } };
    bad.spec.replicas = 'two';
    expect(() => validateKubeObject(bad)).toThrow(/does not match the Kubernetes schema/);
  });

  it('OCM names: the ExternalName Service CLUSTER → the apiserver, the agent Deployment, its Role for the lease', () => {
    const objs = renderAgentInstall(base);
    expect(find(objs, 'Service', 'cluster1')).toMatchObject({
      spec: { type: 'ExternalName', externalName: 'kubernetes.default.svc.cluster.local' },
    });
    expect(find(objs, 'Deployment').metadata.name).toBe('cluster-proxy-proxy-agent');
    expect(JSON.stringify(find(objs, 'Role'))).toContain('"leases"');
    expect(container(objs)[0]!.args).toEqual(
      expect.arrayContaining([
        '--cluster=cluster1',
        '--hub=proxy.hub.example.com:8091',
        '--bootstrap-token-file=/etc/cluster-proxy/bootstrap/token',
      ]),
    );
  });

  it('proxy env (upper and lower case) on every container, NO_PROXY with the cluster ranges and apiserver; https proxy CA joins the trust bundle', () => {
    const objs = renderAgentInstall(withProxy);
    for (const c of container(objs)) {
      const env = Object.fromEntries(c.env.map((e) => [e.name, e.value]));
      expect(env['HTTPS_PROXY']).toBe('https://proxy.corp.example:3129');
      expect(env['https_proxy']).toBe(env['HTTPS_PROXY']);
      for (const entry of ['10.244.0.0/16', '10.96.0.0/12', '10.96.0.1', '.corp.example', '.svc'])
        expect(env['NO_PROXY']!.split(',')).toContain(entry);
      expect(env['no_proxy']).toBe(env['NO_PROXY']);
      expect(c.args).toContain('--proxy-ca=/etc/cluster-proxy/hub-ca/ca.crt');
    }
    const bundle = Buffer.from(
      (find(objs, 'Secret', 'cluster-proxy-hub-ca') as unknown as { data: Record<string, string> }).data['ca.crt']!,
      'base64',
    ).toString();
    const flat = (pem: string): string => pem.replace(/-----[A-Z ]+-----|\s+/g, '');
    expect(flat(bundle)).toContain(flat(hubCa));
    expect(flat(bundle)).toContain(flat(proxyCa));
    expect(container(renderAgentInstall(base))[0]!.env).toEqual([]);
  });

  it('the token appears only in the bootstrap Secret, and deterministically', () => {
    const objs = renderAgentInstall(base);
    const holders = objs.filter(
      (o) => JSON.stringify(o).includes(Buffer.from(TOKEN).toString('base64')) || JSON.stringify(o).includes(TOKEN),
    );
    expect(holders.map((o) => `${o.kind}/${o.metadata.name}`)).toEqual(['Secret/cluster-proxy-bootstrap']);
    expect(manifestsToYaml(renderAgentInstall(base))).toBe(manifestsToYaml(objs));
  });

  it('bad proxy settings fail with the field named', () => {
    expect(() => renderAgentInstall({ ...base, proxyConfig: { httpsProxy: 'ftp://x' } })).toThrow(/httpsProxy/);
  });
});
