import { describe, expect, it } from 'vitest';
import {
  auditNoProxy,
  explainNoProxy,
  formatAudit,
  formatExplanation,
  NoProxyAuditError,
  parseTarget,
  type AuditReport,
  type ClusterFacts,
} from './no-proxy-audit.js';

const facts: ClusterFacts = {
  podCidrs: ['10.244.0.0/16'],
  serviceCidrs: ['10.96.0.0/12'],
  clusterDomain: 'cluster.local',
  apiserverIp: '10.96.0.1',
  hub: 'hub.corp.example:8091',
};

/** A value that gets everything right for `facts`; only the CIDR caveat for other tools remains. */
const GOOD = 'localhost,127.0.0.1,10.244.0.0/16,10.96.0.0/12,.svc,.cluster.local,169.254.169.254,metadata.google.internal';

const codes = (r: AuditReport): string[] => r.findings.map((f) => f.code);
const problemCodes = (r: AuditReport): string[] => r.findings.filter((f) => f.severity === 'problem').map((f) => f.code);

describe('auditNoProxy', () => {
  it('a complete value has no problems, only the CIDR caveat', () => {
    const r = auditNoProxy(GOOD, facts);
    expect(r.problems).toBe(0);
    expect(codes(r)).toEqual(['cidr-entries']);
    expect(r.suggested).toBe(GOOD);
    expect(r.unresolved).toEqual([]);
  });

  it('an empty value: pod CIDR, service CIDR, .svc and the cluster domain are problems; metadata and loopback warnings', () => {
    const r = auditNoProxy('', facts);
    expect(problemCodes(r)).toEqual(['pod-cidr-proxied', 'service-cidr-proxied', 'svc-proxied', 'cluster-domain-proxied']);
    expect(codes(r)).toContain('metadata-proxied');
    expect(codes(r)).toContain('loopback-missing');
    // The apiserver IP lies in the (missing) service CIDR: reported once, under the service CIDR.
    expect(codes(r)).not.toContain('apiserver-proxied');
    expect(r.findings.find((f) => f.code === 'service-cidr-proxied')!.message).toMatch(/\(the apiserver at 10\.96\.0\.1 among them\)$/);
    const pod = r.findings.find((f) => f.code === 'pod-cidr-proxied')!;
    expect(pod.message).toMatch(/Prometheus scrapes.*hairpin through the proxy/);
    expect(pod.fix).toBe('add 10.244.0.0/16');
    // Applying every suggestion yields a value with no problems.
    expect(auditNoProxy(r.suggested, facts).problems).toBe(0);
    expect(r.unresolved).toEqual([]);
  });

  it('the pod CIDR may be covered by a wider entry, by several narrower ones, or only partly', () => {
    expect(problemCodes(auditNoProxy(GOOD.replace('10.244.0.0/16', '10.0.0.0/8'), facts))).toEqual([]);
    expect(problemCodes(auditNoProxy(GOOD.replace('10.244.0.0/16', '10.244.0.0/17,10.244.128.0/18,10.244.192.0/18'), facts))).toEqual([]);
    const partial = auditNoProxy(GOOD.replace('10.244.0.0/16', '10.244.0.0/17'), facts);
    expect(problemCodes(partial)).toEqual(['pod-cidr-proxied']);
    expect(partial.findings[0]!.message).toMatch(/only partly covered \(by "10.244.0.0\/17"\)/);
  });

  it('dual-stack pod CIDRs are checked family by family', () => {
    const r = auditNoProxy(GOOD, { ...facts, podCidrs: ['10.244.0.0/16', 'fd00:10:244::/56'] });
    expect(problemCodes(r)).toEqual(['pod-cidr-proxied']);
    expect(r.findings[0]!.fix).toBe('add fd00:10:244::/56');
    expect(auditNoProxy(`${GOOD},fd00::/8`, { ...facts, podCidrs: ['fd00:10:244::/56'] }).problems).toBe(0);
  });

  it('an apiserver IP outside the service CIDR must be listed itself', () => {
    const r = auditNoProxy(GOOD, { ...facts, apiserverIp: '172.18.0.2' });
    expect(problemCodes(r)).toEqual(['apiserver-proxied']);
    expect(r.findings[0]!.fix).toBe('add 172.18.0.2');
    expect(auditNoProxy(`${GOOD},172.18.0.0/16`, { ...facts, apiserverIp: '172.18.0.2' }).problems).toBe(0);
  });

  it('".svc" alone leaves fully qualified names proxied, and says so', () => {
    const r = auditNoProxy(GOOD.replace(',.cluster.local', ''), facts);
    expect(problemCodes(r)).toEqual(['cluster-domain-proxied']);
    expect(r.findings[0]!.message).toContain('".svc" only matches names ending in .svc, not kubernetes.default.svc.cluster.local');
    expect(r.findings[0]!.fix).toBe('add .cluster.local');
  });

  it('a custom cluster domain is checked instead of cluster.local', () => {
    const r = auditNoProxy(GOOD, { ...facts, clusterDomain: 'k8s.corp.' });
    expect(problemCodes(r)).toEqual(['cluster-domain-proxied']);
    expect(r.findings[0]!.fix).toBe('add .k8s.corp');
    expect(auditNoProxy(`${GOOD},k8s.corp`, { ...facts, clusterDomain: 'k8s.corp' }).problems).toBe(0);
  });

  it('the hub matched by NO_PROXY is a problem naming every matching entry; exact entries are removed in the suggestion', () => {
    const exact = auditNoProxy(`${GOOD},hub.corp.example`, facts);
    expect(problemCodes(exact)).toEqual(['hub-bypassed']);
    expect(exact.findings[0]!.message).toBe(
      'hub hub.corp.example:8091 matches NO_PROXY entry "hub.corp.example": the agent would dial the hub directly instead of through the proxy',
    );
    expect(exact.suggested).toBe(GOOD);
    expect(exact.unresolved).toEqual([]);

    const broad = auditNoProxy(`${GOOD},.corp.example,hub.corp.example:8091`, facts);
    expect(broad.findings[0]!.message).toContain('entries ".corp.example", "hub.corp.example:8091"');
    expect(broad.findings[0]!.fix).toMatch(/remove "hub.corp.example:8091"; narrow ".corp.example"/);
    // A broad entry cannot be fixed automatically: the suggestion keeps it and says what is left.
    expect(broad.suggested).toContain('.corp.example');
    expect(broad.unresolved.map((f) => f.code)).toEqual(['hub-bypassed']);
    expect(formatAudit(broad)).toMatch(/the suggestion still needs a decision by hand: narrow ".corp.example"/);
  });

  it('a port-qualified entry bypasses the hub only on its port', () => {
    expect(problemCodes(auditNoProxy(`${GOOD},hub.corp.example:443`, facts))).toEqual([]);
    expect(problemCodes(auditNoProxy(`${GOOD},hub.corp.example:8091`, facts))).toEqual(['hub-bypassed']);
  });

  it('an IP hub matched by a CIDR entry is a problem; a loopback hub is only a warning', () => {
    expect(problemCodes(auditNoProxy(GOOD, { ...facts, hub: '10.96.10.10:8091' }))).toEqual(['hub-bypassed']);
    const lo = auditNoProxy(GOOD, { ...facts, hub: '127.0.0.1:8091' });
    expect(lo.problems).toBe(0);
    expect(codes(lo)).toContain('hub-loopback');
  });

  it('"*" bypasses everything: the hub problem and a semantics warning', () => {
    const r = auditNoProxy('*,localhost', facts);
    expect(problemCodes(r)).toEqual(['hub-bypassed']);
    expect(r.findings.find((f) => f.code === 'star')!.message).toMatch(/only as the whole value/);
    expect(r.findings[0]!.fix).toMatch(/remove "\*"/);
    expect(auditNoProxy('*', {}).findings.map((f) => f.code)).toEqual(['star']);
  });

  it('entries other tools read differently are warnings', () => {
    const r = auditNoProxy(`${GOOD},*.corp.example,.internal.example,db.example:5432`, { ...facts, hub: 'hub.other.example:443' });
    expect(r.problems).toBe(0);
    const byCode = new Map(r.findings.map((f) => [f.code, f]));
    expect(byCode.get('cidr-entries')!.message).toMatch(/ignored by Python.*wget/);
    expect(byCode.get('star-dot-entry')!.message).toMatch(/"\*\.corp\.example".*curl, wget and Python/);
    expect(byCode.get('star-dot-entry')!.fix).toBe('write ".corp.example" instead (same meaning in Go)');
    expect(byCode.get('port-entries')!.message).toMatch(/"db.example:5432" matches only that port in Go/);
    expect(byCode.get('leading-dot-entries')!.message).toMatch(
      /".internal.example" matches only subdomains in Go.*also match internal.example itself/,
    );
    // Conventional suffixes (.svc, .cluster.local) are not nagged about.
    expect(byCode.get('leading-dot-entries')!.message).not.toContain('.svc');
    expect(r.suggested).toContain(',.corp.example');
    expect(r.suggested).not.toContain('*.corp.example');
  });

  it('entries Go cannot use are reported with a repaired replacement', () => {
    const r = auditNoProxy(`${GOOD},[fd00::1],10.1.0.0/16:443,https://git.example/x,a.example b.example,:443`, facts);
    const never = r.findings.filter((f) => f.code === 'entry-never-matches').map((f) => f.fix);
    expect(never).toEqual([
      'write "fd00::1" instead',
      'write "10.1.0.0/16" instead',
      'write "git.example" instead',
      'write "a.example","b.example" instead',
    ]);
    expect(codes(r)).toContain('entry-ignored');
    expect(r.suggested).toBe(`${GOOD},fd00::1,10.1.0.0/16,git.example,a.example,b.example`);
  });

  it('loopback entries are wanted for other tools even though Go skips loopback itself', () => {
    const r = auditNoProxy(GOOD.replace('localhost,', ''), facts);
    expect(r.findings.find((f) => f.code === 'loopback-missing')!.message).toMatch(/^localhost is not in NO_PROXY/);
    expect(codes(auditNoProxy(GOOD.replace('127.0.0.1', '127.0.0.0/8'), facts))).not.toContain('loopback-missing');
  });

  it('refuses facts that are not what they claim', () => {
    expect(() => auditNoProxy('', { podCidrs: ['10.244.0.0'] })).toThrow(NoProxyAuditError);
    expect(() => auditNoProxy('', { serviceCidrs: ['10.96.0.0/40'] })).toThrow(/--service-cidr "10.96.0.0\/40" is not a CIDR/);
    expect(() => auditNoProxy('', { apiserverIp: 'kubernetes' })).toThrow(/--apiserver-ip/);
    expect(() => auditNoProxy('', { hub: 'hub:99999' })).toThrow(/--hub/);
    expect(() => auditNoProxy('', { clusterDomain: 'a b' })).toThrow(/--cluster-domain/);
  });

  it('formats problems first, then warnings, with counts and the suggested value', () => {
    const text = formatAudit(auditNoProxy('localhost,127.0.0.1,10.0.0.0/8', facts));
    const lines = text.trimEnd().split('\n');
    expect(lines[0]).toBe('NO_PROXY entries (3): localhost,127.0.0.1,10.0.0.0/8');
    const lastProblem = lines.map((l) => l.startsWith('PROBLEM')).lastIndexOf(true);
    expect(lastProblem).toBeGreaterThan(0);
    expect(lines.findIndex((l) => l.startsWith('warning'))).toBeGreaterThan(lastProblem);
    expect(text).toContain('2 problems, 3 warnings.');
    expect(text).toContain(
      'suggested NO_PROXY=localhost,127.0.0.1,10.0.0.0/8,.svc,.cluster.local,169.254.169.254,metadata.google.internal',
    );
    expect(formatAudit(auditNoProxy('localhost,127.0.0.1,.svc,169.254.169.254,metadata.google.internal', {}))).toContain(
      'OK: no problems found.',
    );
  });
});

describe('explainNoProxy', () => {
  it('names the deciding entry', () => {
    const e = explainNoProxy('foo.com,10.0.0.0/8', 'a.foo.com');
    expect(e).toMatchObject({ target: 'a.foo.com:443', decision: 'direct', entry: 'foo.com' });
    expect(formatExplanation(e)).toBe('direct (entry "foo.com")\n  a.foo.com is a subdomain of NO_PROXY entry "foo.com"\n');
  });

  it('says proxy when nothing matches, with port and IPv6 targets', () => {
    expect(explainNoProxy('foo.com:8443', 'foo.com:443')).toMatchObject({ decision: 'proxy', entry: null, target: 'foo.com:443' });
    expect(explainNoProxy('fd00::/8', '[fd00::1]:6443')).toMatchObject({ decision: 'direct', entry: 'fd00::/8', target: '[fd00::1]:6443' });
    expect(explainNoProxy('fd00::/8', 'fd00::1')).toMatchObject({ decision: 'direct', target: '[fd00::1]:443' });
  });

  it('adds notes where other tools decide differently', () => {
    expect(explainNoProxy('10.0.0.0/8', '10.1.2.3').notes.join()).toMatch(/ignore CIDR entries/);
    expect(explainNoProxy('*.foo.com', 'a.foo.com').notes.join()).toMatch(/never match "\*\.foo\.com"/);
    expect(explainNoProxy('', 'localhost:8080').notes.join()).toMatch(/unless NO_PROXY lists it/);
    expect(explainNoProxy('.foo.com', 'foo.com').notes.join()).toMatch(/strip the leading dot of "\.foo\.com": they would go direct/);
    expect(explainNoProxy('a.com,*', 'b.com').notes.join()).toMatch(/only as the whole value/);
    expect(explainNoProxy('foo.com', 'foo.com').notes).toEqual([]);
  });

  it('refuses a target that is not HOST[:PORT]', () => {
    expect(() => explainNoProxy('', 'foo.com:http')).toThrow(NoProxyAuditError);
    expect(() => explainNoProxy('', '')).toThrow(NoProxyAuditError);
  });
});

describe('parseTarget', () => {
  it('reads names, IPs and ports', () => {
    expect(parseTarget('hub:8091')).toEqual({ host: 'hub', port: 8091 });
    expect(parseTarget('hub')).toEqual({ host: 'hub', port: 443 });
    expect(parseTarget('hub', 80)).toEqual({ host: 'hub', port: 80 });
    expect(parseTarget('[::1]:8091')).toEqual({ host: '::1', port: 8091 });
    expect(parseTarget('[::1]')).toEqual({ host: '::1', port: 443 });
    expect(parseTarget('2001:db8::1')).toEqual({ host: '2001:db8::1', port: 443 });
    expect(parseTarget('hub:')).toBeNull();
    expect(parseTarget('hub:65536')).toBeNull();
  });
});
