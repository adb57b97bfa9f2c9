// The HTTP gateway with real control planes on both sides (test/src/fixtures/real-kube.ts): one plays the hub's
// API server (`--store kubernetes`; the hub's TokenReviews and SubjectAccessReviews go there), one the managed
// cluster. Each side gets exactly what our install grants: the hub runs as the chart's service account with the
// chart's RBAC (rendered by the real Helm), and the agent's install manifests from `join` are created in the
// managed cluster; the agent calls that apiserver with a token of its ServiceAccount (TokenRequest API), so only
// the ClusterRole cluster-proxy-gateway-impersonator lets it impersonate. What is asserted is what the real
// apiservers answer and what their audit logs say arrived:
//   - the managed cluster's RBAC for the impersonated identity decides (bound → 200, not bound → its own 403), and
//     the audit log names the impersonated user, groups and uid;
//   - SelfSubjectReview (`kubectl auth whoami`) through the gateway returns the caller's identity exactly, a
//     TokenReview's extra attributes and non-ASCII names included;
//   - hostile identities are refused at the hub or arrive neutralised (Impersonate-* from the caller, names with
//     whitespace or control characters, system:masters from a certificate or an OIDC token): the audit log shows
//     nothing arrived, or what did;
//   - the hub's TokenReview and SubjectAccessReview of real ServiceAccount tokens: accepted, refused by RBAC,
//     another audience, a deleted ServiceAccount, a token of another cluster.
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { issueServerCert } from '@cluster-proxy/server';
import {
  CHART_CRDS_DIR,
  httpsAnswer,
  killAllSpawned,
  runCommand,
  hostileOidcHubArgs,
  startOidcIssuer,
  startRealKube,
  waitFor,
  type AuditEvent,
  type HttpsAnswer,
  type OidcIssuer,
  type RealKube,
} from '../src/fixtures/index.js';
import {
  createObjects,
  createServiceAccount,
  installHubIdentity,
  readObjects,
  serviceAccountToken,
  tokenKubeconfig,
  HUB_NAMESPACE,
  type KubeObject,
} from '../src/fixtures/real-install.js';
import {
  CLI,
  createPki,
  expectTablesEmpty,
  startAgent,
  startHub,
  type AgentProcess,
  type HubProcess,
  type TestPki,
  type UserCert,
} from '../src/harness.js';

/** The first start may build the binaries (the script prints its progress); later starts take seconds. */
const START_TIMEOUT_MS = 45 * 60_000;
const HUB_USER = `system:serviceaccount:${HUB_NAMESPACE}:cluster-proxy`;
const PODS = '/cluster1/api/v1/namespaces/default/pods';
const WHOAMI = '/cluster1/apis/authentication.k8s.io/v1/selfsubjectreviews';

let pki: TestPki;
let tmp: string;
let hubKube: RealKube;
let clusterKube: RealKube;
let idp: OidcIssuer;
let hub: HubProcess;
let agent: AgentProcess;
/** The agent's ServiceAccount in the managed cluster, as its install manifests name it. */
let agentUser: string;
/** Hub tokens scoped to cluster1: alice is bound to a Role in the managed cluster, bob is not. */
let alice: { token: string; id: string };
let bob: { token: string; id: string };
let dora: UserCert;
let marker = 0;

interface Caller {
  token?: string;
  cert?: UserCert;
  headers?: Record<string, string>;
  method?: string;
  body?: string;
}

function gw(target: string, o: Caller = {}): Promise<HttpsAnswer> {
  return httpsAnswer(
    {
      host: '127.0.0.1',
      port: hub.ports.gateway!,
      path: target,
      method: o.method ?? 'GET',
      servername: 'localhost',
      ca: pki.ca.certPem,
      ...(o.cert ? { cert: o.cert.cert, key: o.cert.key } : {}),
      headers: {
        ...(o.token ? { authorization: `Bearer ${o.token}` } : {}),
        ...(o.body !== undefined ? { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(o.body)) } : {}),
        ...o.headers,
      },
    },
    o.body,
  );
}

/** The managed apiserver's audit events of requests the agent made (with whatever it impersonated). */
const agentEvents = (events: AuditEvent[]): AuditEvent[] => events.filter((e) => e.user.username === agentUser);

/**
 * What reached the managed apiserver through the agent while `during` ran: afterwards alice sends a marker
 * request; once the audit log holds it, every agent event before it and after the start is returned.
 */
async function arrivedDuring(during: () => Promise<void>): Promise<AuditEvent[]> {
  const before = (await clusterKube.audit()).length;
  await during();
  const tag = `marker-${++marker}`;
  const m = await gw(`${PODS}?labelSelector=${tag}`, { token: alice.token });
  expect(m.status, m.body).toBe(200);
  const events = await waitFor(
    async () => {
      const all = (await clusterKube.audit()).slice(before);
      const i = all.findIndex((e) => e.requestURI.includes(tag));
      return i >= 0 ? all.slice(0, i) : null;
    },
    { timeoutMs: 10_000, intervalMs: 100, message: `the marker ${tag} in the audit log` },
  );
  return agentEvents(events!);
}

/** A refusal by the hub: this status, one line, and nothing arrived at the managed apiserver. */
async function expectRefused(target: string, o: Caller, status: number, body: RegExp): Promise<void> {
  let r: HttpsAnswer | undefined;
  const arrived = await arrivedDuring(async () => {
    r = await gw(target, o);
  });
  expect(r!.status, r!.body).toBe(status);
  expect(r!.body).toMatch(body);
  expect(r!.body.split('\n')).toHaveLength(2);
  expect(arrived.map((e) => e.requestURI)).toEqual([]);
}

/** The agent's requests to a URI holding `uriPart`, as the audit log shows them. */
async function seen(uriPart: string): Promise<AuditEvent[]> {
  return agentEvents(await clusterKube.audit()).filter((e) => e.requestURI.includes(uriPart));
}

async function issueHubToken(name: string): Promise<{ token: string; id: string }> {
  const r = await runCommand(
    process.execPath,
    [CLI, 'token', 'issue', '--name', name, '--cluster', 'cluster1', '--data-dir', hub.dataDir],
    {
      timeoutMs: 20_000,
    },
  );
  expect(r.code, r.stderr).toBe(0);
  const token = r.stdout.trim();
  // The token's id is the caller's uid: the first request's impersonated uid.
  const who = await gw(WHOAMI, {
    token,
    method: 'POST',
    body: JSON.stringify({ apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' }),
  });
  expect(who.status, who.body).toBe(201);
  return { token, id: (JSON.parse(who.body) as { status: { userInfo: { uid: string } } }).status.userInfo.uid };
}

interface UserInfo {
  username: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

async function whoami(o: Caller): Promise<UserInfo> {
  const r = await gw(WHOAMI, {
    ...o,
    method: 'POST',
    body: JSON.stringify({ apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' }),
  });
  expect(r.status, r.body).toBe(201);
  return (JSON.parse(r.body) as { status: { userInfo: UserInfo } }).status.userInfo;
}

const rbac = (kind: string, name: string, rest: Record<string, unknown>, namespace?: string): KubeObject => ({
  apiVersion: 'rbac.authorization.k8s.io/v1',
  kind,
  metadata: { name, ...(namespace ? { namespace } : {}) },
  ...rest,
});

beforeAll(async () => {
  pki = await createPki();
  tmp = await mkdtemp(path.join(os.tmpdir(), 'cp-real-gateway-'));
  // Nothing here needs a controller: no controller manager on either side.
  const crds = (await readdir(CHART_CRDS_DIR)).filter((f) => f.endsWith('.yaml')).map((f) => path.join(CHART_CRDS_DIR, f));
  [hubKube, clusterKube] = await Promise.all([
    startRealKube({ controllerManager: false, crdFiles: crds }),
    startRealKube({ controllerManager: false }),
  ]);
  idp = await startOidcIssuer({ tls: issueServerCert(pki.ca, { commonName: 'idp', ipAddresses: ['127.0.0.1'] }) });

  // The hub: the chart's service account and RBAC (the gateway port is on by default: TokenReview and SAR).
  const hubKubeconfig = await installHubIdentity(hubKube, tmp);
  hub = await startHub(pki, [
    '--gateway-port',
    '0',
    '--store',
    'kubernetes',
    '--kubeconfig',
    hubKubeconfig,
    '--ca-key',
    path.join(pki.dir, 'ca.key'),
    ...hostileOidcHubArgs(idp, pki.caPath),
  ]);

  // The managed cluster: the agent's install manifests as `join` writes them, created as `kubectl apply` would.
  const bundle = path.join(tmp, 'cluster1-bundle');
  const join = await runCommand(process.execPath, [CLI, 'join', 'cluster1', '--out', bundle, '--admin', `127.0.0.1:${hub.ports.admin}`], {
    timeoutMs: 20_000,
  });
  expect(join.code, join.stderr).toBe(0);
  const manifests = await readObjects(path.join(bundle, 'manifests.yaml'));
  expect(manifests.map((o) => `${o.kind}/${o.metadata.name}`)).toEqual(
    expect.arrayContaining(['ClusterRole/cluster-proxy-gateway-impersonator', 'ClusterRoleBinding/cluster-proxy-gateway-impersonator']),
  );
  await createObjects(clusterKube, manifests);
  const sa = manifests.find((o) => o.kind === 'ServiceAccount')!;
  agentUser = `system:serviceaccount:${sa.metadata.namespace}:${sa.metadata.name}`;
  // The agent's gateway credentials: a token of that ServiceAccount, as the pod's projected token would be.
  const agentKubeconfig = await tokenKubeconfig(
    clusterKube,
    path.join(tmp, 'agent.kubeconfig'),
    await serviceAccountToken(clusterKube, sa.metadata.namespace!, sa.metadata.name),
  );
  agent = await startAgent(pki, hub, {
    cluster: 'cluster1',
    apiserver: new URL(clusterKube.url).host,
    args: ['--gateway-kubeconfig', agentKubeconfig],
  });

  // The hub's RBAC: who may reach cluster1 (hub tokens need none: their scope decides).
  await createObjects(hubKube, [
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'team' } },
    rbac('ClusterRole', 'gateway-cluster1', {
      rules: [
        {
          apiGroups: ['cluster.open-cluster-management.io'],
          resources: ['managedclusters/proxy'],
          resourceNames: ['cluster1'],
          verbs: ['get'],
        },
      ],
    }),
    rbac('ClusterRoleBinding', 'gateway-cluster1', {
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'gateway-cluster1' },
      subjects: [
        { apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: 'dora' },
        { apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: 'mallory' },
        { apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: 'josé' },
        { apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: 'oidc-ops' },
        { kind: 'ServiceAccount', name: 'ci', namespace: 'team' },
      ],
    }),
  ]);
  for (const n of ['ci', 'intruder']) await createServiceAccount(hubKube, 'team', n);

  // The managed cluster's RBAC: who may list pods in default.
  await createObjects(clusterKube, [
    rbac('Role', 'pod-reader', { rules: [{ apiGroups: [''], resources: ['pods'], verbs: ['get', 'list'] }] }, 'default'),
    rbac(
      'RoleBinding',
      'pod-reader',
      {
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'pod-reader' },
        subjects: [
          { apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: 'cluster-proxy:token:alice' },
          { apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: 'dora' },
          { apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: 'cluster:hub:system:serviceaccount:team:ci' },
        ],
      },
      'default',
    ),
  ]);
  alice = await issueHubToken('alice');
  bob = await issueHubToken('bob');
  dora = await pki.user('dora', ['ops']);
}, START_TIMEOUT_MS);

afterAll(async () => {
  await agent?.stop();
  await hub?.stop();
  await killAllSpawned();
  await idp?.close();
  await Promise.all([hubKube?.stop(), clusterKube?.stop()]);
  if (tmp) await rm(tmp, { recursive: true, force: true });
  await pki?.cleanup();
});

describe("the managed cluster's RBAC decides, for the impersonated identity", () => {
  it("a hub token bound by a RoleBinding lists pods (200); one that is not gets the apiserver's own 403; the audit log names each", async () => {
    const ok = await gw(`${PODS}?limit=1&case=alice`, { token: alice.token });
    expect(ok.status, ok.body).toBe(200);
    expect((JSON.parse(ok.body) as { kind: string }).kind).toBe('PodList');
    const no = await gw(`${PODS}?limit=1&case=bob`, { token: bob.token });
    expect(no.status, no.body).toBe(403);
    expect(JSON.parse(no.body)).toMatchObject({
      kind: 'Status',
      reason: 'Forbidden',
      message: 'pods is forbidden: User "cluster-proxy:token:bob" cannot list resource "pods" in API group "" in the namespace "default"',
    });
    // The agent's own account has no right to list pods: only the impersonated user's binding let alice in.
    const own = await clusterKube.request<{ status: { allowed: boolean } }>('POST', '/apis/authorization.k8s.io/v1/subjectaccessreviews', {
      apiVersion: 'authorization.k8s.io/v1',
      kind: 'SubjectAccessReview',
      spec: { user: agentUser, resourceAttributes: { verb: 'list', resource: 'pods', namespace: 'default' } },
    });
    expect(own.body.status.allowed).toBe(false);
    const events = await waitFor(
      async () => {
        const a = await seen('case=alice');
        const b = await seen('case=bob');
        return a.length === 1 && b.length === 1 ? [a[0]!, b[0]!] : null;
      },
      { timeoutMs: 10_000, intervalMs: 100, message: 'both requests in the audit log' },
    );
    expect(events!.map((e) => [e.verb, e.impersonatedUser, e.responseStatus?.code])).toEqual([
      ['list', { username: 'cluster-proxy:token:alice', uid: alice.id, groups: ['cluster-proxy:tokens', 'system:authenticated'] }, 200],
      ['list', { username: 'cluster-proxy:token:bob', uid: bob.id, groups: ['cluster-proxy:tokens', 'system:authenticated'] }, 403],
    ]);
  });

  it('a client certificate user: its RoleBinding lets it list pods, as itself', async () => {
    const r = await gw(`${PODS}?case=dora`, { cert: dora });
    expect(r.status, r.body).toBe(200);
    const e = await waitFor(async () => (await seen('case=dora'))[0], {
      timeoutMs: 10_000,
      intervalMs: 100,
      message: "dora's request audited",
    });
    expect(e?.impersonatedUser).toEqual({ username: 'dora', groups: ['ops', 'system:authenticated'] });
  });
});

describe('SelfSubjectReview (kubectl auth whoami) through the gateway: the identity exactly', () => {
  it('a hub token, a client certificate, a non-ASCII certificate subject', async () => {
    expect(await whoami({ token: alice.token })).toEqual({
      username: 'cluster-proxy:token:alice',
      uid: alice.id,
      groups: ['cluster-proxy:tokens', 'system:authenticated'],
    });
    expect(await whoami({ cert: dora })).toEqual({ username: 'dora', groups: ['ops', 'system:authenticated'] });
    // UTF-8 on the wire (as client-go sends it) is what Go reads: Latin-1 would arrive as something else.
    expect(await whoami({ cert: await pki.user('josé', ['équipe', '開発']) })).toEqual({
      username: 'josé',
      groups: ['équipe', '開発', 'system:authenticated'],
    });
  });

  it("a ServiceAccount token of the hub's API server: the TokenReview's user, uid, groups and extra, with cluster:hub: on the system: names", async () => {
    const token = await serviceAccountToken(hubKube, 'team', 'ci');
    // What the hub's API server says of the token (asked as the admin).
    const review = await hubKube.request<{ status: { authenticated: boolean; user: Required<UserInfo> } }>(
      'POST',
      '/apis/authentication.k8s.io/v1/tokenreviews',
      { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token } },
    );
    expect(review.body.status.authenticated).toBe(true);
    const u = review.body.status.user;
    expect(u.username).toBe('system:serviceaccount:team:ci');
    const info = await whoami({ token });
    expect(info).toEqual({
      username: 'cluster:hub:system:serviceaccount:team:ci',
      uid: u.uid,
      groups: ['cluster:hub:system:serviceaccounts', 'cluster:hub:system:serviceaccounts:team', 'system:authenticated'],
      ...(u.extra ? { extra: u.extra } : {}),
    });
    // The real apiserver gives a bound token's credential id as an extra: it must pass the agent's impersonation.
    expect(Object.keys(info.extra ?? {})).toContain('authentication.kubernetes.io/credential-id');
  });
});

describe('hostile identities: refused before the managed apiserver, or arriving neutralised', () => {
  it.each([
    ['Impersonate-User', { 'impersonate-user': 'system:admin' }],
    ['Impersonate-Group', { 'impersonate-group': 'system:masters' }],
    ['Impersonate-Uid', { 'impersonate-uid': 'x' }],
    ['Impersonate-Extra-*', { 'impersonate-extra-scopes': 'all' }],
  ])("a caller's %s header: 400 at the hub, nothing arrives", async (_what, headers) => {
    await expectRefused(PODS, { token: alice.token, headers }, 400, /callers may not send Impersonate-\* headers\n$/);
  });

  it.each([
    [
      'the group " system:masters"',
      { sub: 'kim', groups: [' system:masters'] },
      /^the credential names an identity the cluster would not read as sent: the group " system:masters" begins or ends with whitespace\n$/,
    ],
    ['the group "system:masters"', { sub: 'kim', groups: ['system:masters'] }, /system:masters/],
    ['the user "system:admin"', { sub: 'system:admin', groups: ['oidc-ops'] }, /system:admin/],
    ['a user with a tab', { sub: 'kim\t', groups: ['oidc-ops'] }, /the user "kim\\u0009" begins or ends with whitespace/],
    ['a user with a NUL', { sub: 'ki\u0000m', groups: ['oidc-ops'] }, /the user "ki\\u0000m" holds a control character/],
    ['a group with a line break', { sub: 'kim', groups: ['oidc-ops\r\nimpersonate-group: system:masters'] }, /holds a control character/],
  ])('an OIDC token naming %s: 401 at the hub, nothing arrives', async (_what, claims, why) => {
    await expectRefused(PODS, { token: await idp.token(claims) }, 401, why);
  });

  it('a certificate subject with a trailing space: 401 at the hub, nothing arrives', async () => {
    await expectRefused(
      PODS,
      { cert: await pki.user('dora ', ['ops']) },
      401,
      /^the client certificate names an identity the cluster would not read as sent: the user "dora " begins or ends with whitespace\n$/,
    );
  });

  it('a certificate with O=system:masters, not allowed by the hub: 403 at the hub (its SubjectAccessReview is not system:masters either)', async () => {
    await expectRefused(
      PODS,
      { cert: await pki.user('nobody', ['system:masters']) },
      403,
      /^certificate "nobody" may not reach cluster cluster1: the hub's RBAC does not allow get on managedclusters\/proxy "cluster1"/,
    );
  });

  it("a certificate with O=system:masters, allowed to reach cluster1: arrives as cluster:hub:system:masters and gets the apiserver's 403", async () => {
    const mallory = await pki.user('mallory', ['system:masters']);
    const r = await gw('/cluster1/api/v1/namespaces/kube-system/secrets?case=mallory', { cert: mallory });
    expect(r.status, r.body).toBe(403);
    expect((JSON.parse(r.body) as { message: string }).message).toBe(
      'secrets is forbidden: User "mallory" cannot list resource "secrets" in API group "" in the namespace "kube-system"',
    );
    const e = await waitFor(async () => (await seen('case=mallory'))[0], { timeoutMs: 10_000, intervalMs: 100, message: 'audited' });
    expect(e?.impersonatedUser).toEqual({ username: 'mallory', groups: ['cluster:hub:system:masters', 'system:authenticated'] });
    expect(await whoami({ cert: mallory })).toEqual({
      username: 'mallory',
      groups: ['cluster:hub:system:masters', 'system:authenticated'],
    });
  });

  it('across every request of this file: the managed apiserver never saw system:masters or a reserved user impersonated', async () => {
    const impersonated = (await clusterKube.audit()).flatMap((e) => (e.impersonatedUser ? [e.impersonatedUser] : []));
    expect(impersonated.length).toBeGreaterThan(5);
    for (const u of impersonated) {
      expect(u.groups ?? []).not.toContain('system:masters');
      expect(u.username.startsWith('system:')).toBe(false);
    }
    // And nothing arrived as the agent without impersonation but its own calls (none: it only serves the gateway here).
    expect(agentEvents(await clusterKube.audit()).filter((e) => !e.impersonatedUser)).toEqual([]);
  });
});

describe("the hub's TokenReview and SubjectAccessReview with real ServiceAccount tokens", () => {
  it("a token of a ServiceAccount the hub's RBAC allows: reviewed by the hub's API server as the chart's service account, then 200", async () => {
    const token = await serviceAccountToken(hubKube, 'team', 'ci');
    const before = (await hubKube.audit()).length;
    const r = await gw(`${PODS}?case=ci`, { token });
    expect(r.status, r.body).toBe(200);
    const reviews = await waitFor(
      async () => {
        const ev = (await hubKube.audit())
          .slice(before)
          .filter((e) => ['tokenreviews', 'subjectaccessreviews'].includes(e.objectRef?.resource ?? ''));
        return ev.length >= 2 ? ev : null;
      },
      { timeoutMs: 10_000, intervalMs: 100, message: "the hub's reviews in its API server's audit log" },
    );
    expect(reviews!.map((e) => [e.user.username, e.verb, e.objectRef?.resource, e.responseStatus?.code])).toEqual([
      [HUB_USER, 'create', 'tokenreviews', 201],
      [HUB_USER, 'create', 'subjectaccessreviews', 201],
    ]);
    const e = await waitFor(async () => (await seen('case=ci'))[0], { timeoutMs: 10_000, intervalMs: 100, message: 'audited' });
    expect(e?.impersonatedUser?.username).toBe('cluster:hub:system:serviceaccount:team:ci');
    expect(e?.responseStatus?.code).toBe(200);
  });

  it("a ServiceAccount the hub's RBAC does not allow: 403 at the hub", async () => {
    await expectRefused(
      PODS,
      { token: await serviceAccountToken(hubKube, 'team', 'intruder') },
      403,
      /^kubernetes user "system:serviceaccount:team:intruder" may not reach cluster cluster1: the hub's RBAC does not allow get on managedclusters\/proxy "cluster1" \(cluster\.open-cluster-management\.io\)\n$/,
    );
  });

  it('a token for another audience, of a deleted ServiceAccount, or of the managed cluster: 401 (TokenReview)', async () => {
    const refused = /^the hub's API server did not accept the token \(TokenReview\)/;
    await expectRefused(PODS, { token: await serviceAccountToken(hubKube, 'team', 'ci', { audiences: ['someone-else'] }) }, 401, refused);
    await createServiceAccount(hubKube, 'team', 'gone');
    const gone = await serviceAccountToken(hubKube, 'team', 'gone');
    expect((await hubKube.request('DELETE', '/api/v1/namespaces/team/serviceaccounts/gone')).status).toBe(200);
    await expectRefused(PODS, { token: gone }, 401, refused);
    await createServiceAccount(clusterKube, 'default', 'local');
    await expectRefused(PODS, { token: await serviceAccountToken(clusterKube, 'default', 'local') }, 401, refused);
  });

  it('no tunneled connection is left (the gateway closes its idle pooled connections to the agent)', async () => {
    await expectTablesEmpty(hub, [agent]);
  });
});
