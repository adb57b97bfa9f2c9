// Writes the starting corpus: hand-picked inputs per target (valid ones that reach deep, and the edges),
// and a few samples of each target's own generator. Files already there are kept; run it after adding a
// target (`pnpm exec vite-node test/fuzz/seed-corpus.ts`). Findings are added by hand as regression-*.
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { encodePacket, packets } from '@cluster-proxy/proto';
import { createCA } from '@cluster-proxy/server/pki';
import { CORPUS_DIR, fc } from './engine.js';
import { TARGETS } from './targets/index.js';

function frame(kind: number, body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32BE(body.length + 1, 0);
  head[4] = kind;
  return Buffer.concat([head, body]);
}

function grpc(body: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32BE(body.length, 1);
  return Buffer.concat([head, body]);
}

const samplePackets = [
  packets.dialRequest('kubernetes.default.svc:443', 0x7fff_ffff_ffff_fff0n),
  packets.dialResponse(5n, 7, '', ''),
  packets.dialResponse(5n, 0, 'dial tcp 10.0.0.1:443: connect: connection refused', 'endpoint'),
  packets.closeRequest(9),
  packets.closeResponse(9, 'Unknown connectID'),
  packets.data(3, Buffer.from('GET / HTTP/1.1\r\n\r\n')),
  packets.data(0, Buffer.alloc(300, 7)),
  packets.closeDial(-5n),
  packets.drain(),
  packets.credit(4, 1 << 20),
  packets.halfClose(12),
];

const hello = Buffer.from(JSON.stringify({ agentID: ['agent-1'], identifiers: ['host=cluster1'], capabilities: ['credit', 'half-close'] }));

const ca = createCA({ commonName: 'fuzz-seed-ca' }).certPem;
const ca2 = createCA({ commonName: 'fuzz-seed-ca-2' }).certPem;

const handPicked: Record<string, Buffer[]> = {
  'packet-codec': samplePackets.map(encodePacket),
  'mux-frames': [
    Buffer.concat([
      frame(0, hello),
      ...samplePackets.map((p) => frame(1, encodePacket(p))),
      frame(2, Buffer.alloc(0)),
      frame(3, Buffer.alloc(0)),
    ]),
    frame(0, Buffer.from('{"error":["refused: unknown agent"]}')),
    frame(1, encodePacket(packets.drain())),
    Buffer.concat([frame(0, Buffer.from('{}')), frame(9, Buffer.alloc(1))]),
  ],
  'grpc-messages': [
    Buffer.concat(samplePackets.map((p) => grpc(encodePacket(p)))),
    Buffer.from([1, 0, 0, 0, 0]),
    Buffer.from([0, 0x7f, 0xff, 0xff, 0xff]),
  ],
  'connect-head': [
    'CONNECT cluster1.svc:443 HTTP/1.1\r\nHost: cluster1.svc:443\r\nProxy-Authorization: Bearer abc.def\r\n\r\n\x16\x03\x01',
    'CONNECT [fd00::1]:6443 HTTP/1.1\r\nProxy-Authorization: Basic dXNlcjp0b2tlbg==\r\n\r\n',
    'CONNECT 10.0.0.1:22 HTTP/1.0\n\n',
    'GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n',
    'CONNECT a:1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n',
    'CONNECT a:1 HTTP/1.1\r\n folded\r\n\r\n',
  ].map((s) => Buffer.from(s, 'latin1')),
  'gateway-target': [
    '/cluster1/api/v1/namespaces/default/pods?watch=1',
    '/cluster1/api/v1/namespaces/web/services/https:frontend:8443/proxy-service/healthz',
    '/cluster1/api/v1/namespaces/default/services/kubernetes/proxy-service/api',
    '/cluster1/api/%2e%2e/secrets',
    '/cluster1//api',
    '/cluster1/api/v1/namespaces/a%2fb/pods',
    '/cluster1/',
  ].map((s) => Buffer.from(s, 'latin1')),
  'gateway-headers': [
    'Authorization: Bearer t\nImpersonate-User: admin\nX-Remote-User: x\nConnection: keep-alive, X-Custom\nX-Custom: 1\nAccept: */*\nSec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.dG9r, v4.channel.k8s.io\nUpgrade: websocket',
  ].map((s) => Buffer.from(s, 'latin1')),
  'upgrade-answer': [
    Buffer.concat([Buffer.from([0, 1]), Buffer.from('Switching Protocols\u0000Upgrade:SPDY/3.1\u0000Connection:Upgrade', 'latin1')]),
  ],
  'proxy-env': [
    '10.0.0.0/8,.svc,.cluster.local,localhost\u0000http://user:S3cr3tPw@proxy.corp:3128\u0000kubernetes.default.svc\u0000443',
    '*\u0000proxy:3128\u000010.1.2.3\u0000443',
    '[fd00::1]:443,fd00::/8\u0000https://[fd00::9]:8443\u0000fd00::1\u00006443',
  ].map((s) => Buffer.from(s)),
  'config-file': [
    'hub: hub.example.com:8091\ncluster: c1\nidentifier:\n  - host=a\n  - host=b\ndebug: true\nversion: 1.20\n',
    'a: &x 1\nb: *x\n',
    'k: |\n  multi\n',
    '---\na: 1\n---\nb: 2\n',
  ].map((s) => Buffer.from(s)),
  'ca-bundle': [
    ca,
    `${ca}${ca2.replace(/\n/g, '\r\n')}`,
    Buffer.from(ca + ca2).toString('base64'),
    '-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n',
    Buffer.from('-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n').toString('base64'),
  ].map((s) => Buffer.from(s)),
};

for (const target of TARGETS) {
  const dir = path.join(CORPUS_DIR, target.name);
  mkdirSync(dir, { recursive: true });
  const generated = target.generate ? fc.sample(target.generate, { seed: 1, numRuns: 8 }) : [];
  // No key material on disk, even junk in a key's armour: targets make those at run time (their seeds()).
  for (const data of [...(handPicked[target.name] ?? []), ...generated].filter((d) => !d.includes('PRIVATE KEY'))) {
    const file = path.join(dir, `seed-${createHash('sha1').update(data).digest('hex').slice(0, 12)}`);
    if (!existsSync(file)) writeFileSync(file, data);
  }
}
