// `cluster-proxy agent`: the agent that runs in a managed cluster.
import { readFile } from 'node:fs/promises';
import { Agent, AllowlistError, startAgentHealthServer } from '@cluster-proxy/agent';
import { parseIdentifiers } from '@cluster-proxy/proto';
import { createLogger } from './logging.js';
import { UsageError, duration, helpText, list, parseFlags, port, required, str, type FlagSpecs } from './flags.js';

export const agentFlags: FlagSpecs = {
  cluster: { type: 'string', help: 'name of the managed cluster this agent serves (required)' },
  namespace: { type: 'string', default: 'open-cluster-management-agent-addon', help: 'install namespace; registers CLUSTER.NAMESPACE too' },
  hub: { type: 'string', default: '127.0.0.1:8091', help: 'HOST:PORT of the hub\'s agent listener' },
  'ca-cert': { type: 'string', help: 'CA bundle to verify the hub (PEM, required)' },
  cert: { type: 'string', help: 'agent client certificate (PEM, required)' },
  key: { type: 'string', help: 'agent client key (PEM, required)' },
  'server-name': { type: 'string', help: 'TLS name to verify on the hub\'s certificate (default: host of --hub)' },
  transport: { type: 'string', default: 'auto', help: 'auto (our framed TLS transport, gRPC for an ANP hub), mux or grpc' },
  apiserver: { type: 'string', default: 'kubernetes.default.svc:443', help: 'where CLUSTER:443 goes' },
  allow: { type: 'string', multiple: true, help: 'extra allowed destination: HOST:PORT, HOST:*, CIDR:PORT, *.DOMAIN:PORT or *' },
  'agent-id': { type: 'string', help: 'agent ID (default: random UUID)' },
  identifiers: { type: 'string', help: 'extra identifiers the hub granted, e.g. "default-route=true&cidr=10.0.0.0/8"' },
  'dial-timeout': { type: 'string', default: '5s', help: 'timeout for connecting to a destination' },
  'drain-grace': { type: 'string', default: '30s', help: 'on SIGTERM, how long open connections may finish' },
  'health-bind-address': { type: 'string', default: '0.0.0.0', help: 'address of the health listener' },
  'health-port': { type: 'string', default: '8093', help: '/healthz, /readyz, /debug/connections' },
  'proxy-ca': { type: 'string', help: 'CA bundle (PEM) to verify an https:// egress proxy (HTTPS_PROXY)' },
  'proxy-connect-timeout': { type: 'string', default: '10s', help: 'timeout for the egress proxy to answer CONNECT' },
  'keepalive-time': { type: 'string', default: '15s', help: 'HTTP/2 ping interval towards the hub' },
  'keepalive-timeout': { type: 'string', default: '10s', help: 'a hub that does not answer a ping within this is considered gone' },
  'log-level': { type: 'string', default: 'info', help: 'fatal, error, warn, info, debug, trace' },
};

export const agentUsage = helpText('cluster-proxy agent --cluster NAME --ca-cert F --cert F --key F [flags]', 'Connects out to the hub and serves dials into this cluster.', agentFlags);

export async function runAgent(args: string[]): Promise<void> {
  const { flags } = parseFlags(args, agentFlags);
  if (flags['help']) {
    process.stdout.write(agentUsage);
    return;
  }
  const cluster = required(flags, 'cluster');
  const read = async (name: string): Promise<Buffer> => {
    const f = required(flags, name);
    try {
      return await readFile(f);
    } catch (err) {
      throw new UsageError(`cannot read --${name} ${f}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
  };
  const log = createLogger(str(flags, 'log-level')!, 'agent');
  const extra = str(flags, 'identifiers');
  const transport = str(flags, 'transport')!;
  if (transport !== 'auto' && transport !== 'mux' && transport !== 'grpc') throw new UsageError(`--transport must be auto, mux or grpc, got "${transport}"`);
  let agent: Agent;
  try {
    agent = new Agent({
      cluster,
      namespace: str(flags, 'namespace')!,
      hubAddress: str(flags, 'hub')!,
      caCert: await read('ca-cert'),
      cert: await read('cert'),
      key: await read('key'),
      serverName: str(flags, 'server-name'),
      transport,
      apiserver: str(flags, 'apiserver')!,
      allow: list(flags, 'allow'),
      agentID: str(flags, 'agent-id'),
      extraIdentifiers: extra ? parseIdentifiers(extra) : undefined,
      dialTimeoutMs: duration(flags, 'dial-timeout'),
      drainGraceMs: duration(flags, 'drain-grace'),
      keepaliveTimeMs: duration(flags, 'keepalive-time'),
      keepaliveTimeoutMs: duration(flags, 'keepalive-timeout'),
      proxyCa: str(flags, 'proxy-ca') ? await read('proxy-ca') : undefined,
      proxyConnectTimeoutMs: duration(flags, 'proxy-connect-timeout'),
      log,
    });
  } catch (err) {
    if (err instanceof AllowlistError) throw new UsageError(err.message);
    if (err instanceof Error && /apiserver address/.test(err.message)) throw new UsageError(err.message);
    throw err;
  }
  const health = await startAgentHealthServer(agent, str(flags, 'health-bind-address')!, port(flags, 'health-port'));
  const healthPort = (health.address() as { port: number }).port;
  log.info({ healthPort }, 'agent health listener up');
  agent.start();
  await new Promise<void>((resolve) => {
    let stopping = false;
    const onSignal = (sig: NodeJS.Signals): void => {
      if (stopping) process.exit(1);
      stopping = true;
      void agent.drain().then(() => {
        health.closeAllConnections();
        health.close(() => resolve());
      });
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
}
