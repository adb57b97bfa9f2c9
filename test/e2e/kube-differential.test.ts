// The same requests to our API stand-in (test/src/fixtures/kube-api-server.ts) and to a real kube-apiserver
// (test/src/fixtures/real-kube.ts), answers compared: status codes, Status reasons, the key order of what
// comes back, resourceVersion conflicts, generation, pruning, the status subresource. Where they differ the
// stand-in is what is wrong: it is what most of our Kubernetes-store and OCM tests run against.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startFakeKubeApiServer, startRealKube, type FakeKubeApiServer, type RealKube } from '../src/fixtures/index.js';
import { createPki, type TestPki } from '../src/harness.js';
import { SAMPLE_CSR } from '../src/store-conformance.js';

const START_TIMEOUT_MS = 45 * 60_000;
const NS = 'c1';

interface Answer {
  status: number;
  /** The Status reason of an error. */
  reason?: string;
  /** The object's keys, and its spec's, in the order they came. */
  keys?: string[];
  specKeys?: string[];
  body: Record<string, unknown>;
}

type Send = (method: string, urlPath: string, body?: unknown) => Promise<Answer>;

function answer(status: number, text: string): Answer {
  let body: Record<string, unknown> = {};
  try {
    body = JSON.parse(text) as Record<string, unknown>;
  } catch {
    // not JSON
  }
  const spec = body['spec'];
  return {
    status,
    ...(body['kind'] === 'Status' && typeof body['reason'] === 'string' ? { reason: body['reason'] } : {}),
    ...(body['kind'] !== 'Status' ? { keys: Object.keys(body) } : {}),
    ...(spec && typeof spec === 'object' ? { specKeys: Object.keys(spec) } : {}),
    body,
  };
}

const ADDONS = `/apis/addon.open-cluster-management.io/v1alpha1/namespaces/${NS}/managedclusteraddons`;
const MPCS = '/apis/proxy.open-cluster-management.io/v1alpha1/managedproxyconfigurations';
const LEASES = `/apis/coordination.k8s.io/v1/namespaces/${NS}/leases`;

/** An addon whose keys are not in sorted order, at the top and in spec. */
const addon = (name: string, extra: Record<string, unknown> = {}): Record<string, unknown> => ({
  kind: 'ManagedClusterAddOn',
  apiVersion: 'addon.open-cluster-management.io/v1alpha1',
  metadata: { name, namespace: NS },
  spec: {
    installNamespace: 'ns-b',
    configs: [{ resource: 'addondeploymentconfigs', group: 'addon.open-cluster-management.io', name: 'x', namespace: NS }],
  },
  ...extra,
});

describe('our API stand-in answers as a real kube-apiserver does', () => {
  let pki: TestPki;
  let fake: FakeKubeApiServer;
  let real: RealKube;
  const send: Record<'fake' | 'real', Send> = {} as Record<'fake' | 'real', Send>;

  beforeAll(async () => {
    pki = await createPki();
    fake = await startFakeKubeApiServer({ namespaces: [NS] });
    const kubeconfig = path.join(pki.dir, 'fake.kubeconfig');
    await fake.writeKubeconfig(kubeconfig);
    const token = (JSON.parse(await readFile(kubeconfig, 'utf8')) as { users: { user: { token: string } }[] }).users[0]!.user.token;
    send.fake = async (method, urlPath, body) => {
      const res = await fetch(`${fake.url}${urlPath}`, {
        method,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      });
      return answer(res.status, await res.text());
    };
    // OCM's CRDs, as the stand-in validates with (our chart's keep unknown fields in spec and status).
    real = await startRealKube({ controllerManager: false });
    await real.applyOcmCrds(['ManagedClusterAddOn', 'ManagedProxyConfiguration']);
    expect((await real.request('POST', '/api/v1/namespaces', { apiVersion: 'v1', kind: 'Namespace', metadata: { name: NS } })).status).toBe(
      201,
    );
    send.real = async (method, urlPath, body) => {
      const r = await real.request(method, urlPath, body);
      return answer(r.status, r.text);
    };
  }, START_TIMEOUT_MS);
  afterAll(async () => {
    await fake?.close();
    await real?.stop();
    await pki?.cleanup();
  });

  /** Runs `steps` against both and returns both answers, step by step. */
  async function both(steps: (s: Send) => Promise<Answer[]>): Promise<{ fake: Answer[]; real: Answer[] }> {
    return { fake: await steps(send.fake), real: await steps(send.real) };
  }
  const shape = (as: Answer[]) => as.map(({ status, reason, keys, specKeys }) => ({ status, reason, keys, specKeys }));

  it('a custom resource comes back with its keys sorted (Go encodes maps so), on create, get and list', async () => {
    const r = await both(async (s) => {
      const created = await s('POST', ADDONS, addon('sorted'));
      const got = await s('GET', `${ADDONS}/sorted`);
      const list = await s('GET', ADDONS);
      const item = (list.body['items'] as Record<string, unknown>[]).find((i) => (i['metadata'] as { name: string }).name === 'sorted')!;
      return [created, got, answer(list.status, JSON.stringify(item))];
    });
    expect(shape(r.real)[0]).toEqual({
      status: 201,
      reason: undefined,
      keys: ['apiVersion', 'kind', 'metadata', 'spec'],
      specKeys: ['configs', 'installNamespace'],
    });
    expect(shape(r.fake)).toEqual(shape(r.real));
    // Nested objects too.
    const config = (a: Answer) => Object.keys((a.body['spec'] as { configs: Record<string, unknown>[] }).configs[0]!);
    expect(config(r.real[1]!)).toEqual(['group', 'name', 'namespace', 'resource']);
    expect(config(r.fake[1]!)).toEqual(config(r.real[1]!));
  });

  it('errors: AlreadyExists, NotFound (object, namespace), Conflict on a stale resourceVersion, Invalid, BadRequest on a name mismatch', async () => {
    const r = await both(async (s) => {
      const created = await s('POST', ADDONS, addon('errs'));
      const rv = (created.body['metadata'] as { resourceVersion: string }).resourceVersion;
      const again = await s('POST', ADDONS, addon('errs'));
      const missing = await s('GET', `${ADDONS}/nope`);
      const noNamespace = await s('POST', ADDONS.replace(`/${NS}/`, '/nowhere/'), {
        ...addon('x'),
        metadata: { name: 'x', namespace: 'nowhere' },
      });
      const first = await s('PUT', `${ADDONS}/errs`, {
        ...addon('errs', {}),
        metadata: { name: 'errs', namespace: NS, resourceVersion: rv },
        spec: { installNamespace: 'ns-c' },
      });
      const stale = await s('PUT', `${ADDONS}/errs`, {
        ...addon('errs', {}),
        metadata: { name: 'errs', namespace: NS, resourceVersion: rv },
        spec: { installNamespace: 'ns-d' },
      });
      // OCM's CRD requires spec.authentication, proxyServer and proxyAgent.
      const invalid = await s('POST', MPCS, {
        apiVersion: 'proxy.open-cluster-management.io/v1alpha1',
        kind: 'ManagedProxyConfiguration',
        metadata: { name: 'bad' },
        spec: {},
      });
      const mismatch = await s('PUT', `${ADDONS}/errs`, { ...addon('other') });
      const deleted = await s('DELETE', `${ADDONS}/errs`);
      const deletedAgain = await s('DELETE', `${ADDONS}/errs`);
      return [created, again, missing, noNamespace, first, stale, invalid, mismatch, deleted, deletedAgain];
    });
    const codes = (as: Answer[]) => as.map((a) => `${a.status} ${a.reason ?? ''}`.trim());
    expect(codes(r.real)).toEqual([
      '201',
      '409 AlreadyExists',
      '404 NotFound',
      '404 NotFound',
      '200',
      '409 Conflict',
      '422 Invalid',
      '400 BadRequest',
      '200',
      '404 NotFound',
    ]);
    expect(codes(r.fake)).toEqual(codes(r.real));
  });

  it('generation moves on spec changes only; status is dropped on create and update, unknown fields pruned', async () => {
    const r = await both(async (s) => {
      const created = await s('POST', ADDONS, addon('gen', { status: { namespace: 'from-create' }, extra: 1 }));
      const m = created.body['metadata'] as { resourceVersion: string };
      const labelled = await s('PUT', `${ADDONS}/gen`, { ...created.body, metadata: { ...m, labels: { a: 'b' } } });
      const m2 = labelled.body['metadata'] as { resourceVersion: string };
      const specChanged = await s('PUT', `${ADDONS}/gen`, {
        ...labelled.body,
        metadata: m2,
        spec: { installNamespace: 'ns-z', unknown: true },
      });
      const m3 = specChanged.body['metadata'] as { resourceVersion: string };
      const status = await s('PUT', `${ADDONS}/gen/status`, {
        ...specChanged.body,
        metadata: m3,
        spec: { installNamespace: 'ignored' },
        status: { namespace: 'ns-s' },
      });
      return [created, labelled, specChanged, status];
    });
    const view = (as: Answer[]) =>
      as.map((a) => ({
        status: a.status,
        generation: (a.body['metadata'] as { generation: number }).generation,
        spec: a.body['spec'],
        st: a.body['status'] ?? null,
        extra: a.body['extra'] ?? null,
      }));
    expect(view(r.real)).toEqual([
      { status: 201, generation: 1, spec: addon('x')['spec'], st: null, extra: null },
      { status: 200, generation: 1, spec: addon('x')['spec'], st: null, extra: null },
      { status: 200, generation: 2, spec: { installNamespace: 'ns-z' }, st: null, extra: null },
      { status: 200, generation: 2, spec: { installNamespace: 'ns-z' }, st: { namespace: 'ns-s' }, extra: null },
    ]);
    expect(view(r.fake)).toEqual(view(r.real));
  });

  it('an update that changes nothing (keys in another order included) keeps the resourceVersion; one that changes something moves it', async () => {
    const r = await both(async (s) => {
      const created = await s('POST', ADDONS, addon('noop'));
      const m = created.body['metadata'] as Record<string, unknown>;
      const same = await s('PUT', `${ADDONS}/noop`, { ...created.body, metadata: m });
      // The same content, keys reversed at every level.
      const reversed = JSON.parse(
        JSON.stringify(created.body, (_k, v: unknown) =>
          v && typeof v === 'object' && !Array.isArray(v) ? Object.fromEntries(Object.entries(v).reverse()) : v,
        ),
      ) as Record<string, unknown>;
      const reordered = await s('PUT', `${ADDONS}/noop`, reversed);
      const changed = await s('PUT', `${ADDONS}/noop`, { ...created.body, metadata: m, spec: { installNamespace: 'ns-other' } });
      return [created, same, reordered, changed];
    });
    const rvs = (as: Answer[]) => as.map((a) => (a.body['metadata'] as { resourceVersion: string }).resourceVersion);
    const moves = (as: Answer[]) =>
      rvs(as)
        .slice(1)
        .map((rv, i) => rv !== rvs(as)[i]);
    expect(moves(r.real)).toEqual([false, false, true]);
    expect(moves(r.fake)).toEqual(moves(r.real));
  });

  it('a CSR approval gets the condition times the writer left out; the spec cannot change; /status cannot add an approval condition', async () => {
    const csr = {
      apiVersion: 'certificates.k8s.io/v1',
      kind: 'CertificateSigningRequest',
      metadata: { name: 'csr-d' },
      spec: { request: Buffer.from(SAMPLE_CSR).toString('base64'), signerName: 'example.com/signer', usages: ['client auth'] },
    };
    const CSRS = '/apis/certificates.k8s.io/v1/certificatesigningrequests';
    const r = await both(async (s) => {
      const created = await s('POST', CSRS, csr);
      const approved = await s('PUT', `${CSRS}/csr-d/approval`, {
        ...created.body,
        status: { conditions: [{ type: 'Approved', status: 'True', reason: 'R', message: 'm' }] },
      });
      const spec = await s('PUT', `${CSRS}/csr-d`, { ...approved.body, spec: { ...csr.spec, usages: ['server auth'] } });
      const denied = await s('PUT', `${CSRS}/csr-d/status`, {
        ...approved.body,
        status: {
          conditions: [
            ...(approved.body['status'] as { conditions: unknown[] }).conditions,
            { type: 'Denied', status: 'True', reason: 'R', message: 'm' },
          ],
        },
      });
      return [created, approved, spec, denied];
    });
    const view = (as: Answer[]) => ({
      codes: as.map((a) => `${a.status} ${a.reason ?? ''}`.trim()),
      conditionKeys: Object.keys((as[1]!.body['status'] as { conditions: Record<string, unknown>[] }).conditions[0]!).sort(),
      usages: (as[2]!.body['spec'] as { usages: string[] }).usages,
    });
    expect(view(r.real)).toEqual({
      codes: ['201', '200', '200', '422 Invalid'],
      conditionKeys: ['lastTransitionTime', 'lastUpdateTime', 'message', 'reason', 'status', 'type'],
      usages: ['client auth'],
    });
    expect(view(r.fake)).toEqual(view(r.real));
  });

  it('a Lease (a built-in kind) keeps its MicroTime as sent and its fields in their declared order', async () => {
    const lease = {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: { name: 'l', namespace: NS },
      spec: { renewTime: '2025-01-02T03:04:05.123456Z', holderIdentity: 'a', leaseDurationSeconds: 60 },
    };
    const r = await both(async (s) => [await s('POST', LEASES, lease), await s('GET', `${LEASES}/l`)]);
    expect(r.real.map((a) => a.body['spec'])).toEqual([lease.spec, lease.spec]);
    expect(r.fake.map((a) => a.body['spec'])).toEqual(r.real.map((a) => a.body['spec']));
    // The real one answers in Go struct order (holderIdentity, leaseDurationSeconds, …, renewTime), neither sorted nor as sent.
    expect(r.real[1]!.specKeys).toEqual(['holderIdentity', 'leaseDurationSeconds', 'renewTime']);
  });
});
