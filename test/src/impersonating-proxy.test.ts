// The agent's half of the gateway (agent/src/gateway/impersonating-proxy.ts) as a component: the real
// ImpersonatingProxy behind an in-memory tunnel end, a real HTTPS "apiserver" that records every header's
// bytes, assertions signed as the hub signs them. Whatever a valid assertion names, the agent never
// impersonates a reserved Kubernetes name unless its admin allowed that name, never puts on the wire a
// name a header would change, sends names as UTF-8, and answers every request with one line.
import type { Duplex } from 'node:stream';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ImpersonatingProxy } from '@cluster-proxy/agent';
import { IDENTITY_HEADER, IDENTITY_SIGNER_HEADER, requestLine, signIdentity, type GatewayIdentity } from '@cluster-proxy/proto';
import { createCA, issueServerCert, type PemPair } from '@cluster-proxy/server';
import { startRecordingApiserver, type RecordingApiserver } from './fixtures/index.js';

let ca: PemPair;
let serving: PemPair;
let api: RecordingApiserver;
const proxies: ImpersonatingProxy[] = [];

beforeAll(async () => {
  ca = createCA({ commonName: 'hub-ca' });
  serving = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'] });
  api = await startRecordingApiserver(issueServerCert(ca, { commonName: 'apiserver', ipAddresses: ['127.0.0.1'] }));
});

afterAll(async () => {
  for (const p of proxies) p.close();
  await api?.close();
});

function proxy(allowReserved?: string[]): ImpersonatingProxy {
  const p = new ImpersonatingProxy({
    cluster: 'c1',
    trust: () => Buffer.from(ca.certPem),
    log: pino({ level: 'silent' }),
    kube: () =>
      Promise.resolve({ server: new URL(`https://${api.address}`), source: 'test', ca: Buffer.from(ca.certPem), token: 'sa-token' }),
    ...(allowReserved ? { allowReserved: new Set(allowReserved) } : {}),
  });
  proxies.push(p);
  return p;
}

/** One request through a tunneled connection, as the hub sends it; resolves with the raw answer once the agent ends or answers it whole. */
function send(
  p: ImpersonatingProxy,
  identity: GatewayIdentity,
  headers: Record<string, string> = {},
  target = '/version',
): Promise<string> {
  const signed = signIdentity(identity, 'c1', requestLine('GET', target), serving.certPem, serving.keyPem);
  const end: Duplex = p.connect();
  const head = [
    `GET ${target} HTTP/1.1`,
    'host: cluster-proxy-gateway.invalid',
    `${IDENTITY_HEADER}: ${signed.assertion}`,
    `${IDENTITY_SIGNER_HEADER}: ${signed.signer}`,
    ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`),
    'connection: close',
    '',
    '',
  ].join('\r\n');
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    end.on('data', (c: Buffer) => chunks.push(c));
    end.once('end', () => {
      resolve(Buffer.concat(chunks).toString('latin1'));
      end.destroy();
    });
    end.once('error', reject);
    end.write(head);
  });
}

const statusOf = (answer: string): number => Number(/^HTTP\/1\.1 (\d{3})/.exec(answer)?.[1] ?? 0);
const bodyOf = (answer: string): string => answer.slice(answer.indexOf('\r\n\r\n') + 4);

describe("the agent's impersonating proxy", () => {
  it.each([
    ['the user system:admin', { user: 'system:admin', groups: [] }, '"system:admin"'],
    ['the group system:masters', { user: 'alice', groups: ['system:masters'] }, '"system:masters"'],
    [
      'a service account of the cluster',
      { user: 'system:serviceaccount:kube-system:default', groups: [] },
      '"system:serviceaccount:kube-system:default"',
    ],
    ['a node', { user: 'system:node:n1', groups: ['system:nodes'] }, '"system:node:n1"'],
  ])('refuses to impersonate %s even when the hub signed it: 403, one line, nothing sent', async (_what, identity, name) => {
    const before = api.requests.length;
    const answer = await send(proxy(), identity);
    expect(statusOf(answer), answer).toBe(403);
    expect(bodyOf(answer)).toBe(
      `the agent refused the request: ${name} is a reserved Kubernetes name this agent does not impersonate (--gateway-allow-reserved allows one by name)\n`,
    );
    expect(api.requests.length).toBe(before);
  });

  it('system:authenticated passes; an admin may allow a reserved name by its exact name', async () => {
    expect(statusOf(await send(proxy(), { user: 'alice', groups: ['system:authenticated'] }))).toBe(200);
    const allowing = proxy(['system:masters']);
    expect(statusOf(await send(allowing, { user: 'alice', groups: ['system:masters'] }))).toBe(200);
    expect(api.requests.at(-1)!.headers['impersonate-group']).toEqual(['system:masters']);
    expect(statusOf(await send(allowing, { user: 'alice', groups: ['system:masters:x'] }))).toBe(403);
  });

  it.each([
    ['a leading space', { user: 'alice', groups: [' system:masters'] }, 'the group " system:masters" begins or ends with whitespace'],
    ['a line break', { user: 'alice\nx', groups: [] }, 'the user "alice\\u000ax" holds a control character'],
    [
      'a code point a header cannot carry as Latin-1',
      { user: 'alice', groups: [], extra: { scopes: ['\u0000'] } },
      'the extra "scopes" value "\\u0000" holds a control character',
    ],
  ])('refuses a signed name with %s (403, one line): never thrown, never a hung caller', async (_what, identity, why) => {
    const before = api.requests.length;
    const answer = await send(proxy(), identity);
    expect([statusOf(answer), bodyOf(answer)]).toEqual([403, `the agent refused the request: ${why}\n`]);
    expect(api.requests.length).toBe(before);
  });

  it('sends names beyond Latin-1 as UTF-8 (user, groups, uid, extra values)', async () => {
    const answer = await send(proxy(), { user: 'José', groups: ['開発'], uid: 'ü-1', extra: { team: ['équipe'] } });
    expect(statusOf(answer), answer).toBe(200);
    const raw = (name: string): Buffer[] =>
      api.requests
        .at(-1)!
        .raw.filter((h) => h.name === name)
        .map((h) => h.value);
    expect(raw('impersonate-user')).toEqual([Buffer.from('José')]);
    expect(raw('impersonate-group')).toEqual([Buffer.from('開発')]);
    expect(raw('impersonate-uid')).toEqual([Buffer.from('ü-1')]);
    expect(raw('impersonate-extra-team')).toEqual([Buffer.from('équipe')]);
  });

  it('drops front-proxy headers and a bearer WebSocket subprotocol even if the hub passed them', async () => {
    const answer = await send(
      proxy(),
      { user: 'alice', groups: [] },
      {
        'x-remote-user': 'root',
        'x-remote-extra-a': 'b',
        'sec-websocket-protocol': 'base64url.bearer.authorization.k8s.io.c2VjcmV0, v5.channel.k8s.io',
      },
    );
    expect(statusOf(answer), answer).toBe(200);
    const seen = api.requests.at(-1)!.headers;
    expect(seen['x-remote-user']).toBeUndefined();
    expect(seen['x-remote-extra-a']).toBeUndefined();
    expect(seen['sec-websocket-protocol']).toEqual(['v5.channel.k8s.io']);
    expect(seen['authorization']).toEqual(['Bearer sa-token']);
  });
});
