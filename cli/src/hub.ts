// `cluster-proxy hub`: the proxy server.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import {
  AUTHORIZATION_MODES,
  OCM_DEFAULT_INSTALL_NAMESPACE,
  OIDC_SIGNING_ALGS,
  Hub,
  ServiceAllowlistError,
  checkOidcConfig,
  embeddedStoreDir,
  ensureHubPki,
  isValidCidr,
  openStore,
  type AuthorizationMode,
  type GatewayAccessConfig,
  type Grant,
  type OidcConfig,
  type Store,
} from '@cluster-proxy/server';
import type { Logger } from 'pino';
import { DEFAULT_HUB_DATA_DIR } from './hub-files.js';
import { LOG_FORMAT_FLAG, createLogger, logUnhandledRejections } from './logging.js';
import {
  UsageError,
  bytes,
  duration,
  helpText,
  optionalCount,
  list,
  parseFlags,
  port,
  str,
  type FlagSpecs,
  type ParsedFlags,
} from './flags.js';
import { allAddresses } from './bind-address.js';

export const hubFlags: FlagSpecs = {
  'data-dir': { type: 'string', default: DEFAULT_HUB_DATA_DIR, help: 'state directory: PKI (if no cert flags), ports.json' },
  'bind-address': {
    type: 'string',
    help: 'address the agent, client, CONNECT, gateway and health listeners bind to; default every address of both families (:: dual-stack where the host has IPv6, else 0.0.0.0)',
  },
  'agent-port': { type: 'string', default: '8091', help: 'agent listener (mTLS gRPC); 0 picks a free port' },
  'frontend-port': { type: 'string', default: '8090', help: 'gRPC frontend (mTLS); 0 picks a free port' },
  'frontend-uds': { type: 'string', help: 'also serve the gRPC frontend, plain, on this Unix socket' },
  'health-port': { type: 'string', default: '8092', help: '/healthz, /readyz and /metrics' },
  'admin-port': { type: 'string', default: '8095', help: 'loopback admin: /metrics, /debug/connections' },
  'connect-port': {
    type: 'string',
    default: '8089',
    help: 'HTTP CONNECT frontend over TLS (client certificate or token); 0 picks a free port, "off" disables it',
  },
  'gateway-port': {
    type: 'string',
    help: "HTTP gateway over TLS: https://HUB:PORT/CLUSTER/PATH to the cluster's apiserver as the authenticated hub user (docs/gateway.md); off unless set; 0 picks a free port",
  },
  'gateway-identity-prefix': {
    type: 'string',
    help: 'prepended to the user and every group the gateway impersonates in managed clusters (e.g. "hub:"), so their RBAC can tell hub identities from their own; none by default',
  },
  'gateway-response-timeout': {
    type: 'string',
    default: '90s',
    help: "gateway: how long a cluster's agent may take to answer a request with its response head before the caller gets 504 (watches, logs -f and exec answer at once, then run as long as they run)",
  },
  'gateway-services': {
    type: 'string',
    help: "YAML/JSON list of in-cluster Services the gateway's proxy-service form may reach (namespace, service, port?, protocol?, clusters?, caFile?); re-read on change; none without it",
  },
  'cluster-profiles-gateway-url': {
    type: 'string',
    help: 'with --agent-install manifestwork and --gateway-port: write the gateway into OCM\'s ClusterProfiles (Cluster Inventory API) as access provider "open-cluster-management", at this URL (e.g. https://cluster-proxy.NS.svc:9092); off unless set',
  },
  'gateway-authorization': {
    type: 'string',
    help: 'who may reach which cluster through the gateway: scope (a hub token its clusters, other callers every cluster; default on the embedded store) or subjectaccessreview (also a SubjectAccessReview on the hub: get managedclusters/proxy NAME; default with --store kubernetes)',
  },
  'oidc-issuer-url': {
    type: 'string',
    help: "gateway: accept OIDC ID tokens of this issuer (https; discovery and JWKS from it), as kube-apiserver's flag",
  },
  'oidc-client-id': { type: 'string', help: 'gateway: the audience ID tokens must carry (required with --oidc-issuer-url)' },
  'oidc-username-claim': { type: 'string', default: 'sub', help: 'gateway: the claim that names the user' },
  'oidc-username-prefix': {
    type: 'string',
    help: 'gateway: prefix of OIDC usernames (default ISSUER# unless the claim is email; - for none)',
  },
  'oidc-groups-claim': { type: 'string', help: "gateway: the claim that lists the user's groups (default: no groups)" },
  'oidc-groups-prefix': { type: 'string', help: 'gateway: prefix of OIDC group names' },
  'oidc-required-claim': { type: 'string', multiple: true, help: 'gateway: KEY=VALUE an ID token must carry' },
  'oidc-ca-file': { type: 'string', help: "gateway: CA bundle (PEM) for the issuer's TLS certificate (default: the system's)" },
  'oidc-signing-algs': {
    type: 'string',
    default: 'RS256',
    help: `gateway: comma-separated algorithms ID tokens may be signed with (${OIDC_SIGNING_ALGS.join(', ')})`,
  },
  'connect-uds': { type: 'string', help: 'also serve HTTP CONNECT on this Unix socket (0660; no credentials needed)' },
  'connect-plain': { type: 'string', help: 'also serve HTTP CONNECT in plain TCP on this loopback HOST:PORT' },
  'connect-plain-allow-tokens': { type: 'boolean', help: 'accept tokens on --connect-plain (they travel unencrypted on loopback)' },
  'tokens-file': { type: 'string', help: 'CONNECT bearer tokens (default DATA_DIR/tokens.json)' },
  'ca-cert': { type: 'string', help: 'CA bundle that signs agent and client certificates (PEM)' },
  'server-cert': { type: 'string', help: 'serving certificate (PEM)' },
  'server-key': { type: 'string', help: 'serving key (PEM)' },
  'ca-key': {
    type: 'string',
    help: "key of --ca-cert's first CA: lets the hub register clusters and sign agent certificates (automatic with the data-dir PKI)",
  },
  'require-registration': {
    type: 'boolean',
    help: 'admit only agents of clusters registered with "cluster-proxy join" (hand-issued certificates of unregistered clusters are refused)',
  },
  'agent-entrypoint': { type: 'string', help: 'HOST:PORT agents dial, written into install manifests (default 127.0.0.1:AGENT_PORT)' },
  'agent-server-name': { type: 'string', help: 'TLS name agents verify on the hub certificate, when not the entrypoint host' },
  'agent-image': { type: 'string', help: 'agent container image for install manifests' },
  'agent-cert-validity': { type: 'string', default: '180d', help: 'lifetime of agent certificates the hub signs (renewed at 80 %)' },
  'health-mode': {
    type: 'string',
    default: 'tunnel',
    help: "addon health: tunnel (lease + the hub's own view of tunnels) or lease (OCM's timing only)",
  },
  'replica-lease-duration': {
    type: 'string',
    default: '30s',
    help: 'a replica that has not renewed its lease in the store for this long counts as gone',
  },
  'shutdown-grace': {
    type: 'string',
    default: '20s',
    help: 'on SIGTERM, how long open connections may finish after readiness turns false and agents are told',
  },
  'shutdown-delay': {
    type: 'string',
    default: '0s',
    help: 'on SIGTERM, how long readiness is false while new work is still accepted (so load balancers notice first)',
  },
  'tls-reload-interval': {
    type: 'string',
    default: '30s',
    help: 'how often the TLS files are checked for a renewed certificate or a CA rollover stage',
  },
  'tunnel-loss-window': {
    type: 'string',
    default: '30s',
    help: 'longest time until a tunnel loss or recovery shows in the addon status (health-mode tunnel)',
  },
  'server-id': { type: 'string', help: "this replica's ID (default: random)" },
  'server-count': { type: 'string', default: '1', help: 'number of replicas agents should connect to' },
  'dial-timeout': { type: 'string', default: '10s', help: 'deadline for every pending dial' },
  'agent-wait': {
    type: 'string',
    default: '5s',
    help: 'how long a dial with no agent here waits for one of its cluster to connect, when another replica holds a tunnel to it (a restarted replica, a reconnecting agent); 0s: fail at once',
  },
  'agent-wait-max-dials': { type: 'string', help: 'dials waiting so at once at most; more fail at once (default: --max-connections)' },
  'memory-budget': {
    type: 'string',
    default: '256Mi',
    help: 'bytes the hub may hold for its peers, all connections together (windows grow from it; a reader that stops holds its share only)',
  },
  'max-connections': {
    type: 'string',
    help: 'tunneled connections (and CONNECT client connections) the hub holds at most; more are refused with reason "limit" (default: budget / 64 KiB, two initial windows)',
  },
  'max-connections-per-client': { type: 'string', help: 'the same per client certificate or token (default: half of --max-connections)' },
  'stall-timeout': {
    type: 'string',
    default: '0s',
    help: 'close a connection whose bytes could not move one way for this long: a destination or client that stopped reading (a hung webhook), or a CONNECT client gone while its kernel still holds unsent bytes; the client hears why. 0s: never (as ANP)',
  },
  grant: { type: 'string', multiple: true, help: "extra identifier for a cluster's agents: CLUSTER=host:NAME | cidr:CIDR | default-route" },
  store: {
    type: 'string',
    default: 'embedded',
    help: 'hub store: embedded (DATA_DIR/store, crash-safe) or kubernetes (the CRDs in deploy/)',
  },
  'agent-install': {
    type: 'string',
    default: 'manual',
    help: 'manual (admins apply "join" bundles) or manifestwork (the hub is OCM\'s addon manager: ManifestWorks, OCM\'s CSR flow; needs --store kubernetes)',
  },
  'agent-install-namespace': {
    type: 'string',
    default: OCM_DEFAULT_INSTALL_NAMESPACE,
    help: "with --agent-install manifestwork: agent namespace when no AddOnDeploymentConfig names one (OCM cluster-proxy's own)",
  },
  kubeconfig: { type: 'string', help: 'with --store kubernetes: kubeconfig file (default: in-cluster, then KUBECONFIG/~/.kube/config)' },
  'kube-context': { type: 'string', help: 'with --store kubernetes: kubeconfig context' },
  'log-level': { type: 'string', default: 'info', help: 'fatal, error, warn, info, debug, trace' },
  'log-format': LOG_FORMAT_FLAG,
};

export const hubUsage = helpText(
  'cluster-proxy hub [flags]',
  'Runs the proxy server: agents connect to --agent-port, clients to --frontend-port.',
  hubFlags,
);

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
    } else g.defaultRoute = true;
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
  if (!['127.0.0.1', '::1', 'localhost'].includes(host))
    throw new UsageError(`--connect-plain must bind a loopback address, not "${host}"`);
  return { host, port: Number(m[2]), allowTokens: flags['connect-plain-allow-tokens'] === true };
}

const OIDC_FLAGS = [
  'oidc-issuer-url',
  'oidc-client-id',
  'oidc-username-claim',
  'oidc-username-prefix',
  'oidc-groups-claim',
  'oidc-groups-prefix',
  'oidc-required-claim',
  'oidc-ca-file',
  'oidc-signing-algs',
];

/** The gateway's --oidc-* and --gateway-authorization flags, checked (one-line usage errors); the CA file is read later. */
export function gatewayAccessFlags(
  flags: ParsedFlags,
  gatewayOn: boolean,
): { config: Omit<GatewayAccessConfig, 'oidc'>; oidc?: Omit<OidcConfig, 'caCert'>; oidcCaFile?: string } {
  const given = (f: string): boolean => {
    const v = flags[f];
    // Flags with a default count as given only when they differ from it.
    const def = hubFlags[f]?.default;
    return Array.isArray(v) ? v.length > 0 : v !== undefined && v !== def;
  };
  const issuer = str(flags, 'oidc-issuer-url');
  const stray = OIDC_FLAGS.filter((f) => f !== 'oidc-issuer-url' && given(f));
  if (!issuer && stray.length > 0) throw new UsageError(`--${stray[0]} goes with --oidc-issuer-url`);
  const mode = str(flags, 'gateway-authorization');
  if (mode !== undefined && !(AUTHORIZATION_MODES as readonly string[]).includes(mode))
    throw new UsageError(`--gateway-authorization must be ${AUTHORIZATION_MODES.join(' or ')}, got "${mode}"`);
  if (mode === 'subjectaccessreview' && str(flags, 'store') !== 'kubernetes')
    throw new UsageError(
      "--gateway-authorization subjectaccessreview needs --store kubernetes (the SubjectAccessReview goes to the hub's API server)",
    );
  if (!gatewayOn && (issuer || mode))
    throw new UsageError(
      `--${issuer ? 'oidc-issuer-url' : 'gateway-authorization'} configures the HTTP gateway: it goes with --gateway-port`,
    );
  const config: Omit<GatewayAccessConfig, 'oidc'> = mode ? { authorization: mode as AuthorizationMode } : {};
  if (!issuer) return { config };
  const requiredClaims: Record<string, string> = {};
  for (const v of list(flags, 'oidc-required-claim')) {
    const eq = v.indexOf('=');
    if (eq <= 0) throw new UsageError(`--oidc-required-claim "${v}" must be KEY=VALUE`);
    requiredClaims[v.slice(0, eq)] = v.slice(eq + 1);
  }
  const oidc: Omit<OidcConfig, 'caCert'> = {
    issuerUrl: issuer,
    clientId: str(flags, 'oidc-client-id') ?? '',
    usernameClaim: str(flags, 'oidc-username-claim') ?? 'sub',
    ...(str(flags, 'oidc-username-prefix') !== undefined ? { usernamePrefix: str(flags, 'oidc-username-prefix')! } : {}),
    ...(str(flags, 'oidc-groups-claim') ? { groupsClaim: str(flags, 'oidc-groups-claim')! } : {}),
    ...(str(flags, 'oidc-groups-prefix') !== undefined ? { groupsPrefix: str(flags, 'oidc-groups-prefix')! } : {}),
    ...(Object.keys(requiredClaims).length > 0 ? { requiredClaims } : {}),
    signingAlgs: (str(flags, 'oidc-signing-algs') ?? 'RS256')
      .split(',')
      .map((a) => a.trim())
      .filter(Boolean),
  };
  const problem = checkOidcConfig(oidc);
  if (problem) throw new UsageError(problem);
  return { config, oidc, ...(str(flags, 'oidc-ca-file') ? { oidcCaFile: str(flags, 'oidc-ca-file')! } : {}) };
}

async function openHubStore(flags: ParsedFlags, dataDir: string, log: Logger): Promise<Store> {
  const kind = str(flags, 'store');
  if (kind !== 'embedded' && kind !== 'kubernetes') throw new UsageError(`--store must be embedded or kubernetes, got "${kind}"`);
  if (kind === 'embedded' && (str(flags, 'kubeconfig') || str(flags, 'kube-context')))
    throw new UsageError('--kubeconfig and --kube-context go with --store kubernetes');
  try {
    const store =
      kind === 'embedded'
        ? await openStore({ type: 'embedded', dataDir, warn: (m) => log.warn(m) })
        : await openStore({ type: 'kubernetes', kubeconfig: str(flags, 'kubeconfig'), context: str(flags, 'kube-context') });
    log.info({ store: store.kind }, `hub store: ${kind === 'embedded' ? embeddedStoreDir(dataDir) : 'kubernetes API'}`);
    return store;
  } catch (err) {
    // Corrupt or locked data directory, unreadable kubeconfig: one line, nothing half-loaded.
    throw new UsageError(`cannot open the hub store: ${(err as Error).message}`);
  }
}

export async function runHub(args: string[]): Promise<void> {
  const { flags } = parseFlags(args, hubFlags);
  if (flags['help']) {
    process.stdout.write(hubUsage);
    return;
  }
  const log = createLogger(str(flags, 'log-level')!, 'hub', { format: str(flags, 'log-format') });
  logUnhandledRejections(log);
  const dataDir = str(flags, 'data-dir')!;
  // Every flag value is checked before any file is read, so a typo is reported as itself.
  const given = ['ca-cert', 'server-cert', 'server-key'].filter((f) => str(flags, f));
  if (given.length !== 0 && given.length !== 3) throw new UsageError('--ca-cert, --server-cert and --server-key go together');
  if (str(flags, 'ca-key') && given.length === 0) throw new UsageError('--ca-key goes with --ca-cert (the data-dir PKI has its own key)');
  const agentInstall = str(flags, 'agent-install');
  if (agentInstall !== 'manual' && agentInstall !== 'manifestwork')
    throw new UsageError(`--agent-install must be manual or manifestwork, got "${agentInstall}"`);
  if (agentInstall === 'manifestwork' && str(flags, 'store') !== 'kubernetes') {
    throw new UsageError(
      '--agent-install manifestwork needs --store kubernetes (ManifestWorks and CSRs live in the OCM hub\'s API); the embedded store installs agents with "cluster-proxy join" only (--agent-install manual)',
    );
  }
  const profilesUrl = str(flags, 'cluster-profiles-gateway-url');
  if (profilesUrl !== undefined) {
    if (agentInstall !== 'manifestwork')
      throw new UsageError("--cluster-profiles-gateway-url needs --agent-install manifestwork (ClusterProfiles are OCM's)");
    if (str(flags, 'gateway-port') === undefined || str(flags, 'gateway-port') === 'off')
      throw new UsageError('--cluster-profiles-gateway-url needs --gateway-port (it advertises the gateway)');
    let u: URL | null = null;
    try {
      u = new URL(profilesUrl);
    } catch {
      // reported below
    }
    if (!u || u.protocol !== 'https:' || u.search || u.hash || (u.pathname !== '/' && u.pathname !== ''))
      throw new UsageError(`--cluster-profiles-gateway-url "${profilesUrl}" must be https://HOST[:PORT] (the cluster name is appended)`);
  }
  const installNamespace = str(flags, 'agent-install-namespace')!;
  if (!/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(installNamespace))
    throw new UsageError(`--agent-install-namespace "${installNamespace}" is not a namespace name`);
  const healthMode = str(flags, 'health-mode');
  if (healthMode !== 'tunnel' && healthMode !== 'lease') throw new UsageError(`--health-mode must be tunnel or lease, got "${healthMode}"`);
  const entrypoint = str(flags, 'agent-entrypoint');
  if (entrypoint !== undefined && !/^(\[[0-9a-fA-F:.]+\]|[^\s:/[\]]+):\d{1,5}$/.test(entrypoint))
    throw new UsageError(`--agent-entrypoint "${entrypoint}" is not HOST:PORT`);
  const serverCount = Number(str(flags, 'server-count'));
  if (!Number.isInteger(serverCount) || serverCount < 1) throw new UsageError('--server-count must be a positive integer');
  if (str(flags, 'gateway-services') !== undefined && (str(flags, 'gateway-port') === undefined || str(flags, 'gateway-port') === 'off'))
    throw new UsageError('--gateway-services needs --gateway-port');
  const identityPrefix = str(flags, 'gateway-identity-prefix');
  if (identityPrefix !== undefined) {
    if (str(flags, 'gateway-port') === undefined || str(flags, 'gateway-port') === 'off')
      throw new UsageError('--gateway-identity-prefix needs --gateway-port');
    // eslint-disable-next-line no-control-regex
    if (identityPrefix === '' || /[\x00-\x20\x7f]/.test(identityPrefix))
      throw new UsageError('--gateway-identity-prefix must be a non-empty string without spaces or control characters');
  }
  const listeners = {
    agentPort: port(flags, 'agent-port'),
    frontendPort: port(flags, 'frontend-port'),
    healthPort: port(flags, 'health-port'),
    adminPort: port(flags, 'admin-port'),
    connectPort: str(flags, 'connect-port') === 'off' ? null : port(flags, 'connect-port'),
    connectPlain: connectPlain(flags),
    gatewayPort: str(flags, 'gateway-port') === undefined || str(flags, 'gateway-port') === 'off' ? null : port(flags, 'gateway-port'),
    gatewayServicesFile: str(flags, 'gateway-services'),
    gatewayIdentityPrefix: identityPrefix,
    gatewayResponseTimeoutMs: duration(flags, 'gateway-response-timeout'),
  };
  const grants = parseGrants(list(flags, 'grant'));
  const access = gatewayAccessFlags(flags, listeners.gatewayPort !== null);
  const timing = {
    healthMode,
    tunnelLossWindowMs: duration(flags, 'tunnel-loss-window'),
    agentCertValidityDays: duration(flags, 'agent-cert-validity') / 86_400_000,
    tlsReloadIntervalMs: duration(flags, 'tls-reload-interval'),
    replicaLeaseDurationMs: duration(flags, 'replica-lease-duration'),
  } as const;
  const dialTimeoutMs = duration(flags, 'dial-timeout');
  const agentWait = { agentWaitMs: duration(flags, 'agent-wait'), maxWaitingDials: optionalCount(flags, 'agent-wait-max-dials') };
  const limits = {
    memoryBudget: bytes(flags, 'memory-budget'),
    maxConnections: optionalCount(flags, 'max-connections'),
    maxConnectionsPerClient: optionalCount(flags, 'max-connections-per-client'),
    stallTimeoutMs: duration(flags, 'stall-timeout'),
  };
  const shutdownGrace = duration(flags, 'shutdown-grace');
  const shutdownDelay = duration(flags, 'shutdown-delay');

  let files: { ca: string; cert: string; key: string; caKey: string | undefined };
  let managedPkiDir: string | undefined;
  if (given.length === 3)
    files = { ca: str(flags, 'ca-cert')!, cert: str(flags, 'server-cert')!, key: str(flags, 'server-key')!, caKey: str(flags, 'ca-key') };
  else {
    managedPkiDir = path.join(dataDir, 'pki');
    const pki = await ensureHubPki(managedPkiDir, {});
    files = { ca: pki.caCert, cert: pki.serverCert, key: pki.serverKey, caKey: pki.caKey };
  }
  const read = async (f: string, what: string): Promise<Buffer> => {
    try {
      return await readFile(f);
    } catch (err) {
      throw new UsageError(`cannot read ${what} ${f}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
  };
  const caCert = await read(files.ca, 'CA certificate');
  const signer = files.caKey
    ? { certPem: firstCertificate(caCert.toString('utf8'), files.ca), keyPem: (await read(files.caKey, 'CA key')).toString('utf8') }
    : undefined;
  const tls = { caCert, cert: await read(files.cert, 'server certificate'), key: await read(files.key, 'server key') };
  let gatewayAccess: GatewayAccessConfig = access.config;
  if (access.oidc) {
    const caCert = access.oidcCaFile ? await read(access.oidcCaFile, 'OIDC CA file') : undefined;
    if (caCert && !caCert.toString('utf8').includes('-----BEGIN CERTIFICATE-----'))
      throw new UsageError(`--oidc-ca-file ${access.oidcCaFile} holds no PEM certificate`);
    gatewayAccess = { ...gatewayAccess, oidc: { ...access.oidc, ...(caCert ? { caCert } : {}) } };
  }
  const store = await openHubStore(flags, dataDir, log);
  const hub = new Hub({
    store,
    signer,
    log,
    requireRegistration: flags['require-registration'] === true,
    agentEntrypoint: entrypoint,
    serverName: str(flags, 'agent-server-name'),
    agentImage: str(flags, 'agent-image'),
    agentInstall,
    agentInstallNamespace: installNamespace,
    ...(profilesUrl ? { clusterProfilesGatewayUrl: profilesUrl.replace(/\/+$/, '') } : {}),
    ...timing,
    tlsFiles: files,
    managedPkiDir,
    server: {
      ...listeners,
      serverID: str(flags, 'server-id'),
      serverCount,
      bindAddress: str(flags, 'bind-address') ?? allAddresses(),
      frontendUds: str(flags, 'frontend-uds'),
      tls,
      dialTimeoutMs,
      ...agentWait,
      ...limits,
      connectUds: str(flags, 'connect-uds'),
      tokensFile: str(flags, 'tokens-file'),
      grants,
      gatewayAccess,
      dataDir,
      processMetrics: true,
    },
  });
  try {
    await hub.start();
  } catch (err) {
    await hub.stop(0).catch(() => {});
    await store.close();
    // A flag's file that is missing or broken is the command line's error, as for the TLS files.
    if (err instanceof ServiceAllowlistError) throw new UsageError(err.message);
    throw err;
  }
  await new Promise<void>((resolve) => {
    let stopping = false;
    const onSignal = (sig: NodeJS.Signals): void => {
      if (stopping) process.exit(1); // second signal: stop now
      stopping = true;
      log.info({ signal: sig }, 'shutting down');
      void hub
        .stop(shutdownGrace, shutdownDelay)
        .then(() => store.close())
        .then(resolve);
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
}

/** The signing CA is the bundle's first certificate (the newest, during a CA rollover). */
function firstCertificate(bundle: string, file: string): string {
  const m = /-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----\n?/.exec(bundle);
  if (!m) throw new UsageError(`CA certificate file ${file} holds no PEM certificate`);
  return m[0];
}
