// gateway: small kube-style GETs (GET /version, ~150 bytes) per second, C at a time on keep-alive
// connections, three ways to one HTTPS "apiserver":
//   direct   - straight to it (the baseline)
//   CONNECT  - through the hub's CONNECT frontend, TLS to the apiserver inside (kubectl's proxy-url): one
//              tunnel per client connection, many requests on it
//   gateway  - https://HUB/bench/version with a client certificate: the hub authenticates each request,
//              signs the identity, sends it over a kept-alive tunneled connection to the agent's reserved
//              destination, the agent calls the apiserver impersonating the caller
// Figures: requests per second, p99 latency, and the hub's and agent's CPU per 1,000 requests; then
// `kubectl exec`'s stream the same three ways: EXEC_BYTES through stdin, echoed back on stdout over
// WebSocket (v5.channel.k8s.io), MB/s of the round trip. Fresh hub + agent per round. Shown in the
// connect column (the hub's HTTP frontends); other paths n/a.
// For profiling: GATEWAY_CPU_PROF=DIR starts hub and agent with `node --cpu-prof` (DIR/hub-gateway.cpuprofile,
// DIR/agent-gateway.cpuprofile; read them with cpuprofile.js); GATEWAY_MODES=gateway (a comma list) measures
// only those ways, GATEWAY_EXEC=0 skips the exec echo, so a profile holds what the GETs cost.
import { readFileSync } from 'node:fs';
import type http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import path from 'node:path';
import tls from 'node:tls';
import { issueServerCert } from '@cluster-proxy/server';
import WebSocket, { WebSocketServer } from 'ws';
import { connectThrough } from '../fixtures/connect-client.js';
import { writeAgentKubeconfig } from '../fixtures/agent-kubeconfig.js';
import { createPki, type TestPki } from '../harness.js';
import { startCluster, type BenchCluster } from './cluster.js';
import { withCpu } from './cpu.js';
import { errorMessage } from './io.js';
import type { Dialer } from './paths.js';
import { withTimeout, type BenchConfig, type MetricSpec, type PathRun, type Scenario } from './scenarios.js';
import { mbPerSecond, Samples } from './stats.js';

const MODES = ['direct', 'CONNECT', 'gateway'] as const;
type Mode = (typeof MODES)[number];
/** Requests in flight at once (each loop sends its next request when the last one answered). */
const CONCURRENCY = 16;
const REQUEST_TIMEOUT_MS = 10_000;

const METRICS: readonly MetricSpec[] = [
  ...MODES.map((m) => ({ metric: `GET/s ${m}`, unit: 'req/s', better: 'higher' as const })),
  ...MODES.map((m) => ({ metric: `GET p99 ${m}`, unit: 'ms', better: 'lower' as const })),
  ...(['CONNECT', 'gateway'] as const).map((m) => ({ metric: `hub+agent CPU ${m}`, unit: 'ms/1k GETs', better: 'lower' as const })),
  ...MODES.map((m) => ({ metric: `exec echo ${m}`, unit: 'MB/s', better: 'higher' as const })),
];
const EXEC_METRIC = 2 * MODES.length + 2;
/** Bytes sent through exec's stdin (and read back from stdout) per measurement. */
const EXEC_BYTES = 64 * 1024 * 1024;
const EXEC_CHUNK = 64 * 1024;
/** Bytes the client lets wait in its WebSocket before it waits for them to go. */
const EXEC_IN_FLIGHT = 4 * 1024 * 1024;

const log = (message: string): void => void process.stderr.write(`[bench] ${message}\n`);

/**
 * A small HTTPS "apiserver": GET /version as kube-apiserver answers it, and a pod's exec over WebSocket
 * (v5.channel.k8s.io) that echoes stdin (channel 0) back on stdout (channel 1), like `cat`.
 */
async function startApiserver(pair: { certPem: string; keyPem: string }): Promise<{ port: number; close(): Promise<void> }> {
  const body = JSON.stringify({ major: '1', minor: '33', gitVersion: 'v1.33.0-bench', gitCommit: '0'.repeat(40), platform: 'linux/amd64' });
  const server = https.createServer({ cert: pair.certPem, key: pair.keyPem, keepAliveTimeout: 60_000 }, (req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  });
  const wss = new WebSocketServer({
    noServer: true,
    handleProtocols: (offered) => (offered.has('v5.channel.k8s.io') ? 'v5.channel.k8s.io' : false),
  });
  server.on('upgrade', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    socket.on('error', () => socket.destroy());
    wss.handleUpgrade(req, socket, head, (ws) => {
      ws.on('message', (data: Buffer) => {
        if (data[0] !== 0) return;
        data[0] = 1; // stdin → stdout, same bytes
        ws.send(data);
        // The echo's own backpressure: stop reading while the answer waits.
        if (ws.bufferedAmount > EXEC_IN_FLIGHT) {
          (ws as unknown as { _socket: Duplex })._socket.pause();
          const resume = (): void => {
            if (ws.bufferedAmount > EXEC_IN_FLIGHT / 2) return void setTimeout(resume, 1);
            (ws as unknown as { _socket: Duplex })._socket.resume();
          };
          setTimeout(resume, 1);
        }
      });
      ws.on('error', () => ws.terminate());
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        for (const c of wss.clients) c.terminate();
        wss.close();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

interface Rig {
  pki: TestPki;
  cluster: BenchCluster;
  apiPort: number;
  stop(): Promise<void>;
}

async function startRig(): Promise<Rig> {
  const steps: (() => Promise<unknown>)[] = [];
  const stop = async (): Promise<void> => {
    for (const s of steps.reverse()) await s().catch(() => {});
  };
  try {
    const pki = await createPki();
    steps.push(() => pki.cleanup());
    const api = await startApiserver(issueServerCert(pki.ca, { commonName: 'bench-apiserver', ipAddresses: ['127.0.0.1'] }));
    steps.push(() => api.close());
    // The agent's own credentials for its apiserver (what a service account gives it in a pod).
    const kubeconfig = await writeAgentKubeconfig(path.join(pki.dir, 'agent-apiserver.kubeconfig'), {
      server: `https://127.0.0.1:${api.port}`,
      caPath: pki.caPath,
      token: 'bench-agent-token',
    });
    const cluster = await startCluster(pki, {
      label: 'gateway',
      transport: 'mux',
      hubArgs: ['--gateway-port', '0'],
      agentArgs: ['--gateway-kubeconfig', kubeconfig],
      ...(process.env['GATEWAY_CPU_PROF'] ? { cpuProfDir: path.resolve(process.env['GATEWAY_CPU_PROF']) } : {}),
      onStarted: (_name, s) => void steps.push(s),
    });
    if (cluster.hub.ports.gateway == null) throw new Error('the bench hub has no gateway port');
    return { pki, cluster, apiPort: api.port, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** The keep-alive pool each mode's requests go through. */
function agentFor(mode: Mode, rig: Rig): { agent: https.Agent; target: { host: string; port: number; path: string } } {
  const ca = readFileSync(rig.pki.caPath);
  const cert = readFileSync(rig.pki.client.certPath);
  const key = readFileSync(rig.pki.client.keyPath);
  if (mode === 'direct')
    return {
      agent: new https.Agent({ keepAlive: true, maxSockets: CONCURRENCY, ca }),
      target: { host: '127.0.0.1', port: rig.apiPort, path: '/version' },
    };
  if (mode === 'gateway') {
    return {
      agent: new https.Agent({ keepAlive: true, maxSockets: CONCURRENCY, ca, cert, key, servername: 'localhost' }),
      target: { host: '127.0.0.1', port: rig.cluster.hub.ports.gateway!, path: '/bench/version' },
    };
  }
  // CONNECT: each pooled connection is a tunnel through the hub, TLS to the apiserver inside it.
  const connectPort = rig.cluster.hub.ports.connect!;
  const agent = new https.Agent({ keepAlive: true, maxSockets: CONCURRENCY, ca });
  (
    agent as unknown as { createConnection: (o: tls.ConnectionOptions, cb: (err: Error | null, s?: net.Socket) => void) => undefined }
  ).createConnection = (o, cb) => {
    const toHub = tls.connect({ host: '127.0.0.1', port: connectPort, servername: 'localhost', ca, cert, key });
    connectThrough(toHub, `127.0.0.1:${rig.apiPort}`).then(
      (tunnel) => {
        const inner = tls.connect({ socket: tunnel, servername: '127.0.0.1', ca });
        inner.once('secureConnect', () => cb(null, inner));
        inner.once('error', (err) => cb(err));
      },
      (err: Error) => cb(err),
    );
    return undefined;
  };
  return { agent, target: { host: '127.0.0.1', port: rig.apiPort, path: '/version' } };
}

function get(agent: https.Agent, target: { host: string; port: number; path: string }): Promise<void> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      { ...target, agent, servername: target.path === '/bench/version' ? 'localhost' : '127.0.0.1', timeout: REQUEST_TIMEOUT_MS },
      (res: http.IncomingMessage) => {
        res.resume();
        res.once('end', () => (res.statusCode === 200 ? resolve() : reject(new Error(`HTTP ${res.statusCode}`))));
        res.once('error', reject);
      },
    );
    req.once('timeout', () => req.destroy(new Error(`no answer within ${REQUEST_TIMEOUT_MS} ms`)));
    req.once('error', reject);
    req.end();
  });
}

/** CONCURRENCY loops of sequential GETs for `seconds`; latencies in ms. */
async function load(
  agent: https.Agent,
  target: { host: string; port: number; path: string },
  seconds: number,
): Promise<{ count: number; seconds: number; latencies: Samples }> {
  const latencies = new Samples();
  const began = performance.now();
  const end = began + seconds * 1000;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < end) {
        const t = performance.now();
        await get(agent, target);
        latencies.add(performance.now() - t);
      }
    }),
  );
  return { count: latencies.count, seconds: (performance.now() - began) / 1000, latencies };
}

/** EXEC_BYTES through an exec session's stdin and back from its stdout; seconds. */
async function execEcho(agent: https.Agent, target: { host: string; port: number; path: string }): Promise<number> {
  const base = target.path.replace(/\/version$/, '');
  const url = `wss://${target.host}:${target.port}${base}/api/v1/namespaces/default/pods/bench/exec?command=cat&stdin=true&stdout=true`;
  // ws hands these to https.request: the TLS name to verify, as for the GETs.
  const options: WebSocket.ClientOptions & { servername: string } = {
    agent,
    servername: target.path === '/bench/version' ? 'localhost' : '127.0.0.1',
  };
  const ws = new WebSocket(url, ['v5.channel.k8s.io'], options);
  try {
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('error', reject);
      ws.once('unexpected-response', (_req, res) => reject(new Error(`exec: HTTP ${res.statusCode}`)));
    });
    const began = performance.now();
    let received = 0;
    const done = new Promise<void>((resolve, reject) => {
      ws.on('message', (data: Buffer) => {
        if (data[0] === 1) received += data.length - 1;
        if (received >= EXEC_BYTES) resolve();
      });
      ws.once('close', () => reject(new Error(`exec: closed after ${received} of ${EXEC_BYTES} bytes`)));
      ws.once('error', reject);
    });
    const chunk = Buffer.alloc(EXEC_CHUNK + 1, 0x61);
    chunk[0] = 0; // stdin
    for (let sent = 0; sent < EXEC_BYTES; sent += EXEC_CHUNK) {
      ws.send(chunk);
      while (ws.bufferedAmount > EXEC_IN_FLIGHT) await new Promise((r) => setTimeout(r, 1));
    }
    await withTimeout(done, 120_000, 'exec echo');
    return (performance.now() - began) / 1000;
  } finally {
    ws.terminate();
  }
}

class GatewayRun implements PathRun {
  private readonly rounds: number[][] = METRICS.map(() => []);
  private readonly notesList: string[] = [];

  constructor(private readonly cfg: BenchConfig) {}

  async measure(): Promise<string> {
    const rig = await startRig();
    const procs = { hub: [rig.cluster.hub.pid], agent: [rig.cluster.agentPid] };
    const seconds = Math.max(1, this.cfg.throughputSeconds * 2);
    const summary: string[] = [];
    try {
      const only = process.env['GATEWAY_MODES']?.split(',');
      for (const mode of MODES.filter((m) => !only || only.includes(m))) {
        const { agent, target } = agentFor(mode, rig);
        try {
          await load(agent, target, Math.min(0.5, seconds / 4)); // warm-up: connections, JIT
          const { result, cpu } = await withCpu(procs, () => load(agent, target, seconds));
          const rate = result.count / result.seconds;
          const p99 = result.latencies.percentile(99);
          this.rounds[MODES.indexOf(mode)]!.push(rate);
          this.rounds[MODES.length + MODES.indexOf(mode)]!.push(p99);
          if (mode !== 'direct') {
            const cpuMs = (((cpu.seconds.hub ?? 0) + (cpu.seconds.agent ?? 0)) * 1000 * 1000) / result.count;
            this.rounds[2 * MODES.length + (mode === 'CONNECT' ? 0 : 1)]!.push(cpuMs);
          }
          summary.push(`${mode} ${rate.toFixed(0)}/s p99 ${p99.toFixed(1)} ms`);
          if (process.env['GATEWAY_EXEC'] === '0') continue;
          const execSeconds = await execEcho(agent, target);
          this.rounds[EXEC_METRIC + MODES.indexOf(mode)]!.push(mbPerSecond(2 * EXEC_BYTES, execSeconds));
          summary.push(`${mode} exec ${mbPerSecond(2 * EXEC_BYTES, execSeconds).toFixed(0)} MB/s`);
        } catch (err) {
          this.notesList.push(`${mode}: ${errorMessage(err)}`);
          log(`gateway: ${mode} failed: ${errorMessage(err)}`);
        } finally {
          agent.destroy();
        }
      }
    } finally {
      await rig.stop();
    }
    return summary.join(', ');
  }

  values(): (number | null)[] {
    return this.rounds.map((r) => (r.length === 0 ? null : r.reduce((a, b) => a + b, 0) / r.length));
  }

  roundValues(): number[][] {
    return this.rounds;
  }

  notes(): string[] {
    return [
      `${CONCURRENCY} requests in flight on keep-alive connections (the gateway keeps its tunneled connections to the agent alive too)`,
      ...this.notesList,
    ];
  }
}

export const GATEWAY: Scenario = {
  name: 'gateway',
  network: 'lan',
  description: `GET /version per second, ${CONCURRENCY} at a time, and an exec session echoing ${EXEC_BYTES / 1024 / 1024} MiB, to an HTTPS apiserver: directly, through CONNECT (kubectl proxy-url), and through the HTTP gateway (authenticated, impersonated)`,
  metrics: METRICS,
  appliesTo: { paths: ['connect'], otherwise: "an HTTP scenario of the hub's own frontends: all three ways are in the connect column" },
  forPath: (_dialer: Dialer, cfg: BenchConfig) => new GatewayRun(cfg),
};
