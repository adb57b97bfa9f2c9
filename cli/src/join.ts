// `cluster-proxy join CLUSTER`: registers a managed cluster with the hub (ManagedCluster + a single-use,
// expiring bootstrap token) and writes the agent's bootstrap bundle and install manifests.
// `cluster-proxy delete cluster NAME`: removes it again, which revokes its agents.
import { chmod, mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { JoinRequest, JoinResponse } from '@cluster-proxy/server';
import { UsageError, duration, helpText, parseFlags, str, type FlagSpecs } from './flags.js';
import { AdminRequestError, adminAddress, adminFlag, adminRequest, hubDataDirFlags } from './hub-files.js';

const joinFlags: FlagSpecs = {
  out: { type: 'string', help: 'directory for the bundle (default ./CLUSTER-bootstrap)' },
  namespace: {
    type: 'string',
    default: 'open-cluster-management-agent-addon',
    help: "the agent's install namespace in the managed cluster",
  },
  'token-ttl': { type: 'string', default: '1h', help: 'how long the single-use bootstrap token stays valid' },
  'agent-entrypoint': { type: 'string', help: "HOST:PORT agents dial (default: the hub's --agent-entrypoint)" },
  'server-name': { type: 'string', help: 'TLS name agents verify on the hub certificate' },
  image: { type: 'string', help: "agent container image (default: the hub's --agent-image)" },
  replicas: { type: 'string', default: '1', help: 'agent Deployment replicas' },
  'pod-cidr': { type: 'string', help: "the cluster's pod CIDR (joins NO_PROXY when a proxy is configured)" },
  'service-cidr': { type: 'string', help: "the cluster's service CIDR (joins NO_PROXY)" },
  'cluster-domain': { type: 'string', help: "the cluster's DNS domain (default cluster.local)" },
  'apiserver-ip': { type: 'string', help: "the cluster's apiserver service IP (joins NO_PROXY)" },
  ...adminFlag,
  'data-dir': hubDataDirFlags['data-dir']!,
};

export const joinUsage = helpText(
  'cluster-proxy join CLUSTER [--out DIR] [flags]',
  "Registers CLUSTER with the hub (run on the hub's machine: it uses the loopback admin endpoint) and writes ca.crt, bootstrap-token and manifests.yaml for its agent.",
  joinFlags,
);

export async function runJoin(args: string[]): Promise<void> {
  const { flags, positionals } = parseFlags(args, joinFlags);
  if (flags['help']) {
    process.stdout.write(joinUsage);
    return;
  }
  if (positionals.length !== 1)
    throw new UsageError(`join takes one CLUSTER name, got ${positionals.length === 0 ? 'none' : `"${positionals.join(' ')}"`}`);
  const cluster = positionals[0]!;
  const replicas = Number(str(flags, 'replicas'));
  if (!Number.isInteger(replicas) || replicas < 1 || replicas > 10) throw new UsageError('--replicas must be a whole number from 1 to 10');
  const request: JoinRequest = {
    cluster,
    installNamespace: str(flags, 'namespace'),
    tokenTtlSeconds: Math.round(duration(flags, 'token-ttl') / 1000),
    agentEntrypoint: str(flags, 'agent-entrypoint'),
    serverName: str(flags, 'server-name'),
    image: str(flags, 'image'),
    agentReplicas: replicas,
    podCidr: str(flags, 'pod-cidr'),
    serviceCidr: str(flags, 'service-cidr'),
    clusterDomain: str(flags, 'cluster-domain'),
    apiserverIp: str(flags, 'apiserver-ip'),
  };
  if (request.tokenTtlSeconds! < 60) throw new UsageError('--token-ttl must be at least 1m');
  let answer: JoinResponse;
  try {
    answer = (await adminRequest(adminAddress(flags), 'POST', '/v1/clusters', request)) as JoinResponse;
  } catch (err) {
    if (err instanceof AdminRequestError && err.status < 500) throw new UsageError(`cannot join ${cluster}: ${err.message}`);
    throw err;
  }
  const out = path.resolve(str(flags, 'out') ?? `${cluster}-bootstrap`);
  await mkdir(out, { recursive: true, mode: 0o700 });
  await writeFile(path.join(out, 'ca.crt'), answer.caBundle);
  // The token is a credential: owner-only, and never printed.
  const tokenFile = path.join(out, 'bootstrap-token');
  await writeFile(tokenFile, `${answer.bootstrapToken}\n`, { mode: 0o600 });
  await chmod(tokenFile, 0o600);
  await writeFile(path.join(out, 'manifests.yaml'), answer.manifests, { mode: 0o600 });
  const rel = (f: string): string => path.relative(process.cwd(), path.join(out, f)) || '.';
  const hub = answer.agentEntrypoint;
  process.stdout.write(
    [
      `${answer.existed ? 'Cluster' : 'Registered cluster'} ${cluster}${answer.existed ? ' was already registered; issued a new bootstrap token' : ''}.`,
      `Bootstrap token: single use, valid until ${answer.tokenExpiresAt} (in ${rel('bootstrap-token')}, not shown).`,
      `Bundle: ${rel('ca.crt')}, ${rel('bootstrap-token')}, ${rel('manifests.yaml')}`,
      '',
      'Install the agent in the managed cluster:',
      `  kubectl apply -f ${rel('manifests.yaml')}`,
      '',
      'Or run the agent on this machine (it creates its key locally and exchanges the token for a certificate):',
      `  cluster-proxy agent --cluster ${cluster} --hub ${hub}${answer.serverName ? ` --server-name ${answer.serverName}` : ''} --ca-cert ${rel('ca.crt')} --bootstrap-token-file ${rel('bootstrap-token')} --credentials-dir ${rel('credentials')} --apiserver HOST:PORT`,
      '',
      'Then watch its health:',
      '  cluster-proxy get managedclusteraddons -A',
      '',
    ].join('\n'),
  );
}

const deleteFlags: FlagSpecs = { ...adminFlag, 'data-dir': hubDataDirFlags['data-dir']! };

export const deleteUsage = helpText(
  'cluster-proxy delete cluster NAME',
  "Removes a managed cluster from the hub: its agents' tunnels are closed and their certificates no longer admitted.",
  deleteFlags,
);

export async function runDelete(args: string[]): Promise<void> {
  const { flags, positionals } = parseFlags(args, deleteFlags);
  if (flags['help']) {
    process.stdout.write(deleteUsage);
    return;
  }
  const [what, name, ...extra] = positionals;
  if (!what || !['cluster', 'clusters', 'managedcluster', 'managedclusters'].includes(what.toLowerCase()))
    throw new UsageError('delete takes "cluster NAME"');
  if (!name || extra.length > 0) throw new UsageError('delete cluster takes exactly one NAME');
  try {
    await adminRequest(adminAddress(flags), 'DELETE', `/v1/clusters/${encodeURIComponent(name)}`);
  } catch (err) {
    if (err instanceof AdminRequestError && err.status === 404) throw new UsageError(`cluster "${name}" is not registered`);
    throw err;
  }
  process.stdout.write(`managedcluster.cluster.open-cluster-management.io/${name} deleted; its agents are revoked\n`);
}
