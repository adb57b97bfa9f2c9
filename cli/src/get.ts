// `cluster-proxy get clusters|agents|managedclusters|managedclusteraddons [NAME] [-o wide|json|yaml]`:
// kubectl-style views from the hub's loopback admin endpoint: the connection table (GET /debug/connections)
// for clusters and agents, the addon manager's objects (GET /v1/...) for the other two.
import { UsageError, helpText, parseFlags, str, type FlagSpecs, type ParsedFlags } from './flags.js';
import {
  adminAddress,
  adminFlag,
  adminRequest,
  fetchConnections,
  hubDataDirFlags,
  type AgentRow,
  type HubConnections,
} from './hub-files.js';
import { table } from './ui.js';
import { stringify as stringifyYaml } from 'yaml';
import type { AddonWideInfo, Condition, ManagedCluster, ManagedClusterAddOn } from '@cluster-proxy/server';
import { toKubectlYaml as toYaml, type YamlValue } from '@cluster-proxy/server';

const getFlags: FlagSpecs = {
  output: { type: 'string', short: 'o', help: 'wide, json or yaml (default: a table)' },
  'all-namespaces': {
    type: 'boolean',
    short: 'A',
    help: "all namespaces (the default: each ManagedClusterAddOn lives in its cluster's namespace; clusters and agents are not namespaced)",
  },
  'no-headers': { type: 'boolean', help: 'omit the table header' },
  ...adminFlag,
  'data-dir': hubDataDirFlags['data-dir']!,
};

export const getUsage = helpText(
  'cluster-proxy get clusters|agents|managedclusters|managedclusteraddons [NAME] [-o wide|json|yaml] [--admin HOST:PORT]',
  "Prints the clusters that have agents connected to the hub, the agents themselves, the registered ManagedClusters, or each cluster's ManagedClusterAddOn health (AVAILABLE, DEGRADED, PROGRESSING; -o wide adds lease age, servers, agent version), from the hub's loopback admin endpoint (run it on the hub's machine).",
  getFlags,
);

type Resource = 'clusters' | 'agents' | 'managedclusteraddons' | 'managedclusters';

const RESOURCES: Record<string, Resource> = {
  cluster: 'clusters',
  clusters: 'clusters',
  agent: 'agents',
  agents: 'agents',
  managedclusteraddon: 'managedclusteraddons',
  managedclusteraddons: 'managedclusteraddons',
  mca: 'managedclusteraddons',
  managedcluster: 'managedclusters',
  managedclusters: 'managedclusters',
  mcl: 'managedclusters',
};

export interface ClusterItem {
  name: string;
  agents: number;
  available: boolean;
  connections: number;
  pending: number;
  hosts: string[];
  agentIDs: string[];
}

export interface AgentItem {
  agentID: string;
  cluster: string;
  status: 'Connected' | 'Draining';
  connections: number;
  pending: number;
  hosts: string[];
  serverID: string;
}

export function clusterItems(c: HubConnections): ClusterItem[] {
  const byName = new Map<string, AgentRow[]>();
  for (const a of c.agents) byName.set(a.cluster, [...(byName.get(a.cluster) ?? []), a]);
  return [...byName.entries()]
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([name, agents]) => ({
      name,
      agents: agents.length,
      available: agents.some((a) => !a.draining),
      connections: agents.reduce((n, a) => n + a.established.length, 0),
      pending: agents.reduce((n, a) => n + a.pending, 0),
      hosts: [...new Set(agents.flatMap((a) => a.hosts))].sort(),
      agentIDs: agents.map((a) => a.agentID).sort(),
    }));
}

export function agentItems(c: HubConnections): AgentItem[] {
  return c.agents
    .map(
      (a): AgentItem => ({
        agentID: a.agentID,
        cluster: a.cluster,
        status: a.draining ? 'Draining' : 'Connected',
        connections: a.established.length,
        pending: a.pending,
        hosts: [...a.hosts].sort(),
        serverID: c.serverID,
      }),
    )
    .sort((a, b) => a.cluster.localeCompare(b.cluster) || a.agentID.localeCompare(b.agentID));
}

function render(
  resource: 'clusters' | 'agents',
  c: HubConnections,
  name: string | undefined,
  format: string | undefined,
  noHeaders: boolean,
): string {
  const items = resource === 'clusters' ? clusterItems(c) : agentItems(c);
  const chosen =
    name === undefined
      ? items
      : items.filter((i) => ('name' in i ? i.name : i.agentID) === name || (resource === 'agents' && (i as AgentItem).cluster === name));
  if (name !== undefined && chosen.length === 0) {
    const what = resource === 'clusters' ? 'cluster' : 'agent';
    throw new Error(
      `${what} "${name}" not found: no agent${resource === 'agents' ? ' with that ID or cluster' : ' of that cluster'} is connected to the hub`,
    );
  }
  const kind = resource === 'clusters' ? 'ClusterList' : 'AgentList';
  if (format === 'json') return `${JSON.stringify({ kind, serverID: c.serverID, items: chosen }, null, 2)}\n`;
  if (format === 'yaml') return toYaml({ kind, serverID: c.serverID, items: chosen } as unknown as YamlValue);
  if (chosen.length === 0) return '';
  const wide = format === 'wide';
  let headers: string[];
  let rows: string[][];
  if (resource === 'clusters') {
    headers = ['NAME', 'AGENTS', 'AVAILABLE', 'CONNECTIONS', 'PENDING', ...(wide ? ['HOSTS', 'AGENT IDS'] : [])];
    rows = (chosen as ClusterItem[]).map((i) => [
      i.name,
      String(i.agents),
      i.available ? 'True' : 'False',
      String(i.connections),
      String(i.pending),
      ...(wide ? [i.hosts.join(',') || '<none>', i.agentIDs.join(',')] : []),
    ]);
  } else {
    headers = ['CLUSTER', 'AGENT ID', 'STATUS', 'CONNECTIONS', 'PENDING', ...(wide ? ['HOSTS', 'SERVER'] : [])];
    rows = (chosen as AgentItem[]).map((i) => [
      i.cluster,
      i.agentID,
      i.status,
      String(i.connections),
      String(i.pending),
      ...(wide ? [i.hosts.join(',') || '<none>', i.serverID] : []),
    ]);
  }
  const out = table(headers, rows);
  return noHeaders ? out.slice(out.indexOf('\n') + 1) : out;
}

function outputFormat(flags: ParsedFlags): string | undefined {
  const o = str(flags, 'output');
  if (o !== undefined && !['wide', 'json', 'yaml'].includes(o)) throw new UsageError(`-o must be wide, json or yaml, got "${o}"`);
  return o;
}

export async function runGet(args: string[]): Promise<void> {
  const { flags, positionals } = parseFlags(args, getFlags);
  if (flags['help']) {
    process.stdout.write(getUsage);
    return;
  }
  const [what, name, ...extra] = positionals;
  if (!what) throw new UsageError('get needs a resource: clusters, agents, managedclusters or managedclusteraddons');
  const resource = RESOURCES[what.toLowerCase()];
  if (!resource) throw new UsageError(`unknown resource "${what}"; use clusters, agents, managedclusters or managedclusteraddons`);
  if (extra.length > 0) throw new UsageError(`get ${resource} takes at most one NAME, got "${positionals.slice(1).join(' ')}"`);
  const format = outputFormat(flags);
  const admin = adminAddress(flags);
  if (resource === 'managedclusteraddons' || resource === 'managedclusters') {
    const out = await renderHubObjects(resource, admin, name, format, flags['no-headers'] === true);
    if (out === '') process.stderr.write('No resources found.\n');
    else process.stdout.write(out);
    return;
  }
  const c = await fetchConnections(admin);
  const out = render(resource, c, name, format, flags['no-headers'] === true);
  if (out === '') process.stderr.write('No resources found.\n');
  else process.stdout.write(out);
}

interface ObjectList<T> {
  items: T[];
  wide?: Record<string, AddonWideInfo>;
}

/** kubectl-style age: 45s, 3m, 5h, 2d. */
export function age(fromIso: string | null | undefined, now = Date.now()): string {
  const t = Date.parse(fromIso ?? '');
  if (!Number.isFinite(t)) return '<none>';
  const s = Math.max(0, Math.floor((now - t) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 172_800) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86_400)}d`;
}

function conditionStatus(obj: { status?: { conditions?: Condition[] } }, type: string): string {
  return obj.status?.conditions?.find((c) => c.type === type)?.status ?? '';
}

/** ManagedClusterAddOns (all namespaces: the addon lives in each cluster's namespace) and ManagedClusters, from the hub's admin API. */
async function renderHubObjects(
  resource: 'managedclusteraddons' | 'managedclusters',
  admin: { host: string; port: number; text: string },
  name: string | undefined,
  format: string | undefined,
  noHeaders: boolean,
): Promise<string> {
  const list = (await adminRequest(admin, 'GET', `/v1/${resource}`)) as ObjectList<ManagedClusterAddOn | ManagedCluster>;
  let items = list.items;
  if (name !== undefined) {
    items = items.filter((o) =>
      resource === 'managedclusteraddons' ? o.metadata.namespace === name || o.metadata.name === name : o.metadata.name === name,
    );
    if (items.length === 0)
      throw new Error(`${resource === 'managedclusters' ? 'managedcluster' : 'managedclusteraddon'} "${name}" not found`);
  }
  const doc = { apiVersion: 'v1', kind: 'List', items };
  if (format === 'json') return `${JSON.stringify(doc, null, 2)}\n`;
  if (format === 'yaml') return stringifyYaml(doc);
  if (items.length === 0) return '';
  let out: string;
  if (resource === 'managedclusters') {
    out = table(
      ['NAME', 'HUB ACCEPTED', 'AGE'],
      (items as ManagedCluster[]).map((m) => [m.metadata.name, String(m.spec.hubAcceptsClient), age(m.metadata.creationTimestamp)]),
    );
  } else {
    const wide = format === 'wide';
    out = table(
      ['NAMESPACE', 'NAME', 'AVAILABLE', 'DEGRADED', 'PROGRESSING', ...(wide ? ['LEASE AGE', 'SERVERS', 'AGENT VERSION'] : [])],
      (items as ManagedClusterAddOn[]).map((a) => {
        const w = list.wide?.[`${a.metadata.namespace}/${a.metadata.name}`];
        return [
          a.metadata.namespace ?? '',
          a.metadata.name,
          conditionStatus(a, 'Available'),
          conditionStatus(a, 'Degraded'),
          conditionStatus(a, 'Progressing'),
          ...(wide
            ? [
                age(w?.leaseRenewTime),
                w?.serverCount != null ? `${w.connectedServers}/${w.serverCount}` : '<none>',
                w?.agentVersion ?? '<none>',
              ]
            : []),
        ];
      }),
    );
  }
  return noHeaders ? out.slice(out.indexOf('\n') + 1) : out;
}
