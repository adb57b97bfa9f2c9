// The ClusterProfile access provider, as OCM's cluster-proxy writes it (clusterprofile_controller.go @ 8165e8e).
import { describe, expect, it } from 'vitest';
import type { ClusterProfile } from '../store/objects.js';
import { accessProviderOf, isOcmProfile, withAccessProvider } from './cluster-profiles.js';

const opts = { gatewayUrl: 'https://gw.example.com:9092/', caBundle: () => 'PEM' };
const profile = (labels: Record<string, string>, status?: ClusterProfile['status']): ClusterProfile => ({
  apiVersion: 'multicluster.x-k8s.io/v1alpha1',
  kind: 'ClusterProfile',
  metadata: { name: 'c1', namespace: 'set', labels },
  spec: { clusterManager: { name: 'open-cluster-management' } },
  ...(status ? { status } : {}),
});
const OCM = { 'x-k8s.io/cluster-manager': 'open-cluster-management', 'open-cluster-management.io/cluster-name': 'c1' };

describe('ClusterProfile access provider', () => {
  it("only profiles OCM manages and that name their cluster (OCM's predicate)", () => {
    expect(isOcmProfile(profile(OCM))).toBe(true);
    expect(isOcmProfile(profile({ ...OCM, 'x-k8s.io/cluster-manager': 'other' }))).toBe(false);
    expect(isOcmProfile(profile({ 'x-k8s.io/cluster-manager': 'open-cluster-management' }))).toBe(false);
  });
  it('server is the gateway URL and the profile name, CA base64, the exec extension names the cluster', () => {
    expect(accessProviderOf(profile(OCM), opts)).toEqual({
      name: 'open-cluster-management',
      cluster: {
        server: 'https://gw.example.com:9092/c1',
        'certificate-authority-data': Buffer.from('PEM').toString('base64'),
        extensions: [{ name: 'client.authentication.k8s.io/exec', extension: { clusterName: 'c1' } }],
      },
    });
  });
  it('upserts ours in place, keeps the others and any other status field, and says when nothing is to write', () => {
    const other = { name: 'kubeconfig', cluster: { server: 'https://x' } };
    const first = withAccessProvider(profile(OCM, { accessProviders: [other], version: { kubernetes: '1.33' } }), opts)!;
    expect(first.accessProviders!.map((a) => a.name)).toEqual(['kubeconfig', 'open-cluster-management']);
    expect(first['version']).toEqual({ kubernetes: '1.33' });
    expect(first.conditions).toEqual([]);
    expect(withAccessProvider(profile(OCM, first), opts)).toBeNull();
    const stale = { ...first, accessProviders: [{ name: 'open-cluster-management', cluster: { server: 'https://old/c1' } }, other] };
    expect(withAccessProvider(profile(OCM, stale), opts)!.accessProviders!.map((a) => a.cluster?.server)).toEqual([
      'https://gw.example.com:9092/c1',
      'https://x',
    ]);
    // As a real apiserver gives it back: every object's keys sorted. Nothing to write.
    const sorted = JSON.parse(
      JSON.stringify(first, (_k, v: unknown) =>
        v && typeof v === 'object' && !Array.isArray(v) ? Object.fromEntries(Object.entries(v).sort(([a], [b]) => (a < b ? -1 : 1))) : v,
      ),
    ) as typeof first;
    expect(JSON.stringify(sorted.accessProviders![1])).not.toBe(JSON.stringify(first.accessProviders![1]));
    expect(withAccessProvider(profile(OCM, sorted), opts)).toBeNull();
    // A CA rollover changes the bundle: rewritten.
    expect(withAccessProvider(profile(OCM, first), { ...opts, caBundle: () => 'PEM2' })).not.toBeNull();
  });
});
