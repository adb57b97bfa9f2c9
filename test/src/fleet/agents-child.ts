// Child process of the fleet simulator: a share of the fleet's clusters, each a real `Agent` from
// @cluster-proxy/agent with its own identity (ECDSA P-256 key, certificate signed here by the hub CA),
// its real LeaseRenewer (lease every leaseDurationMs) and ReplicaSync (replica list every
// replicaSyncMs), all in this one process. Talks to the parent over IPC (fleet.ts); exits when the
// parent goes away or says stop.
import 'reflect-metadata';
import { createPrivateKey, generateKeyPairSync, randomBytes, webcrypto } from 'node:crypto';
import { readFileSync } from 'node:fs';
import * as x509 from '@peculiar/x509';
import pino from 'pino';
import { Agent, LeaseRenewer, ReplicaSync } from '@cluster-proxy/agent';
import { agentSubject } from '@cluster-proxy/server';
import type { ChildReply, ChildRequest, FleetChildJob } from './protocol.js';

x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

/** How often each agent's connected state is sampled (the reconnect spread's resolution). */
const SAMPLE_MS = 100;
const SIGNING = { name: 'RSASSA-PKCS1-v1_5', hash: 'SHA-256' } as const;

interface SimAgent {
  cluster: string;
  agent: Agent;
  lease: LeaseRenewer;
  sync: ReplicaSync;
  /** Last sampled state, and when it last went from no tunnel to a tunnel (ms since the epoch). */
  up: boolean;
  upAt: number;
  stopped: boolean;
}

/** One certificate per cluster, for a fresh ECDSA key, signed with the hub CA's (RSA) key over WebCrypto. */
async function issue(
  job: FleetChildJob,
  cluster: string,
  signingKey: webcrypto.CryptoKey,
  caCert: x509.X509Certificate,
): Promise<{ cert: Buffer; key: Buffer }> {
  const { privateKey, publicKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const spki = publicKey.export({ type: 'spki', format: 'der' });
  const pub = await webcrypto.subtle.importKey('spki', spki, { name: 'ECDSA', namedCurve: 'P-256' }, true, ['verify']);
  const { commonName, organization } = agentSubject(cluster);
  const serial = randomBytes(16);
  serial[0] = serial[0]! & 0x7f;
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial.toString('hex'),
    subject: `O=${organization}, CN=${commonName}`,
    issuer: caCert.subjectName,
    notBefore: new Date(now - 5 * 60_000),
    notAfter: new Date(now + job.certValidityDays * 86_400_000),
    signingAlgorithm: SIGNING,
    publicKey: pub as unknown as x509.X509CertificateCreateWithKeyParams['publicKey'],
    signingKey: signingKey as unknown as x509.X509CertificateCreateWithKeyParams['signingKey'],
    extensions: [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.clientAuth]),
    ],
  });
  return { cert: Buffer.from(cert.toString('pem')), key: Buffer.from(privateKey.export({ type: 'pkcs8', format: 'pem' }) as string) };
}

async function main(): Promise<void> {
  const job = JSON.parse(process.argv[2] ?? '') as FleetChildJob;
  const send = (reply: ChildReply): void => void process.send?.(reply);
  // The parent's IPC channel closing means it is gone: leave with it.
  process.on('disconnect', () => process.exit(0));

  const caPem = readFileSync(job.caCertPath, 'utf8');
  const caCert = new x509.X509Certificate(caPem);
  const der = createPrivateKey(readFileSync(job.caKeyPath, 'utf8')).export({ type: 'pkcs8', format: 'der' });
  const signingKey = await webcrypto.subtle.importKey('pkcs8', der, SIGNING, false, ['sign']);
  const log = pino({ level: job.logLevel, base: { fleet: job.index } }, pino.destination(2));
  const caBuf = Buffer.from(caPem);

  const began = performance.now();
  const agents: SimAgent[] = [];
  for (const [i, cluster] of job.clusters.entries()) {
    const { cert, key } = await issue(job, cluster, signingKey, caCert);
    const agent = new Agent({
      cluster,
      namespace: 'open-cluster-management-agent-addon',
      hubAddress: job.hubAddress,
      caCert: caBuf,
      cert,
      key,
      serverName: 'localhost',
      transport: job.grpc.includes(i) ? 'grpc' : 'mux',
      apiserver: job.apiserver,
      allow: [],
      gateway: false,
      log,
    });
    const lease = new LeaseRenewer({
      agent,
      hub: { address: job.hubAddress, serverName: 'localhost', caCert: caBuf },
      apiserver: job.apiserver,
      leaseDurationMs: job.leaseDurationMs,
      log,
    });
    const sync = new ReplicaSync({
      agent,
      hub: { address: job.hubAddress, serverName: 'localhost' },
      intervalMs: job.replicaSyncMs,
      lease,
      log,
    });
    agents.push({ cluster, agent, lease, sync, up: false, upAt: 0, stopped: false });
  }
  const issuedSeconds = (performance.now() - began) / 1000;

  // Start at a bounded rate: a real fleet does not come up in one millisecond, and the listen backlog is finite.
  let started = 0;
  const perTick = Math.max(1, Math.round((job.startPerSecond * 50) / 1000));
  const starter = setInterval(() => {
    for (let k = 0; k < perTick && started < agents.length; k++, started++) {
      const a = agents[started]!;
      a.agent.start();
      a.lease.start();
      a.sync.start();
    }
    if (started >= agents.length) clearInterval(starter);
  }, 50);

  const sampler = setInterval(() => {
    const now = Date.now();
    for (const a of agents) {
      const up = !a.stopped && a.agent.connectedServers > 0;
      if (up && !a.up) a.upAt = now;
      a.up = up;
    }
  }, SAMPLE_MS);

  const stopAll = (): void => {
    clearInterval(starter);
    clearInterval(sampler);
    for (const a of agents) {
      a.lease.stop();
      a.sync.stop();
      a.agent.stop();
    }
  };

  process.on('message', (raw: unknown) => {
    const msg = raw as ChildRequest;
    switch (msg.type) {
      case 'status': {
        let connected = 0;
        for (const a of agents) if (a.up) connected++;
        send({
          type: 'status',
          id: msg.id,
          connected,
          total: agents.length,
          started,
          issuedSeconds,
          rssKiB: Math.round(process.memoryUsage.rss() / 1024),
        });
        return;
      }
      case 'up-times': {
        // When each agent last came up, if after `since` (the reconnect spread after a hub restart).
        const times = agents.filter((a) => !a.stopped).map((a) => (a.up && a.upAt >= msg.since ? a.upAt : null));
        send({ type: 'up-times', id: msg.id, times });
        return;
      }
      case 'kill': {
        const a = agents.find((x) => x.cluster === msg.cluster);
        if (a && !a.stopped) {
          // As a pod that is killed: its links close, its lease stops.
          a.stopped = true;
          a.lease.stop();
          a.sync.stop();
          a.agent.stop();
        }
        send({ type: 'killed', id: msg.id, found: a !== undefined });
        return;
      }
      case 'stop':
        stopAll();
        send({ type: 'stopped', id: msg.id });
        // Links close asynchronously; give them a moment, then leave regardless.
        setTimeout(() => process.exit(0), 300).unref();
        return;
    }
  });
  send({ type: 'ready', issuedSeconds });
}

main().catch((err: unknown) => {
  process.stderr.write(`fleet child: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
