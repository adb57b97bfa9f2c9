// An HTTP/2 session on a native TLS socket whose peer is SIGKILLed mid-transfer: the hub end (a TLS
// listener handing the socket to our H2Session, as the TlsPort and GrpcServer do) and the client end
// (Node's HTTP/2 on tls.connect, through proto's h2Socket, as GrpcClient does). Both directions carry
// data so that a write is in flight when the reset comes: about half the rounds hit Node's stuck write
// on the client end (see h2-transport.ts in proto), which the watch must end; that test runs rounds
// until the watch has ended at least one. Every round's session must end within 2 s of the kill.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import http2 from 'node:http2';
import type { AddressInfo } from 'node:net';
import { PassThrough } from 'node:stream';
import tls from 'node:tls';
import { H2Session, canWatchTlsWrites, encodeHeaderBlock, h2Socket, stuckTlsWritesEnded, type H2Stream } from '@cluster-proxy/proto';
import { afterEach, describe, expect, it } from 'vitest';
import { createCA, issueClientCert, issueServerCert } from '../pki/certificates.js';

const ca = createCA();
const serving = issueServerCert(ca, { commonName: 'hub', ipAddresses: ['127.0.0.1'] });
const client = issueClientCert(ca, { commonName: 'peer' });

/** The peer, in a child process: an HTTP/2 client or server that sends and reads as fast as it can. */
const PEER = `
import http2 from 'node:http2';
const chunk = Buffer.alloc(16384);
const pump = (s) => { const go = () => { while (!s.destroyed && s.write(chunk)); }; s.on('drain', go); go(); };
const { ROLE, PORT, KEY, CERT, CA } = process.env;
const settings = { initialWindowSize: 16 << 20 };
if (ROLE === 'client') {
  const s = http2.connect('https://127.0.0.1:' + PORT, { ca: CA, key: KEY, cert: CERT, settings });
  s.on('connect', () => s.setLocalWindowSize(64 << 20));
  const req = s.request({ ':path': '/', ':method': 'POST' });
  req.on('data', () => {});
  pump(req);
  req.once('response', () => process.send('flowing'));
} else {
  const srv = http2.createSecureServer({ key: KEY, cert: CERT, settings });
  srv.on('session', (s) => s.setLocalWindowSize(64 << 20));
  srv.on('stream', (st) => {
    st.respond({ ':status': 200 });
    st.on('data', () => {});
    pump(st);
    process.send('flowing');
  });
  srv.listen(0, '127.0.0.1', () => process.send(srv.address().port));
}
`;

const children = new Set<ChildProcess>();
const cleanups: (() => void)[] = [];

afterEach(() => {
  for (const c of children) c.kill('SIGKILL');
  children.clear();
  for (const f of cleanups.splice(0)) f();
});

function peer(role: 'client' | 'server', port = 0): ChildProcess {
  const env = {
    ...process.env,
    ROLE: role,
    PORT: String(port),
    KEY: role === 'client' ? client.keyPem : serving.keyPem,
    CERT: role === 'client' ? client.certPem : serving.certPem,
    CA: ca.certPem,
  };
  const child = spawn(process.execPath, ['--input-type=module', '-e', PEER], { env, stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

/** Waits until `child` says the transfer flows, lets it run 200 ms, SIGKILLs it, and resolves with the ms until `session` closed (or rejects after 2 s). */
/** What killAndTime needs of a session: node:http2's and ours have it. */
interface Closable {
  readonly destroyed: boolean;
  destroy(): void;
  once(event: 'close', listener: () => void): unknown;
}

async function killAndTime(child: ChildProcess, flowing: Promise<unknown>, session: Promise<Closable>): Promise<number> {
  const s = await session;
  await flowing;
  await new Promise((r) => setTimeout(r, 200));
  const t0 = performance.now();
  const closed = new Promise<void>((r) => s.once('close', r)); // (events.once would reject on the session's 'error')
  child.kill('SIGKILL');
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      closed,
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error('the session was still open 2 s after its peer was SIGKILLed')), 2000);
      }),
    ]);
  } finally {
    clearTimeout(timer);
    if (!s.destroyed) s.destroy();
  }
  return performance.now() - t0;
}

const pump = (s: http2.Http2Stream): void => {
  const chunk = Buffer.alloc(16384);
  const go = (): void => {
    while (!s.destroyed && s.write(chunk));
  };
  s.on('drain', go);
  go();
};

/** Runs `round` until the watch ended a stuck write (at most 16 rounds); every round must end its session within 2 s. */
async function rounds(round: () => Promise<number>): Promise<{ ended: number; times: number[] }> {
  const before = stuckTlsWritesEnded();
  const times: number[] = [];
  for (let i = 0; i < 16 && (i < 3 || stuckTlsWritesEnded() === before); i++) times.push(Math.round(await round()));
  return { ended: stuckTlsWritesEnded() - before, times };
}

describe('h2Socket: what node:http2 gets', () => {
  it('the TLS socket itself over TCP (Node internals the watch reads are there), a JS stream over TLS on anything else', async () => {
    const server = tls.createServer({ key: serving.keyPem, cert: serving.certPem });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    cleanups.push(() => server.close());
    const overTcp = tls.connect({ host: '127.0.0.1', port: (server.address() as AddressInfo).port, ca: ca.certPem });
    overTcp.on('error', () => {});
    cleanups.push(() => overTcp.destroy());
    expect(canWatchTlsWrites(overTcp)).toBe(true);
    expect(h2Socket(overTcp)).toBe(overTcp);
    const overDuplex = tls.connect({ socket: new PassThrough(), ca: ca.certPem });
    overDuplex.on('error', () => {});
    cleanups.push(() => overDuplex.destroy());
    expect(canWatchTlsWrites(overDuplex)).toBe(false);
    const transport = h2Socket(overDuplex);
    expect(transport).not.toBe(overDuplex);
    transport.destroy();
    expect(overDuplex.destroyed).toBe(true);
  });
});

describe('h2Socket: HTTP/2 on a native TLS socket whose peer is SIGKILLed mid-transfer', () => {
  it('the hub end (our H2Session): every session ends within 2 s, without the watch', { timeout: 90_000 }, async () => {
    const sessions: ((s: H2Session) => void)[] = [];
    const chunk = Buffer.alloc(16384);
    const server = tls.createServer({
      key: serving.keyPem,
      cert: serving.certPem,
      ca: ca.certPem,
      requestCert: true,
      rejectUnauthorized: true,
      ALPNProtocols: ['h2'],
    });
    server.on('secureConnection', (socket: tls.TLSSocket) => {
      const session = new H2Session(socket, { streamWindow: 16 << 20, connectionWindow: 64 << 20 });
      session.on('stream', (st: H2Stream) => {
        const go = (): void => {
          while (!st.destroyed && st.write([chunk], chunk.length));
        };
        st.handler = {
          onStreamData: () => {},
          onStreamEnd: () => {},
          onStreamDrain: go,
          onStreamTrailersSent: () => {},
          onStreamClose: () => {},
        };
        st.respond(encodeHeaderBlock([[':status', '200']]), false);
        go();
      });
      sessions.shift()?.(session);
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    cleanups.push(() => server.close());
    const port = (server.address() as AddressInfo).port;
    const before = stuckTlsWritesEnded();
    const times: number[] = [];
    for (let i = 0; i < 8; i++) {
      const session = new Promise<H2Session>((r) => sessions.push(r));
      const child = peer('client', port);
      times.push(Math.round(await killAndTime(child, once(child, 'message'), session)));
    }
    expect(times).toHaveLength(8);
    expect(stuckTlsWritesEnded()).toBe(before); // nothing of the watch's was needed
  });

  it('the client end: every session ends within 2 s, stuck writes ended by the watch', { timeout: 90_000 }, async () => {
    const { ended, times } = await rounds(async () => {
      const child = peer('server');
      const [port] = (await once(child, 'message')) as [number];
      const flowing = once(child, 'message');
      const socket = tls.connect({
        host: '127.0.0.1',
        port,
        ca: ca.certPem,
        key: client.keyPem,
        cert: client.certPem,
        ALPNProtocols: ['h2'],
      });
      const session = http2.connect(`https://127.0.0.1:${port}`, {
        settings: { initialWindowSize: 16 << 20 },
        createConnection: () => h2Socket(socket),
      });
      session.on('error', () => {});
      session.once('connect', () => session.setLocalWindowSize(64 << 20));
      const req = session.request({ ':path': '/', ':method': 'POST' });
      req.on('error', () => {});
      req.on('data', () => {});
      pump(req);
      return killAndTime(child, flowing, Promise.resolve(session));
    });
    expect(ended, `session close times ${times.join(', ')} ms`).toBeGreaterThan(0);
  });
});
