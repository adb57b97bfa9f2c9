/**
 * Agent identity: how an agent's client certificate names the one managed cluster it serves.
 *
 * We use Open Cluster Management's addon-agent user naming, so a certificate issued by OCM's
 * addon framework for the cluster-proxy addon and one issued by this module look the same to
 * the hub:
 *
 *   CN = system:open-cluster-management:cluster:<cluster>:addon:cluster-proxy:agent:<agentName>
 *   O  = system:open-cluster-management:cluster:<cluster>:addon:cluster-proxy
 *
 * The hub never trusts a cluster name the agent merely claims on the wire; it takes it from the
 * verified certificate subject via `clusterFromSubject`.
 */

export const AGENT_ADDON_NAME = 'cluster-proxy';
export const DEFAULT_AGENT_NAME = 'proxy-agent';

const CLUSTER_PREFIX = 'system:open-cluster-management:cluster:';
const DNS1123_SUBDOMAIN_MAX = 253;
// Kubernetes' DNS-1123 subdomain: dot-separated labels of lowercase alphanumerics and '-',
// each starting and ending with an alphanumeric. No ':' can appear, which is what makes the
// colon-separated CN unambiguous to parse.
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const AGENT_CN = new RegExp(`^${escapeRegExp(CLUSTER_PREFIX)}([^:]+):addon:${escapeRegExp(AGENT_ADDON_NAME)}:agent:([^:]+)$`);

/** Subject attribute values as Node's `tls.PeerCertificate.subject` presents them. */
export interface SubjectLike {
  CN?: string | string[];
  O?: string | string[];
}

export interface AgentIdentity {
  cluster: string;
  agentName: string;
}

export function isDns1123Subdomain(value: string): boolean {
  return value.length > 0 && value.length <= DNS1123_SUBDOMAIN_MAX && DNS1123_SUBDOMAIN.test(value);
}

/** Throws a one-line error unless `value` is a DNS-1123 subdomain; `what` names it in the message. */
export function assertDns1123Subdomain(value: string, what: string): void {
  if (typeof value !== 'string' || !isDns1123Subdomain(value)) {
    throw new Error(
      `invalid ${what} ${JSON.stringify(value)}: must be a DNS-1123 subdomain ` +
        `(lowercase letters, digits, '-' and '.', starting and ending alphanumeric, at most ${DNS1123_SUBDOMAIN_MAX} characters)`,
    );
  }
}

/** The O value that groups every agent of one cluster for this addon. */
export function agentGroup(cluster: string): string {
  return `${CLUSTER_PREFIX}${cluster}:addon:${AGENT_ADDON_NAME}`;
}

export function agentSubject(cluster: string, agentName: string = DEFAULT_AGENT_NAME): { commonName: string; organization: string } {
  assertDns1123Subdomain(cluster, 'cluster name');
  assertDns1123Subdomain(agentName, 'agent name');
  return {
    commonName: `${agentGroup(cluster)}:agent:${agentName}`,
    organization: agentGroup(cluster),
  };
}

/**
 * Returns the cluster an agent certificate is bound to, or null if the subject is not an agent
 * subject. Requires exactly one CN of the agent form and an O naming the same cluster. Extra O
 * values are tolerated (OCM adds e.g. `system:authenticated`), but an O that scopes the
 * certificate to a *different* cluster makes it ambiguous and it is rejected.
 */
export function clusterFromSubject(subject: SubjectLike | undefined | null): AgentIdentity | null {
  if (!subject) return null;
  const cns = values(subject.CN);
  if (cns.length !== 1) return null;
  const match = AGENT_CN.exec(cns[0]!);
  if (!match) return null;
  const cluster = match[1]!;
  const agentName = match[2]!;
  if (!isDns1123Subdomain(cluster) || !isDns1123Subdomain(agentName)) return null;

  const orgs = values(subject.O);
  if (!orgs.includes(agentGroup(cluster))) return null;
  const ownClusterPrefix = `${CLUSTER_PREFIX}${cluster}:`;
  if (orgs.some((o) => o.startsWith(CLUSTER_PREFIX) && !o.startsWith(ownClusterPrefix))) return null;

  return { cluster, agentName };
}

export function isAgentSubject(subject: SubjectLike | undefined | null): boolean {
  return clusterFromSubject(subject) !== null;
}

// Node gives a string for a single-valued attribute and an array when it repeats. Anything else
// (missing, or an array holding a non-string) counts as no value, so it can never match.
function values(v: string | string[] | undefined): string[] {
  if (typeof v === 'string') return [v];
  if (Array.isArray(v) && v.every((x) => typeof x === 'string')) return v;
  return [];
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
