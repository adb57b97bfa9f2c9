// The whole HTTP gateway with Go as the judge of what arrives: real hub and agent processes, and in the managed
// cluster's place Go's own net/http server (test/go-judge `serve-https`, the HTTP layer kube-apiserver runs),
// which reports every request as Go read it. Each generated case is a caller with an OIDC identity of generated
// names (spaces, tabs, no-break spaces, control characters, line and paragraph separators, lone surrogates,
// non-ASCII, reserved `system:` names, separators) on a TLS connection of its own to the gateway, sending one to
// three generated requests one at a time (test/fuzz/http-judging.ts: odd targets, hostile headers, every body
// framing). What node's parser reads of the caller's bytes is what the caller asked for. On every case:
//   - Go reads only requests the caller sent, in order, with the same method, target (less `/cluster1`) and body;
//   - Go reads the caller's names exactly as the token holds them (Impersonate-User, Impersonate-Group), the
//     agent's Authorization, and no other Impersonate-*, X-Remote-* or identity header;
//   - every request gets an answer or the connection closes.
// Names the cluster would not read as sent, and reserved ones, are refused on the way: the test counts both
// outcomes, so it cannot pass with nothing arriving or nothing refused.
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { issueServerCert } from '@cluster-proxy/server';
import { GoHttpServer, prng } from '../fuzz/go-judge.js';
import { judgeCases, pick, sendCases } from '../fuzz/http-judging.js';
import { hostileOidcHubArgs, killAllSpawned, startOidcIssuer, writeAgentKubeconfig, type OidcIssuer } from '../src/fixtures/index.js';
import { createPki, expectTablesEmpty, startAgent, startHub, type AgentProcess, type HubProcess, type TestPki } from '../src/harness.js';

const SEED = 20261201;
const CASES = 150;
const SA_TOKEN = 'agent-service-account-token';
/** Pieces of generated names: what Unicode can hold, separators, prefixes of ours. */
const NAME_PIECES = [
  'alice',
  'ops',
  'dev',
  'team-a',
  'x',
  'cluster:hub:',
  'cluster-proxy:',
  ':',
  ',',
  ';',
  '"',
  '\\',
  '%20',
  '=',
  '/',
  'é',
  '開発',
  '😀',
  'e\u0301',
  'a b',
];
/** In one name of four: what a header trims or cannot carry, and reserved names. */
const HOSTILE_PIECES = [
  'system:',
  'system:masters',
  ' ',
  '\t',
  '\u00a0',
  '\u2028',
  '\ufeff',
  '\u0000',
  '\u001f',
  '\u007f',
  '\u0085',
  '\ud800',
  '\udc00',
];

let pki: TestPki;
let tmp: string;
let idp: OidcIssuer;
let go: GoHttpServer;
let hub: HubProcess;
let agent: AgentProcess;

function generatedName(r: () => number): string {
  const pieces = r() < 0.25 ? [...NAME_PIECES, ...HOSTILE_PIECES] : NAME_PIECES;
  return Array.from({ length: 1 + Math.floor(r() * 3) }, () => pick(r, pieces)).join('');
}

beforeAll(async () => {
  pki = await createPki();
  tmp = await mkdtemp(path.join(os.tmpdir(), 'cp-gateway-go-'));
  const api = issueServerCert(pki.ca, { commonName: 'cluster1-apiserver', ipAddresses: ['127.0.0.1'] });
  await writeFile(path.join(tmp, 'api.crt'), api.certPem);
  await writeFile(path.join(tmp, 'api.key'), api.keyPem);
  go = await GoHttpServer.start(path.join(tmp, 'api.crt'), path.join(tmp, 'api.key'));
  idp = await startOidcIssuer({ tls: issueServerCert(pki.ca, { commonName: 'idp', ipAddresses: ['127.0.0.1'] }) });
  hub = await startHub(pki, ['--gateway-port', '0', '--gateway-response-timeout', '3s', ...hostileOidcHubArgs(idp, pki.caPath)]);
  const kubeconfig = await writeAgentKubeconfig(path.join(tmp, 'agent.kubeconfig'), {
    server: `https://127.0.0.1:${go.port}`,
    caPath: pki.caPath,
    token: SA_TOKEN,
  });
  agent = await startAgent(pki, hub, {
    cluster: 'cluster1',
    apiserver: `127.0.0.1:${go.port}`,
    args: ['--gateway-kubeconfig', kubeconfig],
  });
}, 180_000);

afterAll(async () => {
  await agent?.stop();
  await hub?.stop();
  await killAllSpawned();
  await go?.stop();
  await idp?.close();
  if (tmp) await rm(tmp, { recursive: true, force: true });
  await pki?.cleanup();
});

describe("the gateway, hub and agent: Go's net/http server is the judge", () => {
  it(`${CASES} generated callers and requests: Go reads exactly what each caller sent, as who its token names`, async () => {
    const r = prng(SEED);
    const claims = new Map<string, { sub: string; groups: string[] }>();
    const tokens = new Map<string, string>();
    // Names first (a token each), so the requests' stream of choices does not depend on the signing.
    for (let n = 0; n < CASES; n++) {
      const c = { sub: generatedName(r), groups: Array.from({ length: Math.floor(r() * 3) }, () => generatedName(r)) };
      claims.set(`c${n}`, c);
      tokens.set(`c${n}`, await idp.token(c));
    }
    const sent = await sendCases(
      {
        count: CASES,
        connect: () =>
          tls.connect({
            host: '127.0.0.1',
            port: hub.ports.gateway!,
            servername: 'localhost',
            ca: pki.ca.certPem,
            ALPNProtocols: ['http/1.1'],
          }),
        context: (caseId) => ({
          caseId,
          prefix: '/cluster1',
          plainPaths: true,
          credentials: () => [['Authorization', `Bearer ${tokens.get(caseId)!}`]],
        }),
      },
      r,
    );
    // Every caller left: once the hub's pooled connections to the agent and the agent's to Go closed, every
    // request Go read has its line.
    await expectTablesEmpty(hub, [agent]);
    expect(await go.allClosed(30_000)).toBe(true);
    const verdict = judgeCases(sent.cases, go.seen, '/cluster1', (id) => {
      const c = claims.get(id)!;
      return { user: c.sub, groups: c.groups, token: SA_TOKEN };
    });
    expect([...sent.problems, ...verdict.problems].slice(0, 20)).toEqual([]);
    // No reserved name arrived, whatever the caller's token said.
    const reserved = go.seen
      .flatMap((s) => [...(s.header['Impersonate-User'] ?? []), ...(s.header['Impersonate-Group'] ?? [])])
      .filter((n) => n.startsWith('system:'));
    expect(reserved).toEqual([]);
    // Neither vacuous way.
    expect(verdict.reached).toBeGreaterThan(CASES / 5);
    expect(verdict.refusedWhole).toBeGreaterThan(CASES / 10);
  }, 300_000);
});
