import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  clusterHostNames,
  emptyIdentifiers,
  formatIdentifiers,
  joinHostPort,
  parseIdentifiers,
  serviceProxyHost,
  splitHostPort,
  type AgentIdentifiers,
} from './identifiers.js';

describe('parseIdentifiers / formatIdentifiers', () => {
  it('round-trips every kind of identifier, including values that need URL escaping', () => {
    const ids: AgentIdentifiers = {
      host: ['c1', 'c1.open-cluster-management-agent-addon', 'api.example.com'],
      ipv4: ['10.0.0.1', '192.168.1.2'],
      ipv6: ['::1', 'fd00::12'],
      cidr: ['10.0.0.0/8', 'fd00::/8'],
      defaultRoute: true,
    };
    const text = formatIdentifiers(ids);
    expect(parseIdentifiers(text)).toEqual(ids);
    // The query form ANP expects: key=value pairs joined by '&'.
    expect(text.split('&')).toContain('host=c1');
    expect(text).toContain('default-route=true');
  });

  it('formats nothing for empty identifiers and parses the empty string to empty identifiers', () => {
    expect(formatIdentifiers(emptyIdentifiers())).toBe('');
    expect(parseIdentifiers('')).toEqual(emptyIdentifiers());
    // default-route=false is not written at all (ANP only reads true).
    expect(formatIdentifiers({ ...emptyIdentifiers(), host: ['a'] })).toBe('host=a');
  });

  it('parses an ANP-style query string, repeated keys in order', () => {
    expect(parseIdentifiers('host=node1&ipv4=1.2.3.4&ipv6=::1&cidr=10.0.0.0/8&default-route=true&host=node2')).toEqual({
      host: ['node1', 'node2'],
      ipv4: ['1.2.3.4'],
      ipv6: ['::1'],
      cidr: ['10.0.0.0/8'],
      defaultRoute: true,
    });
  });

  it('ignores unknown keys (version skew), like ANP', () => {
    expect(parseIdentifiers('host=a&future-key=x&HOST=b&zone=eu')).toEqual({ ...emptyIdentifiers(), host: ['a'] });
  });

  it('lower-cases host identifiers (DNS names are case-insensitive)', () => {
    expect(parseIdentifiers('host=API.Example.COM').host).toEqual(['api.example.com']);
  });

  it("reads default-route like Go's strconv.ParseBool, first value only", () => {
    for (const v of ['1', 't', 'T', 'true', 'TRUE', 'True']) expect(parseIdentifiers(`default-route=${v}`).defaultRoute, v).toBe(true);
    for (const v of ['0', 'f', 'F', 'false', 'FALSE', 'False', '', 'yes', 'on', 'tRUE'])
      expect(parseIdentifiers(`default-route=${v}`).defaultRoute, v).toBe(false);
    expect(parseIdentifiers('default-route=false&default-route=true').defaultRoute).toBe(false);
    expect(parseIdentifiers('default-route=true&default-route=false').defaultRoute).toBe(true);
    expect(parseIdentifiers('host=a').defaultRoute).toBe(false);
  });
});

describe('OCM host names', () => {
  it("matches OCM's documented service-proxy host for cluster1", () => {
    expect(serviceProxyHost('cluster1')).toBe('cluster-a140791d2b20a847f2c74c62c384f93fb83691d871e80385.open-cluster-management.proxy');
  });

  it('is "cluster-" + the first 48 hex chars of sha256(name)', () => {
    const name = 'prod-eu-west-1';
    const hex = createHash('sha256').update(name).digest('hex');
    expect(serviceProxyHost(name)).toBe(`cluster-${hex.slice(0, 48)}.open-cluster-management.proxy`);
    expect(serviceProxyHost('a')).not.toBe(serviceProxyHost('b'));
  });

  it('lists C, C.N and the service-proxy host', () => {
    expect(clusterHostNames('c1', 'ns1')).toEqual(['c1', 'c1.ns1', serviceProxyHost('c1')]);
  });
});

describe('splitHostPort / joinHostPort', () => {
  it('splits names and IPv4 addresses, lower-casing the host', () => {
    expect(splitHostPort('example.com:443')).toEqual({ host: 'example.com', port: 443 });
    expect(splitHostPort('Example.COM:8443')).toEqual({ host: 'example.com', port: 8443 });
    expect(splitHostPort('10.0.0.1:1')).toEqual({ host: '10.0.0.1', port: 1 });
    expect(splitHostPort('c1:65535')).toEqual({ host: 'c1', port: 65535 });
  });

  it('takes IPv6 hosts in brackets and returns them without', () => {
    expect(splitHostPort('[::1]:443')).toEqual({ host: '::1', port: 443 });
    expect(splitHostPort('[FD00::ABCD]:80')).toEqual({ host: 'fd00::abcd', port: 80 });
  });

  it('rejects a bare IPv6 address (ambiguous without brackets)', () => {
    expect(splitHostPort('::1:443')).toBeNull();
    expect(splitHostPort('fd00::1:443')).toBeNull();
  });

  it('rejects a missing or malformed port', () => {
    for (const bad of [
      'example.com',
      'example.com:',
      '[::1]',
      '[::1]443',
      '[::1]:',
      '[::1',
      'host:http',
      'host:-1',
      'host:+80',
      'host:123456',
      'host:4 3',
      '',
    ]) {
      expect(splitHostPort(bad), bad).toBeNull();
    }
  });

  it('rejects port 0 and ports above 65535', () => {
    expect(splitHostPort('example.com:0')).toBeNull();
    expect(splitHostPort('example.com:65536')).toBeNull();
    expect(splitHostPort('[::1]:0')).toBeNull();
    expect(splitHostPort('[::1]:99999')).toBeNull();
  });

  it('rejects an empty host', () => {
    expect(splitHostPort(':443')).toBeNull();
    expect(splitHostPort('[]:443')).toBeNull();
  });

  it('joins IPv6 hosts with brackets, so the result splits back', () => {
    expect(joinHostPort('::1', 443)).toBe('[::1]:443');
    expect(joinHostPort('example.com', 80)).toBe('example.com:80');
    for (const [h, p] of [
      ['::1', 443],
      ['10.0.0.1', 22],
      ['c1', 6443],
    ] as const)
      expect(splitHostPort(joinHostPort(h, p))).toEqual({ host: h, port: p });
  });
});
