import { once } from 'node:events';
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { STARTING_UNSENT_LIMIT, serviceProxyHost, unsentLimitOf, useNativeCalls } from '@cluster-proxy/proto';
import { loadNativeCalls } from '../../cli/src/memory/native-calls.js';
import { startBlackhole } from '../../test/src/fixtures/blackhole.js';
import { DialFailure, TargetDialer } from './target-dialer.js';

const names = ['c1', 'c1.open-cluster-management-agent-addon', serviceProxyHost('c1')];

function dialer(opts: { apiserver?: string; allow?: string[]; dialTimeoutMs?: number } = {}): TargetDialer {
  return new TargetDialer({
    clusterNames: names,
    apiserver: opts.apiserver ?? 'kubernetes.default.svc:6443',
    allow: opts.allow ?? [],
    dialTimeoutMs: opts.dialTimeoutMs ?? 5000,
  });
}

function failure(fn: () => unknown): DialFailure {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(DialFailure);
    return err as DialFailure;
  }
  throw new Error('expected a DialFailure');
}

const cleanups: Array<() => void | Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function listen(): Promise<net.Server> {
  const server = net.createServer((s) => s.destroy());
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
  return server;
}

function portOf(server: net.Server): number {
  return (server.address() as net.AddressInfo).port;
}

describe('TargetDialer.resolve', () => {
  it("maps the cluster's names on port 443 to the apiserver", () => {
    const d = dialer();
    for (const n of names) expect(d.resolve(`${n}:443`, 'tcp')).toEqual({ host: 'kubernetes.default.svc', port: 6443 });
    expect(d.resolve('C1:443', 'tcp')).toEqual({ host: 'kubernetes.default.svc', port: 6443 });
  });

  it('dials the apiserver address itself, and allowlisted destinations, as given', () => {
    const d = dialer({ allow: ['db.internal:5432', '10.0.0.0/8:*'] });
    expect(d.resolve('kubernetes.default.svc:6443', 'tcp')).toEqual({ host: 'kubernetes.default.svc', port: 6443 });
    expect(d.resolve('db.internal:5432', 'tcp')).toEqual({ host: 'db.internal', port: 5432 });
    expect(d.resolve('10.1.2.3:22', 'tcp')).toEqual({ host: '10.1.2.3', port: 22 });
  });

  it('refuses destinations outside the allowlist with `forbidden`, naming them', () => {
    const d = dialer({ allow: ['db.internal:5432'] });
    for (const dest of ['db.internal:5433', 'other:5432', 'kubernetes.default.svc:443', '10.0.0.1:443', '[::1]:22']) {
      const e = failure(() => d.resolve(dest, 'tcp'));
      expect(e.reason, dest).toBe('forbidden');
      expect(e.message).toContain(dest);
    }
  });

  it('refuses protocols other than tcp with `forbidden`', () => {
    const d = dialer({ allow: ['*'] });
    for (const p of ['udp', 'unix', '', 'TCP ']) {
      const e = failure(() => d.resolve('c1:443', p));
      expect(e.reason, p).toBe('forbidden');
      expect(e.message).toContain('tcp');
    }
  });

  it('refuses an address that is not HOST:PORT with `endpoint`', () => {
    const e = failure(() => dialer({ allow: ['*'] }).resolve('c1', 'tcp'));
    expect(e.reason).toBe('endpoint');
    expect(e.message).toContain('"c1"');
  });

  it('rejects an apiserver address that is not HOST:PORT', () => {
    expect(() => dialer({ apiserver: 'kubernetes.default.svc' })).toThrow(/apiserver address/);
  });
});

describe('TargetDialer.dial', () => {
  it('connects to a listening port', async () => {
    const server = await listen();
    const d = dialer({ apiserver: `127.0.0.1:${portOf(server)}` });
    const target = d.resolve('c1:443', 'tcp');
    expect(target).toEqual({ host: '127.0.0.1', port: portOf(server) });
    // The CLI installs the system calls when it starts an agent.
    useNativeCalls(loadNativeCalls());
    cleanups.push(() => useNativeCalls(null));
    const socket = await d.dial(target, new AbortController().signal);
    cleanups.push(() => {
      socket.destroy();
    });
    expect(socket.remotePort).toBe(portOf(server));
    expect(socket.destroyed).toBe(false);
    // A destination that stops reading holds at most this much of our kernel's send queue (Linux),
    // until it shows it keeps up with a bulk transfer (endpoint-connection.ts).
    if (process.platform === 'linux') expect(unsentLimitOf(socket)).toBe(STARTING_UNSENT_LIMIT);
  });

  it('fails a closed port with `endpoint` and "connection refused", quickly', async () => {
    const server = await listen();
    const port = portOf(server);
    await new Promise<void>((r) => server.close(() => r()));
    const d = dialer();
    const t0 = Date.now();
    const err = await d.dial({ host: '127.0.0.1', port }, new AbortController().signal).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(DialFailure);
    expect((err as DialFailure).reason).toBe('endpoint');
    expect((err as DialFailure).message).toContain('connection refused');
    expect((err as DialFailure).message).toContain(`127.0.0.1:${port}`);
    expect(Date.now() - t0).toBeLessThan(2000);
  });

  it('fails with `dialclosed` when the signal aborts, before or during the dial', async () => {
    const server = await listen();
    const d = dialer();
    const target = { host: '127.0.0.1', port: portOf(server) };
    const before = await d.dial(target, AbortSignal.abort()).catch((e: unknown) => e);
    expect(before).toBeInstanceOf(DialFailure);
    expect((before as DialFailure).reason).toBe('dialclosed');
    // Aborted while connecting (a loopback connect completes on a later tick at the earliest).
    const ac = new AbortController();
    const p = d.dial(target, ac.signal).catch((e: unknown) => e);
    ac.abort();
    const during = await p;
    expect(during).toBeInstanceOf(DialFailure);
    expect((during as DialFailure).reason).toBe('dialclosed');
    expect((during as DialFailure).message).toContain(`127.0.0.1:${target.port}`);
  });

  it('fails with `timeout` after dialTimeoutMs when the destination never answers', async () => {
    const hole = await startBlackhole();
    cleanups.push(() => hole.close());
    const d = dialer({ dialTimeoutMs: 200 });
    const t0 = Date.now();
    const err = await d.dial({ host: hole.host, port: hole.port }, new AbortController().signal).catch((e: unknown) => e);
    const elapsed = Date.now() - t0;
    expect(err).toBeInstanceOf(DialFailure);
    expect((err as DialFailure).reason).toBe('timeout');
    expect(elapsed).toBeGreaterThanOrEqual(190);
    expect(elapsed).toBeLessThan(2000);
  });
});
