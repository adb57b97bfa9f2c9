// The gateway's TokenReview and SubjectAccessReview client (server/src/gateway/kube-reviews.ts) against
// the local API server fixture, and the fixture's own checks of review bodies (as the apiserver's).
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { hubReviewsOf, type HubReviews } from '@cluster-proxy/server/gateway-reviews';
import { startFakeKubeApiServer, type FakeKubeApiServer } from './fixtures/index.js';

let api: FakeKubeApiServer;
let dir: string;
let admin: string;
let reviews: HubReviews;

beforeAll(async () => {
  api = await startFakeKubeApiServer();
  dir = await mkdtemp(path.join(os.tmpdir(), 'kube-reviews-'));
  await api.writeKubeconfig(path.join(dir, 'kubeconfig'));
  admin = (JSON.parse(await readFile(path.join(dir, 'kubeconfig'), 'utf8')) as { users: { user: { token: string } }[] }).users[0]!.user
    .token;
  reviews = hubReviewsOf(api.store)!;
});
afterAll(async () => {
  await api?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const post = async (p: string, body: unknown): Promise<{ status: number; body: Record<string, unknown> }> => {
  const res = await fetch(`${api.url}${p}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${admin}`, 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
};
const TR = '/apis/authentication.k8s.io/v1/tokenreviews';
const SAR = '/apis/authorization.k8s.io/v1/subjectaccessreviews';
const attrs = { verb: 'get', group: 'cluster.open-cluster-management.io', resource: 'managedclusters', subresource: 'proxy', name: 'c1' };

describe('review bodies are checked as the apiserver checks them', () => {
  it.each([
    [
      TR,
      { apiVersion: 'authentication.k8s.io/v1beta1', kind: 'TokenReview', spec: { token: 't' } },
      400,
      /API version in the data \(authentication.k8s.io\/v1beta1\) does not match/,
    ],
    [TR, { apiVersion: 'authentication.k8s.io/v1', kind: 'SubjectAccessReview', spec: { token: 't' } }, 400, /kind in the data/],
    [TR, { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: {} }, 400, /token is required for TokenReview/],
    [TR, '{"apiVersion":', 400, /not JSON/],
    [
      SAR,
      { apiVersion: 'authorization.k8s.io/v1', kind: 'SubjectAccessReview', spec: { user: 'a' } },
      422,
      /exactly one of nonResourceAttributes or resourceAttributes/,
    ],
    [
      SAR,
      { apiVersion: 'authorization.k8s.io/v1', kind: 'SubjectAccessReview', spec: { resourceAttributes: attrs } },
      422,
      /at least one of user or group/,
    ],
    [SAR, [1, 2], 400, /not a SubjectAccessReview/],
  ])('%s %j → %i', async (p, body, status, why) => {
    const r = await post(p, body);
    expect(r.status).toBe(status);
    expect(r.body).toMatchObject({ kind: 'Status', status: 'Failure', code: status, message: expect.stringMatching(why) });
  });
});

describe("kubeReviews: the hub's client", () => {
  it("TokenReview: the fixture's users, with system:authenticated; an unknown token is not authenticated", async () => {
    const token = api.addUser('carol', ['qa']);
    expect(await reviews.tokenReview(token)).toEqual({
      authenticated: true,
      user: { username: 'carol', uid: expect.any(String), groups: ['qa', 'system:authenticated'], extra: undefined },
    });
    expect(await reviews.tokenReview('nope')).toEqual({ authenticated: false, error: 'invalid bearer token' });
  });

  it('SubjectAccessReview: allowed, no opinion, denied with a reason', async () => {
    api.access.allow({
      user: 'carol',
      verb: 'get',
      apiGroup: attrs.group,
      resource: 'managedclusters',
      subresource: 'proxy',
      names: ['c1'],
    });
    api.access.deny(
      { group: 'interns', verb: 'get', apiGroup: attrs.group, resource: 'managedclusters', subresource: 'proxy' },
      'no interns',
    );
    expect(await reviews.subjectAccessReview({ user: 'carol', groups: [], resourceAttributes: attrs })).toMatchObject({ allowed: true });
    expect(await reviews.subjectAccessReview({ user: 'carol', groups: [], resourceAttributes: { ...attrs, name: 'c2' } })).toEqual({
      allowed: false,
    });
    expect(await reviews.subjectAccessReview({ user: 'dan', groups: ['interns'], resourceAttributes: attrs })).toEqual({
      allowed: false,
      denied: true,
      reason: 'no interns',
    });
    expect(api.access.asked.at(-1)?.spec).toMatchObject({ user: 'dan', groups: ['interns'], resourceAttributes: attrs });
  });

  it('an unreachable API server is one line, never the token', async () => {
    const secret = 'a-token-that-must-not-appear-anywhere';
    const down = await startFakeKubeApiServer();
    const client = await down.client('x');
    const r = hubReviewsOf(client)!;
    await down.close();
    const err = await r.tokenReview(secret).then(
      () => null,
      (e: Error) => e,
    );
    expect(err?.message).toMatch(/^TokenReview: /);
    expect(err?.message).not.toContain(secret);
  });
});
