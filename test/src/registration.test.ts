// Registration over the real hub API (TLS on the agent port): bootstrap token misuse, proof of key
// possession, renewal, and the registry's admission decisions. The store is the in-memory one.
import { generateKeyPairSync, sign, X509Certificate } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pino from 'pino';
import { hubRequest, HubRequestError } from '@cluster-proxy/agent';
import { bootstrapProofMessage, renewProofMessage } from '@cluster-proxy/proto';
import {
  ClusterRegistry,
  MemoryStore,
  ProxyServer,
  clusterUidFromAltNames,
  consumeBootstrapToken,
  createBootstrapToken,
  createCA,
  issueAgentCert,
  issueServerCert,
  registerRegistrationRoutes,
  type ManagedCluster,
} from '@cluster-proxy/server';
import { waitFor } from './fixtures/index.js';

const log = pino({ level: 'silent' });

function keyPair() {
  return generateKeyPairSync('rsa', {
    modulusLength: 2048,
    publicKeyEncoding: { type: 'spki', format: 'pem' },
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
  });
}

function cluster(name: string, accepts = true): ManagedCluster {
  return {
    apiVersion: 'cluster.open-cluster-management.io/v1',
    kind: 'ManagedCluster',
    metadata: { name },
    spec: { hubAcceptsClient: accepts },
  };
}

describe('bootstrap and renewal through the hub API', () => {
  const ca = createCA({ commonName: 'registration-test' });
  const serving = issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'], ipAddresses: ['127.0.0.1'] });
  const store = new MemoryStore();
  let server: ProxyServer;
  let hub = { address: '', caCert: Buffer.from(ca.certPem), serverName: 'localhost' };

  beforeAll(async () => {
    server = new ProxyServer({
      bindAddress: '127.0.0.1',
      agentPort: 0,
      frontendPort: null,
      healthPort: null,
      adminPort: null,
      tls: { caCert: Buffer.from(ca.certPem), cert: Buffer.from(serving.certPem), key: Buffer.from(serving.keyPem) },
      log,
    });
    registerRegistrationRoutes(server.hubApi, { store, signer: () => ca, caBundle: () => ca.certPem, log });
    const ports = await server.start();
    hub = { ...hub, address: `127.0.0.1:${ports.agent}` };
    for (const c of [cluster('c1'), cluster('c2'), cluster('closed', false)]) await store.create('ManagedCluster', c);
  });
  afterAll(async () => {
    await server?.stop(100);
    await store.close();
  });

  async function bootstrap(clusterName: string, token: string, key = keyPair(), proofFor = clusterName) {
    const proof = sign('sha256', bootstrapProofMessage(proofFor, token.split('.')[0] ?? ''), key.privateKey).toString('base64');
    return {
      key,
      answer: (await hubRequest(hub, 'POST', '/v1/bootstrap', { cluster: clusterName, token, publicKey: key.publicKey, proof })) as {
        certificate: string;
        caBundle: string;
      },
    };
  }
  const refusal = async (p: Promise<unknown>): Promise<HubRequestError> => {
    const err = await p.catch((e: unknown) => e);
    expect(err).toBeInstanceOf(HubRequestError);
    return err as HubRequestError;
  };

  it('a good token yields a certificate for our own key, bound to the cluster and its uid', async () => {
    const { token } = await createBootstrapToken(store, 'c1', 3600);
    const { key, answer } = await bootstrap('c1', token);
    const cert = new X509Certificate(answer.certificate);
    expect(cert.subject).toContain('system:open-cluster-management:cluster:c1:addon:cluster-proxy');
    expect(cert.publicKey.export({ type: 'spki', format: 'pem' })).toBe(key.publicKey);
    expect(cert.checkIssued(new X509Certificate(ca.certPem))).toBe(true);
    const uid = (await store.get('ManagedCluster', { name: 'c1' }))!.metadata.uid;
    expect(clusterUidFromAltNames(cert.subjectAltName)).toBe(uid);
    expect(answer.caBundle).toBe(ca.certPem);
  });

  it('refuses a key the CA would not sign (EC, short RSA) before spending the token', async () => {
    const { token } = await createBootstrapToken(store, 'c1', 3600);
    const ec = generateKeyPairSync('ec', {
      namedCurve: 'prime256v1',
      publicKeyEncoding: { type: 'spki', format: 'pem' },
      privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
    });
    const short = generateKeyPairSync('rsa', {
      modulusLength: 1024,
      publicKeyEncoding: { type: 'spki', format: 'pem' },
      privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
    });
    for (const key of [ec, short]) {
      const err = await refusal(bootstrap('c1', token, key));
      expect(err.status).toBe(400);
      expect(err.message).toMatch(/must be RSA with at least 2048 bits/);
    }
    // The token was not used up by the refusals.
    await expect(bootstrap('c1', token)).resolves.toHaveProperty('answer.certificate');
  });

  it('refuses a reused token', async () => {
    const { token } = await createBootstrapToken(store, 'c1', 3600);
    await bootstrap('c1', token);
    const err = await refusal(bootstrap('c1', token));
    expect(err.status).toBe(401);
    expect(err.message).toMatch(/already used/);
    expect(err.message).not.toContain(token.split('.')[1]);
  });

  it('two concurrent uses of one token: exactly one wins', async () => {
    const { token } = await createBootstrapToken(store, 'c2', 3600);
    const results = await Promise.allSettled([bootstrap('c2', token), bootstrap('c2', token), bootstrap('c2', token)]);
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    for (const r of results) if (r.status === 'rejected') expect(String(r.reason)).toMatch(/already used/);
  });

  it('refuses an expired token, naming when it expired', async () => {
    const { token } = await createBootstrapToken(store, 'c1', 60, new Date(Date.now() - 120_000));
    const err = await refusal(bootstrap('c1', token));
    expect(err.status).toBe(401);
    expect(err.message).toMatch(/expired at \d{4}-/);
  });

  it('refuses a token issued for another cluster (403), an unknown one, a wrong secret and a malformed one (401)', async () => {
    const { token } = await createBootstrapToken(store, 'c1', 3600);
    const foreign = await refusal(bootstrap('c2', token));
    expect(foreign.status).toBe(403);
    expect(foreign.message).toMatch(/issued for another cluster, not for cluster c2/);
    expect((await refusal(bootstrap('c1', 'abcdef.0123456789abcdef'))).message).toMatch(/unknown to the hub/);
    expect((await refusal(bootstrap('c1', `${token.split('.')[0]}.0000000000000000`))).message).toMatch(/does not match/);
    expect((await refusal(bootstrap('c1', 'not-a-token'))).message).toMatch(/malformed/);
  });

  it('refuses clusters that are not registered or not accepted, and proofs made with another key', async () => {
    const { token } = await createBootstrapToken(store, 'closed', 3600);
    expect((await refusal(bootstrap('closed', token))).message).toMatch(/hubAcceptsClient: false/);
    expect((await refusal(bootstrap('nope', 'abcdef.0123456789abcdef'))).message).toMatch(/not registered/);
    const { token: t2 } = await createBootstrapToken(store, 'c1', 3600);
    const other = keyPair();
    const proof = sign('sha256', bootstrapProofMessage('c1', t2.split('.')[0]!), other.privateKey).toString('base64');
    const err = await refusal(
      hubRequest(hub, 'POST', '/v1/bootstrap', { cluster: 'c1', token: t2, publicKey: keyPair().publicKey, proof }),
    );
    expect(err.status).toBe(400);
    expect(err.message).toMatch(/proof does not verify/);
    // The token was not spent by the bad request.
    await bootstrap('c1', t2);
  });

  it('renews with the current certificate; refuses renewal without one', async () => {
    const { token } = await createBootstrapToken(store, 'c1', 3600);
    const { key, answer } = await bootstrap('c1', token);
    const next = keyPair();
    const proof = sign('sha256', renewProofMessage('c1'), next.privateKey).toString('base64');
    const renewed = (await hubRequest(
      { ...hub, cert: Buffer.from(answer.certificate), key: Buffer.from(key.privateKey) },
      'POST',
      '/v1/renew',
      { publicKey: next.publicKey, proof },
    )) as { certificate: string };
    expect(new X509Certificate(renewed.certificate).publicKey.export({ type: 'spki', format: 'pem' })).toBe(next.publicKey);
    expect((await refusal(hubRequest(hub, 'POST', '/v1/renew', { publicKey: next.publicKey, proof }))).status).toBe(401);
  });

  it('consumeBootstrapToken keeps a token usable until its expiry passes (injectable clock)', async () => {
    const now = new Date('2030-01-01T00:00:00Z');
    const { token } = await createBootstrapToken(store, 'c2', 600, now);
    await expect(consumeBootstrapToken(store, 'c2', token, new Date(now.getTime() + 601_000))).rejects.toThrow(/expired/);
    await expect(consumeBootstrapToken(store, 'c2', token, new Date(now.getTime() + 599_000))).resolves.toMatchObject({
      tokenId: token.split('.')[0],
    });
  });
});

describe('cluster registry admission', () => {
  it('admits hand-issued certificates unless registration is required; uid-bound ones only for the current incarnation', async () => {
    const store = new MemoryStore();
    const server = new ProxyServer({
      bindAddress: '127.0.0.1',
      agentPort: 0,
      frontendPort: null,
      healthPort: null,
      adminPort: null,
      tls: { caCert: Buffer.from('x'), cert: Buffer.from('x'), key: Buffer.from('x') },
      log,
    });
    const loose = new ClusterRegistry(store, server.core, log, false);
    const strict = new ClusterRegistry(store, server.core, log, true);
    const ca = createCA();
    const handIssued = new X509Certificate(issueAgentCert(ca, { cluster: 'c9' }).certPem);
    const peer = (x: X509Certificate) => ({ subjectaltname: x.subjectAltName }) as never;
    expect(loose.check('c9', peer(handIssued))).toMatch(/starting/);
    await loose.start();
    await strict.start();
    expect(loose.check('c9', peer(handIssued))).toBeNull();
    expect(strict.check('c9', peer(handIssued))).toMatch(/not registered/);
    const mc = await store.create('ManagedCluster', cluster('c9'));
    const bound = { subjectaltname: `URI:urn:cluster-proxy:cluster-uid:${mc.metadata.uid}` } as never;
    await waitFor(() => strict.check('c9', bound) === null, { timeoutMs: 5000, message: 'the registration reached the registry' });
    expect(strict.check('c9', bound)).toBeNull();
    await store.delete('ManagedCluster', { name: 'c9' });
    await store.create('ManagedCluster', cluster('c9'));
    await waitFor(() => /earlier registration/.test(strict.check('c9', bound) ?? ''), {
      timeoutMs: 5000,
      message: 'the new registration reached the registry',
    });
    expect(strict.check('c9', bound)).toMatch(/earlier registration/);
    loose.stop();
    strict.stop();
    await store.close();
  });
});
