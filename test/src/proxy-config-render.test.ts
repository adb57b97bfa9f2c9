// `cluster-proxy proxy-config render` output checked by the programs and schemas that read it (docs/egress-proxy.md):
// the drop-ins by systemd's own `systemd-analyze verify`, the kubeadm patches against Cluster API's
// v1beta1 schema (the fields we write, transcribed in fixtures/schemas), the Kyverno policy against
// Kyverno's CRD schema (`@kubernetes-models/kyverno`). The real CLI process renders each.
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Ajv2020 } from 'ajv/dist/2020.js';
import { ClusterPolicy } from '@kubernetes-models/kyverno/kyverno.io/v1/ClusterPolicy';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { runCommand } from './fixtures/index.js';
import { CLI } from './harness.js';

const SCHEMA_FILE = fileURLToPath(new URL('../../test/src/fixtures/schemas/capi-kubeadm-v1beta1.schema.json', import.meta.url));
const CA_FILE = fileURLToPath(new URL('../../cli/src/testdata/proxy-config/proxy-ca.crt', import.meta.url));
/** A password with characters systemd (%), YAML (:#) and the shell (') treat specially. */
const PASSWORD = "p%w:d#'x";
const INPUT = [
  '--http-proxy',
  'http://proxy.corp.example:3128',
  '--https-proxy',
  `https://alice:${encodeURIComponent(PASSWORD)}@proxy.corp.example:3129`,
  '--ca-bundle',
  CA_FILE,
  '--no-proxy',
  'corp.example',
  '--pod-cidr',
  '10.244.0.0/16,fd00:10:244::/56',
  '--service-cidr',
  '10.96.0.0/12',
  '--apiserver-ip',
  '10.96.0.1',
  '--hub',
  'hub.example.com:8091',
  '--show-secrets',
];

async function render(format: string, extra: string[] = []): Promise<string> {
  const r = await runCommand(process.execPath, [CLI, 'proxy-config', 'render', '--format', format, ...INPUT, ...extra]);
  expect(r.code, r.stderr).toBe(0);
  return r.stdout;
}

function documents(text: string): Record<string, unknown>[] {
  return parseAllDocuments(text).map((d) => {
    expect(d.errors, String(d.errors)).toEqual([]);
    return d.toJS() as Record<string, unknown>;
  });
}

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'cp-render-schemas-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('systemd drop-ins', () => {
  const analyze = ['/usr/bin/systemd-analyze', '/bin/systemd-analyze'].find((p) => existsSync(p));

  it.skipIf(!analyze)('systemd-analyze verify loads both drop-ins without a warning (the password needs %% there)', async () => {
    const out = path.join(dir, 'systemd');
    const r = await runCommand(process.execPath, [CLI, 'proxy-config', 'render', '--format', 'systemd', ...INPUT, '--out', out]);
    expect(r.code, r.stderr).toBe(0);
    for (const unit of ['containerd', 'kubelet']) {
      // A stand-in unit of the same name, so systemd resolves the drop-in directory beside it.
      const unitDir = path.join(out, 'etc/systemd/system');
      await writeFile(path.join(unitDir, `${unit}.service`), `[Unit]\nDescription=${unit} stand-in\n[Service]\nExecStart=/bin/true\n`);
      const v = await runCommand(analyze!, ['verify', path.join(unitDir, `${unit}.service`)], {
        env: { ...process.env, SYSTEMD_UNIT_PATH: `${unitDir}:` },
      });
      const complaints = v.stderr.split('\n').filter((l) => l.includes('http-proxy.conf'));
      expect(complaints, v.stderr).toEqual([]);
      expect(v.code, v.stderr).toBe(0);
    }
  });

  it.skipIf(!analyze)('the same check does catch a drop-in with an unescaped %', async () => {
    const unitDir = path.join(dir, 'broken');
    await mkdir(path.join(unitDir, 'containerd.service.d'), { recursive: true });
    await writeFile(path.join(unitDir, 'containerd.service'), '[Service]\nExecStart=/bin/true\n');
    await writeFile(
      path.join(unitDir, 'containerd.service.d', 'http-proxy.conf'),
      '[Service]\nEnvironment="HTTPS_PROXY=http://u:a%40b@proxy:3128"\n',
    );
    const v = await runCommand(analyze!, ['verify', path.join(unitDir, 'containerd.service')], {
      env: { ...process.env, SYSTEMD_UNIT_PATH: `${unitDir}:` },
    });
    expect(v.stderr).toContain('http-proxy.conf');
  });

  it('says why when systemd-analyze is missing here', () => {
    if (!analyze)
      console.warn(
        'systemd-analyze not installed: the drop-ins are checked by the systemd-style parser in cli/src/proxy-config.test.ts only',
      );
    expect(true).toBe(true);
  });
});

describe('kubeadm (Cluster API v1beta1)', () => {
  const ajv = new Ajv2020({ allErrors: true, strict: false });
  let schema: Record<string, unknown>;
  beforeAll(async () => {
    schema = JSON.parse(await readFile(SCHEMA_FILE, 'utf8')) as Record<string, unknown>;
    ajv.addSchema(schema, 'capi');
  });
  const check = (kind: string, obj: unknown): void => {
    const validate = ajv.getSchema(`capi#/$defs/${kind}`)!;
    expect(validate(obj), JSON.stringify(validate.errors)).toBe(true);
  };

  it('the KubeadmConfigTemplate is valid as rendered; the KubeadmControlPlane patch is valid merged into a minimal object', async () => {
    const [kcp, kct] = documents(await render('kubeadm'));
    expect(kcp!['kind']).toBe('KubeadmControlPlane');
    expect(kct!['kind']).toBe('KubeadmConfigTemplate');
    check('KubeadmConfigTemplate', kct);
    // The patch alone lacks what only the user's object has (version, machineTemplate): merge it the way
    // `kubectl patch --type merge` does into the smallest valid control plane.
    const spec = kcp!['spec'] as { kubeadmConfigSpec: unknown };
    check('kubeadmConfigSpec', spec.kubeadmConfigSpec);
    check('KubeadmControlPlane', {
      ...kcp,
      spec: {
        version: 'v1.31.0',
        machineTemplate: {
          infrastructureRef: { apiVersion: 'infrastructure.cluster.x-k8s.io/v1beta1', kind: 'DockerMachineTemplate', name: 'cp' },
        },
        ...spec,
      },
    });
  });

  it('the schema check fails on what CAPI would refuse', () => {
    const validate = ajv.getSchema('capi#/$defs/kubeadmConfigSpec')!;
    expect(validate({ files: [{ content: 'x' }] })).toBe(false); // no path
    expect(validate({ preKubeadmCommand: ['x'] })).toBe(false); // misspelt field
    expect(validate({ files: [{ path: '/x', encoding: 'zip' }] })).toBe(false);
  });

  it('the exports are shell-quoted: a POSIX shell reads the password back exactly', async () => {
    const [, kct] = documents(await render('kubeadm'));
    const commands = (kct!['spec'] as { template: { spec: { preKubeadmCommands: string[] } } }).template.spec.preKubeadmCommands;
    const exports = commands.filter((c) => c.startsWith('export '));
    expect(exports).toHaveLength(6);
    const r = await runCommand('sh', ['-c', `${exports.join('\n')}\nprintf '%s' "$HTTPS_PROXY"`]);
    expect(r.stdout).toBe(`https://alice:${encodeURIComponent(PASSWORD)}@proxy.corp.example:3129`);
  });
});

describe('Kyverno ClusterPolicy', () => {
  it("is valid against Kyverno's CRD schema, with its exclusions explicit", async () => {
    const [policy] = documents(
      await render('kyverno', ['--exclude-namespace', 'kube-system,kyverno', '--exclude-namespace', 'cert-manager']),
    );
    expect(() => new ClusterPolicy(policy as never).validate()).not.toThrow();
    const rules = (
      policy!['spec'] as {
        rules: { name: string; exclude: { any: { resources: { namespaces: string[] } }[] }; mutate: { foreach: unknown[] } }[];
      }
    ).rules;
    expect(rules.map((r) => r.name)).toEqual(['proxy-env-containers', 'proxy-env-init-containers']);
    for (const r of rules) {
      expect(r.exclude.any[0]!.resources.namespaces).toEqual(['kube-system', 'kyverno', 'cert-manager']);
      expect(r.mutate.foreach).toHaveLength(6);
    }
  });

  it('the same check fails on an operator Kyverno does not have, or a wrong type', () => {
    const policy = (operator: string, background: unknown): unknown => ({
      apiVersion: 'kyverno.io/v1',
      kind: 'ClusterPolicy',
      metadata: { name: 'x' },
      spec: {
        background,
        rules: [
          {
            name: 'r',
            match: { any: [{ resources: { kinds: ['Pod'] } }] },
            mutate: { foreach: [{ list: 'x', preconditions: { all: [{ key: 'a', operator, value: 'b' }] }, patchStrategicMerge: {} }] },
          },
        ],
      },
    });
    expect(() => new ClusterPolicy(policy('AnyNotIn', false) as never).validate()).not.toThrow();
    expect(() => new ClusterPolicy(policy('NotInAny', false) as never).validate()).toThrow(/operator/);
    expect(() => new ClusterPolicy(policy('AnyNotIn', 'no') as never).validate()).toThrow(/background/);
  });
});
