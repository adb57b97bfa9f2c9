// Child process: the load generator of the scale-agents scenario. It registers `count` agents with
// one hub, each on its own connection, as our agent does (agent/src/server-connection.ts ready()):
//   mux   TLS with ALPN cluster-proxy-mux/1 (connectMux) and the agent hello
//   grpc  one GrpcClient per agent (its own HTTP/2 connection), opening AgentService.Connect with
//         the same metadata and options as the agent's grpc-link.ts
// Every agent uses the same agent certificate (cluster `scale`) with its own agentID; the hub
// allows several agents per cluster. Keepalive as the agent's defaults (15 s / 10 s).
//
//   node agents-load.js '<json {transport, hubAddress, tls, cluster, count, concurrency}>'
//
// Prints {"ready":N,"failed":F,"seconds":S}; on SIGUSR2 prints {"holding":N,"lost":L}; exits on
// SIGTERM (closing every connection with the process), or by itself when the bench goes away.
import { randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import {
  AGENT_CONNECT_PATH,
  CAP_CREDIT,
  CAP_HALF_CLOSE,
  INITIAL_CONNECTION_WINDOW,
  GrpcClient,
  HTTP2_CONNECTION_WINDOW,
  HTTP2_STREAM_WINDOW,
  MAX_MESSAGE_BYTES,
  MD_AGENT_ID,
  MD_AGENT_IDENTIFIERS,
  MD_CAPABILITIES,
  MD_SERVER_ID,
  MD_WINDOW,
  clusterHostNames,
  connectMux,
  emptyIdentifiers,
  formatIdentifiers,
  type Hello,
} from '@cluster-proxy/proto';
import { exitWithParent } from './child-util.js';
import type { TlsFiles } from './clients.js';
import { errorMessage } from './io.js';

interface Job {
  transport: 'mux' | 'grpc';
  hubAddress: string;
  tls: TlsFiles;
  cluster: string;
  count: number;
  concurrency: number;
}

const TIMEOUT_MS = 30_000;
/** The agent's default install namespace (its identifiers include CLUSTER.NAMESPACE). */
const NAMESPACE = 'open-cluster-management-agent-addon';
const say = (obj: object): void => void process.stdout.write(`${JSON.stringify(obj)}\n`);

async function main(): Promise<void> {
  exitWithParent();
  process.on('SIGTERM', () => process.exit(0));
  const job = JSON.parse(process.argv[2] ?? '') as Job;
  const caCert = readFileSync(job.tls.caPath);
  const cert = readFileSync(job.tls.certPath);
  const key = readFileSync(job.tls.keyPath);
  const identifiers = formatIdentifiers({ ...emptyIdentifiers(), host: clusterHostNames(job.cluster, NAMESPACE) });
  const metadata = (): Record<string, string> => ({
    [MD_AGENT_ID]: randomUUID(),
    [MD_AGENT_IDENTIFIERS]: identifiers,
    [MD_CAPABILITIES]: [CAP_CREDIT, CAP_HALF_CLOSE].join(','),
    [MD_WINDOW]: String(INITIAL_CONNECTION_WINDOW),
  });

  let holding = 0;
  let lost = 0;
  const gone = (): void => {
    holding--;
    lost++;
  };

  const openMux = async (): Promise<void> => {
    const hello: Hello = {};
    for (const [k, v] of Object.entries(metadata())) hello[k] = [v];
    const { stream, hello: answer } = await connectMux({
      address: job.hubAddress,
      caCert,
      cert,
      key,
      serverName: 'localhost',
      hello,
      timeoutMs: TIMEOUT_MS,
    });
    if ((answer[MD_SERVER_ID] ?? []).length !== 1) throw new Error('hub answered without serverID');
    stream.startKeepalive(15_000, 10_000);
    holding++;
    let once = false;
    const onGone = (): void => {
      if (!once) {
        once = true;
        gone();
      }
    };
    stream.on('data', () => {}); // no dials are sent to these agents
    stream.on('error', onGone);
    stream.on('end', onGone);
    stream.on('close', onGone);
  };

  const openGrpc = (): Promise<void> =>
    new Promise((resolve, reject) => {
      const client = new GrpcClient({
        address: job.hubAddress,
        tls: { ca: caCert, cert, key, serverName: 'localhost' },
        streamWindow: HTTP2_STREAM_WINDOW,
        connectionWindow: HTTP2_CONNECTION_WINDOW,
        maxMessageBytes: MAX_MESSAGE_BYTES,
        keepalive: { intervalMs: 15_000, timeoutMs: 10_000 },
        refWhenIdle: true,
      });
      const call = client.call(AGENT_CONNECT_PATH, metadata());
      let settled = false;
      const timer = setTimeout(() => {
        settled = true;
        client.close();
        reject(new Error(`no response headers within ${TIMEOUT_MS} ms`));
      }, TIMEOUT_MS);
      call.on('data', () => {});
      call.on('error', (err: Error) => {
        if (!settled) {
          settled = true;
          clearTimeout(timer);
          client.close();
          reject(err);
        } else gone();
      });
      call.once('metadata', (headers: Record<string, string[]>) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        if ((headers[MD_SERVER_ID] ?? []).length !== 1) {
          client.close();
          reject(new Error('hub answered without serverID'));
          return;
        }
        holding++;
        resolve();
      });
    });

  const open = job.transport === 'mux' ? openMux : openGrpc;
  let started = 0;
  let failed = 0;
  let firstError = '';
  const begin = performance.now();
  const worker = async (): Promise<void> => {
    while (started < job.count) {
      started++;
      try {
        await open();
      } catch (err) {
        failed++;
        firstError ||= errorMessage(err);
        if (failed > Math.max(10, job.count / 100)) started = job.count;
      }
    }
  };
  await Promise.all(Array.from({ length: job.concurrency }, worker));
  process.on('SIGUSR2', () => say({ holding, lost }));
  setInterval(() => {}, 1 << 30); // stay until SIGTERM even if no connection is left
  say({ ready: holding, failed, firstError, seconds: (performance.now() - begin) / 1000 });
}

main().catch((err: unknown) => {
  process.stderr.write(`agents-load: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
