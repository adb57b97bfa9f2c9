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
    const t = new Tunnel({ address: `127.0.0.1:${port}`, caCert: Buffer.from(ca.certPem), cert: Buffer.from(me.certPem), key: Buffer.from(me.keyPem), transport: 'mux' });
    const pending = t.dial('c1:443');
    await new Promise((r) => setTimeout(r, 50));
    t.close();
    await expect(pending).rejects.toMatchObject({ reason: 'tunnelclosed' });
    for (const s of held) s.destroy();
    await new Promise<void>((r) => server.close(() => r()));
  });
});
