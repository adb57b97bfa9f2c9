// `cluster-proxy kubeconfig CLUSTER`: a kubeconfig with which unmodified kubectl reaches CLUSTER's
// apiserver through the hub.
//
// --via connect (default): `server: https://CLUSTER` (the agent maps CLUSTER:443 to its apiserver)
// and `proxy-url: https://USER:TOKEN@HUB:8089`, the hub's HTTP CONNECT frontend; kubectl (Go's
// net/http) sends the user-info as `Proxy-Authorization: Basic`, which the frontend accepts with the
// token as password. Go verifies the https proxy with the *cluster's* TLS settings (the same
// tls.Config: root CAs, server name, insecure flag), so `certificate-authority-data` carries the hub
// CA and the apiserver's CA together, and no `tls-server-name` is set (it would apply to the hub's
// certificate too). Without --apiserver-ca the kubeconfig has `insecure-skip-tls-verify: true`,
// which then also leaves the hub unverified: we say so.
//
// --via forward: `server: https://127.0.0.1:PORT` with `tls-server-name: CLUSTER`, served by
// `cluster-proxy forward` (mTLS to the hub with a client certificate; no token involved).
//
// --via gateway: `server: https://HUB:PORT/CLUSTER`, the hub's HTTP gateway, verified with the hub CA, and
// a hub token for CLUSTER as the user's token: the hub authenticates it and the agent calls the apiserver
// as that user by impersonation (docs/gateway.md); no apiserver CA or credentials involved.
import { randomBytes } from 'node:crypto';
import { mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { isDns1123Subdomain, type TokenStore } from '@cluster-proxy/server';
import { UsageError, helpText, hostPort, list, parseFlags, str, type FlagSpecs, type ParsedFlags } from './flags.js';
import {
  AdminUnreachable,
  DEFAULT_CONNECT_PORT,
  adminAddress,
  adminFlag,
  fetchConnections,
  hubDataDirFlags,
  openTokenStore,
  readHubPorts,
  tokensFile,
} from './hub-files.js';
import { DEFAULT_TOKEN_TTL, issueToken, ttlSeconds } from './token.js';
import { Progress, cliWords, shellCommand } from './ui.js';
import { toKubectlYaml as toYaml, type YamlValue } from '@cluster-proxy/server';

const kubeconfigFlags: FlagSpecs = {
  out: { type: 'string', help: 'write the kubeconfig to this file (0600) instead of stdout' },
  via: {
    type: 'string',
    default: 'connect',
    help: "connect: proxy-url to the hub's CONNECT frontend with a token; forward: a local `cluster-proxy forward` port; gateway: the hub's HTTP gateway with a token (as that user, by impersonation)",
  },
  'apiserver-ca': { type: 'string', help: "CA bundle (PEM) of the cluster's apiserver; without it the kubeconfig skips TLS verification" },
  'tls-server-name': { type: 'string', help: '--via forward: name to verify on the apiserver certificate (default CLUSTER)' },
  'apiserver-token': {
    type: 'string',
    help: "bearer token for the apiserver itself (e.g. a service account's); without credentials kubectl prompts for a username",
  },
  token: { type: 'string', help: "--via connect or gateway: an existing token (default: issue one in the hub's token file for CLUSTER)" },
  gateway: { type: 'string', help: "--via gateway: the hub's gateway HOST:PORT (default 127.0.0.1 and the port in DATA_DIR/ports.json)" },
  'exec-command': {
    type: 'string',
    help: "--via gateway: a client-go credential plugin kubectl runs for the user's credential (e.g. kubectl-oidc_login for an OIDC login) instead of a hub token",
  },
  'exec-arg': {
    type: 'string',
    multiple: true,
    help: '--via gateway: an argument of --exec-command (repeatable; --exec-arg=--flag for one that starts with --)',
  },
  user: { type: 'string', help: "--via connect: user name sent with the token (default: the token's name)" },
  ttl: { type: 'string', default: DEFAULT_TOKEN_TTL, help: 'lifetime of an issued token; 0 = never expires' },
  connect: {
    type: 'string',
    help: `--via connect: the hub's CONNECT frontend HOST:PORT (default 127.0.0.1 and the port in DATA_DIR/ports.json, else ${DEFAULT_CONNECT_PORT})`,
  },
  'hub-ca': { type: 'string', help: "--via connect or gateway: CA (PEM) of the hub's certificate (default DATA_DIR/pki/ca.crt)" },
  listen: { type: 'string', default: '127.0.0.1:6443', help: '--via forward: local HOST:PORT the forward listens on' },
  context: { type: 'string', help: 'name of the cluster, user and context entries (default CLUSTER)' },
  'no-check': { type: 'boolean', help: 'do not ask the hub whether an agent of CLUSTER is connected' },
  ...adminFlag,
  ...hubDataDirFlags,
};

export const kubeconfigUsage = helpText(
  'cluster-proxy kubeconfig CLUSTER [--out FILE] [--via connect|forward|gateway] [--apiserver-ca FILE] [--token TOKEN]',
  "Writes a kubeconfig that reaches CLUSTER's apiserver through the hub, for unmodified kubectl.\n" +
    "connect: kubectl sends CONNECT CLUSTER:443 to the hub (proxy-url with a token; issued in the hub's\n" +
    'token file unless --token). forward: kubectl talks to a local `cluster-proxy forward` port.\n' +
    "gateway: kubectl talks to the hub's HTTP gateway (https://HUB:PORT/CLUSTER) with a token, and the\n" +
    "cluster sees the token's user (impersonation).",
  kubeconfigFlags,
);

export interface KubeconfigOptions {
  cluster: string;
  /** Entry names (default: cluster). */
  context?: string;
  /** https://CLUSTER (connect) or https://127.0.0.1:PORT (forward). */
  server: string;
  /** connect: https://USER:TOKEN@HOST:PORT. */
  proxyUrl?: string;
  /** PEM, concatenated into certificate-authority-data. Empty = insecure-skip-tls-verify. */
  caPems: string[];
  tlsServerName?: string;
  /** Bearer token for the apiserver (users[].user.token). */
  userToken?: string;
  /** A client-go credential plugin instead of a token (users[].user.exec). */
  exec?: { command: string; args: string[] };
}

/** The kubeconfig document (YAML). */
export function buildKubeconfig(o: KubeconfigOptions): string {
  const name = o.context ?? o.cluster;
  const cluster: Record<string, YamlValue> = { server: o.server };
  if (o.proxyUrl) cluster['proxy-url'] = o.proxyUrl;
  if (o.caPems.length > 0)
    cluster['certificate-authority-data'] = Buffer.from(o.caPems.map((p) => p.trimEnd() + '\n').join('')).toString('base64');
  else cluster['insecure-skip-tls-verify'] = true;
  if (o.tlsServerName) cluster['tls-server-name'] = o.tlsServerName;
  const doc: YamlValue = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name, cluster }],
    users: [
      {
        name,
        user: o.exec
          ? {
              exec: {
                apiVersion: 'client.authentication.k8s.io/v1',
                command: o.exec.command,
                args: o.exec.args,
                interactiveMode: 'IfAvailable',
                provideClusterInfo: false,
              },
            }
          : o.userToken
            ? { token: o.userToken }
            : {},
      },
    ],
    contexts: [{ name, context: { cluster: name, user: name } }],
    'current-context': name,
    preferences: {},
  };
  const route = o.proxyUrl
    ? 'kubectl -> hub CONNECT frontend -> agent -> apiserver'
    : o.server.endsWith(`/${o.cluster}`)
      ? `kubectl -> hub HTTP gateway -> agent -> apiserver, as the ${o.exec ? "plugin's credential's" : "token's"} user`
      : 'kubectl -> cluster-proxy forward -> hub -> agent -> apiserver';
  return (
    `# Generated by cluster-proxy kubeconfig ${o.cluster}: ${route}.\n` +
    (o.userToken || o.exec ? '' : '# The user entry is empty: add the apiserver credentials you would use inside the cluster.\n') +
    toYaml(doc)
  );
}

/** https://USER:TOKEN@HOST:PORT, user-info percent-encoded. */
export function proxyUrl(user: string, token: string, host: string, port: number): string {
  const h = host.includes(':') ? `[${host}]` : host;
  return `https://${encodeURIComponent(user)}:${encodeURIComponent(token)}@${h}:${port}`;
}

async function readPem(file: string, flag: string, hint = ''): Promise<string> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw new UsageError(`cannot read ${flag} ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}${hint}`);
  }
  if (!text.includes('-----BEGIN CERTIFICATE-----')) throw new UsageError(`${flag} ${file} holds no PEM certificate`);
  return text;
}

/** A token for the kubeconfig: --token, or a new one named kubeconfig-CLUSTER-xxxx for CLUSTER only. */
export async function tokenForKubeconfig(
  store: TokenStore,
  cluster: string,
  ttl: number | undefined,
): Promise<{ name: string; token: string; expiresAt: string | null }> {
  const name = `kubeconfig-${cluster}-${randomBytes(3).toString('hex')}`.slice(0, 128);
  return issueToken(store, { name, clusters: [cluster], ttlSeconds: ttl });
}

/** --token, or a new token for CLUSTER issued in the hub's token file (revoked again if the kubeconfig cannot be written). */
async function tokenOf(
  flags: ParsedFlags,
  cluster: string,
  ttl: number | undefined,
): Promise<{ token: string; issued?: { name: string; store: TokenStore }; note: string }> {
  const given = str(flags, 'token');
  if (given) return { token: given, note: '' };
  const store = await openTokenStore(flags);
  const t = await tokenForKubeconfig(store, cluster, ttl);
  return {
    token: t.token,
    issued: { name: t.name, store },
    note: `; issued token "${t.name}" for ${cluster} in ${tokensFile(flags)}, ${t.expiresAt ? `expires ${t.expiresAt}` : 'never expires'}`,
  };
}

async function checkCluster(flags: ParsedFlags, cluster: string, progress: Progress): Promise<void> {
  if (flags['no-check']) return;
  const admin = adminAddress(flags);
  try {
    const c = await fetchConnections(admin, 3000);
    if (c.agents.some((a) => a.cluster === cluster)) return;
    const known = [...new Set(c.agents.map((a) => a.cluster))].sort();
    throw new UsageError(
      `unknown cluster "${cluster}": no agent of it is connected to the hub (${known.length ? `connected: ${known.join(', ')}` : 'no agent is connected'}); pass --no-check to write the kubeconfig anyway`,
    );
  } catch (err) {
    if (!(err instanceof AdminUnreachable)) throw err;
    progress.line(
      `note: could not check that an agent of "${cluster}" is connected (hub admin ${admin.text} unreachable); writing the kubeconfig anyway`,
    );
  }
}

export async function runKubeconfig(args: string[]): Promise<void> {
  const { flags, positionals } = parseFlags(args, kubeconfigFlags);
  if (flags['help']) {
    process.stdout.write(kubeconfigUsage);
    return;
  }
  if (positionals.length !== 1)
    throw new UsageError('kubeconfig needs exactly one CLUSTER, e.g. "cluster-proxy kubeconfig cluster1 --out cluster1.kubeconfig"');
  const cluster = positionals[0]!;
  if (!isDns1123Subdomain(cluster)) throw new UsageError(`"${cluster}" is not a cluster name (lower-case letters, digits, "-" and ".")`);
  const via = str(flags, 'via')!;
  if (via !== 'connect' && via !== 'forward' && via !== 'gateway')
    throw new UsageError(`--via must be connect, forward or gateway, got "${via}"`);
  if (via !== 'gateway' && str(flags, 'gateway')) throw new UsageError('--gateway works only with --via gateway');
  if (via !== 'gateway' && (str(flags, 'exec-command') !== undefined || list(flags, 'exec-arg').length > 0))
    throw new UsageError("--exec-command works only with --via gateway (the hub authenticates the plugin's credential)");
  if (str(flags, 'exec-command') === undefined && list(flags, 'exec-arg').length > 0)
    throw new UsageError('--exec-arg goes with --exec-command');
  const progress = new Progress();
  const dataDir = str(flags, 'data-dir')!;
  const apiserverCaFile = str(flags, 'apiserver-ca');
  const apiserverCa = apiserverCaFile ? await readPem(apiserverCaFile, '--apiserver-ca') : undefined;
  const context = str(flags, 'context') ?? cluster;
  const out = str(flags, 'out');
  const userToken = str(flags, 'apiserver-token');
  const ttl = ttlSeconds(flags);
  let yaml: string;
  let summary: string;
  let after: string[] = [];
  /** What to try with it (kubectl get --raw drops a server URL's path: not through the gateway). */
  let tryArgs = ['get', '--raw', '/version'];
  const warnings: string[] = []; // printed once the kubeconfig is written
  let issued: { name: string; store: TokenStore } | undefined;

  if (via === 'connect') {
    if (str(flags, 'tls-server-name')) {
      throw new UsageError(
        "--tls-server-name works only with --via forward: kubectl would verify the hub's certificate against that name too",
      );
    }
    const ports = readHubPorts(dataDir);
    const connect = str(flags, 'connect')
      ? hostPort(flags, 'connect')
      : { host: '127.0.0.1', port: typeof ports?.connect === 'number' ? ports.connect : DEFAULT_CONNECT_PORT };
    // The hub CA goes with the apiserver CA; without one, kubectl verifies nothing and cannot take it.
    const hubCaFile = str(flags, 'hub-ca') ?? path.join(dataDir, 'pki', 'ca.crt');
    const hubCa = apiserverCa
      ? await readPem(
          hubCaFile,
          str(flags, 'hub-ca') ? '--hub-ca' : 'the hub CA',
          str(flags, 'hub-ca') ? '' : " (pass --hub-ca FILE or the hub's --data-dir)",
        )
      : undefined;
    await checkCluster(flags, cluster, progress);
    const t = await tokenOf(flags, cluster, ttl);
    issued = t.issued;
    const token = t.token;
    const user = str(flags, 'user') ?? t.issued?.name ?? 'cluster-proxy';
    const expiry = t.note;
    yaml = buildKubeconfig({
      cluster,
      context,
      server: `https://${cluster}`,
      proxyUrl: proxyUrl(user, token, connect.host, connect.port),
      userToken,
      caPems: apiserverCa && hubCa ? [hubCa, apiserverCa] : [],
    });
    if (!apiserverCa) {
      warnings.push(
        'no --apiserver-ca: the kubeconfig has insecure-skip-tls-verify: true, and kubectl then verifies neither the apiserver nor the hub (Go uses one TLS config for both); pass --apiserver-ca FILE to verify both',
      );
    }
    summary = `cluster ${cluster} via the hub's CONNECT frontend ${connect.host}:${connect.port}${expiry}`;
  } else if (via === 'gateway') {
    // The gateway authenticates the token and the agent brings its own apiserver credentials and CA.
    for (const f of ['apiserver-ca', 'apiserver-token', 'tls-server-name', 'user'] as const) {
      if (str(flags, f))
        throw new UsageError(
          `--${f} does not apply to --via gateway: the hub authenticates the token, and the agent calls the apiserver with its own credentials as that user`,
        );
    }
    const ports = readHubPorts(dataDir);
    if (!str(flags, 'gateway') && typeof ports?.gateway !== 'number') {
      throw new UsageError(
        `no gateway port in ${path.join(dataDir, 'ports.json')}: start the hub with --gateway-port, or pass --gateway HOST:PORT`,
      );
    }
    const gateway = str(flags, 'gateway') ? hostPort(flags, 'gateway') : { host: '127.0.0.1', port: ports!.gateway! };
    const hubCaFile = str(flags, 'hub-ca') ?? path.join(dataDir, 'pki', 'ca.crt');
    const hubCa = await readPem(
      hubCaFile,
      str(flags, 'hub-ca') ? '--hub-ca' : 'the hub CA',
      str(flags, 'hub-ca') ? '' : " (pass --hub-ca FILE or the hub's --data-dir)",
    );
    await checkCluster(flags, cluster, progress);
    // A credential plugin (an OIDC login, say) brings the user's own credential: no hub token then.
    const execCommand = str(flags, 'exec-command');
    if (execCommand !== undefined && str(flags, 'token')) throw new UsageError('--exec-command and --token are two credentials: give one');
    const t = execCommand === undefined ? await tokenOf(flags, cluster, ttl) : null;
    issued = t?.issued;
    const expiry = t?.issued ? `${t.note}; the cluster sees user "cluster-proxy:token:${t.issued.name}"` : '';
    const h = gateway.host.includes(':') ? `[${gateway.host}]` : gateway.host;
    // The hub's certificate names localhost, not 127.0.0.1, in a local hub's PKI.
    const tlsServerName = gateway.host === '127.0.0.1' || gateway.host === '::1' ? 'localhost' : undefined;
    yaml = buildKubeconfig({
      cluster,
      context,
      server: `https://${h}:${gateway.port}/${cluster}`,
      caPems: [hubCa],
      tlsServerName,
      ...(execCommand !== undefined ? { exec: { command: execCommand, args: list(flags, 'exec-arg') } } : { userToken: t!.token }),
    });
    summary = `cluster ${cluster} via the hub's HTTP gateway ${h}:${gateway.port}${expiry}`;
    tryArgs = ['version'];
  } else {
    const listen = hostPort(flags, 'listen');
    if (str(flags, 'token'))
      throw new UsageError('--token works only with --via connect (a forward authenticates with a client certificate)');
    await checkCluster(flags, cluster, progress);
    const h = listen.host.includes(':') ? `[${listen.host}]` : listen.host;
    const serverName = str(flags, 'tls-server-name') ?? cluster;
    yaml = buildKubeconfig({
      cluster,
      context,
      server: `https://${h}:${listen.port}`,
      userToken,
      caPems: apiserverCa ? [apiserverCa] : [],
      tlsServerName: apiserverCa ? serverName : undefined,
    });
    if (!apiserverCa)
      warnings.push(
        'no --apiserver-ca: the kubeconfig has insecure-skip-tls-verify: true (the apiserver is not verified; the forward itself uses mTLS to the hub)',
      );
    summary = `cluster ${cluster} via a local forward on ${h}:${listen.port}`;
    const ports = readHubPorts(dataDir);
    const pki = path.resolve(dataDir, 'pki');
    after = [
      'Start the forward it uses (keep it running):',
      `  ${shellCommand([
        ...cliWords(),
        'forward',
        cluster,
        `${cluster}:443`,
        '--listen',
        `${h}:${listen.port}`,
        '--frontend',
        `127.0.0.1:${typeof ports?.frontend === 'number' ? ports.frontend : 8090}`,
        '--server-name',
        'localhost',
        '--ca-cert',
        path.join(pki, 'ca.crt'),
        '--cert',
        path.join(pki, 'client.crt'),
        '--key',
        path.join(pki, 'client.key'),
      ])}`,
    ];
  }

  if (!out) {
    process.stdout.write(yaml);
    progress.line(`kubeconfig for ${summary}.`);
  } else {
    // It holds a token: written 0600 under a temporary name, then renamed over any older file.
    const tmp = `${out}.${randomBytes(4).toString('hex')}.tmp`;
    try {
      await mkdir(path.dirname(path.resolve(out)), { recursive: true });
      await writeFile(tmp, yaml, { mode: 0o600, flag: 'wx' });
      await rename(tmp, out);
    } catch (err) {
      await rm(tmp, { force: true }).catch(() => undefined);
      if (issued) await issued.store.revoke(issued.name).catch(() => undefined);
      throw new UsageError(`cannot write --out ${out}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    progress.line(`Wrote ${out}: ${summary}.`);
  }
  for (const w of warnings) progress.warn(w);
  if (!userToken && via !== 'gateway')
    progress.line(
      'note: the kubeconfig has no apiserver credentials, so kubectl asks for a username; add them with --apiserver-token or "kubectl config set-credentials"',
    );
  for (const l of after) progress.line(l);
  progress.line(`Try: ${shellCommand(['kubectl', '--kubeconfig', out ?? 'FILE', ...tryArgs])}`);
}
