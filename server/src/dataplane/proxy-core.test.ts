// ProxyCore's memory figures: what the budget counts, plus the client bytes that frontends hold in
// Node's buffers (a paused socket or HTTP/2 stream), which no window of ours accounts for.
import pino from 'pino';
import { describe, expect, it } from 'vitest';
import { MAX_CONNECTION_WINDOW, MemoryBudget } from '@cluster-proxy/proto';
import type { AgentBackend } from './backend.js';
import type { ProxiedConnection } from './proxied-connection.js';
import { ProxyCore } from './proxy-core.js';

function coreWith(budget: MemoryBudget, frontendsHold: (number | undefined)[]): ProxyCore {
  const core = new ProxyCore({ dialTimeoutMs: 1000, log: pino({ level: 'silent' }), budget });
  const conns = frontendsHold.map((n) => ({ frontend: n === undefined ? {} : { heldBytes: () => n } }) as unknown as ProxiedConnection);
  const backend = {
    key: 'a1',
    hosts: ['c1'],
    cidrs: [],
    defaultRoute: false,
    draining: false,
    establishedConnections: () => conns,
  } as unknown as AgentBackend;
  core.routes.add(backend);
  return core;
}

describe('ProxyCore.memoryByDirection', () => {
  it('adds what frontends hold to the client bytes held towards agents; frontends that hold nothing of their own add nothing', () => {
    const budget = new MemoryBudget(64 * 1024 * 1024, { maxWindow: MAX_CONNECTION_WINDOW });
    budget.commit('to_agent', 1000);
    budget.held('to_agent', 300, 300);
    budget.commit('to_client', 500);
    const usage = coreWith(budget, [4096, undefined, 16384]).memoryByDirection();
    expect(usage).toEqual(
      expect.arrayContaining([
        { direction: 'to_agent', committed: 1000, buffered: 300 + 4096 + 16384 },
        { direction: 'to_client', committed: 500, buffered: 0 },
      ]),
    );
    // The budget's own figures are unchanged (its decisions use them).
    expect(budget.usageByDirection().find((u) => u.direction === 'to_agent')?.buffered).toBe(300);
    budget.held('to_agent', -300, 0);
  });

  it('a to_agent row appears when only frontends hold client bytes', () => {
    const budget = new MemoryBudget(64 * 1024 * 1024, { maxWindow: MAX_CONNECTION_WINDOW });
    expect(coreWith(budget, [65536]).memoryByDirection()).toEqual([{ direction: 'to_agent', committed: 0, buffered: 65536 }]);
    expect(coreWith(budget, [0, undefined]).memoryByDirection()).toEqual([]);
  });
});
