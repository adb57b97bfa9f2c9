// The gateway identity authenticated by the hub–agent link's own key (proto gateway-identity.ts: an HMAC
// keyed by keying material exported from the link's TLS session), with real parts: two real mutual-TLS
// connections on loopback (two links), the agent's real ImpersonatingProxy behind an in-memory tunnel
// end, a real HTTPS "apiserver" that records what reaches it. Both ends of one link derive the same
// key, two links different ones; the agent believes a MAC only under the key of the link the request
// came in on, for its method and target, and refuses anything else with one line, before the apiserver.
import { once } from 'node:events';
import type { KeyObject } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ImpersonatingProxy } from '@cluster-proxy/agent';
import {
  IDENTITY_HEADER,
  IDENTITY_MAC_HEADER,
  IDENTITY_SIGNER_HEADER,
  identityPayload,
  linkIdentityKey,
  macPayload,
  requestLine,
  signIdentity,
  verifyLinkIdentity,
  type GatewayIdentity,
} from '@cluster-proxy/proto';
import { createCA, issueAgentCert, issueServerCert, type PemPair } from '@cluster-proxy/server';
import { startRecordingApiserver, type RecordingApiserver } from './fixtures/index.js';

const ALICE: GatewayIdentity = { user: 'alice', groups: ['team-a'] };
const VERSION = requestLine('GET', '/version');

let ca: PemPair;
let serving: PemPair;
let api: RecordingApiserver;
let server: tls.Server;
/** Two links: each the hub's end (the server side) and the agent's end, with the key each derived. */
const links: { hub: KeyObject; agent: KeyObject }[] = [];
const sockets: tls.TLSSocket[] = [];
let proxy: ImpersonatingProxy;
let agentCert: PemPair;

/** One mutual-TLS connection as an agent makes to the hub: the hub's end and the agent's. */
async function connectLink(cert: PemPair, maxVersion?: tls.SecureVersion): Promise<{ hubEnd: tls.TLSSocket; client: tls.TLSSocket }> {
  const accepted = once(server, 'secureConnection') as Promise<[tls.TLSSocket]>;
  const client = tls.connect({
    port: (server.address() as AddressInfo).port,
    host: '127.0.0.1',
    servername: 'localhost',
    ca: ca.certPem,
    cert: cert.certPem,
    key: cert.keyPem,
    ...(maxVersion ? { maxVersion } : {}),
  });
  sockets.push(client);
  await once(client, 'secureConnect');
  const [hubEnd] = await accepted;
  sockets.push(hubEnd);
  return { hubEnd, client };
}

/** Both ends' link keys of a new link. */
async function link(cert: PemPair): Promise<{ hub: KeyObject; agent: KeyObject }> {
  const { hubEnd, client } = await connectLink(cert);
  const hub = linkIdentityKey(hubEnd);
  const agent = linkIdentityKey(client);
  if (!hub || !agent) throw new Error('no link key');
  return { hub, agent };
}

beforeAll(async () => {
  ca = createCA({ commonName: 'hub-ca' });
  serving = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'] });
  api = await startRecordingApiserver(issueServerCert(ca, { commonName: 'apiserver', ipAddresses: ['127.0.0.1'] }));
  server = tls.createServer({ cert: serving.certPem, key: serving.keyPem, ca: ca.certPem, requestCert: true, rejectUnauthorized: true });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  agentCert = issueAgentCert(ca, { cluster: 'c1' });
  links.push(await link(agentCert), await link(agentCert));
  proxy = new ImpersonatingProxy({
    cluster: 'c1',
    trust: () => Buffer.from(ca.certPem),
    log: pino({ level: 'silent' }),
    kube: () =>
      Promise.resolve({ server: new URL(`https://${api.address}`), source: 'test', ca: Buffer.from(ca.certPem), token: 'sa-token' }),
  });
});

afterAll(async () => {
  proxy?.close();
  for (const s of sockets) s.destroy();
  await new Promise((resolve) => (server ? server.close(resolve) : resolve(undefined)));
  await api?.close();
});

/** One request on a tunneled connection of the link keyed `linkKey`, with these identity headers; the raw answer. */
function send(linkKey: KeyObject | null, headers: Record<string, string>, method = 'GET', target = '/version'): Promise<string> {
  const end: Duplex = proxy.connect(linkKey);
  const head = [
    `${method} ${target} HTTP/1.1`,
    'host: cluster-proxy-gateway.invalid',
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
const mac = (key: KeyObject, who = ALICE, request = VERSION, cluster = 'c1'): string =>
  macPayload(identityPayload(who, cluster, request), key);

describe('the link key', () => {
  it("both ends of a link derive the same key; another link's differs", () => {
    const [a, b] = links;
    expect(a!.hub.export().equals(a!.agent.export())).toBe(true);
    expect(b!.hub.export().equals(b!.agent.export())).toBe(true);
    expect(a!.hub.export().equals(b!.hub.export())).toBe(false);
    expect(a!.hub.export()).toHaveLength(32);
  });

  it('a TLS 1.2 link gives none at either end (signed identities then), nor does a socket not yet connected', async () => {
    const { hubEnd, client } = await connectLink(agentCert, 'TLSv1.2');
    expect(client.getProtocol()).toBe('TLSv1.2');
    expect(linkIdentityKey(hubEnd)).toBeNull();
    expect(linkIdentityKey(client)).toBeNull();
    expect(linkIdentityKey(new tls.TLSSocket(null as never))).toBeNull();
  });
});

describe('an identity authenticated by the link key', () => {
  it('verifies under the key of its own link, for its request, with the identity the hub put in', () => {
    const [a] = links;
    expect(verifyLinkIdentity(mac(a!.hub), a!.agent, 'c1', VERSION)).toEqual(ALICE);
  });

  it.each([
    ['replayed on another link', (k: KeyObject[]) => verifyLinkIdentity(mac(k[0]!), k[1]!, 'c1', VERSION), 'bad identity MAC'],
    ['on a link without a key', (k: KeyObject[]) => verifyLinkIdentity(mac(k[0]!), null, 'c1', VERSION), 'without an identity key'],
    [
      'for another method',
      (k: KeyObject[]) => verifyLinkIdentity(mac(k[0]!), k[0]!, 'c1', requestLine('DELETE', '/version')),
      'another request',
    ],
    ['for another target', (k: KeyObject[]) => verifyLinkIdentity(mac(k[0]!), k[0]!, 'c1', requestLine('GET', '/api')), 'another request'],
    [
      'for another cluster',
      (k: KeyObject[]) => verifyLinkIdentity(mac(k[0]!, ALICE, VERSION, 'c2'), k[0]!, 'c1', VERSION),
      'for cluster "c2"',
    ],
    [
      'expired',
      (k: KeyObject[]) =>
        verifyLinkIdentity(macPayload(identityPayload(ALICE, 'c1', VERSION, Date.now() - 120_000), k[0]!), k[0]!, 'c1', VERSION),
      'expired',
    ],
    [
      'a forged payload (admin) with the MAC of another',
      (k: KeyObject[]) => {
        const mac0 = mac(k[0]!).split('.')[1];
        return verifyLinkIdentity(`${identityPayload({ user: 'admin', groups: [] }, 'c1', VERSION)}.${mac0}`, k[0]!, 'c1', VERSION);
      },
      'bad identity MAC',
    ],
    [
      'a MAC spelt with a trailing character',
      (k: KeyObject[]) => verifyLinkIdentity(`${mac(k[0]!)}A`, k[0]!, 'c1', VERSION),
      'bad identity MAC',
    ],
    ['no MAC', (k: KeyObject[]) => verifyLinkIdentity(identityPayload(ALICE, 'c1', VERSION), k[0]!, 'c1', VERSION), 'malformed'],
  ])('is refused %s, in one line', (_what, run, reason) => {
    const r = run(links.map((l) => l.hub));
    expect(r).toHaveProperty('error');
    const error = (r as { error: string }).error;
    expect(error).toContain(reason);
    expect(error).not.toMatch(/\n/);
  });
});

describe("the agent's gateway handler with link keys", () => {
  it("serves a MAC made with its link's key: the apiserver sees the identity", async () => {
    const [a] = links;
    const answer = await send(a!.agent, { [IDENTITY_MAC_HEADER]: mac(a!.hub) });
    expect(statusOf(answer), answer).toBe(200);
    const seen = api.requests.at(-1)!;
    expect(seen.headers['impersonate-user']).toEqual(['alice']);
    expect(seen.headers['impersonate-group']).toEqual(['team-a']);
    expect(Object.keys(seen.headers).filter((h) => h.startsWith('x-cluster-proxy'))).toEqual([]);
  });

  it.each([
    [
      "another link's MAC",
      (l: typeof links) => ({ key: l[1]!.agent, headers: { [IDENTITY_MAC_HEADER]: mac(l[0]!.hub) } }),
      'bad identity MAC',
    ],
    [
      'a MAC on a link without a key (an agent that did not take the capability)',
      (l: typeof links) => ({ key: null, headers: { [IDENTITY_MAC_HEADER]: mac(l[0]!.hub) } }),
      'without an identity key',
    ],
    [
      'a MAC for another method',
      (l: typeof links) => ({
        key: l[0]!.agent,
        headers: { [IDENTITY_MAC_HEADER]: mac(l[0]!.hub, ALICE, requestLine('GET', '/version')) },
        method: 'DELETE',
      }),
      'another request',
    ],
    [
      'a MAC for another target',
      (l: typeof links) => ({ key: l[0]!.agent, headers: { [IDENTITY_MAC_HEADER]: mac(l[0]!.hub) }, target: '/api/v1/secrets' }),
      'another request',
    ],
    [
      'a MAC and a signed identity at once',
      (l: typeof links) => {
        const signed = signIdentity({ user: 'admin', groups: [] }, 'c1', VERSION, serving.certPem, serving.keyPem);
        return {
          key: l[0]!.agent,
          headers: { [IDENTITY_MAC_HEADER]: mac(l[0]!.hub), [IDENTITY_HEADER]: signed.assertion, [IDENTITY_SIGNER_HEADER]: signed.signer },
        };
      },
      'more than one identity assertion',
    ],
  ])('refuses %s: 403, one line, nothing reaches the apiserver', async (_what, make, reason) => {
    const r = make(links) as { key: KeyObject | null; headers: Record<string, string>; method?: string; target?: string };
    const before = api.requests.length;
    const answer = await send(r.key, r.headers, r.method, r.target);
    expect(statusOf(answer), answer).toBe(403);
    expect(bodyOf(answer)).toMatch(new RegExp(`^the agent refused the request: [^\\n]*${reason}[^\\n]*\\n$`));
    expect(api.requests.length).toBe(before);
  });

  it('still serves a signed identity on a link with a key, and on one without (what a hub that does not use the key sends)', async () => {
    for (const key of [links[0]!.agent, null]) {
      const signed = signIdentity(ALICE, 'c1', VERSION, serving.certPem, serving.keyPem);
      const answer = await send(key, { [IDENTITY_HEADER]: signed.assertion, [IDENTITY_SIGNER_HEADER]: signed.signer });
      expect(statusOf(answer), answer).toBe(200);
      expect(api.requests.at(-1)!.headers['impersonate-user']).toEqual(['alice']);
    }
  });
});
