import { once } from 'node:events';
import { describe, expect, it } from 'vitest';
import { TunnelError } from './errors.js';
import { Tunnel } from './tunnel.js';

describe('Tunnel without a hub', () => {
  it('refuses to dial after close(), asynchronously like net.connect', async () => {
    const t = new Tunnel({ address: 'unix:///nonexistent/hub.sock' });
    t.close();
    const s = t.connect('c1:443');
    const [err] = (await once(s, 'error')) as [TunnelError];
    expect(err).toBeInstanceOf(TunnelError);
    expect(err.reason).toBe('tunnelclosed');
    expect(err.message).toContain('c1:443');
    await expect(t.dial('c1:443')).rejects.toMatchObject({ reason: 'tunnelclosed' });
  });

  it('fails a dial with `tunnelclosed` naming the destination when the hub is unreachable', async () => {
    const t = new Tunnel({ address: 'unix:///nonexistent/hub.sock' });
    try {
      const err = await t.dial('c1:443', { timeoutMs: 5000 }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(TunnelError);
      expect((err as TunnelError).reason).toBe('tunnelclosed');
      expect((err as Error).message).toMatch(/c1:443.*UNAVAILABLE/);
    } finally {
      t.close();
    }
  });

  it('needs certificates for a TCP hub address', () => {
    expect(() => new Tunnel({ address: '127.0.0.1:8090' })).toThrow(/caCert, cert and key/);
  });
});

describe('Tunnel.close() with a dial in flight', () => {
  it('rejects the pending dial with tunnelclosed instead of leaving it hanging', async () => {
    // A hub address that accepts TCP but never completes TLS: the dial stays pending until close().
    const { createServer } = await import('node:net');
    const held: import('node:net').Socket[] = [];
    const server = createServer((s) => held.push(s));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    const port = (server.address() as { port: number }).port;
    const { createCA, issueClientCert } = await import('@cluster-proxy/server');
    const ca = createCA();
    const me = issueClientCert(ca, { commonName: 'me' });
    const t = new Tunnel({
      address: `127.0.0.1:${port}`,
      caCert: Buffer.from(ca.certPem),
      cert: Buffer.from(me.certPem),
      key: Buffer.from(me.keyPem),
      transport: 'mux',
    });
    const pending = t.dial('c1:443');
    await new Promise((r) => setTimeout(r, 50));
    t.close();
    await expect(pending).rejects.toMatchObject({ reason: 'tunnelclosed' });
    for (const s of held) s.destroy();
    await new Promise<void>((r) => server.close(() => r()));
  });
});

describe('Tunnel.close() while the mux connection is being opened', () => {
  it('closes the connection that arrives after the close: the hub sees it go', async () => {
    // A mux hub that holds its hello until the tunnel is closed.
    const tls = await import('node:tls');
    const { FramedPacketStream, MUX_ALPN } = await import('@cluster-proxy/proto');
    const { createCA, issueClientCert, issueServerCert } = await import('@cluster-proxy/server');
    const ca = createCA();
    const hub = issueServerCert(ca, { commonName: 'hub', ipAddresses: ['127.0.0.1'] });
    const me = issueClientCert(ca, { commonName: 'me' });
    let accepted: ((s: InstanceType<typeof FramedPacketStream>) => void) | null = null;
    const arrived = new Promise<InstanceType<typeof FramedPacketStream>>((r) => (accepted = r));
    const server = tls.createServer(
      { ca: ca.certPem, cert: hub.certPem, key: hub.keyPem, requestCert: true, ALPNProtocols: [MUX_ALPN] },
      (socket) => {
        accepted!(new FramedPacketStream(socket, 1 << 20));
      },
    );
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    const port = (server.address() as { port: number }).port;
    const t = new Tunnel({
      address: `127.0.0.1:${port}`,
      caCert: Buffer.from(ca.certPem),
      cert: Buffer.from(me.certPem),
      key: Buffer.from(me.keyPem),
      transport: 'mux',
    });
    try {
      const pending = t.dial('c1:443');
      const stream = await arrived;
      await once(stream, 'hello'); // the tunnel's hello: it waits for ours now
      t.close();
      await expect(pending).rejects.toMatchObject({ reason: 'tunnelclosed' });
      const gone = once(stream, 'close');
      stream.sendHello({});
      await gone; // the tunnel closed the connection it no longer needs
    } finally {
      t.close();
      await new Promise<void>((r) => server.close(() => r()));
    }
  }, 15_000);
});
