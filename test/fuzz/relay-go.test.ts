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
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ImpersonatingProxy } from '@cluster-proxy/agent';
import { IDENTITY_HEADER, IDENTITY_SIGNER_HEADER, MessageParser, distinctHeaders, requestLine, signIdentity } from '@cluster-proxy/proto';
import { createCA, issueServerCert, type PemPair } from '@cluster-proxy/server';
import { buildGoJudge, prng } from './go-judge.js';

const SEED = 20261130;
const CASES = 400;
const CASE_TIMEOUT_MS = 5_000;
const USER = 'alice';
const GROUPS = ['devs'];
const TOKEN = 'sa-token';

/** A request as Go's handler got it (serve.go). */
interface GoSeen {
  conn: number | string;
  method: string;
  requestURI: string;
  header: Record<string, string[]>;
  contentLength: number;
  transferEncoding: string[] | null;
  body: string; // base64
  bodyError?: string;
}

/** What node's parser read of the caller's bytes: the requests the caller asked for. */
interface Intended {
  method: string;
  url: string;
  headers: Record<string, string[] | undefined>;
  body: Buffer;
}

class GoServer {
  readonly seen: GoSeen[] = [];
  /** Connections Go accepted and has not closed. */
  private open = 0;
  private readonly waiters: Array<() => void> = [];
  private partial = '';
  port = 0;

  private constructor(private readonly child: ChildProcessWithoutNullStreams) {}

  static async start(certFile: string, keyFile: string): Promise<GoServer> {
    const s = new GoServer(spawn(buildGoJudge(), ['serve-https', certFile, keyFile], { stdio: ['pipe', 'pipe', 'pipe'] }));
    let stderr = '';
    s.child.stderr.on('data', (c: Buffer) => (stderr = (stderr + c.toString()).slice(-2000)));
    s.child.stdout.setEncoding('utf8');
    const listening = new Promise<number>((resolve, reject) => {
      s.child.once('exit', (code) => reject(new Error(`the Go server exited (${code}): ${stderr}`)));
      s.child.stdout.on('data', (text: string) => {
        const lines = (s.partial + text).split('\n');
        s.partial = lines.pop()!;
        for (const line of lines) {
          const o = JSON.parse(line) as GoSeen | { listening: number } | { conn: string };
          if ('listening' in o) resolve(o.listening);
          else if (typeof o.conn === 'string') s.open += o.conn === 'new' ? 1 : -1;
          else s.seen.push(o as GoSeen);
        }
        for (const w of s.waiters.splice(0)) w();
      });
    });
    s.port = await listening;
    return s;
  }

  /** Resolves once Go has closed every connection it accepted (false if not within the timeout): every request it read has its line by then. */
  async allClosed(timeoutMs: number): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    while (this.open > 0) {
      const left = deadline - Date.now();
      if (left <= 0) return false;
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
    return true;
  }

  async stop(): Promise<void> {
    const exited = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    this.child.stdin.end();
    await exited;
  }
}

// --- generated requests ---------------------------------------------------------------------------------

const SEGMENTS = ['pods', 'namespaces', 'default', 'a%2Fb', '..', '.', '%00', '~x', ';p=1', 'a,b', '%20', '', '*', '@', ':', "'", '!'];
/** Rarer: node's parser refuses a raw non-ASCII byte in a target, Go a bad escape. */
const ODD_SEGMENTS = ['%', '%zz', 'caf\u00c3\u00a9', '\u007f'];
const QUERIES = ['', '?watch=1', '?a=b&a=c', '?x=%26y', '?', '??', '?labelSelector=a%3Db', '?a=b;c', '?q=%C3%A9'];
const METHODS = ['GET', 'GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'PROPFIND', 'LIST'];
const EXTRA_HEADERS: Array<[string, string]> = [
  ['Accept', 'application/json'],
  ['User-Agent', 'kubectl/v1.34 \t (x)'],
  ['X-Obs-Text', 'a\u0080\u00ff'],
  ['X-Empty', ''],
  ['X-Padded', '   padded   '],
  ['x-under_score', 'v'],
  ['Impersonate-User', 'system:admin'],
  ['impersonate-group', 'system:masters'],
  ['IMPERSONATE-EXTRA-scopes', 'all'],
  ['Impersonate-Uid', 'root'],
  ['Authorization', 'Bearer stolen'],
  ['authorization', 'Basic YTpi'],
  ['X-Remote-User', 'root'],
  ['X-Remote-Group', 'system:masters'],
  ['X-Remote-Extra-Scopes', 'all'],
  ['Proxy-Authorization', 'Basic eDp5'],
  ['Connection', 'keep-alive'],
  ['Connection', 'x-hop, te'],
  ['X-Hop', 'dropped if named by Connection'],
  ['Keep-Alive', 'timeout=5'],
  ['TE', 'trailers'],
  ['Trailer', 'X-T'],
  ['Content-Type', 'application/json'],
  ['Cookie', 'a=b; c=d'],
  ['X-Folded', 'a\r\n b'],
  ['X-Dup', 'one'],
  ['X-Dup', 'two'],
  ['Host', 'second.example'],
  ['Expect', '100-continue'],
  ['Transfer-Encoding', 'identity'],
  [IDENTITY_HEADER, 'forged'],
  ['X-Cluster-Proxy-Identity-Mac', 'forged'],
];
const BODY_PIECES = [
  'a',
  '{"kind":"Pod"}',
  '\r\n',
  '0\r\n\r\n',
  'GET /smuggled HTTP/1.1\r\nHost: h\r\nX-Case: smuggled\r\n\r\n',
  '5\r\nhello\r\n',
  '\u0000\u00ff',
  'x'.repeat(300),
];

type Framing = 'none' | 'length' | 'chunked' | 'both' | 'odd-length';

interface GeneratedRequest {
  bytes: Buffer;
  method: string;
  target: string;
}

function pick<T>(r: () => number, xs: readonly T[]): T {
  return xs[Math.floor(r() * xs.length)]!;
}

function identity(method: string, target: string): Array<[string, string]> {
  const signed = signIdentity({ user: USER, groups: GROUPS }, 'c1', requestLine(method, target), hubCert.certPem, hubCert.keyPem);
  return [
    [IDENTITY_HEADER, signed.assertion],
    [IDENTITY_SIGNER_HEADER, signed.signer],
  ];
}

function chunkedBody(r: () => number, body: Buffer): string {
  let out = '';
  let at = 0;
  while (at < body.length) {
    const n = Math.min(body.length - at, 1 + Math.floor(r() * 40));
    const size = r() < 0.2 ? n.toString(16).toUpperCase().padStart(4, '0') : n.toString(16);
    out += `${size}${r() < 0.15 ? ';ext=1' : ''}\r\n${body.subarray(at, at + n).toString('latin1')}\r\n`;
    at += n;
  }
  return `${out}0\r\n${r() < 0.2 ? 'X-T: 1\r\n' : ''}\r\n`;
}

function generateRequest(r: () => number, caseId: string): GeneratedRequest {
  const method = pick(r, METHODS);
  const segments = Array.from({ length: 1 + Math.floor(r() * 3) }, () => pick(r, r() < 0.05 ? ODD_SEGMENTS : SEGMENTS));
  const target = `/api/v1/${segments.join('/')}${pick(r, QUERIES)}`;
  const body = Buffer.from(Array.from({ length: Math.floor(r() * 3) }, () => pick(r, BODY_PIECES)).join(''), 'latin1');
  const framing: Framing =
    body.length === 0 && r() < 0.5 ? 'none' : pick(r, ['length', 'length', 'chunked', 'chunked', 'both', 'odd-length']);
  const headers: Array<[string, string]> = [['Host', 'h'], ['X-Case', caseId], ...identity(method, target)];
  for (let i = Math.floor(r() * 4); i > 0; i--) headers.push(pick(r, EXTRA_HEADERS));
  let bodyText = '';
  switch (framing) {
    case 'none':
      break;
    case 'length':
      headers.push(['Content-Length', String(body.length)]);
      bodyText = body.toString('latin1');
      break;
    case 'odd-length':
      headers.push([
        'Content-Length',
        pick(r, [`0${body.length}`, ` ${body.length} `, `${body.length}, ${body.length}`, `+${body.length}`]),
      ]);
      bodyText = body.toString('latin1');
      break;
    case 'chunked':
      headers.push(['Transfer-Encoding', pick(r, ['chunked', 'chunked', 'Chunked', 'gzip, chunked', 'chunked, identity', ' chunked'])]);
      bodyText = chunkedBody(r, body);
      break;
    case 'both':
      headers.push(['Content-Length', String(body.length)], ['Transfer-Encoding', 'chunked']);
      bodyText = chunkedBody(r, body);
      break;
  }
  // Shuffled, so identity, framing and hostile headers come in any order.
  for (let i = headers.length - 1; i > 0; i--) {
    const j = Math.floor(r() * (i + 1));
    [headers[i], headers[j]] = [headers[j]!, headers[i]!];
  }
  const head = `${method} ${target} HTTP/1.1\r\n${headers.map(([n, v]) => `${n}: ${v}\r\n`).join('')}\r\n`;
  return { bytes: Buffer.from(head + bodyText, 'latin1'), method, target };
}

/** What node's parser reads of one request's bytes: the requests it ended, and whether that was all of them, exactly one, cleanly. */
function intendedRequests(bytes: Buffer): { requests: Intended[]; whole: boolean } {
  const requests: Intended[] = [];
  let current: Intended | null = null;
  let chunks: Buffer[] = [];
  const parser = new MessageParser(
    'request',
    {
      head: (h) => {
        current = { method: h.method, url: h.url, headers: distinctHeaders(h.rawHeaders), body: Buffer.alloc(0) };
        chunks = [];
        return false;
      },
      body: (c) => chunks.push(Buffer.from(c)),
      end: () => {
        if (current) requests.push({ ...current, body: Buffer.concat(chunks) });
        current = null;
      },
    },
    64 * 1024,
  );
  const taken = parser.execute(bytes);
  return { requests, whole: taken === bytes.length && requests.length === 1 && current === null };
}

// --- the run --------------------------------------------------------------------------------------------

let hubCert: PemPair;
let ca: PemPair;
let dir: string;
let go: GoServer;
let proxy: ImpersonatingProxy;

beforeAll(async () => {
  ca = createCA({ commonName: 'hub-ca' });
  hubCert = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'] });
  const api = issueServerCert(ca, { commonName: 'apiserver', ipAddresses: ['127.0.0.1'] });
  dir = mkdtempSync(path.join(os.tmpdir(), 'relay-go-'));
  writeFileSync(path.join(dir, 'api.crt'), api.certPem);
  writeFileSync(path.join(dir, 'api.key'), api.keyPem);
  go = await GoServer.start(path.join(dir, 'api.crt'), path.join(dir, 'api.key'));
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

/**
 * One tunneled connection driven as the hub drives it: a request, then nothing until its answer ended (the hub
 * never pipelines; the relay closes a connection that does).
 */
class TunneledConnection {
  private readonly end = proxy.connect();
  private answers = 0;
  private judged = 0;
  private closed = false;
  private wake: (() => void) | null = null;
  private readonly parser = new MessageParser(
    'response',
    {
      head: (h) => {
        if (h.rawHeaders.some((v, i) => i % 2 === 0 && v.toLowerCase() === 'x-judge')) this.judged++;
        return false;
      },
      body: () => {},
      end: () => {
        this.answers++;
        this.wake?.();
      },
    },
    64 * 1024,
  );

  constructor() {
    this.end.on('data', (c: Buffer) => this.parser.execute(c));
    const gone = (): void => {
      this.closed = true;
      this.wake?.();
    };
    this.end.once('end', gone);
    this.end.once('close', gone);
  }

  /** Answers from Go (X-Judge) so far. */
  get fromGo(): number {
    return this.judged;
  }

  /** Writes `bytes`; resolves with how it ended: an answer, the connection closed, or neither within the timeout. */
  async send(bytes: Buffer): Promise<'answered' | 'closed' | 'timeout'> {
    const want = this.answers + 1;
    this.end.write(bytes);
    const deadline = Date.now() + CASE_TIMEOUT_MS;
    while (this.answers < want && !this.closed) {
      const left = deadline - Date.now();
      if (left <= 0) return 'timeout';
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.wake = () => {
          clearTimeout(t);
          resolve();
        };
      });
      this.wake = null;
    }
    return this.answers >= want ? 'answered' : 'closed';
  }

  destroy(): void {
    this.end.destroy();
  }
}

function problemsOf(caseId: string, intended: Intended[], seen: GoSeen[]): string[] {
  const problems: string[] = [];
  let j = 0;
  for (const s of seen) {
    // Go's request must be one the caller sent, after the one matched before it.
    let k = j;
    while (k < intended.length && !(intended[k]!.method === s.method && intended[k]!.url === s.requestURI)) k++;
    const want = intended[k];
    if (!want) {
      problems.push(`Go read a request the caller did not send: ${s.method} ${s.requestURI}`);
      continue;
    }
    j = k + 1;
    const body = Buffer.from(s.body, 'base64');
    // A body cut short (the relay refused its rest and closed) fails in Go's reading: kube-apiserver fails the
    // request. A whole body must be the caller's.
    if (!s.bodyError && !body.equals(want.body))
      problems.push(`${s.method} ${s.requestURI}: Go read a body of ${body.length} bytes, the caller sent ${want.body.length}`);
    problems.push(...headerProblems(s));
  }
  return problems.map((p) => `case ${caseId}: ${p}`);
}

/** What kube-apiserver would read as identity or credentials, against what the agent must send. */
function headerProblems(s: GoSeen): string[] {
  const problems: string[] = [];
  const h = s.header;
  const expectExactly = (name: string, values: string[]): void => {
    if (JSON.stringify(h[name] ?? []) !== JSON.stringify(values)) problems.push(`${name} read as ${JSON.stringify(h[name] ?? [])}`);
  };
  expectExactly('Impersonate-User', [USER]);
  expectExactly('Impersonate-Group', GROUPS);
  expectExactly('Authorization', [`Bearer ${TOKEN}`]);
  for (const name of Object.keys(h)) {
    const lower = name.toLowerCase();
    if (lower.startsWith('impersonate-') && name !== 'Impersonate-User' && name !== 'Impersonate-Group') problems.push(`Go read ${name}`);
    if (lower.startsWith('x-remote-') || lower === 'proxy-authorization' || lower.startsWith('x-cluster-proxy-'))
      problems.push(`Go read ${name}`);
  }
  return problems;
}

describe("the agent's apiserver relay: Go's net/http server is the judge", () => {
  it(`${CASES} generated cases: Go reads exactly the requests the caller sent, with the agent's identity only, and each is answered`, async () => {
    const r = prng(SEED);
    const problems: string[] = [];
    let reached = 0;
    let refusedWhole = 0;
    const cases = new Map<string, Intended[]>();
    for (let n = 0; n < CASES; n++) {
      const caseId = `c${n}`;
      const requests = Array.from({ length: 1 + Math.floor(r() * 3) }, () => generateRequest(r, caseId));
      const intended: Intended[] = [];
      cases.set(caseId, intended);
      const conn = new TunneledConnection();
      for (const q of requests) {
        const parsed = intendedRequests(q.bytes);
        intended.push(...parsed.requests);
        const outcome = await conn.send(q.bytes);
        if (outcome === 'timeout' && parsed.whole)
          problems.push(`case ${caseId}: ${q.method} ${q.target}: no answer and the connection still open after ${CASE_TIMEOUT_MS} ms`);
        if (outcome !== 'answered') break;
      }
      conn.destroy();
    }
    // The relays closed: once Go closed every connection, every request it read has its line.
    proxy.close();
    expect(await go.allClosed(20_000)).toBe(true);
    const byCase = new Map<string, GoSeen[]>();
    for (const s of go.seen) {
      const id = s.header['X-Case']?.[0] ?? '';
      if (!cases.has(id))
        problems.push(`Go read a request no case sent: ${s.method} ${s.requestURI} (X-Case ${JSON.stringify(s.header['X-Case'])})`);
      else byCase.set(id, [...(byCase.get(id) ?? []), s]);
    }
    for (const [id, intended] of cases) {
      const seen = byCase.get(id) ?? [];
      problems.push(...problemsOf(id, intended, seen));
      if (seen.length > 0) reached++;
      else if (intended.length > 0) refusedWhole++;
    }
    expect(problems.slice(0, 20)).toEqual([]);
    // Neither vacuous way: many cases reach Go, and many are refused before it.
    expect(reached).toBeGreaterThan(CASES / 4);
    expect(refusedWhole).toBeGreaterThan(CASES / 20);
  }, 240_000);
});
