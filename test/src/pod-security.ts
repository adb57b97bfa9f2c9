// Admission rules a pod of ours must pass, as the admission controllers judge a pod spec:
//   - Kubernetes' Pod Security Standard `restricted` (k8s.io/pod-security-admission, policy checks of
//     the baseline and restricted levels, latest version);
//   - OpenShift's `restricted-v2` SecurityContextConstraints (the default for authenticated users since
//     OpenShift 4.11): runAsUser MustRunAsRange and fsGroup MustRunAs over the namespace's range (a fixed ID
//     outside it is refused), no privilege escalation, ALL capabilities dropped (NET_BIND_SERVICE may be
//     added), seccomp runtime/default, and its volume types;
//   - ours on top: a read-only root filesystem in every container.
// What it cannot show: mutation by the admission chain (OpenShift fills in the UID and SELinux level), and
// the container runtime's view of the image's USER.

export interface PodSpecLike {
  hostNetwork?: boolean;
  hostPID?: boolean;
  hostIPC?: boolean;
  securityContext?: SecurityContextLike & { fsGroup?: number; supplementalGroups?: number[]; sysctls?: { name: string }[] };
  containers: ContainerLike[];
  initContainers?: ContainerLike[];
  volumes?: Record<string, unknown>[];
}
interface SecurityContextLike {
  runAsNonRoot?: boolean;
  runAsUser?: number;
  runAsGroup?: number;
  seccompProfile?: { type: string };
  seLinuxOptions?: { type?: string };
}
interface ContainerLike {
  name: string;
  ports?: { hostPort?: number }[];
  securityContext?: SecurityContextLike & {
    privileged?: boolean;
    allowPrivilegeEscalation?: boolean;
    readOnlyRootFilesystem?: boolean;
    capabilities?: { add?: string[]; drop?: string[] };
    procMount?: string;
  };
}

const RESTRICTED_VOLUMES = ['configMap', 'csi', 'downwardAPI', 'emptyDir', 'ephemeral', 'persistentVolumeClaim', 'projected', 'secret'];
const SAFE_SYSCTLS = new Set([
  'kernel.shm_rmid_forced',
  'net.ipv4.ip_local_port_range',
  'net.ipv4.ip_unprivileged_port_start',
  'net.ipv4.tcp_syncookies',
  'net.ipv4.ping_group_range',
  'net.ipv4.ip_local_reserved_ports',
  'net.ipv4.tcp_keepalive_time',
  'net.ipv4.tcp_fin_timeout',
  'net.ipv4.tcp_keepalive_intvl',
  'net.ipv4.tcp_keepalive_probes',
]);

const containersOf = (p: PodSpecLike): ContainerLike[] => [...(p.initContainers ?? []), ...p.containers];
const volumeType = (v: Record<string, unknown>): string => Object.keys(v).find((k) => k !== 'name') ?? '';

/** Violations of the `restricted` Pod Security Standard (baseline checks included). */
export function restrictedProblems(p: PodSpecLike): string[] {
  const out: string[] = [];
  if (p.hostNetwork || p.hostPID || p.hostIPC) out.push('host namespaces');
  for (const s of p.securityContext?.sysctls ?? []) if (!SAFE_SYSCTLS.has(s.name)) out.push(`unsafe sysctl ${s.name}`);
  for (const v of p.volumes ?? [])
    if (!RESTRICTED_VOLUMES.includes(volumeType(v))) out.push(`volume ${String(v['name'])}: type ${volumeType(v)} not allowed`);
  const podSc = p.securityContext ?? {};
  if (podSc.runAsUser === 0) out.push('pod runAsUser 0');
  if (podSc.seccompProfile && !['RuntimeDefault', 'Localhost'].includes(podSc.seccompProfile.type))
    out.push(`pod seccompProfile ${podSc.seccompProfile.type}`);
  for (const c of containersOf(p)) {
    const sc = c.securityContext ?? {};
    const where = `container ${c.name}`;
    if (sc.privileged) out.push(`${where}: privileged`);
    if ((c.ports ?? []).some((x) => (x.hostPort ?? 0) !== 0)) out.push(`${where}: hostPort`);
    if (sc.procMount && sc.procMount !== 'Default') out.push(`${where}: procMount ${sc.procMount}`);
    if (sc.allowPrivilegeEscalation !== false) out.push(`${where}: allowPrivilegeEscalation must be false`);
    if (sc.runAsNonRoot !== true && podSc.runAsNonRoot !== true) out.push(`${where}: runAsNonRoot must be true`);
    if (sc.runAsNonRoot === false) out.push(`${where}: runAsNonRoot false`);
    if (sc.runAsUser === 0) out.push(`${where}: runAsUser 0`);
    const seccomp = sc.seccompProfile?.type ?? podSc.seccompProfile?.type;
    if (seccomp !== 'RuntimeDefault' && seccomp !== 'Localhost') out.push(`${where}: seccompProfile must be RuntimeDefault or Localhost`);
    if (!(sc.capabilities?.drop ?? []).includes('ALL')) out.push(`${where}: capabilities must drop ALL`);
    for (const cap of sc.capabilities?.add ?? []) if (cap !== 'NET_BIND_SERVICE') out.push(`${where}: capability ${cap} added`);
  }
  return out;
}

/** Violations of OpenShift's restricted-v2 SCC for a namespace whose UID (and group) range starts at `rangeStart`. */
export function restrictedV2Problems(
  p: PodSpecLike,
  range: { start: number; size: number } = { start: 1000770000, size: 10000 },
): string[] {
  const out: string[] = [];
  const inRange = (id: number): boolean => id >= range.start && id < range.start + range.size;
  if (p.hostNetwork || p.hostPID || p.hostIPC) out.push('host namespaces');
  for (const v of p.volumes ?? [])
    if (!RESTRICTED_VOLUMES.includes(volumeType(v))) out.push(`volume ${String(v['name'])}: type ${volumeType(v)} not allowed`);
  const podSc = p.securityContext ?? {};
  if (podSc.runAsUser !== undefined && !inRange(podSc.runAsUser))
    out.push(`pod runAsUser ${podSc.runAsUser} is not in the namespace's range ${range.start}-${range.start + range.size - 1}`);
  if (podSc.fsGroup !== undefined && !inRange(podSc.fsGroup)) out.push(`pod fsGroup ${podSc.fsGroup} is not in the namespace's range`);
  if (podSc.seccompProfile && podSc.seccompProfile.type !== 'RuntimeDefault') out.push(`pod seccompProfile ${podSc.seccompProfile.type}`);
  for (const c of containersOf(p)) {
    const sc = c.securityContext ?? {};
    const where = `container ${c.name}`;
    if (sc.privileged) out.push(`${where}: privileged`);
    if ((c.ports ?? []).some((x) => (x.hostPort ?? 0) !== 0)) out.push(`${where}: hostPort`);
    if (sc.allowPrivilegeEscalation !== false) out.push(`${where}: allowPrivilegeEscalation must be false`);
    if (sc.runAsUser !== undefined && !inRange(sc.runAsUser))
      out.push(`${where}: runAsUser ${sc.runAsUser} is not in the namespace's range`);
    if (sc.seccompProfile && sc.seccompProfile.type !== 'RuntimeDefault') out.push(`${where}: seccompProfile ${sc.seccompProfile.type}`);
    if (!(sc.capabilities?.drop ?? []).includes('ALL')) out.push(`${where}: capabilities must drop ALL`);
    for (const cap of sc.capabilities?.add ?? []) if (cap !== 'NET_BIND_SERVICE') out.push(`${where}: capability ${cap} added`);
    if (sc.readOnlyRootFilesystem !== true) out.push(`${where}: readOnlyRootFilesystem must be true (ours)`);
  }
  return out;
}
