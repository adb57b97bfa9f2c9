// `cluster-proxy hub`: the proxy server.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { ProxyServer, ensureHubPki, isValidCidr, type Grant } from '@cluster-proxy/server';
import { DEFAULT_HUB_DATA_DIR } from './hub-files.js';
import { createLogger } from './logging.js';
import { UsageError, duration, helpText, list, parseFlags, port, str, type FlagSpecs, type ParsedFlags } from './flags.js';

export const hubFlags: FlagSpecs = {
  'data-dir': { type: 'string', default: DEFAULT_HUB_DATA_DIR, help: 'state directory: PKI (if no cert flags), ports.json' },
  'bind-address': { type: 'string', default: '0.0.0.0', help: 'address the gRPC listeners bind to' },
  'agent-port': { type: 'string', default: '8091', help: 'agent listener (mTLS gRPC); 0 picks a free port' },
  'frontend-port': { type: 'string', default: '8090', help: 'gRPC frontend (mTLS); 0 picks a free port' },
  'frontend-uds': { type: 'string', help: 'also serve the gRPC frontend, plain, on this Unix socket' },
  'health-port': { type: 'string', default: '8092', help: '/healthz and /readyz' },
  'admin-port': { type: 'string', default: '8095', help: 'loopback admin: /debug/connections' },
  'connect-port': { type: 'string', default: '8089', help: 'HTTP CONNECT frontend over TLS (client certificate or token); 0 picks a free port, "off" disables it' },
  'connect-uds': { type: 'string', help: 'also serve HTTP CONNECT on this Unix socket (0660; no credentials needed)' },
  'connect-plain': { type: 'string', help: 'also serve HTTP CONNECT in plain TCP on this loopback HOST:PORT' },
  'connect-plain-allow-tokens': { type: 'boolean', help: 'accept tokens on --connect-plain (they travel unencrypted on loopback)' },
  'tokens-file': { type: 'string', help: 'CONNECT bearer tokens (default DATA_DIR/tokens.json)' },
  'ca-cert': { type: 'string', help: 'CA bundle that signs agent and client certificates (PEM)' },
  'server-cert': { type: 'string', help: 'serving certificate (PEM)' },
  'server-key': { type: 'string', help: 'serving key (PEM)' },
  'server-id': { type: 'string', help: 'this replica\'s ID (default: random)' },
  'server-count': { type: 'string', default: '1', help: 'number of replicas agents should connect to' },
  'dial-timeout': { type: 'string', default: '10s', help: 'deadline for every pending dial' },
  grant: { type: 'string', multiple: true, help: 'extra identifier for a cluster\'s agents: CLUSTER=host:NAME | cidr:CIDR | default-route' },
  'log-level': { type: 'string', default: 'info', help: 'fatal, error, warn, info, debug, trace' },
};

export const hubUsage = helpText('cluster-proxy hub [flags]', 'Runs the proxy server: agents connect to --agent-port, clients to --frontend-port.', hubFlags);

export function parseGrants(values: string[]): Map<string, Grant> {
  const grants = new Map<string, Grant>();
  for (const v of values) {
    const m = /^([^=]+)=(host:(.+)|cidr:(.+)|default-route)$/.exec(v);
    if (!m) throw new UsageError(`--grant "${v}" must be CLUSTER=host:NAME, CLUSTER=cidr:CIDR or CLUSTER=default-route`);
    const g = grants.get(m[1]!) ?? { hosts: [], cidrs: [], defaultRoute: false };
    if (m[3]) g.hosts.push(m[3].toLowerCase());
    else if (m[4]) {
      if (!isValidCidr(m[4])) throw new UsageError(`--grant "${v}": "${m[4]}" is not a CIDR such as 10.0.0.0/8 or fd00::/8`);
      g.cidrs.push(m[4]);
    }
    else g.defaultRoute = true;
    grants.set(m[1]!, g);
  }
  return grants;
}

function connectPlain(flags: ParsedFlags): { host: string; port: number; allowTokens: boolean } | undefined {
  const v = str(flags, 'connect-plain');
  if (!v) return undefined;
  const m = /^(.+):(\d{1,5})$/.exec(v);
  if (!m || Number(m[2]) > 65535) throw new UsageError(`--connect-plain "${v}" is not HOST:PORT`);
  const host = m[1]!.replace(/^\[(.*)\]$/, '$1');
  if (!['127.0.0.1', '::1', 'localhost'].includes(host)) throw new UsageError(`--connect-plain must bind a loopback address, not "${host}"`);
  return { host, port: Number(m[2]), allowTokens: flags['connect-plain-allow-tokens'] === true };
}

export async function runHub(args: string[]): Promise<void> {
  const { flags } = parseFlags(args, hubFlags);
  if (flags['help']) {
    process.stdout.write(hubUsage);
    return;
  }
  const log = createLogger(str(flags, 'log-level')!, 'hub');
  const dataDir = str(flags, 'data-dir')!;
  const given = ['ca-cert', 'server-cert', 'server-key'].filter((f) => str(flags, f));
  if (given.length !== 0 && given.length !== 3) throw new UsageError('--ca-cert, --server-cert and --server-key go together');
  let files: { ca: string; cert: string; key: string };
  if (given.length === 3) files = { ca: str(flags, 'ca-cert')!, cert: str(flags, 'server-cert')!, key: str(flags, 'server-key')! };
  else {
    const pki = await ensureHubPki(path.join(dataDir, 'pki'), {});
    files = { ca: pki.caCert, cert: pki.serverCert, key: pki.serverKey };
  }
  const read = async (f: string, what: string): Promise<Buffer> => {
    try {
      return await readFile(f);
    } catch (err) {
      throw new UsageError(`cannot read ${what} ${f}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
  };
  const serverCount = Number(str(flags, 'server-count'));
  if (!Number.isInteger(serverCount) || serverCount < 1) throw new UsageError('--server-count must be a positive integer');
  const server = new ProxyServer({
    serverID: str(flags, 'server-id'),
    serverCount,
    bindAddress: str(flags, 'bind-address')!,
    agentPort: port(flags, 'agent-port'),
    frontendPort: port(flags, 'frontend-port'),
    frontendUds: str(flags, 'frontend-uds'),
    healthPort: port(flags, 'health-port'),
    adminPort: port(flags, 'admin-port'),
    tls: { caCert: await read(files.ca, 'CA certificate'), cert: await read(files.cert, 'server certificate'), key: await read(files.key, 'server key') },
    dialTimeoutMs: duration(flags, 'dial-timeout'),
    connectPort: str(flags, 'connect-port') === 'off' ? null : port(flags, 'connect-port'),
    connectUds: str(flags, 'connect-uds'),
    connectPlain: connectPlain(flags),
    tokensFile: str(flags, 'tokens-file'),
    grants: parseGrants(list(flags, 'grant')),
    dataDir,
    log,
  });
  await server.start();
  await new Promise<void>((resolve) => {
    let stopping = false;
    const onSignal = (sig: NodeJS.Signals): void => {
      if (stopping) process.exit(1); // second signal: stop now
      stopping = true;
      log.info({ signal: sig }, 'shutting down');
      void server.stop(5000).then(resolve);
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
}
