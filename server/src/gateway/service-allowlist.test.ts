// The proxy-service form: its URL, and the allowlist that decides which Services it reaches (default deny).
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createCA } from '../pki/certificates.js';
import { parseGatewayTarget, type ServiceTarget } from './paths.js';
import { ServiceAllowlist, allowedEntry, parseServiceAllowlist } from './service-allowlist.js';

const svc = (name: string, port: number, protocol: 'http' | 'https' = 'http', namespace = 'demo'): ServiceTarget => ({
  protocol,
  namespace,
  name,
  port,
});
const noCa = (): Buffer => {
  throw new Error('no caFile expected');
};

describe('the proxy-service URL form', () => {
  const base = '/c1/api/v1/namespaces/demo/services';
  it.each([
    [`${base}/http:hello:8080/proxy-service/a/b?x=1`, svc('hello', 8080), '/a/b?x=1'],
    [`${base}/hello/proxy-service/`, svc('hello', 443, 'https'), '/'],
    [`${base}/hello/proxy-service`, svc('hello', 443, 'https'), '/'],
    [`${base}/hello:9443/proxy-service/x`, svc('hello', 9443, 'https'), '/x'],
    [`${base}/https:hello:9443/proxy-service/x`, svc('hello', 9443, 'https'), '/x'],
    [`${base}/http:hello:/proxy-service/x`, svc('hello', 80), '/x'],
  ])('%s', (target, service, p) => {
    expect(parseGatewayTarget(target)).toEqual({ cluster: 'c1', path: p, service });
  });
  it('default/kubernetes is the apiserver itself (impersonated, no allowlist), as in OCM', () => {
    expect(parseGatewayTarget('/c1/api/v1/namespaces/default/services/https:kubernetes:443/proxy-service/api/v1/pods')).toEqual({
      cluster: 'c1',
      path: '/api/v1/pods',
    });
  });
  it("the apiserver's own service proxy path (no proxy-service segment) is a plain kube path", () => {
    expect(parseGatewayTarget(`${base}/hello:80/proxy/x`)).toEqual({
      cluster: 'c1',
      path: '/api/v1/namespaces/demo/services/hello:80/proxy/x',
    });
  });
  it.each([
    [`${base}/ftp:hello:21/proxy-service/`, /protocol "ftp" must be http or https/],
    [`${base}/hello:web/proxy-service/`, /must be a port number/],
    // As Kubernetes splits it: NAME:PORT, so "http" is the name and "hello" a (named) port.
    [`${base}/http:hello/proxy-service/`, /port "hello" must be a port number/],
    [`${base}/hello:70000/proxy-service/`, /out of range/],
    [`${base}/Hello/proxy-service/`, /not a Service name/],
    [`${base}/a:b:c:d/proxy-service/`, /must be \[http:\|https:\]NAME\[:PORT\]/],
    ['/c1/api/v1/namespaces/De_mo/services/hello/proxy-service/', /not a namespace name/],
    [`${base}/hello/proxy-service/../x`, /dot segments/],
  ])('refuses %s', (target, why) => {
    const r = parseGatewayTarget(target);
    expect('error' in r && r.error).toMatch(why);
  });
});

describe('the service allowlist', () => {
  it('default deny: empty, or no entry matching namespace, name, port, protocol and cluster', () => {
    expect(parseServiceAllowlist('', noCa)).toEqual([]);
    const list = parseServiceAllowlist(
      `
- { namespace: demo, service: hello, port: 8080, protocol: http }
- { namespace: demo, service: any-port }
- { namespace: demo, service: scoped, clusters: [c2] }
`,
      noCa,
    );
    expect(allowedEntry(list, 'c1', svc('hello', 8080))).toMatchObject({ service: 'hello' });
    expect(allowedEntry(list, 'c1', svc('hello', 8081))).toBeNull();
    expect(allowedEntry(list, 'c1', svc('hello', 8080, 'https'))).toBeNull();
    expect(allowedEntry(list, 'c1', svc('hello', 8080, 'http', 'other'))).toBeNull();
    expect(allowedEntry(list, 'c1', svc('any-port', 1))).not.toBeNull();
    expect(allowedEntry(list, 'c1', svc('any-port', 65535, 'https'))).not.toBeNull();
    expect(allowedEntry(list, 'c1', svc('scoped', 80))).toBeNull();
    expect(allowedEntry(list, 'c2', svc('scoped', 80))).not.toBeNull();
    expect(allowedEntry(list, 'c1', svc('nothing', 80))).toBeNull();
  });
  it('JSON works too, and a port may be a quoted number (as in a ConfigMap)', () => {
    const list = parseServiceAllowlist('[{"namespace":"demo","service":"hello","port":"8080"}]', noCa);
    expect(list).toEqual([{ namespace: 'demo', service: 'hello', port: 8080 }]);
  });
  it.each([
    ['{ namespace: demo }', /must be a list/],
    ['- demo/hello', /entry 1: must be a mapping/],
    ['- { service: hello }', /entry 1: namespace is required/],
    ['- { namespace: demo, service: "" }', /entry 1: service is required/],
    ['- { namespace: demo, service: a }\n- { namespace: demo, service: b, prot: http }', /entry 2: unknown field "prot"/],
    ['- { namespace: demo, service: a, port: 0 }', /port must be a number from 1 to 65535/],
    ['- { namespace: demo, service: a, port: web }', /port must be a number/],
    ['- { namespace: demo, service: a, protocol: tcp }', /protocol must be http or https/],
    ['- { namespace: demo, service: a, clusters: [] }', /clusters must be a non-empty list/],
    ['- { namespace: demo, service: a, caFile: /nonexistent/ca.crt }', /cannot read caFile \/nonexistent\/ca.crt: ENOENT/],
    ['- [unclosed', /not YAML or JSON/],
  ])('refuses %s', (text, why) => {
    expect(() =>
      parseServiceAllowlist(text, (f) => {
        const err = new Error(`open ${f}`) as NodeJS.ErrnoException;
        err.code = 'ENOENT';
        throw err;
      }),
    ).toThrow(why);
  });
  it('a caFile must hold a PEM certificate', () => {
    expect(() => parseServiceAllowlist('- { namespace: d, service: a, caFile: x }', () => Buffer.from('not a certificate'))).toThrow(
      /holds no PEM certificate/,
    );
    const pem = createCA({ commonName: 'svc-ca' }).certPem;
    expect(parseServiceAllowlist('- { namespace: d, service: a, caFile: x }', () => Buffer.from(pem))[0]!.ca?.toString()).toBe(pem);
  });
});

describe('ServiceAllowlist (the file)', () => {
  let dir: string;
  const log = pino({ level: 'silent' });
  beforeEach(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'cp-svc-allow-'));
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('a missing or broken file at start is a one-line error', async () => {
    await expect(ServiceAllowlist.open({ file: path.join(dir, 'none.yaml'), log })).rejects.toThrow(
      /--gateway-services .*none.yaml: no such file/,
    );
    await writeFile(path.join(dir, 'bad.yaml'), '- { service: x }');
    await expect(ServiceAllowlist.open({ file: path.join(dir, 'bad.yaml'), log })).rejects.toThrow(
      /bad.yaml: entry 1: namespace is required/,
    );
  });

  it('re-read on change; a broken change keeps the last good list; a deleted file denies everything', async () => {
    const file = path.join(dir, 'services.yaml');
    await writeFile(file, '- { namespace: demo, service: a }\n');
    const list = await ServiceAllowlist.open({ file, log, intervalMs: 60_000 });
    try {
      expect(list.allowed('c1', svc('a', 80))).not.toBeNull();
      await writeFile(file, '- { namespace: demo, service: a }\n- { namespace: demo, service: b }\n');
      await list.check();
      expect(list.size).toBe(2);
      expect(list.allowed('c1', svc('b', 80))).not.toBeNull();
      await writeFile(file, '- { namespace: demo, service: a, bogus: 1 }\n');
      await list.check();
      expect(list.size).toBe(2);
      await rm(file);
      await list.check();
      expect(list.size).toBe(0);
      expect(list.allowed('c1', svc('a', 80))).toBeNull();
      await writeFile(file, '- { namespace: demo, service: c, caFile: ca.crt }\n');
      await writeFile(path.join(dir, 'ca.crt'), createCA({ commonName: 'svc-ca' }).certPem);
      await list.check();
      expect(list.allowed('c1', svc('c', 443, 'https'))?.ca).toBeDefined();
    } finally {
      list.close();
    }
  });
});
