import { describe, expect, it } from 'vitest';
import { emptyIdentifiers, serviceProxyHost, type AgentIdentifiers } from '@cluster-proxy/proto';
import { IdentityError, checkIdentifiers, type Grant } from './agent-listener.js';

function ids(partial: Partial<AgentIdentifiers>): AgentIdentifiers {
  return { ...emptyIdentifiers(), ...partial };
}

function grant(partial: Partial<Grant>): Grant {
  return { hosts: [], cidrs: [], defaultRoute: false, ...partial };
}

/** The IdentityError checkIdentifiers throws, or a failure if it accepts. */
function refusal(cluster: string, i: AgentIdentifiers, g?: Grant): IdentityError {
  try {
    checkIdentifiers(cluster, i, g);
  } catch (err) {
    expect(err).toBeInstanceOf(IdentityError);
    return err as IdentityError;
  }
  throw new Error(`expected ${JSON.stringify(i)} to be refused for cluster ${cluster}`);
}

describe('checkIdentifiers', () => {
  it("accepts the cluster's own names: C, C.<namespace> and OCM's service-proxy host", () => {
    expect(() =>
      checkIdentifiers('c1', ids({ host: ['c1', 'c1.open-cluster-management-agent-addon', serviceProxyHost('c1')] }), undefined),
    ).not.toThrow();
    expect(() => checkIdentifiers('c1', ids({ host: ['c1.ns-2'] }), undefined)).not.toThrow();
    expect(() => checkIdentifiers('c1', ids({ host: ['c1.a'] }), undefined)).not.toThrow();
    expect(() => checkIdentifiers('c1', ids({}), undefined)).not.toThrow();
  });

  it("refuses another cluster's names, naming the identifier", () => {
    for (const h of ['c2', 'c2.open-cluster-management-agent-addon', serviceProxyHost('c2'), 'c10', 'xc1']) {
      const e = refusal('c1', ids({ host: ['c1', h] }));
      expect(e.message).toContain(`host=${h}`);
      expect(e.message).toContain('c1');
      expect(e.message).not.toContain('\n');
    }
  });

  it('refuses C.<something> unless <something> is a single DNS label', () => {
    for (const h of ['c1.a.b', 'c1.', 'c1.-ns', 'c1.ns-', 'c1.n_s', `c1.${serviceProxyHost('c2')}`]) {
      expect(refusal('c1', ids({ host: [h] })).message, h).toContain(`host=${h}`);
    }
  });

  it('accepts hosts, cidrs and default-route the hub granted the cluster', () => {
    const g = grant({ hosts: ['API.example.com'], cidrs: ['10.0.0.0/8', 'fd00::/8'], defaultRoute: true });
    expect(() =>
      checkIdentifiers('c1', ids({ host: ['c1', 'api.example.com'], cidr: ['10.0.0.0/8', 'fd00::/8'], defaultRoute: true }), g),
    ).not.toThrow();
  });

  it('accepts an ipv4/ipv6 identifier the hub granted as a /32 or /128', () => {
    // `--grant C=cidr:10.0.0.5/32` is how an operator grants one address; the agent (or an
    // unmodified ANP agent) registers it as ipv4=10.0.0.5.
    const g = grant({ cidrs: ['10.0.0.5/32', 'fd00::5/128'] });
    expect(() => checkIdentifiers('c1', ids({ ipv4: ['10.0.0.5'] }), g)).not.toThrow();
    expect(() => checkIdentifiers('c1', ids({ ipv6: ['fd00::5'] }), g)).not.toThrow();
  });

  it('refuses grants of another cluster', () => {
    // The grant passed is the one for the agent's own cluster; a host granted to c2 does not help c1.
    const e = refusal('c1', ids({ host: ['api.example.com'] }), grant({ hosts: ['other.example.com'] }));
    expect(e.message).toContain('host=api.example.com');
  });

  it('refuses ungranted ipv4, ipv6, cidr and default-route identifiers, naming them', () => {
    expect(refusal('c1', ids({ ipv4: ['10.0.0.1'] })).message).toContain('ipv4=10.0.0.1');
    expect(refusal('c1', ids({ ipv6: ['::1'] })).message).toContain('ipv6=::1');
    expect(refusal('c1', ids({ cidr: ['10.0.0.0/8'] })).message).toContain('cidr=10.0.0.0/8');
    expect(refusal('c1', ids({ defaultRoute: true })).message).toContain('default-route');
    // A grant for something else does not cover them.
    const g = grant({ hosts: ['api.example.com'], cidrs: ['192.168.0.0/16'] });
    expect(refusal('c1', ids({ cidr: ['10.0.0.0/8'] }), g).message).toContain('cidr=10.0.0.0/8');
    expect(refusal('c1', ids({ cidr: ['0.0.0.0/0'] }), g).message).toContain('cidr=0.0.0.0/0');
    expect(refusal('c1', ids({ ipv4: ['8.8.8.8'] }), g).message).toContain('ipv4=8.8.8.8');
    expect(refusal('c1', ids({ defaultRoute: true }), g).message).toContain('default-route');
  });

  it('refuses an invalid cidr, even one the hub "granted"', () => {
    for (const c of ['10.0.0.0/33', '10.0.0.0', 'fd00::/129', 'example.com/8', '10.0.0.0/x', '']) {
      const e = refusal('c1', ids({ cidr: [c] }), grant({ cidrs: [c] }));
      expect(e.message, c).toContain(`cidr=${c}`);
    }
  });
});
