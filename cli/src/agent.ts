// `cluster-proxy agent`: the agent that runs in a managed cluster.
import { readFile } from 'node:fs/promises';
import {
  Agent,
  AllowlistError,
  BootstrapRefused,
  CertFilesWatcher,
  CredentialsManager,
  LeaseRenewer,
  ReplicaSync,
  SecretCredentialsMirror,
  proxyFromEnvironment,
  startAgentHealthServer,
  type CredentialsMirror,
  type EgressOptions,
} from '@cluster-proxy/agent';
import { splitHostPort } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { parseIdentifiers } from '@cluster-proxy/proto';
import { LOG_FORMAT_FLAG, createLogger, logUnhandledRejections } from './logging.js';
import {
  UsageError,
  bytes,
  duration,
  optionalCount,
  helpText,
  list,
  parseFlags,
  port,
  required,
  str,
  type FlagSpecs,
  type ParsedFlags,
} from './flags.js';
import { allAddresses } from './bind-address.js';

export const agentFlags: FlagSpecs = {
  cluster: { type: 'string', help: 'name of the managed cluster this agent serves (required)' },
  namespace: { type: 'string', default: 'open-cluster-management-agent-addon', help: 'install namespace; registers CLUSTER.NAMESPACE too' },
  hub: { type: 'string', default: '127.0.0.1:8091', help: "HOST:PORT of the hub's agent listener" },
  'ca-cert': { type: 'string', help: 'CA bundle to verify the hub (PEM, required)' },
  cert: { type: 'string', help: 'agent client certificate (PEM; or use --credentials-dir)' },
  key: { type: 'string', help: 'agent client key (PEM; or use --credentials-dir)' },
  'cert-reload-interval': {
    type: 'string',
    default: '10s',
    help: "with --cert/--key: how often the files are re-read; a renewed pair (e.g. from OCM's CSR flow) is used without dropping tunnels",
  },
  'credentials-dir': {
    type: 'string',
    help: 'where the agent keeps the key it makes and the certificate the hub signs (agent.key 0600, agent.crt)',
  },
  'bootstrap-token-file': {
    type: 'string',
    help: 'single-use token from "cluster-proxy join", traded for a certificate when --credentials-dir has none',
  },
  'credentials-secret': {
    type: 'string',
    help: 'also keep key, certificate and hub CA bundle in this Secret of --namespace (in a pod: its service account; else KUBECONFIG), so a new pod or replica reuses them',
  },
  'replica-sync-interval': {
    type: 'string',
    default: '10s',
    help: 'how often the agent asks the hub for its live replicas (one tunnel each; tunnels to gone replicas are dropped)',
  },
  'lease-duration': { type: 'string', default: '60s', help: 'how often the agent renews its lease on the hub (while it holds a tunnel)' },
  'server-name': { type: 'string', help: "TLS name to verify on the hub's certificate (default: host of --hub)" },
  transport: { type: 'string', default: 'auto', help: 'auto (our framed TLS transport, gRPC for an ANP hub), mux or grpc' },
  apiserver: { type: 'string', default: 'kubernetes.default.svc:443', help: 'where CLUSTER:443 goes' },
  allow: { type: 'string', multiple: true, help: 'extra allowed destination: HOST:PORT, HOST:*, CIDR:PORT, *.DOMAIN:PORT or *' },
  gateway: { type: 'string', default: 'on', help: "serve the hub's HTTP gateway (requests as the hub user, by impersonation): on or off" },
  'gateway-allow-reserved': {
    type: 'string',
    multiple: true,
    help: 'a reserved Kubernetes name (system: user or group, e.g. system:masters) the gateway may impersonate all the same, exactly as written; none by default: hub callers never become system: identities in this cluster',
  },
  'gateway-identity-mac': {
    type: 'string',
    default: 'on',
    help: "believe identities the hub authenticates with this link's TLS session key (cheaper than a signature per request): on, or off for signed identities only (as agents before it)",
  },
  'gateway-kubeconfig': {
    type: 'string',
    help: "the gateway's apiserver and the agent's own credentials for it (default: KUBECONFIG, ~/.kube/config, else the pod's service account)",
  },
  'agent-id': { type: 'string', help: 'agent ID (default: random UUID)' },
  identifiers: { type: 'string', help: 'extra identifiers the hub granted, e.g. "default-route=true&cidr=10.0.0.0/8"' },
  'dial-timeout': { type: 'string', default: '5s', help: 'timeout for connecting to a destination' },
  'memory-budget': {
    type: 'string',
    default: '64Mi',
    help: 'bytes the agent may hold for the hub, all connections together (windows grow from it; a destination that stops reading holds its share only)',
  },
  'max-connections': {
    type: 'string',
    help: 'connections the agent holds at most; more dials are refused with reason "limit" (default: budget / 32 KiB initial window)',
  },
  'drain-grace': { type: 'string', default: '30s', help: 'on SIGTERM, how long open connections may finish' },
  'health-bind-address': {
    type: 'string',
    help: 'address of the health listener; default every address of both families (:: dual-stack where the host has IPv6, else 0.0.0.0)',
  },
  'health-port': { type: 'string', default: '8093', help: '/healthz, /readyz, /metrics, /debug/connections' },
  'proxy-ca': { type: 'string', help: 'CA bundle (PEM) to verify an https:// egress proxy (HTTPS_PROXY)' },
  'proxy-connect-timeout': { type: 'string', default: '10s', help: 'timeout for the egress proxy to answer CONNECT' },
  'keepalive-time': { type: 'string', default: '15s', help: 'HTTP/2 ping interval towards the hub' },
  'keepalive-timeout': { type: 'string', default: '10s', help: 'a hub that does not answer a ping within this is considered gone' },
  'log-level': { type: 'string', default: 'info', help: 'fatal, error, warn, info, debug, trace' },
  'log-format': LOG_FORMAT_FLAG,
};

export const agentUsage = helpText(
  'cluster-proxy agent --cluster NAME --ca-cert F (--cert F --key F | --credentials-dir D [--bootstrap-token-file F]) [flags]',
  'Connects out to the hub and serves dials into this cluster.',
  agentFlags,
);

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
  const log = createLogger(str(flags, 'log-level')!, 'agent', { format: str(flags, 'log-format') });
  logUnhandledRejections(log);
  const extra = str(flags, 'identifiers');
  const transport = str(flags, 'transport')!;
  if (transport !== 'auto' && transport !== 'mux' && transport !== 'grpc')
    throw new UsageError(`--transport must be auto, mux or grpc, got "${transport}"`);
  const hubAddress = str(flags, 'hub')!;
  const credentialsDir = str(flags, 'credentials-dir');
  if (credentialsDir && (str(flags, 'cert') || str(flags, 'key')))
    throw new UsageError('use either --cert/--key or --credentials-dir, not both');
  if (!credentialsDir && str(flags, 'bootstrap-token-file'))
    throw new UsageError('--bootstrap-token-file needs --credentials-dir (where the key and certificate go)');
  const secretName = str(flags, 'credentials-secret');
  if (secretName !== undefined && !credentialsDir) throw new UsageError('--credentials-secret needs --credentials-dir (the working copy)');
  if (secretName !== undefined && !/^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/.test(secretName))
    throw new UsageError(`--credentials-secret "${secretName}" is not a valid Secret name`);
  const mirror = secretName ? await mirrorOf(str(flags, 'namespace')!, secretName) : undefined;
  const hubClient: { address: string; caCert: Buffer; serverName: string | undefined; egress: EgressOptions | undefined } = {
    address: hubAddress,
    caCert: Buffer.alloc(0),
    serverName: str(flags, 'server-name'),
    egress: hubEgress(hubAddress, str(flags, 'proxy-ca') ? await read('proxy-ca') : undefined, duration(flags, 'proxy-connect-timeout')),
  };
  const credentials = credentialsDir
    ? new CredentialsManager({
        cluster,
        dir: credentialsDir,
        bootstrapTokenFile: str(flags, 'bootstrap-token-file'),
        hub: hubClient,
        log,
        mirror,
      })
    : null;
  // A CA bundle the hub handed out later (CA rollover) supersedes the one from the install bundle.
  const caCert = (await credentials?.savedTrust()) ?? (await read('ca-cert'));
  hubClient.caCert = caCert;
  let stopRequested = false;
  let wakeBootstrap: () => void = () => {};
  const earlySignal = (): void => {
    stopRequested = true;
    wakeBootstrap();
  };
  process.once('SIGTERM', earlySignal);
  process.once('SIGINT', earlySignal);
  let identity: { cert: Buffer; key: Buffer };
  if (credentials) {
    const loaded = await bootstrapUntilDone(
      credentials,
      log,
      () => stopRequested,
      (w) => (wakeBootstrap = w),
    );
    if (!loaded) return;
    identity = loaded;
  } else {
    identity = { cert: await read('cert'), key: await read('key') };
  }
  process.removeListener('SIGTERM', earlySignal);
  process.removeListener('SIGINT', earlySignal);
  let agent: Agent;
  try {
    agent = new Agent({
      cluster,
      namespace: str(flags, 'namespace')!,
      hubAddress,
      caCert,
      cert: identity.cert,
      key: identity.key,
      serverName: str(flags, 'server-name'),
      transport,
      apiserver: str(flags, 'apiserver')!,
      allow: list(flags, 'allow'),
      agentID: str(flags, 'agent-id'),
      extraIdentifiers: extra ? parseIdentifiers(extra) : undefined,
      dialTimeoutMs: duration(flags, 'dial-timeout'),
      memoryBudget: bytes(flags, 'memory-budget'),
      maxConnections: optionalCount(flags, 'max-connections'),
      drainGraceMs: duration(flags, 'drain-grace'),
      keepaliveTimeMs: duration(flags, 'keepalive-time'),
      keepaliveTimeoutMs: duration(flags, 'keepalive-timeout'),
      proxyCa: str(flags, 'proxy-ca') ? await read('proxy-ca') : undefined,
      proxyConnectTimeoutMs: duration(flags, 'proxy-connect-timeout'),
      gateway: gatewayOption(flags),
      processMetrics: true,
      log,
    });
  } catch (err) {
    if (err instanceof AllowlistError) throw new UsageError(err.message);
    if (err instanceof Error && /apiserver address/.test(err.message)) throw new UsageError(err.message);
    throw err;
  }
  const health = await startAgentHealthServer(agent, str(flags, 'health-bind-address') ?? allAddresses(), port(flags, 'health-port'));
  const healthPort = (health.address() as { port: number }).port;
  log.info({ healthPort }, 'agent health listener up');
  agent.start();
  credentials?.onRenewed((c) => agent.setCredentials(c.cert, c.key));
  const certFiles = credentials
    ? null
    : new CertFilesWatcher({
        cert: required(flags, 'cert'),
        key: required(flags, 'key'),
        intervalMs: duration(flags, 'cert-reload-interval'),
        current: identity,
        log,
        onChange: (c) => agent.setCredentials(c.cert, c.key),
      });
  certFiles?.start();
  const lease = new LeaseRenewer({
    agent,
    hub: hubClient,
    apiserver: str(flags, 'apiserver')!,
    leaseDurationMs: duration(flags, 'lease-duration'),
    log,
    onTrust: (bundle) => {
      hubClient.caCert = bundle;
      return credentials?.saveTrust(bundle);
    },
    phase: () => (credentials?.isRenewing ? 'RenewingCredentials' : 'Running'),
    onRenewRequested: () => {
      if (credentials) credentials.renewNow();
      else log.warn('the hub asks for a certificate from its new CA; this agent uses --cert/--key, so replace them by hand');
    },
  });
  lease.start();
  const replicaSync = new ReplicaSync({
    agent,
    hub: { address: hubAddress, serverName: hubClient.serverName, egress: hubClient.egress },
    intervalMs: duration(flags, 'replica-sync-interval'),
    lease,
    log,
  });
  replicaSync.start();
  await new Promise<void>((resolve) => {
    let stopping = false;
    const onSignal = (sig: NodeJS.Signals): void => {
      if (stopping) process.exit(1);
      stopping = true;
      lease.stop();
      replicaSync.stop();
      credentials?.stop();
      certFiles?.stop();
      void agent.drain().then(() => {
        health.closeAllConnections();
        health.close(() => resolve());
      });
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
}

async function mirrorOf(namespace: string, name: string): Promise<CredentialsMirror> {
  try {
    return await SecretCredentialsMirror.fromEnvironment(namespace, name);
  } catch (err) {
    throw new UsageError(`--credentials-secret: no Kubernetes API to keep it in (${(err as Error).message})`);
  }
}

/** The egress proxy for the hub API calls (bootstrap, renewal, lease): the same decision the tunnels make. */
function hubEgress(hubAddress: string, proxyCa: Buffer | undefined, connectTimeoutMs: number): EgressOptions | undefined {
  const hp = splitHostPort(hubAddress);
  if (!hp) throw new UsageError(`--hub "${hubAddress}" is not HOST:PORT`);
  const d = proxyFromEnvironment(process.env, hp.host, hp.port, 'https');
  return d.proxy ? { proxy: d.proxy, ca: proxyCa, connectTimeoutMs } : undefined;
}

/**
 * Loads or bootstraps the agent's credentials, retrying with backoff: a refused token is logged (once
 * per distinct reason) and retried, since the operator may write a fresh token into the file.
 * Resolves null when a signal arrived first.
 */
async function bootstrapUntilDone(
  creds: CredentialsManager,
  log: Logger,
  stopped: () => boolean,
  setWake: (w: () => void) => void,
): Promise<{ cert: Buffer; key: Buffer } | null> {
  let delay = 1000;
  let last = '';
  while (!stopped()) {
    try {
      return await creds.load();
    } catch (err) {
      const msg = (err as Error).message;
      if (msg !== last) {
        if (err instanceof BootstrapRefused) log.error(`bootstrap refused: ${msg}`);
        else log.warn(`cannot bootstrap yet: ${msg}`);
      }
      last = msg;
    }
    await new Promise<void>((resolve) => {
      const t = setTimeout(resolve, delay);
      setWake(() => {
        clearTimeout(t);
        resolve();
      });
    });
    delay = Math.min(delay * 2, 30_000);
  }
  return null;
}

/** --gateway on|off, --gateway-kubeconfig, --gateway-allow-reserved and --gateway-identity-mac on|off. */
function gatewayOption(flags: ParsedFlags): { kubeconfig?: string; allowReserved?: string[]; signedOnly?: boolean } | false {
  const v = str(flags, 'gateway');
  if (v !== 'on' && v !== 'off') throw new UsageError(`--gateway must be on or off, not "${v}"`);
  const allowReserved = list(flags, 'gateway-allow-reserved');
  if (v === 'off') {
    if (allowReserved.length > 0) throw new UsageError('--gateway-allow-reserved goes with --gateway on');
    return false;
  }
  for (const n of allowReserved)
    if (!n.startsWith('system:'))
      throw new UsageError(`--gateway-allow-reserved takes system: names (others need no allowing), got "${n}"`);
  const mac = str(flags, 'gateway-identity-mac');
  if (mac !== 'on' && mac !== 'off') throw new UsageError(`--gateway-identity-mac must be on or off, not "${mac}"`);
  const kubeconfig = str(flags, 'gateway-kubeconfig');
  return {
    ...(kubeconfig ? { kubeconfig } : {}),
    ...(allowReserved.length > 0 ? { allowReserved } : {}),
    ...(mac === 'off' ? { signedOnly: true } : {}),
  };
}
