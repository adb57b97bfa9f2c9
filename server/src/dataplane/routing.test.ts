import { describe, expect, it } from 'vitest';
import { RoutingTable, type Routable, type RouteResult } from './routing.js';

interface FakeBackend extends Routable {
  draining: boolean;
  openConnections: number;
}

let n = 0;
function backend(opts: Partial<Omit<FakeBackend, 'key'>> = {}): FakeBackend {
  return { key: `b${++n}`, hosts: [], cidrs: [], defaultRoute: false, draining: false, openConnections: 0, ...opts };
}

function routed<B>(r: RouteResult<B>): B {
  if (!('backend' in r)) throw new Error(`expected a backend, got ${r.reason}: ${r.message}`);
  return r.backend;
}

function refused<B>(r: RouteResult<B>): { reason: string; message: string } {
  if ('backend' in r) throw new Error('expected no backend');
  return r;
}

describe('RoutingTable', () => {
  it('routes by exact host identifier, case-insensitively, ignoring the port', () => {
    const t = new RoutingTable<FakeBackend>();
    const c1 = backend({ hosts: ['C1', 'c1.ns'] });
    const c2 = backend({ hosts: ['c2'] });
    t.add(c1);
    t.add(c2);
    expect(routed(t.route('c1:443'))).toBe(c1);
    expect(routed(t.route('C1:8080'))).toBe(c1);
    expect(routed(t.route('c1.NS:443'))).toBe(c1);
    expect(routed(t.route('c2:1'))).toBe(c2);
    // Exact match only: no suffix or prefix matching.
    expect(refused(t.route('x.c1:443')).reason).toBe('no_agent');
    expect(refused(t.route('c1.ns.other:443')).reason).toBe('no_agent');
  });

  it('matches IPv6 host identifiers against bracketed destinations', () => {
    const t = new RoutingTable<FakeBackend>();
    const b = backend({ hosts: ['::1'] });
    t.add(b);
    expect(routed(t.route('[::1]:443'))).toBe(b);
    expect(refused(t.route('[::2]:443')).reason).toBe('no_agent');
  });

  it('routes IP destinations by cidr identifiers, IPv4 and IPv6', () => {
    const t = new RoutingTable<FakeBackend>();
    const v4 = backend({ cidrs: ['10.0.0.0/8'] });
    const v6 = backend({ cidrs: ['fd00::/8'] });
    const host = backend({ cidrs: ['192.168.1.7/32'] });
    t.add(v4);
    t.add(v6);
    t.add(host);
    expect(routed(t.route('10.1.2.3:443'))).toBe(v4);
    expect(routed(t.route('10.255.255.255:1'))).toBe(v4);
    expect(routed(t.route('[fd12:3456::1]:6443'))).toBe(v6);
    expect(routed(t.route('192.168.1.7:22'))).toBe(host);
    expect(refused(t.route('192.168.1.8:22')).reason).toBe('no_agent');
    expect(refused(t.route('11.0.0.1:443')).reason).toBe('no_agent');
    expect(refused(t.route('[fe80::1]:443')).reason).toBe('no_agent');
    // A name is not an IP: cidrs never match it.
    expect(refused(t.route('ten.example.com:443')).reason).toBe('no_agent');
  });

  it('ignores an invalid cidr instead of failing the table', () => {
    const t = new RoutingTable<FakeBackend>();
    const b = backend({ hosts: ['h'], cidrs: ['10.0.0.0/33', 'not-a-cidr', '10.0.0.0/8'] });
    t.add(b);
    expect(routed(t.route('h:1'))).toBe(b);
    expect(routed(t.route('10.0.0.1:1'))).toBe(b);
  });

  it('prefers an exact host, then a cidr, then a default route', () => {
    const t = new RoutingTable<FakeBackend>();
    const exact = backend({ hosts: ['10.0.0.1'], openConnections: 50 });
    const cidr = backend({ cidrs: ['10.0.0.0/8'], openConnections: 10 });
    const dflt = backend({ defaultRoute: true, openConnections: 0 });
    t.add(dflt);
    t.add(cidr);
    t.add(exact);
    expect(routed(t.route('10.0.0.1:443'))).toBe(exact);
    expect(routed(t.route('10.0.0.2:443'))).toBe(cidr);
    expect(routed(t.route('8.8.8.8:53'))).toBe(dflt);
    expect(routed(t.route('anything.example:80'))).toBe(dflt);
  });

  it('skips draining agents', () => {
    const t = new RoutingTable<FakeBackend>();
    const old = backend({ hosts: ['c1'], draining: true, openConnections: 0 });
    const fresh = backend({ hosts: ['c1'], openConnections: 100 });
    t.add(old);
    t.add(fresh);
    for (let i = 0; i < 5; i++) expect(routed(t.route('c1:443'))).toBe(fresh);
  });

  it('says `draining` when every matching agent is draining', () => {
    const t = new RoutingTable<FakeBackend>();
    t.add(backend({ hosts: ['c1'], draining: true }));
    t.add(backend({ hosts: ['c1'], draining: true }));
    t.add(backend({ hosts: ['c2'] }));
    const r = refused(t.route('c1:443'));
    expect(r.reason).toBe('draining');
    expect(r.message).toContain('c1:443');
  });

  it('picks the agent with the fewest open connections', () => {
    const t = new RoutingTable<FakeBackend>();
    const a = backend({ hosts: ['c1'], openConnections: 5 });
    const b = backend({ hosts: ['c1'], openConnections: 2 });
    const c = backend({ hosts: ['c1'], openConnections: 3 });
    const idle = backend({ hosts: ['c1'], openConnections: 0, draining: true });
    for (const x of [a, b, c, idle]) t.add(x);
    expect(routed(t.route('c1:443'))).toBe(b);
    b.openConnections = 9;
    expect(routed(t.route('c1:443'))).toBe(c);
    a.openConnections = 1;
    expect(routed(t.route('c1:443'))).toBe(a);
    // The same among cidr and default-route candidates.
    const t2 = new RoutingTable<FakeBackend>();
    const d1 = backend({ defaultRoute: true, openConnections: 4 });
    const d2 = backend({ defaultRoute: true, openConnections: 1 });
    t2.add(d1);
    t2.add(d2);
    expect(routed(t2.route('x:1'))).toBe(d2);
  });

  it('remove() takes the agent out of every index', () => {
    const t = new RoutingTable<FakeBackend>();
    const b = backend({ hosts: ['c1', 'Alias'], cidrs: ['10.0.0.0/8', 'fd00::/8'], defaultRoute: true });
    t.add(b);
    expect(t.size).toBe(1);
    t.remove(b);
    expect(t.size).toBe(0);
    expect(t.backends()).toEqual([]);
    for (const dest of ['c1:443', 'alias:443', '10.0.0.1:443', '[fd00::1]:443', 'elsewhere:80']) {
      expect(refused(t.route(dest)).reason, dest).toBe('no_agent');
    }
    // Removing twice, or an agent never added, is harmless.
    t.remove(b);
    t.remove(backend({ hosts: ['c1'] }));
    expect(t.size).toBe(0);
  });

  it('remove() leaves other agents with the same identifiers in place', () => {
    const t = new RoutingTable<FakeBackend>();
    const a = backend({ hosts: ['c1'], cidrs: ['10.0.0.0/8'], defaultRoute: true });
    const b = backend({ hosts: ['c1'], cidrs: ['10.0.0.0/8'], defaultRoute: true, openConnections: 7 });
    t.add(a);
    t.add(b);
    t.remove(a);
    expect(routed(t.route('c1:443'))).toBe(b);
    expect(routed(t.route('10.9.9.9:443'))).toBe(b);
    expect(routed(t.route('other:80'))).toBe(b);
    expect(t.backends()).toEqual([b]);
    // And it can come back.
    t.add(a);
    expect(routed(t.route('c1:443'))).toBe(a);
    expect(t.size).toBe(2);
  });

  it('refuses a destination that is not HOST:PORT with `endpoint`', () => {
    const t = new RoutingTable<FakeBackend>();
    t.add(backend({ hosts: ['c1'], defaultRoute: true }));
    for (const bad of ['c1', 'c1:', 'c1:0', 'c1:70000', '::1:443', '[::1]', '']) {
      const r = refused(t.route(bad));
      expect(r.reason, bad).toBe('endpoint');
      expect(r.message).toContain(`"${bad}"`);
    }
  });

  it('refuses an unknown destination with `no_agent`, naming it', () => {
    const t = new RoutingTable<FakeBackend>();
    t.add(backend({ hosts: ['c1'] }));
    const r = refused(t.route('nowhere.example:8443'));
    expect(r.reason).toBe('no_agent');
    expect(r.message).toContain('nowhere.example:8443');
    expect(refused(new RoutingTable<FakeBackend>().route('c1:443')).reason).toBe('no_agent');
  });
});
