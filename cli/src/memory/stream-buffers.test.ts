import net from 'node:net';
import { getDefaultHighWaterMark, setDefaultHighWaterMark } from 'node:stream';
import tls from 'node:tls';
import { createCA, issueServerCert } from '@cluster-proxy/server';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { STREAM_BUFFER_BYTES, limitStreamBuffers } from './stream-buffers.js';

const open: Array<net.Socket | net.Server> = [];
// limitStreamBuffers changes a process-wide default: give the worker back the one it had.
const nodeDefault = getDefaultHighWaterMark(false);
afterAll(() => setDefaultHighWaterMark(false, nodeDefault));

afterEach(async () => {
  const all = open.splice(0);
  for (const s of all) if (s instanceof net.Socket) s.destroy();
  for (const s of all) if (s instanceof net.Server) await new Promise((r) => s.close(r));
});

/** A TLS server that pauses each connection after its first chunk, as the hub pauses a CONNECT client
 * whose credit ran out; a client that writes `bytes` into it. Resolves once nothing moves any more. */
async function pausedTlsConnection(bytes: number): Promise<tls.TLSSocket> {
  const ca = createCA({ commonName: 'stream-buffers-test' });
  const pair = issueServerCert(ca, { commonName: 'localhost', dnsNames: ['localhost'] });
  let accepted!: (s: tls.TLSSocket) => void;
  const serverSide = new Promise<tls.TLSSocket>((r) => (accepted = r));
  const srv = tls.createServer({ key: pair.keyPem, cert: pair.certPem }, (s) => {
    open.push(s);
    s.once('data', () => s.pause());
    accepted(s);
  });
  open.push(srv);
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const client = tls.connect({ port: (srv.address() as net.AddressInfo).port, host: '127.0.0.1', ca: ca.certPem, servername: 'localhost' });
  open.push(client);
  client.on('error', () => {});
  await new Promise((r) => client.once('secureConnect', r));
  client.write(Buffer.alloc(bytes, 7));
  const server = await serverSide;
  // Settled when the server's buffer stops growing (the kernel holds the rest).
  let last = -1;
  while (server.readableLength !== last) {
    last = server.readableLength;
    await new Promise((r) => setTimeout(r, 100));
  }
  return server;
}

describe('limitStreamBuffers', () => {
  it('lowers the mark of the sockets a TLS server accepts (they take no option for it) and so what a paused one reads ahead', async () => {
    limitStreamBuffers();
    const server = await pausedTlsConnection(4 * 1024 * 1024);
    expect(server.readableHighWaterMark).toBe(STREAM_BUFFER_BYTES);
    expect(server.readableLength).toBeGreaterThan(0);
    // At most the mark plus the rest of the read it was reached in (libuv reads up to 64 KiB, and
    // every TLS record in it is decrypted and pushed); with Node 24's default it is the 64 KiB mark plus that.
    expect(server.readableLength).toBeLessThanOrEqual(STREAM_BUFFER_BYTES + 64 * 1024);
  });
});
