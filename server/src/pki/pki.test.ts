import { X509Certificate } from 'node:crypto';
import { mkdtemp, readFile, readdir, rm, stat, unlink, writeFile } from 'node:fs/promises';
import type { AddressInfo, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import tls from 'node:tls';
import forge from 'node-forge';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  agentSubject,
  clusterFromSubject,
  createCA,
  ensureHubPki,
  isAgentSubject,
  issueAgentCert,
  issueClientCert,
  issueServerCert,
  readPemPair,
  writePemPair,
  type AgentIdentity,
  type PemPair,
} from './index.js';

const DAY_MS = 24 * 60 * 60 * 1000;
const SERVER_AUTH = '1.3.6.1.5.5.7.3.1';
const CLIENT_AUTH = '1.3.6.1.5.5.7.3.2';
const AGENT_CN_A = 'system:open-cluster-management:cluster:cluster-a:addon:cluster-proxy:agent:proxy-agent';
const AGENT_O_A = 'system:open-cluster-management:cluster:cluster-a:addon:cluster-proxy';

// Key generation dominates the run time, so every certificate the file needs is made once here.
let ca: PemPair;
let otherCa: PemPair;
let serverPair: PemPair;
let agentPair: PemPair;
let expiredAgentPair: PemPair;
let foreignAgentPair: PemPair;
let userPair: PemPair;
let caX: X509Certificate;
let otherCaX: X509Certificate;
let tmpRoot: string;

beforeAll(async () => {
  ca = createCA();
  otherCa = createCA({ commonName: 'some-other-ca', validityDays: 30 });
  serverPair = issueServerCert(ca, {
    commonName: 'hub',
    dnsNames: ['localhost', 'hub.example.com'],
    ipAddresses: ['127.0.0.1', '::1', '2001:db8::10', '::ffff:10.1.2.3'],
  });
  agentPair = issueAgentCert(ca, { cluster: 'cluster-a' });
  const now = Date.now();
  expiredAgentPair = issueAgentCert(ca, { cluster: 'cluster-a', notBefore: new Date(now - 2 * DAY_MS), notAfter: new Date(now - DAY_MS) });
  foreignAgentPair = issueAgentCert(otherCa, { cluster: 'cluster-a' });
  userPair = issueClientCert(ca, { commonName: 'alice', organization: ['dev', 'ops'] });
  caX = new X509Certificate(ca.certPem);
  otherCaX = new X509Certificate(otherCa.certPem);
  tmpRoot = await mkdtemp(join(tmpdir(), 'cluster-proxy-pki-'));
});

afterAll(async () => {
  if (tmpRoot) await rm(tmpRoot, { recursive: true, force: true });
});

function forgeExt<T>(pem: string, name: string): (T & { critical?: boolean }) | undefined {
  return forge.pki.certificateFromPem(pem).getExtension(name) as (T & { critical?: boolean }) | undefined;
}

describe('createCA', () => {
  it('makes a self-signed CA with the default name, ~10 years validity and CA-only key usage', () => {
    expect(caX.ca).toBe(true);
    expect(caX.subject).toBe('CN=cluster-proxy-ca');
    expect(caX.issuer).toBe(caX.subject);
    expect(caX.checkIssued(caX)).toBe(true);
    expect(caX.verify(caX.publicKey)).toBe(true);
    const from = new Date(caX.validFrom).getTime();
    const to = new Date(caX.validTo).getTime();
    expect(from).toBeLessThan(Date.now());
    expect(from).toBeGreaterThan(Date.now() - 10 * 60 * 1000);
    expect((to - Date.now()) / DAY_MS).toBeCloseTo(3650, 0);
    expect(forgeExt<{ cA: boolean }>(ca.certPem, 'basicConstraints')).toMatchObject({ cA: true, critical: true });
    const keyUsage = forgeExt<Record<string, boolean>>(ca.certPem, 'keyUsage');
    expect(keyUsage).toMatchObject({ keyCertSign: true, cRLSign: true, critical: true });
    expect(keyUsage?.['digitalSignature']).toBeFalsy();
    expect(ca.keyPem).toMatch(new RegExp(`^-----BEGIN ${'PRIVATE'} KEY-----`)); // built, so no key-looking literal sits in the repo
  });

  it('uses a random positive serial of up to 128 bits', () => {
    const serials = [caX.serialNumber, otherCaX.serialNumber];
    for (const serial of serials) {
      expect(serial).toMatch(/^[0-9A-F]{1,32}$/);
      expect(serial.length).toBeGreaterThanOrEqual(31); // non-zero first byte -> at most one nibble lost
      expect(parseInt(serial[0]!, 16)).toBeLessThan(8); // top bit clear: positive
    }
    expect(serials[0]).not.toBe(serials[1]);
  });

  it('honours commonName and validityDays', () => {
    expect(otherCaX.subject).toBe('CN=some-other-ca');
    const to = new Date(otherCaX.validTo).getTime();
    expect((to - Date.now()) / DAY_MS).toBeCloseTo(30, 0);
  });
});

describe('issueServerCert', () => {
  it('is signed by the CA and carries the DNS and IP (v4 and v6) SANs', () => {
    const x = new X509Certificate(serverPair.certPem);
    expect(x.subject).toBe('CN=hub');
    expect(x.issuer).toBe(caX.subject);
    expect(x.ca).toBe(false);
    expect(x.checkIssued(caX)).toBe(true);
    expect(x.verify(caX.publicKey)).toBe(true);
    expect(x.verify(otherCaX.publicKey)).toBe(false);
    expect(x.checkIssued(otherCaX)).toBe(false);
    expect(x.subjectAltName).toContain('DNS:localhost');
    expect(x.subjectAltName).toContain('DNS:hub.example.com');
    expect(x.subjectAltName).toContain('IP Address:127.0.0.1');
    expect(x.checkHost('hub.example.com')).toBe('hub.example.com');
    expect(x.checkHost('other.example.com')).toBeUndefined();
    expect(x.checkIP('127.0.0.1')).toBe('127.0.0.1');
    expect(x.checkIP('::1')).toBe('::1');
    expect(x.checkIP('2001:db8::10')).toBe('2001:db8::10');
    expect(x.checkIP('::ffff:10.1.2.3')).toBe('::ffff:10.1.2.3');
    expect(x.checkIP('10.9.9.9')).toBeUndefined();
    expect(x.keyUsage).toEqual(expect.arrayContaining([SERVER_AUTH]));
  });

  it('defaults to 180 days, starting a few minutes in the past for clock skew', () => {
    const x = new X509Certificate(serverPair.certPem);
    const from = new Date(x.validFrom).getTime();
    const to = new Date(x.validTo).getTime();
    expect(Date.now() - from).toBeGreaterThan(60 * 1000);
    expect(Date.now() - from).toBeLessThan(10 * 60 * 1000);
    expect((to - Date.now()) / DAY_MS).toBeCloseTo(180, 0);
  });

  it('rejects an invalid IP address before doing any work', () => {
    expect(() => issueServerCert(ca, { commonName: 'x', ipAddresses: ['300.1.1.1'] })).toThrow(/invalid IP address "300.1.1.1"/);
    expect(() => issueServerCert(ca, { commonName: 'x', ipAddresses: ['localhost'] })).toThrow(/invalid IP address/);
  });

  it('refuses a CA pair whose key does not match, or a non-CA issuer', () => {
    expect(() => issueServerCert({ certPem: ca.certPem, keyPem: otherCa.keyPem }, { commonName: 'x' })).toThrow(
      'CA key does not match the CA certificate',
    );
    expect(() => issueServerCert(serverPair, { commonName: 'x' })).toThrow(/not a CA/);
    expect(() => issueServerCert({ certPem: 'nope', keyPem: ca.keyPem }, { commonName: 'x' })).toThrow(/CA certificate is not a PEM/);
  });
});

describe('issueClientCert', () => {
  it('is a clientAuth-only certificate with the given O values', () => {
    const x = new X509Certificate(userPair.certPem);
    expect(x.subject.split('\n')).toEqual(['O=dev', 'O=ops', 'CN=alice']);
    expect(x.keyUsage).toEqual([CLIENT_AUTH]);
    expect(x.ca).toBe(false);
    expect(x.checkIssued(caX)).toBe(true);
    expect(x.verify(caX.publicKey)).toBe(true);
  });

  it('writes names that are not PrintableStrings as UTF8Strings of their UTF-8 bytes; printable ones as before', () => {
    const pair = issueClientCert(ca, { commonName: 'josé', organization: ['開発', 'a@b', 'ops'] });
    const x = new X509Certificate(pair.certPem);
    expect(x.subject.split('\n')).toEqual(['O=開発', 'O=a@b', 'O=ops', 'CN=josé']);
    const der = x.raw;
    const tagged = (tag: number, value: string): Buffer => {
      const bytes = Buffer.from(value, 'utf8');
      return Buffer.concat([Buffer.from([tag, bytes.length]), bytes]);
    };
    for (const v of ['開発', 'a@b', 'josé']) expect(der.includes(tagged(12, v)), v).toBe(true);
    expect(der.includes(tagged(19, 'ops'))).toBe(true);
    // A CA named so: its leaves name it as it names itself.
    const utf8Ca = createCA({ commonName: 'Café 開発 CA' });
    const leaf = new X509Certificate(issueClientCert(utf8Ca, { commonName: 'zoë' }).certPem);
    const utf8CaX = new X509Certificate(utf8Ca.certPem);
    expect([utf8CaX.subject, leaf.issuer]).toEqual(['CN=Café 開発 CA', 'CN=Café 開発 CA']);
    expect(leaf.checkIssued(utf8CaX)).toBe(true);
  });
});

describe('issueAgentCert', () => {
  it('binds the certificate to one cluster with the OCM addon-agent naming', () => {
    const x = new X509Certificate(agentPair.certPem);
    expect(x.subject.split('\n')).toEqual([`O=${AGENT_O_A}`, `CN=${AGENT_CN_A}`]);
    expect(x.keyUsage).toEqual([CLIENT_AUTH]);
    expect(x.verify(caX.publicKey)).toBe(true);
    expect(new X509Certificate(foreignAgentPair.certPem).verify(caX.publicKey)).toBe(false);
  });

  it('uses the explicit validity window (here: already expired)', () => {
    const x = new X509Certificate(expiredAgentPair.certPem);
    const from = new Date(x.validFrom).getTime();
    const to = new Date(x.validTo).getTime();
    expect(Math.abs(from - (Date.now() - 2 * DAY_MS))).toBeLessThan(5 * 60 * 1000);
    expect(to).toBeLessThan(Date.now());
    expect(x.verify(caX.publicKey)).toBe(true); // well-formed and signed, just expired
  });

  it('rejects cluster names that are not DNS-1123 subdomains, with a one-line message', () => {
    for (const bad of ['Cluster-A', 'cluster_a', '', '-a', 'a-', 'a:b', 'a..b', 'a'.repeat(254)]) {
      let message = '';
      try {
        issueAgentCert(ca, { cluster: bad });
      } catch (err) {
        message = (err as Error).message;
      }
      expect(message, `cluster ${JSON.stringify(bad)}`).toMatch(/^invalid cluster name .*DNS-1123 subdomain/);
      expect(message).not.toContain('\n');
    }
    expect(() => issueAgentCert(ca, { cluster: 'ok', agentName: 'a:b' })).toThrow(/invalid agent name/);
    expect(() => agentSubject('a'.repeat(253))).not.toThrow();
  });

  it('rejects an empty or inverted validity window', () => {
    const now = Date.now();
    expect(() => issueAgentCert(ca, { cluster: 'c', notBefore: new Date(now), notAfter: new Date(now - 1000) })).toThrow(
      /notAfter .* is not after notBefore/,
    );
    expect(() => issueAgentCert(ca, { cluster: 'c', validityDays: 0 })).toThrow(/validityDays/);
    expect(() => issueAgentCert(ca, { cluster: 'c', notBefore: new Date('garbage') })).toThrow(/notBefore/);
  });
});

describe('agent identity', () => {
  it('agentSubject and clusterFromSubject round-trip', () => {
    const s = agentSubject('prod.eu-1', 'agent-7');
    expect(s.commonName).toBe('system:open-cluster-management:cluster:prod.eu-1:addon:cluster-proxy:agent:agent-7');
    expect(s.organization).toBe('system:open-cluster-management:cluster:prod.eu-1:addon:cluster-proxy');
    expect(clusterFromSubject({ CN: s.commonName, O: s.organization })).toEqual({ cluster: 'prod.eu-1', agentName: 'agent-7' });
    expect(agentSubject('c').commonName.endsWith(':agent:proxy-agent')).toBe(true);
  });

  it('accepts single-element arrays and extra unrelated O values (as OCM issues them)', () => {
    expect(clusterFromSubject({ CN: [AGENT_CN_A], O: [AGENT_O_A] })).toEqual({ cluster: 'cluster-a', agentName: 'proxy-agent' });
    const ocmGroups = [AGENT_O_A, 'system:open-cluster-management:addon:cluster-proxy', 'system:authenticated'];
    expect(clusterFromSubject({ CN: AGENT_CN_A, O: ocmGroups })?.cluster).toBe('cluster-a');
  });

  it('rejects everything else', () => {
    const cases: Array<[string, Parameters<typeof clusterFromSubject>[0]]> = [
      ['undefined subject', undefined],
      ['empty subject', {}],
      ['missing O', { CN: AGENT_CN_A }],
      ['missing CN', { O: AGENT_O_A }],
      ['O for another cluster', { CN: AGENT_CN_A, O: 'system:open-cluster-management:cluster:cluster-b:addon:cluster-proxy' }],
      ['O for another addon', { CN: AGENT_CN_A, O: 'system:open-cluster-management:cluster:cluster-a:addon:other' }],
      ['extra O scoping another cluster', { CN: AGENT_CN_A, O: [AGENT_O_A, 'system:open-cluster-management:cluster:cluster-b:addon:x'] }],
      ['two CNs', { CN: [AGENT_CN_A, AGENT_CN_A], O: AGENT_O_A }],
      ['empty arrays', { CN: [], O: [] }],
      ['plain user', { CN: 'alice', O: 'system:masters' }],
      ['other addon CN', { CN: AGENT_CN_A.replace(':addon:cluster-proxy:', ':addon:other:'), O: AGENT_O_A }],
      ['CN with suffix', { CN: `${AGENT_CN_A}:x`, O: AGENT_O_A }],
      ['CN with prefix', { CN: `x${AGENT_CN_A}`, O: AGENT_O_A }],
      ['empty agent name', { CN: AGENT_CN_A.replace(/proxy-agent$/, ''), O: AGENT_O_A }],
      [
        'invalid cluster name',
        {
          CN: 'system:open-cluster-management:cluster:Bad_Name:addon:cluster-proxy:agent:proxy-agent',
          O: 'system:open-cluster-management:cluster:Bad_Name:addon:cluster-proxy',
        },
      ],
    ];
    for (const [name, subject] of cases) {
      expect(clusterFromSubject(subject), name).toBeNull();
      expect(isAgentSubject(subject), name).toBe(false);
    }
    expect(isAgentSubject({ CN: AGENT_CN_A, O: AGENT_O_A })).toBe(true);
  });
});

describe('files', () => {
  it('writes the key 0600 and the cert 0644 into a new 0700 directory, and reads them back', async () => {
    const dir = join(tmpRoot, 'write', 'nested');
    const paths = await writePemPair(dir, 'agent', agentPair);
    expect(paths).toEqual({ certPath: join(dir, 'agent.crt'), keyPath: join(dir, 'agent.key') });
    expect((await stat(paths.keyPath)).mode & 0o777).toBe(0o600);
    expect((await stat(paths.certPath)).mode & 0o777).toBe(0o644);
    expect((await stat(dir)).mode & 0o777).toBe(0o700);
    expect(await readPemPair(dir, 'agent')).toEqual(agentPair);

    // Overwrite replaces the content and keeps the modes; no temp files are left behind.
    await writePemPair(dir, 'agent', userPair);
    expect(await readPemPair(dir, 'agent')).toEqual(userPair);
    expect((await stat(paths.keyPath)).mode & 0o777).toBe(0o600);
    expect((await readdir(dir)).sort()).toEqual(['agent.crt', 'agent.key']);
  });

  it('names the file when it is missing or not PEM, without echoing key material', async () => {
    const dir = join(tmpRoot, 'read');
    await writePemPair(dir, 'x', agentPair);
    await expect(readPemPair(dir, 'missing')).rejects.toThrow(`PKI file ${join(dir, 'missing.crt')} not found`);

    await writeFile(join(dir, 'x.crt'), 'hello\n');
    await expect(readPemPair(dir, 'x')).rejects.toThrow(`PKI file ${join(dir, 'x.crt')} is not a valid PEM certificate`);

    await writeFile(join(dir, 'x.crt'), agentPair.certPem);
    const truncatedKey = agentPair.keyPem.slice(0, 200) + '\n-----END PRIVATE KEY-----\n';
    await writeFile(join(dir, 'x.key'), truncatedKey);
    const err = await readPemPair(dir, 'x').catch((e: Error) => e);
    expect(err).toBeInstanceOf(Error);
    expect((err as Error).message).toBe(`PKI file ${join(dir, 'x.key')} is not a valid PEM private key`);
    expect((err as Error).message).not.toContain(agentPair.keyPem.split('\n')[1]!);
  });

  it('ensureHubPki creates ca/server/client once and then only loads them', async () => {
    const dir = join(tmpRoot, 'hub');
    const paths = await ensureHubPki(dir, { hostnames: ['hub.example.com'], ipAddresses: ['10.0.0.5'] });
    expect(paths).toEqual({
      caCert: join(dir, 'ca.crt'),
      caKey: join(dir, 'ca.key'),
      serverCert: join(dir, 'server.crt'),
      serverKey: join(dir, 'server.key'),
      clientCert: join(dir, 'client.crt'),
      clientKey: join(dir, 'client.key'),
    });
    for (const key of [paths.caKey, paths.serverKey, paths.clientKey]) expect((await stat(key)).mode & 0o777).toBe(0o600);

    const hubCa = new X509Certificate(await readFile(paths.caCert));
    const server = new X509Certificate(await readFile(paths.serverCert));
    const client = new X509Certificate(await readFile(paths.clientCert));
    expect(hubCa.ca).toBe(true);
    expect(server.checkIssued(hubCa) && server.verify(hubCa.publicKey)).toBe(true);
    expect(client.checkIssued(hubCa) && client.verify(hubCa.publicKey)).toBe(true);
    for (const host of ['localhost', 'hub.example.com']) expect(server.checkHost(host)).toBe(host);
    for (const ip of ['127.0.0.1', '::1', '10.0.0.5']) expect(server.checkIP(ip)).toBe(ip);
    expect(client.subject).toContain('CN=cluster-proxy-admin');
    expect(client.keyUsage).toEqual([CLIENT_AUTH]);

    const snapshot = async () => Promise.all(Object.values(paths).map((p) => readFile(p, 'utf8')));
    const before = await snapshot();
    expect(await ensureHubPki(dir, { hostnames: ['something-else'] })).toEqual(paths);
    expect(await snapshot()).toEqual(before);

    // A missing leaf is re-issued from the existing CA; nothing else changes.
    await unlink(paths.serverCert);
    await unlink(paths.serverKey);
    await ensureHubPki(dir, {});
    const after = await snapshot();
    expect(after[0]).toBe(before[0]); // CA untouched
    expect(after[4]).toBe(before[4]); // client untouched
    expect(after[2]).not.toBe(before[2]);
    expect(new X509Certificate(after[2]!).verify(hubCa.publicKey)).toBe(true);

    // Half a pair is an error, not a reason to mint a new CA.
    await unlink(paths.caKey);
    await expect(ensureHubPki(dir, {})).rejects.toThrow(/incomplete PKI pair "ca".*ca\.key is missing/);
    expect(await readFile(paths.caCert, 'utf8')).toBe(before[0]);
  });
});

describe('mTLS handshake', () => {
  interface Outcome {
    identity?: AgentIdentity | null;
    serverError?: NodeJS.ErrnoException;
    // Why the server refused: Node destroys the socket after a failed client-certificate check
    // and reports only "socket hang up" as the error; the verify code is left on the socket.
    authorizationError?: string;
    received: string;
  }

  // Hub-like TLS server requiring a client certificate from `ca`; connects once with `client`.
  async function handshake(client: Partial<PemPair>): Promise<Outcome> {
    const outcome: Outcome = { received: '' };
    const serverSockets = new Set<Socket>();
    let serverDone!: () => void;
    const serverSettled = new Promise<void>((resolve) => (serverDone = resolve));
    const server = tls.createServer({
      key: serverPair.keyPem,
      cert: serverPair.certPem,
      ca: [ca.certPem],
      requestCert: true,
      rejectUnauthorized: true,
    });
    server.on('connection', (s: Socket) => {
      serverSockets.add(s);
      s.on('close', () => serverSockets.delete(s));
    });
    server.on('secureConnection', (socket) => {
      outcome.identity = clusterFromSubject(socket.getPeerCertificate().subject);
      socket.end(outcome.identity ? `hello ${outcome.identity.cluster}` : 'hello stranger');
      serverDone();
    });
    server.on('tlsClientError', (err: NodeJS.ErrnoException, socket: tls.TLSSocket) => {
      outcome.serverError = err;
      outcome.authorizationError = socket.authorizationError?.toString();
      serverDone();
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    try {
      await new Promise<void>((resolve) => {
        const socket = tls.connect({ host: '127.0.0.1', port, ca: [ca.certPem], cert: client.certPem, key: client.keyPem });
        socket.setEncoding('utf8');
        socket.setTimeout(10_000, () => socket.destroy(new Error('client timed out')));
        socket.on('data', (chunk: string) => (outcome.received += chunk));
        socket.on('error', () => undefined); // the refusal shows up here as an alert or reset
        socket.on('close', () => resolve());
      });
      await serverSettled;
    } finally {
      for (const s of serverSockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
    return outcome;
  }

  it('accepts a valid agent certificate and tells the server which cluster it is', async () => {
    const outcome = await handshake(agentPair);
    expect(outcome.serverError).toBeUndefined();
    expect(outcome.identity).toEqual({ cluster: 'cluster-a', agentName: 'proxy-agent' });
    expect(outcome.received).toBe('hello cluster-a');
  });

  it('accepts a CA-signed user certificate but does not take it for an agent', async () => {
    const outcome = await handshake(userPair);
    expect(outcome.serverError).toBeUndefined();
    expect(outcome.identity).toBeNull();
    expect(outcome.received).toBe('hello stranger');
  });

  it('refuses an expired agent certificate', async () => {
    const outcome = await handshake(expiredAgentPair);
    expect(outcome.identity).toBeUndefined();
    expect(outcome.received).toBe('');
    expect(outcome.serverError).toBeDefined();
    expect(outcome.authorizationError).toBe('CERT_HAS_EXPIRED');
  });

  it('refuses an agent certificate from a different CA', async () => {
    const outcome = await handshake(foreignAgentPair);
    expect(outcome.identity).toBeUndefined();
    expect(outcome.received).toBe('');
    expect(outcome.serverError).toBeDefined();
    expect(outcome.authorizationError).toMatch(/^(UNABLE_TO_GET_ISSUER_CERT_LOCALLY|UNABLE_TO_VERIFY_LEAF_SIGNATURE)$/);
  });

  it('refuses a client without a certificate', async () => {
    const outcome = await handshake({});
    expect(outcome.identity).toBeUndefined();
    expect(outcome.received).toBe('');
    expect(outcome.serverError).toBeDefined();
    expect(outcome.serverError?.message).toMatch(/peer did not return a certificate/);
  });
});
