// The agent's apiserver relay (agent/src/gateway/apiserver-relay.ts) with Go as the judge of what arrives: the
// next hop of a gateway request is kube-apiserver, whose HTTP layer is Go's net/http server, so the relay's
// output goes to that very server (test/go-judge, `serve-https`), which reports every request as Go read it.
// Generated request bytes from a fixed seed (odd targets, odd and hostile headers, bodies framed by length or
// chunked, with extensions, trailers, text that looks like a request, pipelined requests) are written on
// tunneled connections as the hub would, each with the identity the hub signs. What node's parser (the hub's
// and the agent's) read of them is what the caller asked for; on every case:
//   - Go sees only requests the caller sent, in order, with the same method, target and body bytes: no
//     request smuggled in a body, none split or merged;
//   - Go reads exactly the impersonation the agent set (Impersonate-User and -Group, no other Impersonate-*),
//     the agent's Authorization, and none of the caller's credential or identity headers;
//   - every request gets an answer, or the connection closes: nothing waits.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ImpersonatingProxy } from '@cluster-proxy/agent';
import { IDENTITY_HEADER, IDENTITY_SIGNER_HEADER, requestLine, signIdentity } from '@cluster-proxy/proto';
import { createCA, issueServerCert, type PemPair } from '@cluster-proxy/server';
import { GoHttpServer, prng } from './go-judge.js';
import { judgeCases, sendCases } from './http-judging.js';

const SEED = 20261130;
const CASES = 400;
const USER = 'alice';
const GROUPS = ['devs'];
const TOKEN = 'sa-token';

function identity(method: string, target: string): Array<[string, string]> {
  const signed = signIdentity({ user: USER, groups: GROUPS }, 'c1', requestLine(method, target), hubCert.certPem, hubCert.keyPem);
  return [
    [IDENTITY_HEADER, signed.assertion],
    [IDENTITY_SIGNER_HEADER, signed.signer],
  ];
}

let hubCert: PemPair;
let ca: PemPair;
let dir: string;
let go: GoHttpServer;
let proxy: ImpersonatingProxy;

beforeAll(async () => {
  ca = createCA({ commonName: 'hub-ca' });
  hubCert = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'] });
  const api = issueServerCert(ca, { commonName: 'apiserver', ipAddresses: ['127.0.0.1'] });
  dir = mkdtempSync(path.join(os.tmpdir(), 'relay-go-'));
  writeFileSync(path.join(dir, 'api.crt'), api.certPem);
  writeFileSync(path.join(dir, 'api.key'), api.keyPem);
  go = await GoHttpServer.start(path.join(dir, 'api.crt'), path.join(dir, 'api.key'));
  proxy = new ImpersonatingProxy({
    cluster: 'c1',
    trust: () => Buffer.from(ca.certPem),
    log: pino({ level: 'silent' }),
    kube: () =>
      Promise.resolve({ server: new URL(`https://127.0.0.1:${go.port}`), source: 'test', ca: Buffer.from(ca.certPem), token: TOKEN }),
  });
}, 180_000);

afterAll(async () => {
  proxy?.close();
  await go?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe("the agent's apiserver relay: Go's net/http server is the judge", () => {
  it(`${CASES} generated cases: Go reads exactly the requests the caller sent, with the agent's identity only, and each is answered`, async () => {
    const sent = await sendCases(
      { count: CASES, connect: () => proxy.connect(), context: (caseId) => ({ caseId, prefix: '', credentials: identity }) },
      prng(SEED),
    );
    // The relays closed: once Go closed every connection, every request it read has its line.
    proxy.close();
    expect(await go.allClosed(20_000)).toBe(true);
    const verdict = judgeCases(sent.cases, go.seen, '', () => ({ user: USER, groups: GROUPS, token: TOKEN }));
    expect([...sent.problems, ...verdict.problems].slice(0, 20)).toEqual([]);
    // Neither vacuous way: many cases reach Go, and many are refused before it.
    expect(verdict.reached).toBeGreaterThan(CASES / 4);
    expect(verdict.refusedWhole).toBeGreaterThan(CASES / 20);
  }, 240_000);
});
