import { once } from 'node:events';
import net from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { connectThroughProxy, EgressProxyError, formatHostPort, proxyAuthorization } from './egress-proxy.js';

interface Seen {
  head: string;
  requestLine: string;
  headers: Map<string, string>;
}

type Behaviour = (socket: net.Socket, seen: Seen) => void;

interface FakeProxy {
  url: (userinfo?: string) => URL;
  port: number;
  seen: Seen[];
  behave(b: Behaviour): void;
  close(): Promise<void>;
}

const servers: Array<{ close(): Promise<void> }> = [];

async function listen(onConnection: (s: net.Socket) => void): Promise<{ port: number; sockets: Set<net.Socket>; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    sockets.add(s);
    s.on('error', () => {});
    s.once('close', () => sockets.delete(s));
    onConnection(s);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as net.AddressInfo).port;
  const handle = {
    port,
    sockets,
    async close() {
      const done = new Promise<void>((resolve) => server.close(() => resolve()));
      for (const s of sockets) s.destroy();
      await done;
    },
  };
  servers.push(handle);
  return handle;
}

/** Tunnels to the requested target (only loopback targets are honoured here). */
const tunnel: Behaviour = (socket, seen) => {
  const [host, port] = seen.requestLine.split(' ')[1]!.split(/:(?=\d+$)/) as [string, string];
  const up = net.connect(Number(port), host.replace(/^\[|\]$/g, ''), () => {
    socket.write('HTTP/1.1 200 Connection established\r\n\r\n');
    socket.pipe(up);
    up.pipe(socket);
  });
  up.on('error', () => socket.destroy());
  socket.on('close', () => up.destroy());
};

async function startFakeProxy(): Promise<FakeProxy> {
  let behaviour: Behaviour = tunnel;
  const seen: Seen[] = [];
  const srv = await listen((socket) => {
    let buf = Buffer.alloc(0);
    const onData = (d: Buffer): void => {
      buf = Buffer.concat([buf, d]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      socket.off('data', onData);
      socket.pause();
      const head = buf.subarray(0, end).toString('latin1');
      const rest = buf.subarray(end + 4);
      if (rest.length > 0) socket.unshift(rest);
      const [requestLine = '', ...lines] = head.split('\r\n');
      const headers = new Map(lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
      const s: Seen = { head, requestLine, headers };
      seen.push(s);
      behaviour(socket, s);
    };
    socket.on('data', onData);
  });
  return {
    port: srv.port,
    seen,
    url: (userinfo = '') => new URL(`http://${userinfo}${userinfo ? '@' : ''}127.0.0.1:${srv.port}`),
    behave(b) {
      behaviour = b;
    },
    close: () => srv.close(),
  };
}

let proxy: FakeProxy;
let echoPort: number;

beforeAll(async () => {
  proxy = await startFakeProxy();
  echoPort = (await listen((s) => s.pipe(s))).port;
});

afterEach(() => proxy.behave(tunnel));

afterAll(async () => {
  await Promise.all(servers.map((s) => s.close()));
});

async function expectProxyError(p: Promise<unknown>): Promise<EgressProxyError> {
  try {
    const s = await p;
    (s as net.Socket).destroy();
  } catch (err) {
    expect(err).toBeInstanceOf(EgressProxyError);
    return err as EgressProxyError;
  }
  throw new Error('expected connectThroughProxy to fail');
}

async function roundTrip(s: net.Socket, payload: Buffer): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let n = 0;
  const done = new Promise<void>((resolve, reject) => {
    s.on('data', (d: Buffer) => {
      chunks.push(d);
      n += d.length;
      if (n >= payload.length) resolve();
    });
    s.once('error', reject);
  });
  s.write(payload);
  await done;
  return Buffer.concat(chunks);
}

const target = (): { host: string; port: number } => ({ host: '127.0.0.1', port: echoPort });

describe('connectThroughProxy', () => {
  it('sends CONNECT with Host and decoded Basic credentials, then carries bytes both ways', async () => {
    const s = await connectThroughProxy({ proxy: proxy.url('al%20ice:p%40ss%3Aw0rd'), target: target(), timeoutMs: 2000 });
    expect((await roundTrip(s, Buffer.from('ping'))).toString()).toBe('ping');
    s.destroy();
    const seen = proxy.seen.at(-1)!;
    expect(seen.requestLine).toBe(`CONNECT 127.0.0.1:${echoPort} HTTP/1.1`);
    expect(seen.headers.get('host')).toBe(`127.0.0.1:${echoPort}`);
    expect(Buffer.from(seen.headers.get('proxy-authorization')!.replace(/^Basic /, ''), 'base64').toString()).toBe('al ice:p@ss:w0rd');
  });

  it('sends no Proxy-Authorization without user-info, and brackets IPv6 targets', async () => {
    proxy.behave((s) => s.end('HTTP/1.1 502 Bad Gateway\r\n\r\n'));
    await expectProxyError(connectThroughProxy({ proxy: proxy.url(), target: { host: '::1', port: 443 }, timeoutMs: 2000 }));
    const seen = proxy.seen.at(-1)!;
    expect(seen.requestLine).toBe('CONNECT [::1]:443 HTTP/1.1');
    expect(seen.headers.has('proxy-authorization')).toBe(false);
  });

  it('hands back bytes the proxy sent right after the head', async () => {
    proxy.behave((s) => s.write('HTTP/1.0 200 OK\r\nVia: test\r\n\r\nSSH-2.0-banner\r\n'));
    const s = await connectThroughProxy({ proxy: proxy.url(), target: target(), timeoutMs: 2000 });
    const [first] = (await once(s, 'data')) as [Buffer];
    expect(first.toString()).toBe('SSH-2.0-banner\r\n');
    s.destroy();
  });

  it('407 with credentials: "proxy authentication failed", naming the proxy without the password', async () => {
    proxy.behave((s) => s.end('HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm="x"\r\n\r\n'));
    const e = await expectProxyError(connectThroughProxy({ proxy: proxy.url('alice:hunter2'), target: target(), timeoutMs: 2000 }));
    expect(e.kind).toBe('auth');
    expect(e.statusCode).toBe(407);
    expect(e.message).toBe(`proxy authentication failed (http://alice@127.0.0.1:${proxy.port} answered 407)`);
    expect(`${e.message} ${e.proxy} ${e.stack}`).not.toContain('hunter2');
  });

  it('407 without credentials, and a proxy that wants something other than Basic', async () => {
    proxy.behave((s) => s.end('HTTP/1.1 407 Nope\r\nProxy-Authenticate: Negotiate\r\nProxy-Authenticate: NTLM\r\n\r\n'));
    const e = await expectProxyError(connectThroughProxy({ proxy: proxy.url(), target: target(), timeoutMs: 2000 }));
    expect(e.message).toBe(
      `proxy authentication required (http://127.0.0.1:${proxy.port} answered 407 and the proxy URL has no user name and password; it asks for Negotiate, NTLM, only Basic is supported)`,
    );
  });

  it('403: "proxy refused CONNECT to TARGET"; other statuses: status and reason', async () => {
    proxy.behave((s) => s.end('HTTP/1.1 403 Forbidden\r\nX-Squid-Error: ERR_ACCESS_DENIED 0\r\n\r\n'));
    const e403 = await expectProxyError(connectThroughProxy({ proxy: proxy.url(), target: { host: 'hub', port: 8091 }, timeoutMs: 2000 }));
    expect(e403.kind).toBe('refused');
    expect(e403.message).toBe(`proxy refused CONNECT to hub:8091 (403 Forbidden from http://127.0.0.1:${proxy.port}, ERR_ACCESS_DENIED 0)`);
    proxy.behave((s) => s.end('HTTP/1.1 503 Service Unavailable\r\n\r\n'));
    const e503 = await expectProxyError(connectThroughProxy({ proxy: proxy.url(), target: { host: 'hub', port: 8091 }, timeoutMs: 2000 }));
    expect(e503).toMatchObject({
      kind: 'status',
      statusCode: 503,
      message: `proxy http://127.0.0.1:${proxy.port} answered CONNECT to hub:8091 with 503 Service Unavailable`,
    });
  });

  it('a head larger than the limit, or not HTTP at all, is a protocol error', async () => {
    proxy.behave((s) => s.write(`HTTP/1.1 200 OK\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`));
    const big = await expectProxyError(connectThroughProxy({ proxy: proxy.url(), target: target(), timeoutMs: 2000 }));
    expect(big).toMatchObject({
      kind: 'protocol',
      message: `proxy http://127.0.0.1:${proxy.port} sent a CONNECT answer head larger than 16 KiB`,
    });
    proxy.behave((s) => s.end('SSH-2.0-OpenSSH_9.2\r\n\r\n'));
    const ssh = await expectProxyError(connectThroughProxy({ proxy: proxy.url(), target: target(), timeoutMs: 2000 }));
    expect(ssh.message).toBe(`proxy http://127.0.0.1:${proxy.port} answered CONNECT with something that is not HTTP: SSH-2.0-OpenSSH_9.2`);
    proxy.behave((s) => s.write(Buffer.from([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x46])));
    const tlsAlert = await expectProxyError(connectThroughProxy({ proxy: proxy.url(), target: target(), timeoutMs: 2000 }));
    expect(tlsAlert.message).toBe(`proxy http://127.0.0.1:${proxy.port} answered CONNECT with TLS, not HTTP: is it an https:// proxy?`);
  });

  it('a proxy that closes without answering, or never answers', async () => {
    proxy.behave((s) => s.end());
    const closed = await expectProxyError(connectThroughProxy({ proxy: proxy.url(), target: target(), timeoutMs: 2000 }));
    expect(closed).toMatchObject({
      kind: 'closed',
      message: `proxy http://127.0.0.1:${proxy.port} closed the connection without answering CONNECT 127.0.0.1:${echoPort}`,
    });
    proxy.behave(() => {});
    const t0 = performance.now();
    const silent = await expectProxyError(connectThroughProxy({ proxy: proxy.url('u:secret'), target: target(), timeoutMs: 300 }));
    expect(performance.now() - t0).toBeGreaterThanOrEqual(290);
    expect(silent).toMatchObject({
      kind: 'timeout',
      message: `proxy http://u@127.0.0.1:${proxy.port} did not answer CONNECT within 300 ms`,
    });
  });

  it('an unreachable proxy: "cannot reach proxy"', async () => {
    const gone = await listen(() => {});
    await gone.close();
    const e = await expectProxyError(
      connectThroughProxy({ proxy: new URL(`http://bob:pw@127.0.0.1:${gone.port}`), target: target(), timeoutMs: 2000 }),
    );
    expect(e).toMatchObject({
      kind: 'unreachable',
      code: 'ECONNREFUSED',
      message: `cannot reach proxy http://bob@127.0.0.1:${gone.port}: ECONNREFUSED`,
    });
  });

  it('https:// against a plain-TCP proxy fails in the TLS phase', async () => {
    proxy.behave(() => {});
    const plain = await listen((s) => s.end('HTTP/1.1 400 Bad Request\r\n\r\n'));
    const e = await expectProxyError(
      connectThroughProxy({ proxy: new URL(`https://127.0.0.1:${plain.port}`), target: target(), timeoutMs: 2000 }),
    );
    expect(e.kind).toBe('tls');
    expect(e.message).toMatch(new RegExp(`^TLS to proxy https://127.0.0.1:${plain.port} failed: .*is it an http:// proxy\\?$`));
  });

  it('an AbortSignal cancels a pending CONNECT', async () => {
    proxy.behave(() => {});
    const ac = new AbortController();
    const p = connectThroughProxy({ proxy: proxy.url(), target: target(), timeoutMs: 5000, signal: ac.signal });
    setTimeout(() => ac.abort(), 50);
    expect((await expectProxyError(p)).kind).toBe('aborted');
    expect(
      (await expectProxyError(connectThroughProxy({ proxy: proxy.url(), target: target(), timeoutMs: 5000, signal: ac.signal }))).kind,
    ).toBe('aborted');
  });

  it('refuses unusable configuration before dialing', async () => {
    const cfg = (p: Promise<unknown>): Promise<EgressProxyError> => expectProxyError(p);
    expect(
      (await cfg(connectThroughProxy({ proxy: new URL('socks5://127.0.0.1:1080'), target: target(), timeoutMs: 1000 }))).message,
    ).toMatch(/scheme socks5 is not supported/);
    expect(
      (await cfg(connectThroughProxy({ proxy: proxy.url(), target: { host: 'a\r\nX-Evil: 1', port: 1 }, timeoutMs: 1000 }))).kind,
    ).toBe('config');
    expect((await cfg(connectThroughProxy({ proxy: proxy.url(), target: { host: 'a', port: 0 }, timeoutMs: 1000 }))).kind).toBe('config');
    expect((await cfg(connectThroughProxy({ proxy: proxy.url(), target: target(), timeoutMs: 0 }))).kind).toBe('config');
  });

  it('helpers', () => {
    expect(formatHostPort('::1', 443)).toBe('[::1]:443');
    expect(formatHostPort('[::1]', 443)).toBe('[::1]:443');
    expect(formatHostPort('hub', 8091)).toBe('hub:8091');
    expect(proxyAuthorization(new URL('http://p:1'))).toBeNull();
    expect(proxyAuthorization(new URL('http://a:b@p:1'))).toBe(`Basic ${Buffer.from('a:b').toString('base64')}`);
    expect(proxyAuthorization(new URL('http://a@p:1'))).toBe(`Basic ${Buffer.from('a:').toString('base64')}`);
  });
});
