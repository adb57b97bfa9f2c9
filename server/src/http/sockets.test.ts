// peerReset() on real sockets: a client that resets with data still queued unread is noticed without
// reading; a client that only half-closed (FIN) is not; a live one is not.
import { once } from 'node:events';
import net from 'node:net';
import tls from 'node:tls';
import { afterEach, describe, expect, it } from 'vitest';
import { createCA, issueServerCert } from '../pki/index.js';
import { peerReset } from './sockets.js';

const cleanup: Array<() => void> = [];
afterEach(() => {
  for (const c of cleanup.splice(0)) c();
});

/** A server whose accepted sockets are paused at once (as for a connection waiting for credit). */
async function pausedServer(
  make: (onSocket: (s: net.Socket) => void) => net.Server,
): Promise<{ port: number; accepted: Promise<net.Socket> }> {
  let resolve!: (s: net.Socket) => void;
  const accepted = new Promise<net.Socket>((r) => (resolve = r));
  const server = make((s) => {
    s.pause();
    s.on('error', () => {});
    cleanup.push(() => s.destroy());
    resolve(s);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  cleanup.push(() => server.close());
  return { port: (server.address() as net.AddressInfo).port, accepted };
}

/** Writes more than the kernel buffers hold, so unread data sits before whatever comes next. */
function fill(c: net.Socket): void {
  c.write(Buffer.alloc(16 * 1024 * 1024));
}

const until = async (f: () => boolean): Promise<void> => {
  for (let i = 0; i < 100 && !f(); i++) await new Promise((r) => setTimeout(r, 20));
};

/** The server writes and the client reads it: the connection is live both ways at this point. */
async function answered(server: net.Socket, client: net.Socket): Promise<void> {
  const got = once(client, 'data');
  server.write('still there');
  await got;
}

describe('peerReset', () => {
  it('plain TCP: false while the client is there, true once it reset with data unread', async () => {
    const { port, accepted } = await pausedServer((on) => net.createServer({ allowHalfOpen: true }, on));
    const client = net.connect(port, '127.0.0.1');
    client.on('error', () => {});
    cleanup.push(() => client.destroy());
    const s = await accepted;
    fill(client);
    await answered(s, client);
    expect(peerReset(s)).toBe(false);
    client.resetAndDestroy();
    await until(() => peerReset(s));
    expect(peerReset(s)).toBe(true);
    expect(s.destroyed).toBe(false); // nothing was read: the socket knows nothing yet
  });

  it('plain TCP: a FIN is not a reset', async () => {
    const { port, accepted } = await pausedServer((on) => net.createServer({ allowHalfOpen: true }, on));
    const client = net.connect(port, '127.0.0.1');
    cleanup.push(() => client.destroy());
    const s = await accepted;
    client.end('bye');
    // The FIN has arrived once the server reads to its end (allowHalfOpen: the server keeps its side).
    s.resume();
    await once(s, 'end');
    expect(peerReset(s)).toBe(false);
  });

  it('TLS: the TCP connection under it is asked', async () => {
    const ca = createCA({ commonName: 'peer-reset test CA' });
    const cert = issueServerCert(ca, { commonName: 'localhost', dnsNames: ['localhost'] });
    const { port, accepted } = await pausedServer((on) => tls.createServer({ cert: cert.certPem, key: cert.keyPem }, on));
    const raw = net.connect(port, '127.0.0.1');
    raw.on('error', () => {});
    cleanup.push(() => raw.destroy());
    const client = tls.connect({ socket: raw, servername: 'localhost', ca: ca.certPem });
    client.on('error', () => {});
    await once(client, 'secureConnect');
    const s = await accepted;
    fill(client);
    await answered(s, client);
    expect(peerReset(s)).toBe(false);
    raw.resetAndDestroy();
    await until(() => peerReset(s));
    expect(peerReset(s)).toBe(true);
  });
});
