import { X509Certificate } from 'node:crypto';
import type { AddressInfo, Socket } from 'node:net';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createCA, issueClientCert, issueServerCert, type PemPair } from '../pki/certificates.js';
import { avoidPeerCertificateLeak } from './peer-certificate-leak.js';

// The handle's native method that leaks, counted: installed before the replacement, so that a Node
// whose server still calls it (24.21.0 does, once per verified client) would count every handshake.
const probe = new tls.TLSSocket(null as unknown as Socket);
const handleProto = Object.getPrototypeOf((probe as unknown as { _handle: object })._handle) as {
  getPeerX509Certificate: (...args: unknown[]) => unknown;
};
probe.destroy();
const native = handleProto.getPeerX509Certificate;
let nativeCalls = 0;
handleProto.getPeerX509Certificate = function counted(this: unknown, ...args: unknown[]): unknown {
  nativeCalls += 1;
  return native.apply(this, args);
};

interface Accepted {
  authorized: boolean;
  authorizationError: string | undefined;
  x509: X509Certificate | undefined;
}

describe('avoidPeerCertificateLeak', () => {
  let ca: PemPair;
  let client: PemPair;
  let server: tls.Server;
  let port: number;
  const accepted: Accepted[] = [];

  beforeAll(async () => {
    ca = createCA({ commonName: 'leak-test-ca' });
    const serving = issueServerCert(ca, { commonName: 'localhost', ipAddresses: ['127.0.0.1'] });
    client = issueClientCert(ca, { commonName: 'leak-test-client', organization: ['team'] });
    expect(avoidPeerCertificateLeak()).toBe(true);
    expect(avoidPeerCertificateLeak()).toBe(true);
    server = tls.createServer(
      { ca: ca.certPem, cert: serving.certPem, key: serving.keyPem, requestCert: true, rejectUnauthorized: false },
      (s) => {
        accepted.push({
          authorized: s.authorized,
          authorizationError: s.authorizationError as string | undefined,
          x509: s.getPeerX509Certificate(),
        });
        s.end();
      },
    );
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as AddressInfo).port;
  });

  afterAll(async () => {
    handleProto.getPeerX509Certificate = native;
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });

  function handshake(opts: tls.ConnectionOptions): Promise<void> {
    return new Promise((resolve, reject) => {
      const c = tls.connect({ host: '127.0.0.1', port, ca: ca.certPem, ...opts });
      c.on('data', () => undefined);
      c.once('close', () => resolve());
      c.once('error', reject);
    });
  }

  it("keeps Node's server from calling the leaking method, with the same verdicts", async () => {
    accepted.length = 0;
    nativeCalls = 0;
    for (let i = 0; i < 20; i++) await handshake({ key: client.keyPem, cert: client.certPem });
    await handshake({});
    // A client certificate from another CA: chain not verified.
    const stranger = createCA({ commonName: 'stranger-ca' });
    const forged = issueClientCert(stranger, { commonName: 'leak-test-client' });
    await handshake({ key: forged.keyPem, cert: forged.certPem });

    expect(nativeCalls).toBe(0);
    expect(accepted).toHaveLength(22);
    for (const a of accepted.slice(0, 20)) {
      expect(a.authorized).toBe(true);
      expect(a.x509?.subject).toBe('O=team\nCN=leak-test-client');
      expect(a.x509?.checkIssued(new X509Certificate(ca.certPem))).toBe(true);
    }
    expect(accepted[20]).toMatchObject({ authorized: false, x509: undefined });
    expect(accepted[21]?.authorized).toBe(false);
    expect(accepted[21]?.authorizationError).toBeTruthy();
    expect(accepted[21]?.x509?.subject).toBe('CN=leak-test-client');
  });
});
