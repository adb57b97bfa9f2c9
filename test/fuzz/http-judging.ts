// Generated HTTP requests and their judging by Go's own net/http server (go-judge.ts, GoHttpServer), shared
// by the differential of the agent's relay alone (relay-go.test.ts) and of the whole gateway (hub and agent
// processes, test/e2e/gateway-go.test.ts). What node's parser (the hub's and the agent's) reads of a caller's
// bytes is what the caller asked for; Go must read exactly those requests, with the identity the agent sets.
import type { Duplex } from 'node:stream';
import { IDENTITY_HEADER, MessageParser } from '@cluster-proxy/proto';
import type { GoSeen } from './go-judge.js';

/** How long a request may go unanswered on a connection that stays open. */
export const ANSWER_TIMEOUT_MS = 5_000;

/** What node's parser read of the caller's bytes: the requests the caller asked for. */
export interface Intended {
  method: string;
  url: string;
  body: Buffer;
}

// --- generated requests ---------------------------------------------------------------------------------

const SEGMENTS = ['pods', 'namespaces', 'default', 'a%2Fb', '..', '.', '%00', '~x', ';p=1', 'a,b', '%20', '', '*', '@', ':', "'", '!'];
/** Those the hub's gateway lets through (it refuses dot segments, empty ones, encoded slashes and NULs). */
const PLAIN_SEGMENTS = SEGMENTS.filter((x) => !['a%2Fb', '..', '.', '%00', ''].includes(x));
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

export interface GeneratedRequest {
  bytes: Buffer;
  method: string;
  target: string;
}

export function pick<T>(r: () => number, xs: readonly T[]): T {
  return xs[Math.floor(r() * xs.length)]!;
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

/** What a generated request carries besides its own headers: the caller's credentials (or the hub's identity). */
export interface RequestContext {
  caseId: string;
  /** Before every target: the gateway's cluster (`/cluster1`), or nothing at the agent. */
  prefix: string;
  /** Only path segments the hub's gateway lets through (the hub's own path rules are tested elsewhere). */
  plainPaths?: boolean;
  credentials: (method: string, target: string) => Array<[string, string]>;
}

/** One request's bytes, from `r`: odd and hostile parts, each framing. */
export function generateRequest(r: () => number, ctx: RequestContext): GeneratedRequest {
  const method = pick(r, METHODS);
  const segments = Array.from({ length: 1 + Math.floor(r() * 3) }, () =>
    pick(r, r() < 0.05 ? ODD_SEGMENTS : ctx.plainPaths ? PLAIN_SEGMENTS : SEGMENTS),
  );
  const target = `${ctx.prefix}/api/v1/${segments.join('/')}${pick(r, QUERIES)}`;
  const body = Buffer.from(Array.from({ length: Math.floor(r() * 3) }, () => pick(r, BODY_PIECES)).join(''), 'latin1');
  const framing: Framing =
    body.length === 0 && r() < 0.5 ? 'none' : pick(r, ['length', 'length', 'chunked', 'chunked', 'both', 'odd-length']);
  const headers: Array<[string, string]> = [['Host', 'h'], ['X-Case', ctx.caseId], ...ctx.credentials(method, target)];
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
export function intendedRequests(bytes: Buffer): { requests: Intended[]; whole: boolean } {
  const requests: Intended[] = [];
  let current: Intended | null = null;
  let chunks: Buffer[] = [];
  const parser = new MessageParser(
    'request',
    {
      head: (h) => {
        current = { method: h.method, url: h.url, body: Buffer.alloc(0) };
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

/**
 * A connection driven as the hub drives the agent's: a request, then nothing until its answer ended (the hub
 * never pipelines; the relay closes a connection that does). Counts the answers Go gave (its X-Judge header).
 */
export class OneAtATime {
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

  constructor(private readonly end: Duplex) {
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
    const deadline = Date.now() + ANSWER_TIMEOUT_MS;
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

/** Who the agent says the caller is, and its own credential: all kube-apiserver may read of identity. */
export interface ExpectedIdentity {
  user: string;
  groups: string[];
  token: string;
}

/** What Go read of one case against what the caller sent (targets without `prefix`) and the identity expected. */
export function problemsOf(caseId: string, intended: Intended[], seen: GoSeen[], prefix: string, expected: ExpectedIdentity): string[] {
  const problems: string[] = [];
  let j = 0;
  for (const s of seen) {
    // Go's request must be one the caller sent, after the one matched before it.
    let k = j;
    while (k < intended.length && !(intended[k]!.method === s.method && intended[k]!.url === prefix + s.requestURI)) k++;
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
    problems.push(...headerProblems(s, expected));
  }
  return problems.map((p) => `case ${caseId}: ${p}`);
}

/** What kube-apiserver would read as identity or credentials, against what the agent must send. */
function headerProblems(s: GoSeen, expected: ExpectedIdentity): string[] {
  const problems: string[] = [];
  const h = s.header;
  const expectExactly = (name: string, values: string[]): void => {
    if (JSON.stringify(h[name] ?? []) !== JSON.stringify(values)) problems.push(`${name} read as ${JSON.stringify(h[name] ?? [])}`);
  };
  expectExactly('Impersonate-User', [expected.user]);
  expectExactly('Impersonate-Group', expected.groups);
  expectExactly('Authorization', [`Bearer ${expected.token}`]);
  for (const name of Object.keys(h)) {
    const lower = name.toLowerCase();
    if (lower.startsWith('impersonate-') && name !== 'Impersonate-User' && name !== 'Impersonate-Group') problems.push(`Go read ${name}`);
    if (lower.startsWith('x-remote-') || lower === 'proxy-authorization' || lower.startsWith('x-cluster-proxy-'))
      problems.push(`Go read ${name}`);
  }
  return problems;
}

// --- a run -----------------------------------------------------------------------------------------------

export interface CaseRun {
  count: number;
  /** A new connection to whatever takes the requests (the agent's relay, the hub's gateway). */
  connect: () => Duplex;
  context: (caseId: string) => RequestContext;
}

/** Sends `count` cases of one to three requests, each case on a connection of its own, one request at a time. */
export async function sendCases(run: CaseRun, next: () => number): Promise<{ cases: Map<string, Intended[]>; problems: string[] }> {
  const problems: string[] = [];
  const cases = new Map<string, Intended[]>();
  for (let n = 0; n < run.count; n++) {
    const ctx = run.context(`c${n}`);
    const requests = Array.from({ length: 1 + Math.floor(next() * 3) }, () => generateRequest(next, ctx));
    const intended: Intended[] = [];
    cases.set(ctx.caseId, intended);
    const conn = new OneAtATime(run.connect());
    for (const q of requests) {
      const parsed = intendedRequests(q.bytes);
      intended.push(...parsed.requests);
      const outcome = await conn.send(q.bytes);
      if (outcome === 'timeout' && parsed.whole)
        problems.push(`case ${ctx.caseId}: ${q.method} ${q.target}: no answer and the connection still open after ${ANSWER_TIMEOUT_MS} ms`);
      if (outcome !== 'answered') break;
    }
    conn.destroy();
  }
  return { cases, problems };
}

/**
 * Every request Go read (call once Go closed every connection: then each has its line) against the cases:
 * the problems, how many cases reached Go, and how many were refused whole on the way although node's parser
 * read a request in them.
 */
export function judgeCases(
  cases: ReadonlyMap<string, Intended[]>,
  seen: readonly GoSeen[],
  prefix: string,
  expected: (caseId: string) => ExpectedIdentity,
): { problems: string[]; reached: number; refusedWhole: number } {
  const problems: string[] = [];
  const byCase = new Map<string, GoSeen[]>();
  for (const s of seen) {
    const id = s.header['X-Case']?.[0] ?? '';
    if (!cases.has(id))
      problems.push(`Go read a request no case sent: ${s.method} ${s.requestURI} (X-Case ${JSON.stringify(s.header['X-Case'])})`);
    else byCase.set(id, [...(byCase.get(id) ?? []), s]);
  }
  let reached = 0;
  let refusedWhole = 0;
  for (const [id, intended] of cases) {
    const got = byCase.get(id) ?? [];
    problems.push(...problemsOf(id, intended, got, prefix, expected(id)));
    if (got.length > 0) reached++;
    else if (intended.length > 0) refusedWhole++;
  }
  return { problems, reached, refusedWhole };
}
