// The agent's Prometheus text: what a scraper (and our metrics-text parser) reads.
import { describe, expect, it } from 'vitest';
import net from 'node:net';
import { Counter, Gauge, Histogram, RefreshedGauge, Registry, processMetrics } from './prometheus.js';

describe('Prometheus text exposition', () => {
  it('counters: a label-less one starts at 0, labelled series appear on first inc, in label-name order', () => {
    const r = new Registry();
    const plain = r.register(new Counter('a_total', 'plain'));
    const labelled = r.register(new Counter('b_total', 'with "labels"\nand a newline', ['segment', 'type'] as const));
    expect(r.text()).toBe(
      '# HELP a_total plain\n# TYPE a_total counter\na_total 0\n# HELP b_total with "labels"\\nand a newline\n# TYPE b_total counter\n',
    );
    plain.inc();
    plain.inc(2.5);
    labelled.inc({ type: 'DATA', segment: 'to_agent' });
    labelled.inc({ segment: 'to_agent', type: 'DATA' }, 3);
    labelled.inc({ segment: 'x"y\\z', type: 'CLOSE' });
    expect(r.text().split('\n')).toEqual(
      expect.arrayContaining(['a_total 3.5', 'b_total{segment="to_agent",type="DATA"} 4', 'b_total{segment="x\\"y\\\\z",type="CLOSE"} 1']),
    );
    expect(() => plain.inc(-1)).toThrow(/only goes up/);
    expect(() => r.register(new Counter('a_total', 'again'))).toThrow(/twice/);
  });

  it('a child is the same series as inc(labels), appears at its first inc, and refuses to go down', () => {
    const r = new Registry();
    const c = r.register(new Counter('p_total', 'packets', ['segment', 'type'] as const));
    const data = c.child({ type: 'DATA', segment: 'to_agent' });
    expect(r.text()).not.toContain('p_total{');
    data.inc();
    data.inc(2);
    c.inc({ segment: 'to_agent', type: 'DATA' });
    expect(r.text().split('\n')).toContain('p_total{segment="to_agent",type="DATA"} 4');
    expect(() => data.inc(-1)).toThrow(/only goes up/);
  });

  it('gauges are read at scrape time; a histogram has cumulative buckets, +Inf, sum and count', () => {
    const r = new Registry();
    let v = 1;
    r.register(new Gauge('g', 'gauge', () => v));
    const h = r.register(new Histogram('h_seconds', 'latency', [0.1, 1]));
    h.observe(0.05);
    h.observe(0.5);
    h.observe(3);
    v = 7;
    expect(r.text()).toBe(
      [
        '# HELP g gauge',
        '# TYPE g gauge',
        'g 7',
        '# HELP h_seconds latency',
        '# TYPE h_seconds histogram',
        'h_seconds_bucket{le="0.1"} 1',
        'h_seconds_bucket{le="1"} 2',
        'h_seconds_bucket{le="+Inf"} 3',
        'h_seconds_sum 3.55',
        'h_seconds_count 3',
        '',
      ].join('\n'),
    );
  });

  it('process metrics: CPU counters, resident memory, open fds, start time', () => {
    const r = new Registry();
    for (const m of processMetrics()) r.register(m);
    const text = r.text();
    expect(text).toContain('# TYPE process_cpu_user_seconds_total counter');
    const rss = Number(/^process_resident_memory_bytes (\d+)$/m.exec(text)?.[1]);
    expect(rss).toBeGreaterThan(10 * 1024 * 1024);
    expect(Number(/^process_open_fds (\d+)$/m.exec(text)?.[1])).toBeGreaterThan(2);
    expect(Math.abs(Number(/^process_start_time_seconds (\d+)$/m.exec(text)?.[1]) - (Date.now() / 1000 - process.uptime()))).toBeLessThan(
      2,
    );
  });

  it('a labelled histogram has a series per label set, none before the first observation', () => {
    const r = new Registry();
    const h = r.register(new Histogram('l_seconds', 'lists', [1], ['http_response_code'] as const));
    expect(r.text()).toBe('# HELP l_seconds lists\n# TYPE l_seconds histogram\n');
    h.observeWith({ http_response_code: '200' }, 0.5);
    h.observeWith({ http_response_code: '404' }, 2);
    expect(r.text().split('\n')).toEqual(
      expect.arrayContaining([
        'l_seconds_bucket{http_response_code="200",le="1"} 1',
        'l_seconds_bucket{http_response_code="200",le="+Inf"} 1',
        'l_seconds_count{http_response_code="200"} 1',
        'l_seconds_bucket{http_response_code="404",le="1"} 0',
        'l_seconds_sum{http_response_code="404"} 2',
      ]),
    );
    expect(() => h.observe(1)).toThrow(/observeWith/);
  });

  it('a refreshed gauge reads before the scrape (collect), at most once per interval', async () => {
    const r = new Registry();
    let reads = 0;
    r.register(new RefreshedGauge('slow', 'read asynchronously', async () => ++reads, 60_000));
    expect(r.text()).toContain('slow NaN');
    expect(await r.collect()).toContain('slow 1');
    expect(await r.collect()).toContain('slow 1');
    expect(reads).toBe(1);
  });

  it('a refreshed gauge never holds up a scrape after its first reading: a slow one answers with the last value', async () => {
    const r = new Registry();
    const pending: ((v: number) => void)[] = [];
    r.register(new RefreshedGauge('slow', 'read asynchronously', () => new Promise<number>((resolve) => pending.push(resolve)), 0));
    const first = r.collect();
    pending.shift()!(7);
    expect(await first).toContain('slow 7');
    // The next reading starts and does not finish: the scrape answers with the last value, and starts no second one.
    expect(await r.collect()).toContain('slow 7');
    expect(await r.collect()).toContain('slow 7');
    expect(pending).toHaveLength(1);
    pending.shift()!(9);
    await new Promise((resolve) => setImmediate(resolve));
    expect(r.text()).toContain('slow 9');
  });

  it('the memory a pod is charged: anonymous memory below RSS, and the bytes our sockets hold unread', async () => {
    // A connection to ourselves whose receiving side never reads: its bytes wait in the kernel, ours.
    const accepted: net.Socket[] = [];
    // pauseOnConnect: the accepted socket never starts reading (a paused one still fills Node's buffer).
    const server = net.createServer({ pauseOnConnect: true }, (s) => {
      accepted.push(s);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const client = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
    try {
      await new Promise((resolve) => client.once('connect', resolve));
      const before = readGauge(await registryOf().collect(), 'cluster_proxy_process_socket_memory_bytes');
      await new Promise<void>((resolve) => client.write(Buffer.alloc(64 * 1024, 1), () => resolve()));
      // The kernel hands the bytes to the paused side's buffer at its pace: wait until they are all queued.
      let during = before;
      for (let i = 0; i < 100 && during - before < 64 * 1024; i++) {
        await new Promise((resolve) => setTimeout(resolve, 20));
        during = readGauge(await registryOf().collect(), 'cluster_proxy_process_socket_memory_bytes');
      }
      expect(during - before).toBeGreaterThanOrEqual(64 * 1024);
      const text = await registryOf().collect();
      const anon = readGauge(text, 'cluster_proxy_process_anon_memory_bytes');
      expect(anon).toBeGreaterThan(process.memoryUsage().heapUsed);
      expect(anon).toBeLessThan(readGauge(text, 'process_resident_memory_bytes'));
      expect(readGauge(text, 'process_max_fds')).toBeGreaterThan(0);
      expect(readGauge(text, 'process_virtual_memory_bytes')).toBeGreaterThan(anon);
    } finally {
      client.destroy();
      for (const s of accepted) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});

/** A fresh registry of the process metrics (their socket gauge reads on its first collect). */
function registryOf(): Registry {
  const r = new Registry();
  for (const m of processMetrics()) r.register(m);
  return r;
}

function readGauge(text: string, name: string): number {
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}
