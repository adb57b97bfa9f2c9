import { describe, expect, it } from 'vitest';
import type { ClusterManagementAddOn, ManagedClusterAddOn } from '../store/objects.js';
import { addonConfigReferences, clusterManagementAddOnStatus, configSpecHash, memoLookup, type ConfigObject } from './config-hashes.js';

// Expected hashes computed by Go 1.26 itself: encoding/json.Marshal of the object minus apiVersion/kind/metadata/
// status, then sha256, as addon-framework's GetSpecHash does (a ten-line Go program over these exact inputs).
const GOLDEN: [string, string][] = [
  [
    '{"apiVersion":"proxy.open-cluster-management.io/v1alpha1","kind":"ManagedProxyConfiguration","metadata":{"name":"cluster-proxy","generation":1},"spec":{"proxyServer":{"image":"quay.io/x:1","entrypoint":{"type":"Hostname","hostname":{"value":"hub.example.com"},"port":8091}},"proxyAgent":{"image":"ghcr.io/a/b:2","replicas":1},"authentication":{"signer":{"type":"SelfSigned"}}},"status":{"conditions":[]}}',
    '261dde3b3a7d32ec29d560d547d74c13d36a55792b4cf21fb9aa445ed37fe5aa',
  ],
  [
    '{"apiVersion":"addon.open-cluster-management.io/v1alpha1","kind":"AddOnDeploymentConfig","metadata":{"name":"c","namespace":"n"},"spec":{"proxyConfig":{"httpProxy":"http://p:3128","noProxy":"a<b>&c,\\u2028\\u2029"},"customizedVariables":[{"name":"z","value":"tab\\there\\u0001\\u007f\\b\\f"}],"agentInstallNamespace":"ns","zeta":0.000001,"tiny":1.5e-7,"big":1e21,"frac":12.5,"neg":-3,"emoji":"😀é","nul":null,"t":true}}',
    '94cfc25cd7abae9be6afeb3f9d2d36a492d6893b416dd9df76d926a4ad4c1b85',
  ],
  [
    '{"kind":"X","spec":{},"extra":[1,2,{"b":1,"a":2,"B":3,"_":4,"é":5,"z":6}]}',
    'c533e78ae2441c9a4ec7b02433319d1e31970ddaeee2c3ec0c9f9e1a3012b154',
  ],
];

const MPC = { group: 'proxy.open-cluster-management.io', resource: 'managedproxyconfigurations' };
const ADC = { group: 'addon.open-cluster-management.io', resource: 'addondeploymentconfigs' };

function configs(objs: Record<string, ConfigObject>) {
  const reads: string[] = [];
  const lookup = memoLookup(async ({ group, resource, name, namespace }) => {
    reads.push(`${resource}/${namespace ?? ''}/${name}`);
    if (group !== MPC.group && group !== ADC.group) return undefined;
    return objs[`${resource}/${namespace ?? ''}/${name}`] ?? null;
  });
  return { lookup, reads };
}

const mpc: ConfigObject = { metadata: { generation: 3 }, spec: { proxyAgent: { replicas: 1 } } };
const adc: ConfigObject = { metadata: { generation: 7 }, spec: { agentInstallNamespace: 'x' } };

describe('config spec hashes (addon-framework GetSpecHash, addonconfig, cmaconfig)', () => {
  it("hashes as Go's encoding/json and sha256 do: sorted keys, HTML escapes, numbers, non-ASCII", () => {
    for (const [json, hash] of GOLDEN) expect(configSpecHash(JSON.parse(json) as Record<string, unknown>), json).toBe(hash);
  });

  it("fills lastObservedGeneration for every found config and the hash only for the addon's spec.configs; null when nothing changes", async () => {
    const { lookup, reads } = configs({ 'managedproxyconfigurations//cluster-proxy': mpc, 'addondeploymentconfigs/c1/adc': adc });
    const addon = {
      metadata: { name: 'cluster-proxy', namespace: 'c1' },
      spec: { configs: [{ ...ADC, name: 'adc', namespace: 'c1' }] },
      status: {
        configReferences: [
          { ...ADC, name: 'adc', namespace: 'c1', desiredConfig: { name: 'adc', namespace: 'c1', specHash: '' } },
          { ...MPC, name: 'cluster-proxy', desiredConfig: { name: 'cluster-proxy', specHash: 'from-the-cma' } },
          { group: 'other.io', resource: 'things', name: 't', desiredConfig: { name: 't', specHash: '' } },
          { ...ADC, name: 'gone', namespace: 'c1', desiredConfig: { name: 'gone', namespace: 'c1', specHash: '' } },
        ],
      },
    } as unknown as ManagedClusterAddOn;
    const refs = (await addonConfigReferences(addon, lookup))!;
    expect(refs[0]).toMatchObject({ lastObservedGeneration: 7, desiredConfig: { specHash: configSpecHash(adc) } });
    // A default's hash is the CMA's (OCM's addon-manager copies it): only the generation is ours.
    expect(refs[1]).toMatchObject({ lastObservedGeneration: 3, desiredConfig: { specHash: 'from-the-cma' } });
    // A kind the addon does not read, and a config that does not exist, are left as they are.
    expect(refs[2]).toEqual(addon.status!.configReferences![2]);
    expect(refs[3]).toEqual(addon.status!.configReferences![3]);
    expect(await addonConfigReferences({ ...addon, status: { configReferences: refs } } as ManagedClusterAddOn, lookup)).toBeNull();
    // Each config read once, however often it is asked for.
    expect(reads.filter((r) => r === 'addondeploymentconfigs/c1/adc')).toHaveLength(1);
  });

  it('writes the ClusterManagementAddOn hashes into defaultconfigReferences and every install progression; a missing config hashes to ""', async () => {
    const { lookup } = configs({ 'managedproxyconfigurations//cluster-proxy': mpc, 'addondeploymentconfigs/ns/adc': adc });
    const cma = {
      metadata: { name: 'cluster-proxy' },
      spec: {},
      status: {
        defaultconfigReferences: [{ ...MPC, desiredConfig: { name: 'cluster-proxy', specHash: '' } }],
        installProgressions: [
          {
            placementRef: { name: 'p', namespace: 'ns' },
            configReferences: [
              { ...ADC, desiredConfig: { name: 'adc', namespace: 'ns', specHash: '' } },
              { ...ADC, desiredConfig: { name: 'missing', namespace: 'ns', specHash: 'stale' } },
              { group: 'other.io', resource: 'things', desiredConfig: { name: 't', specHash: 'kept' } },
            ],
            conditions: [{ type: 'Progressing' }],
          },
        ],
      },
    } as unknown as ClusterManagementAddOn;
    const status = (await clusterManagementAddOnStatus(cma, lookup)) as {
      defaultconfigReferences: { desiredConfig: { specHash: string } }[];
      installProgressions: { configReferences: { desiredConfig: { specHash: string } }[]; conditions: unknown }[];
    };
    expect(status.defaultconfigReferences[0]!.desiredConfig.specHash).toBe(configSpecHash(mpc));
    const p = status.installProgressions[0]!;
    expect(p.configReferences.map((r) => r.desiredConfig.specHash)).toEqual([configSpecHash(adc), '', 'kept']);
    expect(p.conditions).toEqual([{ type: 'Progressing' }]);
    expect(await clusterManagementAddOnStatus({ ...cma, status } as ClusterManagementAddOn, lookup)).toBeNull();
  });
});
