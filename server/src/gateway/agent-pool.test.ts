// The gateway's connections towards the agents and their keep-alive pool: what it keeps after an answer.
import { type Duplex, duplexPair } from 'node:stream';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { ProxyCore } from '../dataplane/proxy-core.js';
import { AgentLeg, GatewayPool, IDLE_MS } from './agent-pool.js';
import { TunnelSocket } from './tunnel-socket.js';

/** A leg over an in-memory pair (the far end is the agent's), to an agent shutting down or not. */
function leg(key: string, agentDraining = false): { leg: AgentLeg; far: Duplex } {
  const [near, far] = duplexPair();
  return { leg: new AgentLeg(Object.assign(near, { agentDraining }), key), far };
}

describe('GatewayPool', () => {
  const dials: string[] = [];
  const core = {
    dialGateway: (cluster: string, f: { client: string }) => (dials.push(`${cluster}/${f.client}`), null),
  } as unknown as ProxyCore;
  afterEach(() => {
    vi.useRealTimers();
    dials.length = 0;
  });

  it('keeps a connection for the next request of the same cluster and caller, not one to an agent that is shutting down', () => {
    const pool = new GatewayPool(core);
    const a = leg('c1\0alice').leg;
    pool.release(a);
    expect(pool.size).toBe(1);
    let got: AgentLeg | undefined;
    pool.take('c1', 'bob', () => {});
    expect(dials).toEqual(['c1/bob']); // another caller dials its own
    pool.take('c1', 'alice', (_e, l) => (got = l));
    expect(got).toBe(a);
    expect(dials).toEqual(['c1/bob']);
    expect(pool.size).toBe(0);
    const draining = leg('c1\0alice', true).leg;
    pool.release(draining);
    expect(draining.state).toBe('closed');
    expect(pool.size).toBe(0);
    pool.close();
  });

  it('a connection the agent closes leaves the pool at once; an idle one closes after IDLE_MS', async () => {
    const pool = new GatewayPool(core);
    const b = leg('c2\0alice');
    pool.release(b.leg);
    b.far.end();
    await new Promise((r) => setImmediate(r));
    expect(b.leg.state).toBe('closed');
    expect(pool.size).toBe(0);
    vi.useFakeTimers();
    const a = leg('c1\0alice');
    pool.release(a.leg);
    vi.advanceTimersByTime(IDLE_MS - 1);
    expect([a.leg.state, pool.size]).toEqual(['idle', 1]);
    vi.advanceTimersByTime(1);
    expect([a.leg.state, pool.size]).toEqual(['closed', 0]);
  });

  it('an answer is parsed for the request that asked; bytes nobody asked for close an idle connection, paused or not', async () => {
    const { leg: l, far } = leg('c1\0alice');
    const seen: string[] = [];
    l.use({
      head: (h) => (seen.push(`head ${h.status}`), false),
      body: (b) => seen.push(`body ${b.toString()}`),
      end: () => seen.push('end'),
      failed: (e) => seen.push(`failed ${e.message}`),
    });
    far.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
    await new Promise((r) => setImmediate(r));
    expect(seen).toEqual(['head 200', 'body ok', 'end']);
    const pool = new GatewayPool(core);
    l.socket.pause(); // held for a slow caller when the answer ended: it reads again once idle
    pool.release(l);
    far.write('HTTP/1.1 200 OK\r\n\r\n');
    await new Promise((r) => setImmediate(r));
    expect(l.state).toBe('closed');
    expect(pool.size).toBe(0);
  });

  it("a kept connection does not collect node:http's per-request timeout listeners (setTimeout(0, cb) takes cb off, as on net.Socket)", () => {
    const s = new TunnelSocket({ dialGateway: () => null } as unknown as ProxyCore, 'c1', 'alice', () => {});
    for (let i = 0; i < 50; i++) {
      const cb = (): void => {};
      s.setTimeout(IDLE_MS, cb);
      s.setTimeout(0, cb);
    }
    expect(s.listenerCount('timeout')).toBe(0);
    s.destroy();
  });
});
