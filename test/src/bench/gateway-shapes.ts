// What Node allows for the gateway, by shape: bare two-process relays (none of our code, nothing authenticated but
// one HMAC per request, as the hub's identity) between a load generator and one HTTPS "apiserver" answering
// GET /version, kept-alive connections, C requests at a time. Each relay process reports its CPU; a figure is the
// two relays' CPU per GET and the GETs per second, beside CONNECT's in the same round.
//   direct     straight to the apiserver
//   connect    two byte relays (TLS, then TLS to TCP), the client's TLS to the apiserver inside: the CONNECT path
//   full       two HTTP proxies (an HTTPS server whose handler calls on through a kept-alive HTTPS client): the
//              gateway's shape today, where the hub and the agent each parse and write both heads and bodies
//   head       two head-only relays: each connection paired with one to the next hop; request heads parsed and
//              rewritten (the caller's credentials out, the identity MAC in at the first, checked and replaced by
//              impersonation at the second), response bytes relayed as they come
//   agent-head an HTTP proxy in front of a head-only relay (only the agent's half changed)
//   framed     an HTTPS server and an HTTPS client with length-prefixed frames between them (the middle HTTP
//              hop replaced, both ends as they are)
//
//   node test/dist/bench/gateway-shapes.js [--seconds 5] [--rounds 4] [--concurrency 16]
//
// The relays read GETs without bodies only; they measure the shapes' floor, not a gateway to ship.
import { fork, type ChildProcess } from 'node:child_process';
import crypto from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { issueServerCert } from '@cluster-proxy/server';
import { createPki } from '../harness.js';
import { toolArgs } from './tool-args.js';

type Role =
  | 'api'
  | 'connect-front'
  | 'connect-back'
  | 'full-hub'
  | 'full-agent'
  | 'head-hub'
  | 'head-agent'
  | 'framed-hub'
  | 'framed-agent'
  | 'parsed-hub'
  | 'parsed-agent';
const MAC_KEY = Buffer.alloc(32, 7);
const HEAD_END = Buffer.from('\r\n\r\n');
const mac = (line: string): string => crypto.createHmac('sha256', MAC_KEY).update(`alice|${line}`).digest('base64');

/** One relay or the apiserver, in a process of its own: listens, says its port, answers 'cpu' with its CPU in ms. */
function serve(role: Role, next: number, certFile: string, keyFile: string): void {
  // The parent gone (a crash, Ctrl-C before its finally ran): this relay goes too, its port with it.
  process.once('disconnect', () => process.exit(0));
  const cert = readFileSync(certFile);
  const key = readFileSync(keyFile);
  const insecure = { rejectUnauthorized: false };
  process.on('message', (m) => {
    if (m !== 'cpu') return;
    const u = process.cpuUsage();
    process.send?.({ cpu: (u.user + u.system) / 1000 });
  });
  const listening = (s: net.Server): void => {
    s.listen(0, '127.0.0.1', () => process.send?.({ port: (s.address() as net.AddressInfo).port }));
  };
  const nextTls = (): tls.TLSSocket => tls.connect({ port: next, host: '127.0.0.1', ...insecure });
  const apiAgent = new https.Agent({ keepAlive: true, maxSockets: 64, ...insecure });
  switch (role) {
    case 'api': {
      const body = JSON.stringify({
        major: '1',
        minor: '34',
        gitVersion: 'v1.34.0-bench',
        gitCommit: '0'.repeat(40),
        platform: 'linux/amd64',
      });
      const headers = { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) };
      return listening(
        https.createServer({ cert, key, keepAliveTimeout: 60_000 }, (req, res) => {
          req.resume();
          res.writeHead(200, headers).end(body);
        }),
      );
    }
    case 'connect-front':
    case 'connect-back':
      return listening(
        tls.createServer({ cert, key }, (down) => splice(down, role === 'connect-front' ? nextTls() : net.connect(next, '127.0.0.1'))),
      );
    case 'full-hub':
    case 'full-agent':
      return listening(
        https.createServer({ cert, key, keepAliveTimeout: 60_000 }, (req, res) => {
          const line = `${req.method} ${req.url}`;
          const headers = { ...req.headers };
          delete headers['authorization'];
          delete headers['x-identity-mac'];
          if (role === 'full-hub') headers['x-identity-mac'] = mac(line);
          else if (req.headers['x-identity-mac'] !== mac(line)) return void res.writeHead(403).end();
          else Object.assign(headers, { 'impersonate-user': 'alice', authorization: 'Bearer agent-token' });
          const up = https.request({ host: '127.0.0.1', port: next, method: req.method, path: req.url, headers, agent: apiAgent }, (r) => {
            res.writeHead(r.statusCode ?? 502, r.headers);
            r.pipe(res);
          });
          up.on('error', () => res.destroy());
          req.pipe(up);
        }),
      );
    case 'head-hub':
    case 'head-agent':
      return listening(tls.createServer({ cert, key }, (down) => headRelay(down, nextTls(), role === 'head-hub')));
    case 'parsed-hub':
    case 'parsed-agent':
      return listening(tls.createServer({ cert, key }, (down) => parsedRelay(down, nextTls(), role === 'parsed-hub')));
    case 'framed-hub':
      return listening(framedHub(cert, key, nextTls));
    case 'framed-agent':
      return listening(
        tls.createServer({ cert, key }, (c) => {
          c.setNoDelay(true);
          readFrames(c, (f) => {
            const { m, p, h } = JSON.parse(f.toString()) as { m: string; p: string; h: Record<string, string> };
            if (h['x-identity-mac'] !== mac(`${m} ${p}`)) return void c.destroy();
            delete h['x-identity-mac'];
            Object.assign(h, { 'impersonate-user': 'alice', authorization: 'Bearer agent-token' });
            https
              .request({ host: '127.0.0.1', port: next, method: m, path: p, headers: h, agent: apiAgent }, (r) => {
                c.write(Buffer.concat(frame(Buffer.from(JSON.stringify({ s: r.statusCode, h: r.headers })))));
                r.on('data', (d: Buffer) => c.write(Buffer.concat(frame(d))));
                r.on('end', () => c.write(Buffer.alloc(4)));
              })
              .end();
          });
        }),
      );
  }
}

function splice(a: Duplex, b: Duplex): void {
  a.pipe(b);
  b.pipe(a);
  a.on('error', () => b.destroy());
  b.on('error', () => a.destroy());
  a.on('close', () => b.destroy());
  b.on('close', () => a.destroy());
}

/** Request heads (GETs: no bodies) from `down` rewritten onto `up`; `up`'s bytes back to `down` as they are. */
function headRelay(down: Duplex, up: Duplex, hub: boolean): void {
  let buf: Buffer = Buffer.alloc(0);
  down.on('data', (d: Buffer) => {
    buf = buf.length > 0 ? Buffer.concat([buf, d]) : d;
    for (let end = buf.indexOf(HEAD_END); end >= 0; end = buf.indexOf(HEAD_END)) {
      const lines = buf.subarray(0, end).toString('latin1').split('\r\n');
      buf = buf.subarray(end + 4);
      const first = lines.shift() ?? '';
      const line = first.slice(0, first.lastIndexOf(' '));
      const out = [first];
      let given = '';
      for (const l of lines) {
        const name = l.slice(0, l.indexOf(':')).trim().toLowerCase();
        if (name === 'x-identity-mac') given = l.slice(l.indexOf(':') + 1).trim();
        else if (name !== 'authorization') out.push(l);
      }
      if (hub) out.push(`x-identity-mac: ${mac(line)}`);
      else if (given !== mac(line)) return void down.destroy();
      else out.push('impersonate-user: alice', 'authorization: Bearer agent-token');
      up.write(`${out.join('\r\n')}\r\n\r\n`);
    }
  });
  up.pipe(down);
  down.on('error', () => up.destroy());
  up.on('error', () => down.destroy());
  down.on('close', () => up.destroy());
  up.on('close', () => down.destroy());
}

interface LlParser {
  initialize(kind: number, resource: object): void;
  execute(b: Buffer): number | Error;
  [k: number]: unknown;
}
interface LlParserClass {
  new (): LlParser;
  REQUEST: number;
  RESPONSE: number;
  kOnHeadersComplete: number;
  kOnBody: number;
  kOnMessageComplete: number;
  kOnExecute: number;
}
const { HTTPParser, methods: METHODS } = (await import('node:_http_common' as string)) as {
  HTTPParser: LlParserClass;
  methods: string[];
};

/**
 * head-only with Node's own parser (llhttp) at both ends: request heads and bodies parsed (bodies re-chunked
 * when chunked), heads rewritten; at the hub, responses parsed to find where each ends (what audit, errors
 * and a next request need) while their bytes go back as they came.
 */
function parsedRelay(down: Duplex, up: Duplex, hub: boolean): void {
  const req = new HTTPParser();
  req.initialize(HTTPParser.REQUEST, {});
  let chunked = false;
  req[HTTPParser.kOnHeadersComplete] = (_maj: number, _min: number, headers: string[], method: number, url: string): number => {
    const name = METHODS[method] ?? 'GET';
    const line = `${name} ${url}`;
    let head = `${line} HTTP/1.1\r\n`;
    let given = '';
    chunked = false;
    for (let i = 0; i < headers.length; i += 2) {
      const k = headers[i]!.toLowerCase();
      const v = headers[i + 1]!;
      if (k === 'x-identity-mac') given = v;
      else if (k !== 'authorization') head += `${headers[i]}: ${v}\r\n`;
      if (k === 'transfer-encoding') chunked = true;
    }
    if (hub) head += `x-identity-mac: ${mac(line)}\r\n`;
    else if (given !== mac(line)) {
      down.destroy();
      return 1;
    } else head += 'impersonate-user: alice\r\nauthorization: Bearer agent-token\r\n';
    up.write(`${head}\r\n`);
    return 0;
  };
  req[HTTPParser.kOnBody] = (b: Buffer): void => {
    if (chunked) up.write(`${b.length.toString(16)}\r\n`);
    up.write(b);
    if (chunked) up.write('\r\n');
  };
  req[HTTPParser.kOnMessageComplete] = (): void => {
    if (chunked) up.write('0\r\n\r\n');
  };
  req[HTTPParser.kOnExecute] = (): void => {};
  let res: LlParser | null = null;
  if (hub) {
    res = new HTTPParser();
    res.initialize(HTTPParser.RESPONSE, {});
    res[HTTPParser.kOnHeadersComplete] = (): number => 0;
    res[HTTPParser.kOnBody] = (): void => {};
    res[HTTPParser.kOnMessageComplete] = (): void => {};
    res[HTTPParser.kOnExecute] = (): void => {};
  }
  down.on('data', (d: Buffer) => {
    if (req.execute(d) instanceof Error) down.destroy();
  });
  up.on('data', (d: Buffer) => {
    if (res && res.execute(d) instanceof Error) return void up.destroy();
    down.write(d);
  });
  down.on('error', () => up.destroy());
  up.on('error', () => down.destroy());
  down.on('close', () => up.destroy());
  up.on('close', () => down.destroy());
}

const frame = (b: Buffer): Buffer[] => {
  const h = Buffer.alloc(4);
  h.writeUInt32BE(b.length);
  return [h, b];
};

function readFrames(sock: Duplex, onFrame: (f: Buffer) => void): void {
  let b: Buffer = Buffer.alloc(0);
  sock.on('data', (d: Buffer) => {
    b = b.length > 0 ? Buffer.concat([b, d]) : d;
    while (b.length >= 4 && b.length >= 4 + b.readUInt32BE(0)) {
      const n = b.readUInt32BE(0);
      const f = b.subarray(4, 4 + n);
      b = b.subarray(4 + n);
      onFrame(f);
    }
  });
}

/** An HTTPS server sending each request as frames on a kept TLS connection (one request at a time on each). */
function framedHub(cert: Buffer, key: Buffer, nextTls: () => tls.TLSSocket): https.Server {
  type Link = { sock: tls.TLSSocket; res: import('node:http').ServerResponse | null; head: boolean };
  const idle: Link[] = [];
  const open = (): Link => {
    const link: Link = { sock: nextTls(), res: null, head: true };
    link.sock.setNoDelay(true);
    readFrames(link.sock, (f) => {
      const res = link.res!;
      if (link.head) {
        const h = JSON.parse(f.toString()) as { s: number; h: Record<string, string> };
        res.writeHead(h.s, h.h);
        link.head = false;
      } else if (f.length > 0) res.write(f);
      else {
        link.head = true;
        link.res = null;
        idle.push(link);
        res.end();
      }
    });
    return link;
  };
  return https.createServer({ cert, key, keepAliveTimeout: 60_000 }, (req, res) => {
    const headers: Record<string, unknown> = { ...req.headers, 'x-identity-mac': mac(`${req.method} ${req.url}`) };
    delete headers['authorization'];
    const link = idle.pop() ?? open();
    link.res = res;
    req.resume();
    link.sock.write(Buffer.concat(frame(Buffer.from(JSON.stringify({ m: req.method, p: req.url, h: headers })))));
  });
}

interface Started {
  child: ChildProcess;
  port: number;
}

async function main(): Promise<void> {
  const { values } = toolArgs(
    'gateway-shapes',
    'Usage: node test/dist/bench/gateway-shapes.js [--seconds 5] [--rounds 4] [--concurrency 16]\n',
    {
      options: {
        seconds: { type: 'string', default: '5' },
        rounds: { type: 'string', default: '4' },
        concurrency: { type: 'string', default: '16' },
      },
    },
  );
  const seconds = Number(values.seconds);
  const concurrency = Number(values.concurrency);
  const pki = await createPki();
  const pair = issueServerCert(pki.ca, { commonName: 'localhost', ipAddresses: ['127.0.0.1'], dnsNames: ['localhost'] });
  const certFile = path.join(pki.dir, 'shapes.crt');
  const keyFile = path.join(pki.dir, 'shapes.key');
  writeFileSync(certFile, pair.certPem);
  writeFileSync(keyFile, pair.keyPem, { mode: 0o600 });
  const children: ChildProcess[] = [];
  const start = (role: Role, next = 0): Promise<Started> =>
    new Promise((resolve, reject) => {
      const child = fork(fileURLToPath(import.meta.url), ['--role', role, String(next), certFile, keyFile]);
      children.push(child);
      child.once('error', reject);
      child.once('message', (m: { port: number }) => resolve({ child, port: m.port }));
    });
  const cpu = (c: ChildProcess): Promise<number> =>
    new Promise((resolve) => {
      c.once('message', (m: { cpu: number }) => resolve(m.cpu));
      c.send('cpu');
    });
  try {
    const api = await start('api');
    const chain = async (front: Role, back: Role): Promise<Started[]> => {
      const b = await start(back, api.port);
      return [await start(front, b.port), b];
    };
    const insecure = { keepAlive: true, maxSockets: concurrency, rejectUnauthorized: false };
    const connectFront = (await chain('connect-front', 'connect-back'))[0]!;
    const connectAgent = new https.Agent(insecure);
    (
      connectAgent as unknown as { createConnection: (o: unknown, cb: (e: Error | null, s?: Duplex) => void) => undefined }
    ).createConnection = (_o, cb) => {
      const outer = tls.connect({ port: connectFront.port, host: '127.0.0.1', rejectUnauthorized: false });
      const inner = tls.connect({ socket: outer, servername: 'localhost', rejectUnauthorized: false });
      inner.once('secureConnect', () => cb(null, inner));
      inner.once('error', (e) => cb(e));
      return undefined;
    };
    const shapes: { name: string; port: number; agent: https.Agent; relays: ChildProcess[] }[] = [
      { name: 'direct', port: api.port, agent: new https.Agent(insecure), relays: [] },
      { name: 'connect', port: 0, agent: connectAgent, relays: children.slice(1, 3) },
    ];
    for (const [name, front, back] of [
      ['full', 'full-hub', 'full-agent'],
      ['head', 'head-hub', 'head-agent'],
      ['agent-head', 'full-hub', 'head-agent'],
      ['framed', 'framed-hub', 'framed-agent'],
      ['parsed', 'parsed-hub', 'parsed-agent'],
    ] as const) {
      const c = await chain(front, back);
      shapes.push({ name, port: c[0]!.port, agent: new https.Agent(insecure), relays: c.map((s) => s.child) });
    }
    const get = (agent: https.Agent, port: number): Promise<void> =>
      new Promise((resolve, reject) => {
        const r = https.request(
          { host: '127.0.0.1', port, path: '/version', agent, headers: { authorization: 'Bearer caller' } },
          (res) => {
            if (res.statusCode !== 200) reject(new Error(`status ${res.statusCode}`));
            res.resume();
            res.on('end', resolve);
          },
        );
        r.on('error', reject);
        r.end();
      });
    const rows = new Map<string, { gps: number[]; us: number[] }>();
    for (let round = 0; round < Number(values.rounds); round++) {
      let connect = { gps: 0, us: 0 };
      for (const s of shapes) {
        const before = await Promise.all(s.relays.map(cpu));
        let n = 0;
        const t0 = performance.now();
        const end = t0 + seconds * 1000;
        await Promise.all(
          Array.from({ length: concurrency }, async () => {
            while (performance.now() < end) {
              await get(s.agent, s.port);
              n++;
            }
          }),
        );
        const gps = n / ((performance.now() - t0) / 1000);
        const after = await Promise.all(s.relays.map(cpu));
        const us = (after.reduce((a, v, i) => a + v - before[i]!, 0) * 1000) / n;
        if (s.name === 'connect') connect = { gps, us };
        const row = rows.get(s.name) ?? { gps: [], us: [] };
        row.gps.push(s.name === 'direct' || s.name === 'connect' ? gps : gps / connect.gps);
        row.us.push(s.name === 'direct' || s.name === 'connect' ? us : us / connect.us);
        rows.set(s.name, row);
        s.agent.destroy();
      }
    }
    const range = (v: number[], digits: number): string => {
      const sorted = [...v].sort((a, b) => a - b);
      return `${sorted[0]!.toFixed(digits)}–${sorted.at(-1)!.toFixed(digits)}`;
    };
    console.log(`${Number(values.rounds)} rounds of ${seconds} s, ${concurrency} GETs in flight; ranges over the rounds`);
    for (const [name, r] of rows) {
      if (name === 'direct') console.log(`direct      ${range(r.gps, 0)} GET/s`);
      else if (name === 'connect') console.log(`connect     ${range(r.gps, 0)} GET/s, relays ${range(r.us, 0)} µs CPU per GET`);
      else console.log(`${name.padEnd(11)} ${range(r.gps, 2)}× CONNECT's GET/s, ${range(r.us, 2)}× its CPU per GET`);
    }
  } finally {
    for (const c of children) c.kill();
    await pki.cleanup();
  }
}

const roleAt = process.argv.indexOf('--role');
if (roleAt >= 0) {
  const [role, next, certFile, keyFile] = process.argv.slice(roleAt + 1);
  serve(role as Role, Number(next), certFile!, keyFile!);
} else {
  await main();
  process.exit(0);
}
