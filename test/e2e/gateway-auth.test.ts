// The gateway's authentication and authorization with real processes: a hub on --store kubernetes (the
// local API server fixture answers its TokenReviews and SubjectAccessReviews) with an OIDC issuer
// (a local HTTPS issuer, tokens signed by jose, a key rotation), an agent in front of a recording
// "apiserver", and a second hub on the embedded store with OIDC and the scope policy. Each refusal is
// checked for its status and one-line reason, and for nothing reaching the apiserver; each success for the
// Impersonate-* headers the apiserver receives and the caller's token never reaching it.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { issueServerCert } from '@cluster-proxy/server';
import {
  httpsAnswer,
  killAllSpawned,
  runCommand,
  startFakeKubeApiServer,
  startOidcIssuer,
  startRecordingApiserver,
  writeAgentKubeconfig,
  type FakeKubeApiServer,
  type OidcIssuer,
  type RecordingApiserver,
  type RunResult,
} from '../src/fixtures/index.js';
import {
  CLI,
  createPki,
  expectTablesEmpty,
  startAgent,
  startHub,
  type AgentProcess,
  type HubProcess,
  type TestPki,
} from '../src/harness.js';
import { kubectlBinary, kubectlUnsupported } from './kubectl-binary.js';

const SA_TOKEN = 'agent-service-account-token';
const PROXY = { verb: 'get', apiGroup: 'cluster.open-cluster-management.io', resource: 'managedclusters', subresource: 'proxy' };
let pki: TestPki;
let tmp: string;
let api: FakeKubeApiServer;
let idp: OidcIssuer;
let recorder: RecordingApiserver;
let hub: HubProcess;
let agent: AgentProcess;
let embedded: HubProcess;
let cert: { cert: Buffer; key: Buffer };
const skipKubectl = kubectlUnsupported();
/** Every bearer token a test sent: none may show up in the hub's log. */
const sent = new Set<string>();

interface Answer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

function gw(port: number, target: string, o: { token?: string; cert?: boolean } = {}): Promise<Answer> {
  if (o.token) sent.add(o.token);
  return httpsAnswer({
    host: '127.0.0.1',
    port,
    path: target,
    servername: 'localhost',
    ca: pki.ca.certPem,
    ...(o.cert ? { cert: cert.cert, key: cert.key } : {}),
    headers: o.token ? { authorization: `Bearer ${o.token}` } : {},
  });
}
const viaHub = (target: string, o: { token?: string; cert?: boolean } = {}): Promise<Answer> => gw(hub.ports.gateway!, target, o);

/** A refusal: this status and one-line body, and nothing reached the apiserver. */
async function expectRefused(
  target: string,
  o: { token?: string; cert?: boolean },
  status: number,
  body: RegExp | string,
  port = hub.ports.gateway!,
): Promise<void> {
  const before = recorder.requests.length;
  const r = await gw(port, target, o);
  expect(r.status, r.body).toBe(status);
  if (typeof body === 'string') expect(r.body).toBe(`${body}\n`);
  else expect(r.body).toMatch(body);
  expect(r.body.split('\n').length).toBe(2);
  if (status === 401) expect(r.headers['www-authenticate']).toBe('Bearer realm="cluster-proxy"');
  expect(recorder.requests.length).toBe(before);
}

function lastSeen(): Record<string, string[]> {
  const r = recorder.requests.at(-1);
  if (!r) throw new Error('the apiserver saw no request');
  return r.headers;
}

const cli = (args: string[]): Promise<RunResult> => runCommand(process.execPath, [CLI, ...args], { timeoutMs: 20_000 });

beforeAll(async () => {
  pki = await createPki();
  tmp = await mkdtemp(path.join(os.tmpdir(), 'cp-gateway-auth-'));
  recorder = await startRecordingApiserver(issueServerCert(pki.ca, { commonName: 'cluster1-apiserver', ipAddresses: ['127.0.0.1'] }));
  idp = await startOidcIssuer({ tls: issueServerCert(pki.ca, { commonName: 'idp', ipAddresses: ['127.0.0.1'] }), path: '/realms/fleet' });
  api = await startFakeKubeApiServer();
  const kubeconfig = path.join(tmp, 'hub.kubeconfig');
  await api.writeKubeconfig(kubeconfig);
  const oidcFlags = [
    '--oidc-issuer-url',
    idp.url,
    '--oidc-client-id',
    idp.clientId,
    '--oidc-groups-claim',
    'groups',
    '--oidc-groups-prefix',
    'oidc:',
    '--oidc-required-claim',
    'tenant=blue',
    '--oidc-ca-file',
    pki.caPath,
  ];
  hub = await startHub(pki, ['--gateway-port', '0', '--store', 'kubernetes', '--kubeconfig', kubeconfig, ...oidcFlags]);
  embedded = await startHub(pki, ['--gateway-port', '0', ...oidcFlags]);
  const agentKubeconfig = await writeAgentKubeconfig(path.join(tmp, 'agent.kubeconfig'), {
    server: `https://${recorder.address}`,
    caPath: pki.caPath,
    token: SA_TOKEN,
  });
  agent = await startAgent(pki, hub, { cluster: 'cluster1', apiserver: recorder.address, args: ['--gateway-kubeconfig', agentKubeconfig] });
  cert = await pki.user('dora', ['ops']);
  // Who may reach cluster1 on the hub (RBAC stand-in): OIDC group dev, user carol, certificate user dora.
  api.access.allow({ group: 'oidc:dev', ...PROXY, names: ['cluster1'] });
  api.access.allow({ user: 'carol', ...PROXY, names: ['cluster1'] });
  // The hub's RBAC names its own service account as its API server does (no cluster:hub: prefix).
  api.access.allow({ user: 'system:serviceaccount:team:ci', ...PROXY, names: ['cluster1'] });
  api.access.allow({ user: 'dora', ...PROXY, names: ['cluster1'] });
  api.access.allow({ user: 'erin', ...PROXY, names: ['cluster1'] });
  api.access.deny({ user: 'carol', ...PROXY, names: ['cluster2'] }, 'cluster2 is frozen for carol by the change board');
}, 90_000);

afterEach(async () => {
  // Every test leaves no tunneled connection behind, refusals included.
  if (hub && agent) await expectTablesEmpty(hub, [agent]);
});

afterAll(async () => {
  await agent?.stop();
  await hub?.stop();
  await embedded?.stop();
  await killAllSpawned();
  await recorder?.close();
  await idp?.close();
  await api?.close();
  if (tmp) await rm(tmp, { recursive: true, force: true });
  await pki?.cleanup();
});

describe('gateway authentication: OIDC', () => {
  it("a good ID token: the apiserver sees the agent's credentials and Impersonate-User/Group with the prefixes, never the ID token", async () => {
    const token = await idp.token({ sub: 'alice', groups: ['dev', 'ops'], tenant: 'blue' });
    const r = await viaHub('/cluster1/version', { token });
    expect(r.status, r.body).toBe(200);
    const seen = lastSeen();
    expect(seen['authorization']).toEqual([`Bearer ${SA_TOKEN}`]);
    expect(seen['impersonate-user']).toEqual([`${idp.url}#alice`]);
    expect(seen['impersonate-group']).toEqual(['oidc:dev', 'oidc:ops']);
    expect(JSON.stringify(seen)).not.toContain(token);
    // The hub asked its API server whether this user may reach cluster1.
    const sar = api.access.asked.filter((a) => a.kind === 'SubjectAccessReview').at(-1);
    expect(sar?.spec).toMatchObject({
      user: `${idp.url}#alice`,
      groups: ['oidc:dev', 'oidc:ops'],
      resourceAttributes: {
        verb: 'get',
        group: 'cluster.open-cluster-management.io',
        resource: 'managedclusters',
        subresource: 'proxy',
        name: 'cluster1',
      },
    });
  });

  it('refusals, 401 each with its reason: no credentials, expired, wrong audience, bad signature, missing required claim, not yet valid', async () => {
    await expectRefused(
      '/cluster1/version',
      {},
      401,
      /^no credentials: present a client certificate of the hub CA or send Authorization: Bearer <hub token \| OIDC ID token \| token of the hub's Kubernetes API>\n$/,
    );
    const claims = { groups: ['dev'], tenant: 'blue' };
    await expectRefused('/cluster1/version', { token: await idp.token(claims, { expiresIn: -600 }) }, 401, 'the token has expired');
    await expectRefused(
      '/cluster1/version',
      { token: await idp.token({ ...claims, aud: 'someone-else' }) },
      401,
      `the token's audience is not ${idp.clientId} (--oidc-client-id)`,
    );
    await expectRefused(
      '/cluster1/version',
      { token: await idp.token(claims, { key: await idp.foreignKey(), kid: idp.current.kid }) },
      401,
      "the token's signature does not verify",
    );
    await expectRefused(
      '/cluster1/version',
      { token: await idp.token({ groups: ['dev'] }) },
      401,
      'the token\'s claim "tenant" is missing or does not equal the required value (--oidc-required-claim)',
    );
    await expectRefused(
      '/cluster1/version',
      { token: await idp.token(claims, { notBeforeIn: 600 }) },
      401,
      'the token is not valid yet (nbf)',
    );
  });

  it("a JWT of another issuer is not OIDC's: on --store kubernetes the hub's API server judges it (TokenReview, 401)", async () => {
    const other = await startOidcIssuer({ tls: issueServerCert(pki.ca, { commonName: 'other', ipAddresses: ['127.0.0.1'] }) });
    try {
      const reviews = api.access.count('TokenReview');
      await expectRefused(
        '/cluster1/version',
        { token: await other.token({ tenant: 'blue' }) },
        401,
        "the hub's API server did not accept the token (TokenReview): invalid bearer token",
      );
      expect(api.access.count('TokenReview')).toBe(reviews + 1);
      // On the embedded store there is no TokenReview: the issuer is simply wrong.
      await expectRefused(
        '/cluster1/version',
        { token: await other.token({ tenant: 'blue' }) },
        401,
        `the token is not issued by ${idp.url} (--oidc-issuer-url)`,
        embedded.ports.gateway!,
      );
    } finally {
      await other.close();
    }
  });

  it('key rotation: a token of a new key id works once the hub refetched the JWKS', async () => {
    const before = idp.served['/realms/fleet/jwks'] ?? 0;
    expect(before).toBeGreaterThan(0);
    const next = await idp.rotate({ dropOld: true });
    const token = await idp.token({ sub: 'alice', groups: ['dev'], tenant: 'blue' });
    expect(token.split('.')[0]).toBe(Buffer.from(JSON.stringify({ alg: 'RS256', kid: next.kid, typ: 'JWT' })).toString('base64url'));
    const r = await viaHub('/cluster1/version', { token });
    expect(r.status, r.body).toBe(200);
    expect(idp.served['/realms/fleet/jwks']).toBe(before + 1);
    expect(lastSeen()['impersonate-user']).toEqual([`${idp.url}#alice`]);
    // Cached now: the next token of that key costs no fetch.
    expect((await viaHub('/cluster1/version', { token: await idp.token({ sub: 'alice', groups: ['dev'], tenant: 'blue' }) })).status).toBe(
      200,
    );
    expect(idp.served['/realms/fleet/jwks']).toBe(before + 1);
  }, 30_000);

  it("embedded store: OIDC users pass the scope policy (the cluster's RBAC decides); a token that is neither kind is 401", async () => {
    const port = embedded.ports.gateway!;
    const ok = await gw(port, '/nosuch/version', { token: await idp.token({ groups: ['dev'], tenant: 'blue' }) });
    expect([ok.status, ok.body]).toEqual([404, 'cluster nosuch is not known to this hub\n']);
    await expectRefused(
      '/cluster1/version',
      { token: 'not-a-hub-token-nor-a-jwt' },
      401,
      'the token is neither a hub token nor an OIDC ID token',
      port,
    );
  });
});

describe('gateway authentication: TokenReview (--store kubernetes)', () => {
  it("a token of the hub's API server: the review's user, groups and uid, cached; system: names get cluster:hub:", async () => {
    const carol = api.addUser('carol', ['qa']);
    const reviews = api.access.count('TokenReview');
    const r = await viaHub('/cluster1/api/v1/namespaces/default/pods', { token: carol });
    expect(r.status, r.body).toBe(200);
    const seen = lastSeen();
    expect(seen['impersonate-user']).toEqual(['carol']);
    expect(seen['impersonate-group']).toEqual(['qa']);
    expect(seen['impersonate-uid']?.[0]).toMatch(/^[0-9a-f-]{36}$/);
    expect(JSON.stringify(seen)).not.toContain(carol);
    expect((await viaHub('/cluster1/version', { token: carol })).status).toBe(200);
    expect(api.access.count('TokenReview')).toBe(reviews + 1);
    const ci = api.addUser('system:serviceaccount:team:ci', ['system:serviceaccounts', 'system:serviceaccounts:team']);
    expect((await viaHub('/cluster1/version', { token: ci })).status).toBe(200);
    expect(lastSeen()['impersonate-user']).toEqual(['cluster:hub:system:serviceaccount:team:ci']);
    expect(lastSeen()['impersonate-group']).toEqual(['cluster:hub:system:serviceaccounts', 'cluster:hub:system:serviceaccounts:team']);
  });

  it("a TokenReview's extra attributes reach the cluster as Impersonate-Extra-*, the key lowercased and percent-encoded", async () => {
    const erin = api.addUser('erin', ['qa']);
    api.access.setExtra('erin', { 'scopes.authorization.openshift.io': ['user:info', 'user:check-access'], 'Acme.com/Project': ['blue'] });
    expect((await viaHub('/cluster1/version', { token: erin })).status).toBe(200);
    const seen = lastSeen();
    expect(seen['impersonate-user']).toEqual(['erin']);
    expect(seen['impersonate-extra-scopes.authorization.openshift.io']).toEqual(['user:info', 'user:check-access']);
    expect(seen['impersonate-extra-acme.com%2fproject']).toEqual(['blue']);
  });

  it('TokenReview says unauthenticated: 401', async () => {
    await expectRefused(
      '/cluster1/version',
      { token: 'some-token-the-api-server-never-issued' },
      401,
      "the hub's API server did not accept the token (TokenReview): invalid bearer token",
    );
  });
});

describe('gateway authorization', () => {
  it('SubjectAccessReview denies: 403 with the reason, one line', async () => {
    const carol = api.addUser('carol');
    await expectRefused(
      '/cluster2/version',
      { token: carol },
      403,
      'kubernetes user "carol" may not reach cluster cluster2: the hub\'s RBAC does not allow get on managedclusters/proxy "cluster2" (cluster.open-cluster-management.io): cluster2 is frozen for carol by the change board',
    );
    // No rule at all: the same refusal without a reason (RBAC gives none); a 404 would tell a stranger which clusters exist.
    const eve = api.addUser('eve');
    await expectRefused(
      '/cluster1/version',
      { token: eve },
      403,
      'kubernetes user "eve" may not reach cluster cluster1: the hub\'s RBAC does not allow get on managedclusters/proxy "cluster1" (cluster.open-cluster-management.io)',
    );
    await expectRefused(
      '/cluster1/version',
      { token: await idp.token({ sub: 'mallory', groups: ['guests'], tenant: 'blue' }) },
      403,
      new RegExp(`^oidc user "${idp.url}#mallory" may not reach cluster cluster1: `),
    );
  });

  it('client certificates go through the SubjectAccessReview too', async () => {
    expect((await viaHub('/cluster1/version', { cert: true })).status).toBe(200);
    expect(lastSeen()['impersonate-user']).toEqual(['dora']);
    await expectRefused(
      '/cluster2/version',
      { cert: true },
      403,
      /^certificate "dora" may not reach cluster cluster2: the hub's RBAC does not allow/,
    );
  });

  it('a hub token scoped to cluster1: cluster1 by its scope alone (no SubjectAccessReview), cluster2 is 403', async () => {
    const issued = await cli(['token', 'issue', '--name', 'scoped', '--cluster', 'cluster1', '--data-dir', hub.dataDir]);
    expect(issued.code, issued.stderr).toBe(0);
    const token = issued.stdout.trim();
    const sars = api.access.count('SubjectAccessReview');
    const r = await viaHub('/cluster1/version', { token });
    expect(r.status, r.body).toBe(200);
    expect(lastSeen()['impersonate-user']).toEqual(['cluster-proxy:token:scoped']);
    expect(api.access.count('SubjectAccessReview')).toBe(sars);
    await expectRefused('/cluster2/version', { token }, 403, /^token "scoped" \([0-9a-f]{16}\) may not reach cluster cluster2\n$/);
  });

  it.skipIf(skipKubectl !== null)('kubectl with an OIDC ID token in its kubeconfig', async () => {
    const file = path.join(tmp, 'oidc.kubeconfig');
    await writeFile(
      file,
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        'current-context': 'gw',
        clusters: [
          { name: 'gw', cluster: { server: `https://127.0.0.1:${hub.ports.gateway}/cluster1`, 'certificate-authority': pki.caPath } },
        ],
        users: [{ name: 'u', user: { token: await idp.token({ sub: 'alice', groups: ['dev'], tenant: 'blue' }) } }],
        contexts: [{ name: 'gw', context: { cluster: 'gw', user: 'u' } }],
      }),
      { mode: 0o600 },
    );
    const r = await runCommand(
      await kubectlBinary(),
      ['--kubeconfig', file, 'get', 'pods', '-n', 'kube-system', '-o', 'name', '--request-timeout', '20s'],
      { env: { PATH: process.env['PATH'], HOME: tmp }, timeoutMs: 30_000 },
    );
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout.trim()).toBe('pod/demo-pod');
    expect(lastSeen()['impersonate-user']).toEqual([`${idp.url}#alice`]);
  });

  it("no token of any kind appears in the hub's log; the audit line names the user", async () => {
    const lines = hub.proc.lines();
    expect(sent.size).toBeGreaterThan(10);
    for (const t of sent)
      expect(
        lines.some((l) => l.includes(t)),
        "a token in the hub's log",
      ).toBe(false);
    expect(lines.some((l) => /eyJ[A-Za-z0-9_-]{10,}\.eyJ/.test(l))).toBe(false);
    const audit = lines
      .map((l) => {
        try {
          return JSON.parse(l) as Record<string, unknown>;
        } catch {
          return {};
        }
      })
      .filter((o) => o['msg'] === 'gateway request');
    expect(audit.some((o) => o['user'] === `${idp.url}#alice` && o['status'] === 200)).toBe(true);
    expect(audit.some((o) => o['reason'] === 'not_authorized' && o['status'] === 403)).toBe(true);
    const started = lines.find((l) => l.includes('"gateway access"'));
    expect(started).toMatch(/"authentication":\["token","oidc","tokenreview","certificate"\],"authorizationMode":"subjectaccessreview"/);
  });
});
