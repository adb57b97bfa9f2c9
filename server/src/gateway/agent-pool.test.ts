// The gateway's keep-alive pool towards the agents: what it keeps after a response.
import { describe, expect, it } from 'vitest';
import type { ProxyCore } from '../dataplane/proxy-core.js';
import { GatewayPool, IDLE_MS } from './agent-pool.js';
import { TunnelSocket } from './tunnel-socket.js';

/** What node's Agent touches on a socket it keeps. */
function socketLike(agentDraining: boolean): Record<string, unknown> {
  const s: Record<string, unknown> = { agentDraining, timeout: 0 };
  s['setKeepAlive'] = () => s;
  s['unref'] = () => s;
  s['setTimeout'] = (ms: number) => {
    s['timeout'] = ms;
    return s;
  };
  return s;
}

describe('GatewayPool', () => {
  const pool = new GatewayPool({} as ProxyCore);
  it('keeps a connection for the next request with the idle timeout, not one to an agent that is shutting down', () => {
    const agent = pool.agentFor('c1', 'alice') as unknown as { keepSocketAlive(s: unknown): boolean };
    const kept = socketLike(false);
    expect(agent.keepSocketAlive(kept)).toBe(true);
    expect(kept['timeout']).toBe(IDLE_MS);
    expect(agent.keepSocketAlive(socketLike(true))).toBe(false);
  });
  it('one pool per cluster and caller (the per-client limit counts by caller)', () => {
    expect(pool.agentFor('c1', 'alice')).toBe(pool.agentFor('c1', 'alice'));
    expect(pool.agentFor('c1', 'bob')).not.toBe(pool.agentFor('c1', 'alice'));
    expect(pool.agentFor('c2', 'alice')).not.toBe(pool.agentFor('c1', 'alice'));
    expect(pool.size).toBe(3);
    pool.close();
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
