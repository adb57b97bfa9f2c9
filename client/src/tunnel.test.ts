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
