// The agent's Prometheus text: what a scraper (and our metrics-text parser) reads.
import { describe, expect, it } from 'vitest';
import { Counter, Gauge, Histogram, Registry, processMetrics } from './prometheus.js';

describe('Prometheus text exposition', () => {
  it('counters: a label-less one starts at 0, labelled series appear on first inc, in label-name order', () => {
    const r = new Registry();
    const plain = r.register(new Counter('a_total', 'plain'));
    const labelled = r.register(new Counter('b_total', 'with "labels"\nand a newline', ['segment', 'type'] as const));
    expect(r.text()).toBe('# HELP a_total plain\n# TYPE a_total counter\na_total 0\n# HELP b_total with "labels"\\nand a newline\n# TYPE b_total counter\n');
    plain.inc();
    plain.inc(2.5);
    labelled.inc({ type: 'DATA', segment: 'to_agent' });
    labelled.inc({ segment: 'to_agent', type: 'DATA' }, 3);
    labelled.inc({ segment: 'x"y\\z', type: 'CLOSE' });
    expect(r.text().split('\n')).toEqual(expect.arrayContaining(['a_total 3.5', 'b_total{segment="to_agent",type="DATA"} 4', 'b_total{segment="x\\"y\\\\z",type="CLOSE"} 1']));
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
    expect(r.text()).toBe([
      '# HELP g gauge', '# TYPE g gauge', 'g 7',
      '# HELP h_seconds latency', '# TYPE h_seconds histogram',
      'h_seconds_bucket{le="0.1"} 1', 'h_seconds_bucket{le="1"} 2', 'h_seconds_bucket{le="+Inf"} 3', 'h_seconds_sum 3.55', 'h_seconds_count 3', '',
    ].join('\n'));
  });

  it('process metrics: CPU counters, resident memory, open fds, start time', () => {
    const r = new Registry();
    for (const m of processMetrics()) r.register(m);
    const text = r.text();
    expect(text).toContain('# TYPE process_cpu_user_seconds_total counter');
    const rss = Number(/^process_resident_memory_bytes (\d+)$/m.exec(text)?.[1]);
    expect(rss).toBeGreaterThan(10 * 1024 * 1024);
    expect(Number(/^process_open_fds (\d+)$/m.exec(text)?.[1])).toBeGreaterThan(2);
    expect(Math.abs(Number(/^process_start_time_seconds (\d+)$/m.exec(text)?.[1]) - (Date.now() / 1000 - process.uptime()))).toBeLessThan(2);
  });
});
