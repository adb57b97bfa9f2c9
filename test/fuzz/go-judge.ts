// Go as the judge of Go semantics: test/go-judge (a small Go main of ours) answers with
// golang.org/x/net/http/httpproxy, the code kubelet and kubectl run, which proxy a request takes; the
// agent's agent/src/no-proxy.ts must decide the same for the same environment and target. The judge is
// built once per version of its sources into ~/.cache/cluster-proxy/go-judge (never committed).
import { spawn, spawnSync, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { proxyFromEnvironment } from '@cluster-proxy/agent';
import { FUZZ_DIR } from './engine.js';

const JUDGE_DIR = path.join(FUZZ_DIR, '..', 'go-judge');
const CACHE = path.join(process.env['XDG_CACHE_HOME'] ?? path.join(os.homedir(), '.cache'), 'cluster-proxy', 'go-judge');

/** The machine's go, or the toolchain scripts/build-real-peers.sh fetched into its cache. */
function goBinary(): string {
  const probe = spawnSync('go', ['version'], { encoding: 'utf8' });
  if (probe.status === 0) return 'go';
  const peers = process.env['CLUSTER_PROXY_PEERS_CACHE'] ?? path.join(os.homedir(), '.cache', 'cluster-proxy', 'real-peers');
  const cached = path.join(peers, 'go-1.26.8', 'go', 'bin', 'go');
  if (existsSync(cached)) return cached;
  throw new Error('no Go toolchain: install Go 1.24+ or run scripts/build-real-peers.sh (it fetches one)');
}

/** Builds the judge if this version of its sources has not been built yet; returns its path. */
export function buildGoJudge(): string {
  const hash = createHash('sha256');
  for (const f of ['go.mod', 'go.sum', 'main.go', 'serve.go']) hash.update(readFileSync(path.join(JUDGE_DIR, f)));
  const bin = path.join(CACHE, `judge-${hash.digest('hex').slice(0, 16)}`);
  if (existsSync(bin)) return bin;
  mkdirSync(CACHE, { recursive: true });
  const tmp = `${bin}.${process.pid}.tmp`;
  const r = spawnSync(goBinary(), ['build', '-trimpath', '-o', tmp, '.'], {
    cwd: JUDGE_DIR,
    encoding: 'utf8',
    env: { ...process.env, CGO_ENABLED: '0' },
  });
  if (r.status !== 0) throw new Error(`go build of test/go-judge failed: ${r.stderr || r.error?.message}`);
  renameSync(tmp, bin);
  return bin;
}

export interface JudgeCase {
  env: Record<string, string>;
  host: string;
  port: number;
}

interface GoProxy {
  scheme: string;
  user: string;
  password: string;
  hasPassword: boolean;
  hostname: string;
  port: string;
}

export interface GoAnswer {
  proxy: GoProxy | null;
  urlError?: string;
  error?: string;
}

/** The judge process: batches of cases in, answers out in order. */
export class GoJudge {
  private readonly waiting: { resolve: (a: GoAnswer) => void; reject: (e: Error) => void }[] = [];
  private stderr = '';
  private constructor(private readonly child: ChildProcessWithoutNullStreams) {
    // Lines split on '\n' alone (readline would also split on '\r' and U+2028, which JSON may hold).
    let partial = '';
    child.stdout.setEncoding('utf8');
    child.stdout.on('data', (text: string) => {
      const lines = (partial + text).split('\n');
      partial = lines.pop()!;
      for (const line of lines) this.waiting.shift()?.resolve(JSON.parse(line) as GoAnswer);
    });
    child.stderr.on('data', (c: Buffer) => (this.stderr = (this.stderr + c.toString()).slice(-4000)));
    child.once('exit', (code) => {
      for (const w of this.waiting.splice(0)) w.reject(new Error(`the Go judge exited (${code}) without answering: ${this.stderr}`));
    });
  }

  static start(): GoJudge {
    return new GoJudge(spawn(buildGoJudge(), [], { stdio: ['pipe', 'pipe', 'pipe'] }));
  }

  ask(cases: readonly JudgeCase[]): Promise<GoAnswer[]> {
    const answers = cases.map(() => new Promise<GoAnswer>((resolve, reject) => this.waiting.push({ resolve, reject })));
    this.child.stdin.write(
      cases.map((c) => `${JSON.stringify({ env: c.env, url: `https://${targetHostPort(c.host, c.port)}` })}\n`).join(''),
    );
    return Promise.all(answers);
  }

  async close(): Promise<void> {
    const exited = new Promise<void>((resolve) => this.child.once('exit', () => resolve()));
    this.child.stdin.end();
    await exited;
  }
}

// --- Go's HTTP server ---------------------------------------------------------------------------------

/** A request as Go's handler got it (serve.go). */
export interface GoSeen {
  conn: number | string;
  method: string;
  requestURI: string;
  header: Record<string, string[]>;
  contentLength: number;
  transferEncoding: string[] | null;
  body: string; // base64
  bodyError?: string;
}

/** Go's own net/http server (`judge serve-https`), reporting every request as Go read it. */
export class GoHttpServer {
  readonly seen: GoSeen[] = [];
  /** Connections Go accepted and has not closed. */
  private open = 0;
  private readonly waiters: Array<() => void> = [];
  private partial = '';
  port = 0;

  private constructor(private readonly child: ChildProcessWithoutNullStreams) {}

  static async start(certFile: string, keyFile: string): Promise<GoHttpServer> {
    const s = new GoHttpServer(spawn(buildGoJudge(), ['serve-https', certFile, keyFile], { stdio: ['pipe', 'pipe', 'pipe'] }));
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

function targetHostPort(host: string, port: number): string {
  return host.includes(':') && !host.startsWith('[') ? `[${host}]:${port}` : `${host}:${port}`;
}

/** What the agent decides, in the judge's terms. */
function oursFor(c: JudgeCase): { proxy: GoProxy | null } {
  const d = proxyFromEnvironment(c.env, c.host, c.port, 'https');
  if (d.proxy === null) return { proxy: null };
  const u = d.proxy;
  return {
    proxy: {
      scheme: u.protocol.slice(0, -1),
      user: decodeURIComponent(u.username),
      password: decodeURIComponent(u.password),
      hasPassword: u.password !== '',
      hostname: u.hostname.replace(/^\[(.*)\]$/, '$1'),
      port: u.port,
    },
  };
}

const DEFAULT_PORTS: Record<string, string> = { http: '80', https: '443', socks5: '1080', socks5h: '1080' };

/**
 * Where we differ from Go on purpose (docs/egress-proxy.md, "Where the agent differs from Go"), by name;
 * null for any other case.
 */
export function deliberate(c: JudgeCase, go: GoAnswer): string | null {
  // Go compares the target with "localhost" before lower-casing it; we fold case first.
  if (c.host.toLowerCase() === 'localhost' && c.host !== 'localhost') return 'LOCALHOST in another case is never proxied';
  const value = c.env['HTTPS_PROXY'] || c.env['https_proxy'] || '';
  const g = go.proxy;
  if (g === null) return null;
  // A value Go's parseProxy keeps although no connection can use it (no host, the host "http" its
  // "http://" retry made of a value that does not parse, a port that is no port): Go's requests fail;
  // the agent ignores the value (it logs why) and reads the URL as WHATWG does.
  const port = g.port === '' ? 1 : /^\d{1,5}$/.test(g.port) ? Number(g.port) : 0;
  const retried = g.hostname === 'http' && !/^([^@/]*@)?http([:/]|$)/i.test(value.replace(/^[a-z][a-z0-9+.-]*:\/\//i, ''));
  if (g.hostname === '' || retried || port < 1 || port > 65535) return 'a proxy value Go keeps but cannot connect to';
  // An IPv6 zone (fe80::1%25eth0): WHATWG URLs have none, so the agent cannot use such a proxy URL.
  if (g.hostname.includes('%')) return 'an IPv6 proxy address with a zone';
  return null;
}

/** Null when both decide alike (same proxy, as a connection to it would go, or both direct). */
export function difference(c: JudgeCase, go: GoAnswer): string | null {
  if (go.urlError !== undefined) return null; // Go cannot even parse the target: no request to decide on
  const ours = oursFor(c);
  const goDecision = go.error !== undefined ? `error (${go.error})` : go.proxy === null ? 'direct' : 'proxy';
  const ourDecision = ours.proxy === null ? 'direct' : 'proxy';
  if (goDecision !== ourDecision) return `Go: ${goDecision}, ours: ${ourDecision}`;
  if (go.proxy === null || ours.proxy === null) return null;
  const g = go.proxy;
  const o = ours.proxy;
  const port = (p: GoProxy): string => p.port || DEFAULT_PORTS[p.scheme.toLowerCase()] || '';
  const diffs: string[] = [];
  if (g.scheme.toLowerCase() !== o.scheme) diffs.push(`scheme ${g.scheme} vs ${o.scheme}`);
  // WHATWG lower-cases names, writes IDNs as punycode and IPv6 canonically: the same host to connect to.
  if (g.hostname.toLowerCase() !== o.hostname && !o.hostname.startsWith('xn--') && !o.hostname.includes(':'))
    diffs.push(`host ${g.hostname} vs ${o.hostname}`);
  if (port(g) !== port(o)) diffs.push(`port ${port(g)} vs ${port(o)}`);
  if (g.user !== o.user) diffs.push(`user ${JSON.stringify(g.user)} vs ${JSON.stringify(o.user)}`);
  if (g.password !== o.password) diffs.push(`password differs`);
  return diffs.length > 0 ? `proxy URL: ${diffs.join(', ')}` : null;
}

// --- generated cases ------------------------------------------------------------------------------------

/** A small seeded PRNG (mulberry32): the same seed, the same cases. */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const NAMES = [
  'example.com',
  'foo.example.com',
  'a.b.example.com',
  'example.co',
  'xample.com',
  'localhost',
  'kubernetes.default.svc',
  'svc',
  'bücher.de',
  'xn--bcher-kva.de',
  'münchen.example',
  'ß.de',
  'e\u0301.com',
  '例え.jp',
  'host_name.local',
  'a..b',
  '-a.com',
  'com',
];
const V4 = [
  '10.0.0.1',
  '10.1.2.3',
  '10.255.255.255',
  '11.0.0.1',
  '127.0.0.1',
  '127.1.2.3',
  '1.2.3.4',
  '192.168.0.10',
  '0.0.0.0',
  '255.255.255.255',
  '01.2.3.4',
  '1.2.3',
  '256.1.1.1',
  '169.254.169.254',
];
const V6 = [
  '::1',
  'fd00::1',
  'fd00:0:0:0:0:0:0:1',
  'FD00::1',
  '2001:db8::5',
  '::ffff:10.0.0.1',
  '::ffff:127.0.0.1',
  '::',
  'fe80::1%eth0',
  '::ffff:a00:1',
  '0:0:0:0:0:0:0:1',
  '1::2::3',
  '::1.2.3.4',
  'fd00::',
];
const CIDRS = [
  '10.0.0.0/8',
  '10.1.0.0/16',
  '10.1.2.3/32',
  '0.0.0.0/0',
  '127.0.0.0/8',
  'fd00::/8',
  '2001:db8::/32',
  '::/0',
  '::ffff:10.0.0.0/104',
  '::ffff:0:0/96',
  '1.2.3.4/33',
  '10.0.0.0/08',
  'fd00::/129',
  '10.0.0.1/24',
  '10.0.0.0/-1',
];
const PORTS = ['443', '80', '8443', '6443', '', '0', '65535', 'abc', '4430'];
const PROXIES = [
  'http://proxy:3128',
  'proxy:3128',
  'https://u:p@proxy.corp:8443',
  'http://u@proxy',
  'http://proxy',
  '10.0.0.1:3128',
  '[fd00::9]:3128',
  'socks5://s:1080',
  'http://%41:b@p:1',
  'http://user:p%40ss@proxy:3128/path?x',
  'HTTP://PROXY:3128',
  'proxy',
  'http://[::1]:3128',
  '://nohost',
  'http://',
  'http://a b',
  'http://proxy:99999',
  'http://proxy:port',
  'p:3128/x',
  'http:proxy:3128',
  '//proxy:3128',
  'http://bücher.de:3128',
  'http://u:p@[fe80::1%25eth0]:3128',
  'ftp://f',
  'http:///path',
];

export class CaseGenerator {
  private readonly r: () => number;
  constructor(seed: number) {
    this.r = prng(seed);
  }
  private pick<T>(xs: readonly T[]): T {
    return xs[Math.floor(this.r() * xs.length)]!;
  }
  private chance(p: number): boolean {
    return this.r() < p;
  }
  private mangleCase(s: string): string {
    if (!this.chance(0.2)) return s;
    return [...s].map((c) => (this.chance(0.5) ? c.toUpperCase() : c)).join('');
  }
  private int(n: number): number {
    return Math.floor(this.r() * n);
  }
  /** An IPv4 address, mostly inside 10.0.0.0/8 and 192.168.0.0/16 so that CIDR entries decide. */
  private randomV4(): string {
    const first = this.pick([10, 10, 192, 127, this.int(256)]);
    const second = first === 192 ? 168 : this.int(256);
    return `${first}.${second}.${this.chance(0.5) ? 0 : this.int(256)}.${this.int(256)}`;
  }
  /** An IPv6 address in any of its spellings: full, compressed, mixed case, IPv4-mapped. */
  private randomV6(): string {
    if (this.chance(0.2)) return `::ffff:${this.randomV4()}`;
    const groups = Array.from({ length: 8 }, (_, i) =>
      i === 0 ? this.pick(['fd00', '2001', 'fe80', '0']) : this.chance(0.5) ? '0' : this.int(0x10000).toString(16),
    );
    let text = groups.join(':');
    if (this.chance(0.6)) text = text.replace(/(^|:)0(:0)+(:|$)/, '::');
    return this.mangleCase(text);
  }
  private randomCidr(): string {
    const v6 = this.chance(0.4);
    const bits = this.int(v6 ? 130 : 34);
    return `${v6 ? this.randomV6() : this.randomV4()}/${this.chance(0.05) ? '0' : ''}${bits}`;
  }
  private host(): string {
    const k = this.r();
    if (k < 0.15) return this.chance(0.6) ? this.randomV4() : this.randomV6();
    let h = k < 0.5 ? this.pick(NAMES) : k < 0.75 ? this.pick(V4) : this.pick(V6);
    if (this.chance(0.15) && !h.includes(':')) h = `${this.pick(['a', 'x.y', 'www'])}.${h}`;
    if (this.chance(0.08)) h = `${h}.`;
    return this.mangleCase(h);
  }
  private entry(): string {
    const k = this.r();
    let e: string;
    if (k < 0.05) e = '*';
    else if (k < 0.35) {
      e = this.pick(NAMES);
      const lead = this.r();
      if (lead < 0.25) e = `.${e}`;
      else if (lead < 0.4) e = `*.${e}`;
      else if (lead < 0.43) e = `*${e}`;
      if (this.chance(0.06)) e = `${e}.`;
    } else if (k < 0.55) e = this.pick(V4);
    else if (k < 0.7) e = this.chance(0.3) ? `[${this.pick(V6)}]` : this.pick(V6);
    else if (k < 0.8) e = this.pick(CIDRS);
    else if (k < 0.9) e = this.chance(0.7) ? this.randomCidr() : this.chance(0.5) ? this.randomV4() : this.randomV6();
    else e = this.host();
    if (this.chance(0.2)) {
      const p = this.pick(PORTS);
      e = e.includes(':') && !e.startsWith('[') && this.chance(0.7) ? `[${e}]:${p}` : `${e}:${p}`;
    }
    if (this.chance(0.1)) e = ` ${e} `;
    return this.mangleCase(e);
  }
  next(): JudgeCase {
    const env: Record<string, string> = {};
    const proxy = this.pick(PROXIES);
    const pv = this.r();
    if (pv < 0.7) env['HTTPS_PROXY'] = proxy;
    else if (pv < 0.85) env['https_proxy'] = proxy;
    else if (pv < 0.9) {
      env['HTTPS_PROXY'] = '';
      env['https_proxy'] = proxy;
    } else if (pv < 0.95) env['HTTP_PROXY'] = proxy;
    const entries = Array.from({ length: Math.floor(this.r() * 4) }, () => this.entry());
    const noProxy = entries.join(this.chance(0.1) ? ', ' : ',') + (this.chance(0.05) ? ',' : '');
    const nv = this.r();
    if (nv < 0.75) env['NO_PROXY'] = noProxy;
    else if (nv < 0.9) env['no_proxy'] = noProxy;
    else if (nv < 0.95) {
      env['NO_PROXY'] = '';
      env['no_proxy'] = noProxy;
    }
    const port = this.chance(0.8) ? 443 : Number(this.pick(['80', '8443', '6443', '1', '65535']));
    return { env, host: this.host(), port };
  }
}

export interface DifferentialResult {
  cases: number;
  /** Cases Go cannot even parse as a target URL (no decision to compare). */
  unparsed: number;
  /** Differences we keep on purpose, counted by name (deliberate()). */
  deliberate: Record<string, number>;
  /** Every other difference (the first `keep`), and how many in all. */
  differences: { case: JudgeCase; go: GoAnswer; what: string }[];
  differing: number;
}

/** Runs `count` generated cases (or until `deadline`) through Go and ours; keeps the first `keep` differences. */
export async function runDifferential(
  judge: GoJudge,
  seed: number,
  count: number,
  deadline = Number.POSITIVE_INFINITY,
  keep = 50,
): Promise<DifferentialResult> {
  const gen = new CaseGenerator(seed);
  const out: DifferentialResult = { cases: 0, unparsed: 0, deliberate: {}, differences: [], differing: 0 };
  const batch = 2000;
  while (out.cases < count && Date.now() < deadline) {
    const cases = Array.from({ length: Math.min(batch, count - out.cases) }, () => gen.next());
    const answers = await judge.ask(cases);
    cases.forEach((c, i) => {
      const go = answers[i]!;
      if (go.urlError !== undefined) out.unparsed++;
      const what = difference(c, go);
      if (what === null) return;
      const why = deliberate(c, go);
      if (why !== null) {
        out.deliberate[why] = (out.deliberate[why] ?? 0) + 1;
        return;
      }
      out.differing++;
      if (out.differences.length < keep) out.differences.push({ case: c, go, what });
    });
    out.cases += cases.length;
  }
  return out;
}
