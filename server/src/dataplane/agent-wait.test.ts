// Dials waiting for an agent (agent-wait.ts): who waits, how each wait ends (an agent connects, the
// time runs out, the client leaves, the server stops), the cap, and that no timer outlives a wait.
import pino from 'pino';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { serviceProxyHost, type ByteSink, type DialFailureReason } from '@cluster-proxy/proto';
import { AgentWaits } from './agent-wait.js';
import type { Frontend } from './frontend.js';
import { ServerMetrics } from './metrics.js';

/** A frontend that records what the waits tell it. */
function frontend(): Frontend & { failed: { reason: DialFailureReason; message: string }[] } {
  const failed: { reason: DialFailureReason; message: string }[] = [];
  return {
    failed,
    sink: { write: () => true } as ByteSink,
    client: 'test-client',
    halfClose: true,
    dialSucceeded: () => {},
    dialFailed: (reason, message) => void failed.push({ reason, message }),
    remoteEnded: () => {},
    closed: () => {},
    pause: () => {},
    resume: () => {},
  };
}

function setup(opts: { waitMs?: number; maxWaiting?: number; elsewhere?: string[] } = {}) {
  const metrics = new ServerMetrics();
  /** Hosts an agent here serves now. */
  const here = new Set<string>();
  const waits = new AgentWaits({
    waitMs: opts.waitMs ?? 5000,
    maxWaiting: opts.maxWaiting ?? 100,
    routable: (address) => here.has(address.slice(0, address.lastIndexOf(':'))),
    metrics,
    log: pino({ level: 'silent' }),
  });
  const elsewhere = new Set(opts.elsewhere ?? ['c1']);
  waits.setAgentsElsewhere(() => elsewhere);
  const results = async (): Promise<Record<string, number>> =>
    Object.fromEntries((await metrics.agentWaits.get()).values.map((v) => [String(v.labels['result']), v.value]));
  return { waits, here, metrics, results };
}

describe('AgentWaits', () => {
  beforeEach(() => void vi.useFakeTimers());
  afterEach(() => void vi.useRealTimers());

  it('a cluster no other replica reaches, an address an agent here serves, or waiting off: dial at once', () => {
    const { waits, here } = setup();
    expect(waits.wait('nobody:443', frontend(), () => {})).toBeNull();
    expect(waits.wait('x.c1:443', frontend(), () => {})).toBeNull(); // not one of c1's names
    expect(waits.wait('10.0.0.1:443', frontend(), () => {})).toBeNull();
    here.add('c1');
    expect(waits.wait('c1:443', frontend(), () => {})).toBeNull();
    expect(setup({ waitMs: 0 }).waits.wait('c1:443', frontend(), () => {})).toBeNull();
    expect(waits.size).toBe(0);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('waits for CLUSTER, CLUSTER.NAMESPACE and the service-proxy host; goes on when an agent that serves it connects', async () => {
    const { waits, here, results } = setup();
    const ready: string[] = [];
    for (const host of ['c1', 'c1.open-cluster-management-agent-addon', serviceProxyHost('c1')]) {
      expect(waits.wait(`${host}:443`, frontend(), () => ready.push(host))).not.toBeNull();
    }
    expect(waits.size).toBe(3);
    waits.agentConnected({ hosts: ['c2'], defaultRoute: false }); // an agent that serves none of them
    expect(ready).toEqual([]);
    here.add('c1');
    waits.agentConnected({ hosts: ['c1'], defaultRoute: false });
    expect(ready).toEqual(['c1']);
    here.add('c1.open-cluster-management-agent-addon');
    here.add(serviceProxyHost('c1'));
    waits.agentConnected({ hosts: ['C1.open-cluster-management-agent-addon', serviceProxyHost('c1')], defaultRoute: false });
    expect(ready).toHaveLength(3);
    expect(waits.size).toBe(0);
    expect(vi.getTimerCount()).toBe(0);
    expect(await results()).toEqual({ connected: 3 });
  });

  it('a default-route agent serves any waiting dial the routing table now sends to it', () => {
    const { waits, here } = setup({ elsewhere: ['c1', 'c2'] });
    const ready: string[] = [];
    waits.wait('c1:443', frontend(), () => ready.push('c1'));
    waits.wait('c2:443', frontend(), () => ready.push('c2'));
    here.add('c2'); // stands for "routable now"
    waits.agentConnected({ hosts: [], defaultRoute: true });
    expect(ready).toEqual(['c2']);
    expect(waits.size).toBe(1);
    waits.stop();
  });

  it('a frontend that throws when its dial goes on fails that dial only', () => {
    const { waits, here } = setup();
    const f = frontend();
    const other: string[] = [];
    waits.wait('c1:443', f, () => {
      throw new Error('frontend bug');
    });
    waits.wait('c1:443', frontend(), () => other.push('ok'));
    here.add('c1');
    waits.agentConnected({ hosts: ['c1'], defaultRoute: false });
    expect(f.failed).toEqual([{ reason: 'unknown', message: 'dial to c1:443 failed: frontend bug' }]);
    expect(other).toEqual(['ok']);
    expect(waits.size).toBe(0);
  });

  it('no agent within the wait: the usual reason, a message that says why it took a while', async () => {
    const { waits, metrics, results } = setup({ waitMs: 3000 });
    const f = frontend();
    let ready = false;
    waits.wait('c1:443', f, () => (ready = true));
    vi.advanceTimersByTime(2999);
    expect(f.failed).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(f.failed).toEqual([
      {
        reason: 'no_agent',
        message: 'No agent available for c1:443: none of cluster c1 connected to this proxy server within 3000 ms (other replicas had one)',
      },
    ]);
    expect(ready).toBe(false);
    expect(waits.size).toBe(0);
    expect(await results()).toEqual({ timeout: 1 });
    // Counted as the failure it is, as an immediate one would be.
    expect((await metrics.dialFailures.get()).values.map((v) => [v.labels['reason'], v.value])).toEqual([['no_agent', 1]]);
  });

  it('a client that leaves cancels its wait: no callback later, its timer stopped', async () => {
    const { waits, here, results } = setup();
    const f = frontend();
    let ready = false;
    const w = waits.wait('c1:443', f, () => (ready = true))!;
    w.cancel();
    w.cancel();
    expect(vi.getTimerCount()).toBe(0);
    here.add('c1');
    waits.agentConnected({ hosts: ['c1'], defaultRoute: false });
    vi.advanceTimersByTime(10_000);
    expect(ready).toBe(false);
    expect(f.failed).toEqual([]);
    expect(await results()).toEqual({ cancelled: 1 });
  });

  it('at most maxWaiting dials wait; the next one is not held', async () => {
    const { waits, results } = setup({ maxWaiting: 2 });
    expect(waits.wait('c1:443', frontend(), () => {})).not.toBeNull();
    expect(waits.wait('c1:443', frontend(), () => {})).not.toBeNull();
    expect(waits.wait('c1:443', frontend(), () => {})).toBeNull();
    expect(waits.size).toBe(2);
    expect(await results()).toEqual({ full: 1 });
    waits.stop();
  });

  it('stop(): every waiting dial fails as "draining" at once, every timer stopped, and nothing waits afterwards', async () => {
    const { waits, results } = setup();
    const fs = [frontend(), frontend()];
    for (const f of fs) waits.wait('c1:443', f, () => {});
    waits.stop();
    for (const f of fs)
      expect(f.failed).toEqual([
        { reason: 'draining', message: 'this proxy server is shutting down; dial c1:443 through another replica' },
      ]);
    expect(vi.getTimerCount()).toBe(0);
    expect(waits.wait('c1:443', frontend(), () => {})).toBeNull();
    expect(await results()).toEqual({ shutdown: 2 });
  });
});
