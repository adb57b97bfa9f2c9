// The paths a client can take to a target, in two network settings:
//   lan:   direct      = client → target
//          ssh         = client → sshd -R port → ssh → target
//          tunnel      = client → hub frontend (SDK Tunnel, our framed "mux" transport) → hub → agent (mux) → target
//          tunnel-grpc = client → hub frontend (SDK Tunnel, transport 'grpc') → hub → agent (--transport grpc) → target:
//                        the ANP-compatible path (konnectivity-client and ANP agents speak this)
//          connect     = client → hub's HTTP CONNECT port (TLS, client certificate) → hub → agent (mux) → target
//          forward     = client → `cluster-proxy forward` (a local port, one process per target) → SDK mux → hub → agent (mux) → target
//   rtt20: the same with a 20 ms RTT latency relay on the link a tunnel would cross: between
//          client and target (direct), ssh and sshd (ssh), agent and hub (the tunnel paths).
//
// `tunnel` and `connect` share one hub + mux agent per network; `tunnel-grpc` has its own hub +
// gRPC agent (both agents serve 127.0.0.0/8, so one hub could not tell which should get a dial).
// The scale scenarios get fresh processes (scaleConns/scaleAgents), so earlier measurements'
// heaps do not hide or inflate what 10,000 connections cost.
import type { Duplex } from 'node:stream';
import { createPki } from '../harness.js';
import type { CleanupStack, LogFn } from './cleanup.js';
import { openClient, type Client, type ClientSpec, type TlsFiles } from './clients.js';
import { startBenchHub, startCluster, type AgentTransport, type BenchCluster, type ProcessOptions } from './cluster.js';
import type { PathProcesses } from './cpu.js';
import { startRelays, startTargets, type TargetName, type TargetPorts } from './helpers.js';
import { errorMessage, Pinger } from './io.js';
import { removeOnDeath } from './reaper.js';
import { findSshTools, startSshd, startSshTunnel, type Sshd, type SshTools } from './sshd.js';

export type PathName = 'direct' | 'ssh' | 'tunnel' | 'tunnel-grpc' | 'connect' | 'forward';
export const PATH_NAMES: readonly PathName[] = ['direct', 'ssh', 'tunnel', 'tunnel-grpc', 'connect', 'forward'];
export const PATH_LABELS: Readonly<Record<PathName, string>> = {
  direct: 'direct',
  ssh: 'ssh -R',
  tunnel: 'tunnel',
  'tunnel-grpc': 'tunnel-grpc',
  connect: 'connect',
  forward: 'forward',
};
/** Our paths: the ones the goals of docs/goals.md are checked for (forward has its own goal: against the SDK path). */
export const OUR_PATHS: readonly PathName[] = ['tunnel', 'tunnel-grpc', 'connect'];
/** The columns of the goals table. */
export const GOAL_PATHS: readonly PathName[] = ['tunnel', 'tunnel-grpc', 'connect', 'forward'];

export type Network = 'lan' | 'rtt20';
/** One-way delay of the rtt20 relays (so 20 ms per round trip). */
export const RTT20_ONE_WAY_MS = 10;

/** Fresh processes for the idle-connections scale scenario, and how to measure them. */
export interface ScaleRig {
  /** How the scale client reaches the echo target through these processes. */
  spec: ClientSpec;
  /** Processes whose VmRSS counts for each side (several PIDs are summed: sshd forks per connection). */
  pids(): Promise<{ hub: number[]; agent: number[] }>;
  /** Full GC in the measured processes, with their V8 heapUsed (bytes) after it; nothing for OpenSSH. */
  gc(): Promise<{ hub: number; agent: number } | undefined>;
  /** Connections the hub side holds, where it can tell (checks all N are up, and drained after). */
  hubConnections(): Promise<number | undefined>;
  /** Process names for the table notes, e.g. "hub / agent" or "sshd session / ssh". */
  sides: { hub: string; agent: string };
  stop(): Promise<void>;
}

/** A fresh hub for the many-agents scale scenario. */
export interface AgentsRig {
  transport: AgentTransport;
  /** HOST:PORT of the hub's agent port. */
  hubAddress: string;
  hubPid: number;
  /** Agent certificate for `cluster`, and the CA. */
  tls: TlsFiles;
  cluster: string;
  gc(): Promise<number>;
  agentsRegistered(): Promise<number>;
  stop(): Promise<void>;
}

export interface Dialer {
  readonly path: PathName;
  readonly network: Network;
  /** Opens a connection to a target; resolves once the client sees it connected. */
  dial(target: TargetName, timeoutMs: number): Promise<Duplex>;
  /** lan only, where it applies: fresh processes for scale-conns. */
  scaleConns?: () => Promise<ScaleRig>;
  /** lan only, where it applies: a fresh hub for scale-agents. */
  scaleAgents?: () => Promise<AgentsRig>;
  /** lan only: the processes a connection to `target` crosses besides the client (CPU accounting). */
  processes?: (target: TargetName) => PathProcesses;
}

export type PathSlot = { ok: true; dialer: Dialer } | { ok: false; reason: string };
export type PathSet = Record<PathName, PathSlot>;

export interface PathsSetup {
  sets: Map<Network, PathSet>;
  /** Facts worth printing (ssh version/cipher, transports, ...). */
  facts: Record<string, string>;
}

export interface SetupOptions {
  /** Write V8 CPU profiles of every hub and agent into this directory. */
  cpuProfDir?: string;
}

/** Dials echo, checks one 64-byte round trip, closes: a path that fails here is reported n/a. */
async function probe(dialer: Dialer): Promise<void> {
  const socket = await dialer.dial('echo', 15_000);
  try {
    const pinger = new Pinger(socket);
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      pinger.ping(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error('no echo within 10 s')), 10_000);
      }),
    ]).finally(() => clearTimeout(timer));
  } finally {
    socket.destroy();
  }
}

async function attempt(what: string, log: LogFn, build: () => Promise<Dialer>): Promise<PathSlot> {
  try {
    const dialer = await build();
    await probe(dialer);
    return { ok: true, dialer };
  } catch (err) {
    const reason = `${what}: ${errorMessage(err)}`;
    log(`path unavailable: ${reason}`);
    return { ok: false, reason };
  }
}

function dialerFor(path: PathName, network: Network, client: Client, extra: Partial<Dialer> = {}): Dialer {
  return { path, network, dial: (target, timeoutMs) => client.dial(target, timeoutMs), ...extra };
}

/** Starts targets, hubs/agents, sshd/ssh and relays for the requested networks. */
export async function setupPaths(
  networks: ReadonlySet<Network>,
  cleanup: CleanupStack,
  log: LogFn,
  options: SetupOptions = {},
): Promise<PathsSetup> {
  const register = (name: string, stop: () => Promise<void>): void => void cleanup.add(name, stop);
  const facts: Record<string, string> = {};
  const sets = new Map<Network, PathSet>();
  const processOptions: ProcessOptions = { cpuProfDir: options.cpuProfDir };

  log('starting targets ...');
  const targets = await startTargets();
  register('targets', targets.stop);
  const targetPorts: TargetPorts = targets.ports;
  const targetPid = targets.proc.pid;
  if (targetPid === undefined) throw new Error('the targets process has no pid');
  const target = [targetPid];
  const targetMap: Record<string, number> = { ...targetPorts };

  const pki = await createPki();
  removeOnDeath(pki.dir);
  register('pki', pki.cleanup);

  const tools = await findSshTools(log);
  let sshTools: SshTools | undefined;
  let sshd: Sshd | undefined;
  let sshUnavailable = '';
  if (tools.ok) {
    sshTools = tools.tools;
    facts['ssh'] = `${sshTools.version}; cipher ${sshTools.cipher} (default)`;
    try {
      log('starting sshd ...');
      sshd = await startSshd(sshTools, register);
    } catch (err) {
      sshUnavailable = `sshd did not start: ${errorMessage(err)}`;
    }
  } else {
    sshUnavailable = tools.reason;
  }
  if (sshUnavailable) {
    log(`NOTE: the ssh -R baseline is n/a: ${sshUnavailable}`);
    facts['ssh'] = `n/a (${sshUnavailable.split('\n')[0]})`;
  }

  const useClient = (name: string, spec: ClientSpec): Client => {
    const client = openClient(spec);
    register(`client-${name}`, async () => client.close());
    return client;
  };

  const sshSlot = async (network: Network, sshPort: (sshdPort: number) => Promise<number>): Promise<PathSlot> => {
    if (!sshTools || !sshd) return { ok: false, reason: sshUnavailable };
    const tools = sshTools;
    const server = sshd;
    return attempt(`ssh -R (${network})`, log, async () => {
      const tunnel = await startSshTunnel(
        tools,
        server,
        { label: network, sshPort: await sshPort(server.port), targets: targetMap },
        register,
      );
      const client = useClient(`ssh-${network}`, { kind: 'tcp', ports: tunnel.remotePorts });
      const sshPid = tunnel.proc.pid;
      const processes = sshPid === undefined ? undefined : (): PathProcesses => ({ hub: tunnel.sessionPids, agent: [sshPid], target });
      return dialerFor('ssh', network, client, network === 'lan' ? { scaleConns: () => sshScaleRig(tools, server), processes } : {});
    });
  };

  // One ssh -R connection of its own (only echo forwarded): what 10,000 channels cost sshd's
  // session processes and the ssh client.
  const sshScaleRig = async (tools: SshTools, server: Sshd): Promise<ScaleRig> => {
    const steps: (() => Promise<void>)[] = [];
    const tunnel = await startSshTunnel(
      tools,
      server,
      { label: 'scale', sshPort: server.port, targets: { echo: targetPorts.echo } },
      (_name, stop) => void steps.push(stop),
    );
    const { sessionPids } = tunnel;
    const sshPid = tunnel.proc.pid;
    if (sshPid === undefined) {
      await tunnel.stop();
      throw new Error('the ssh client of the scale connection has no pid');
    }
    return {
      spec: { kind: 'tcp', ports: tunnel.remotePorts },
      pids: async () => ({ hub: sessionPids, agent: [sshPid] }),
      gc: async () => undefined,
      hubConnections: async () => undefined,
      sides: { hub: `sshd session (${sessionPids.length} processes)`, agent: 'ssh client' },
      stop: async () => {
        for (const stop of steps.reverse()) await stop();
      },
    };
  };

  const clusterRig = async (label: string, transport: AgentTransport, kind: 'tunnel' | 'connect'): Promise<ScaleRig> => {
    const steps: (() => Promise<void>)[] = [];
    const stopAll = async (): Promise<void> => {
      for (const stop of steps.reverse()) await stop().catch(() => {});
    };
    try {
      // The default admission limits (sized from the memory budget: 4,096 on the hub, 2,048 per client
      // and per agent) would refuse most of the 10,000 idle connections measured here.
      const limits = '20000'; // twice the full run's 10,000
      const cluster = await startCluster(pki, {
        label,
        transport,
        gcHook: true,
        onStarted: (_name, stop) => void steps.push(stop),
        hubArgs: ['--max-connections', limits, '--max-connections-per-client', limits],
        agentArgs: ['--max-connections', limits],
      });
      const echoOnly = { echo: targetPorts.echo };
      return {
        // CONNECT clients resume TLS sessions here: 10,000 full RSA handshakes would take minutes on
        // 2 cores, and what is measured is the memory of open connections, not the dial.
        spec: kind === 'tunnel' ? cluster.tunnelSpec(echoOnly) : { ...cluster.connectSpec(echoOnly), resume: true },
        pids: async () => ({ hub: [cluster.hub.pid], agent: [cluster.agentPid] }),
        gc: () => cluster.gc(),
        hubConnections: async () => (await cluster.hub.tables()).agents.reduce((n, a) => n + a.established.length + a.pending, 0),
        sides: { hub: 'hub', agent: `agent (--transport ${transport})` },
        stop: stopAll,
      };
    } catch (err) {
      await stopAll();
      throw err;
    }
  };

  let scaleAgentCert: Promise<{ certPath: string; keyPath: string }> | undefined;
  const agentsRig = async (label: string, transport: AgentTransport): Promise<AgentsRig> => {
    // One agent certificate for cluster `scale`, shared by every simulated agent (RSA keygen is slow).
    scaleAgentCert ??= pki.agent('scale', { name: 'agent-scale' });
    const cert = await scaleAgentCert;
    const steps: (() => Promise<void>)[] = [];
    const hub = await startBenchHub(pki, { label, gcHook: true, onStarted: (_name, stop) => void steps.push(stop) });
    return {
      transport,
      hubAddress: `127.0.0.1:${hub.ports.agent}`,
      hubPid: hub.pid,
      tls: { caPath: pki.caPath, certPath: cert.certPath, keyPath: cert.keyPath },
      cluster: 'scale',
      gc: () => hub.gc(),
      agentsRegistered: async () => (await hub.tables()).agents.length,
      stop: async () => {
        for (const stop of steps.reverse()) await stop().catch(() => {});
      },
    };
  };

  const clusterProcesses = (cluster: BenchCluster) => (): PathProcesses => ({ hub: [cluster.hub.pid], agent: [cluster.agentPid], target });

  const tunnelSlots = async (
    network: Network,
    agentHubAddress?: (label: string) => (port: number) => Promise<string>,
  ): Promise<Pick<PathSet, 'tunnel' | 'tunnel-grpc' | 'connect' | 'forward'>> => {
    const lan = network === 'lan';
    let mux: BenchCluster | undefined;
    const tunnel = await attempt(`tunnel (${network})`, log, async () => {
      mux = await startCluster(pki, {
        ...processOptions,
        label: network,
        transport: 'mux',
        agentHubAddress: agentHubAddress?.('relay-tunnel'),
        onStarted: register,
      });
      const client = useClient(`tunnel-${network}`, mux.tunnelSpec(targetPorts));
      const processes = clusterProcesses(mux);
      const dialer = dialerFor(
        'tunnel',
        network,
        client,
        lan
          ? {
              scaleConns: () => clusterRig('scale-tunnel', 'mux', 'tunnel'),
              scaleAgents: () => agentsRig('scale-agents-mux', 'mux'),
              processes,
            }
          : {},
      );
      await probe(dialer);
      if (client.describe() !== 'SDK transport mux')
        throw new Error(`expected the SDK to use the mux transport, it uses: ${client.describe()}`);
      return dialer;
    });
    const connect: PathSlot = !mux
      ? { ok: false, reason: `connect (${network}): needs the tunnel path's hub, which did not start` }
      : await attempt(`connect (${network})`, log, async () => {
          const client = useClient(`connect-${network}`, mux!.connectSpec(targetPorts));
          return dialerFor(
            'connect',
            network,
            client,
            lan ? { scaleConns: () => clusterRig('scale-connect', 'mux', 'connect'), processes: clusterProcesses(mux!) } : {},
          );
        });
    const forward: PathSlot = !mux
      ? { ok: false, reason: `forward (${network}): needs the tunnel path's hub, which did not start` }
      : await attempt(`forward (${network})`, log, async () => {
          const { ports, pids } = await mux!.forwards(targetPorts, register);
          const hubAndAgent = clusterProcesses(mux!);
          // Only the forward process of the target in use: the others idle meanwhile.
          const processes = (to: TargetName): PathProcesses => ({
            ...hubAndAgent(),
            forward: pids[to] === undefined ? [] : [pids[to]],
            target,
          });
          return dialerFor('forward', network, useClient(`forward-${network}`, { kind: 'tcp', ports }), lan ? { processes } : {});
        });
    const grpc = await attempt(`tunnel-grpc (${network})`, log, async () => {
      const cluster = await startCluster(pki, {
        ...processOptions,
        label: `${network}-grpc`,
        transport: 'grpc',
        agentHubAddress: agentHubAddress?.('relay-tunnel-grpc'),
        onStarted: register,
      });
      const client = useClient(`tunnel-grpc-${network}`, cluster.tunnelSpec(targetPorts));
      const processes = clusterProcesses(cluster);
      const dialer = dialerFor(
        'tunnel-grpc',
        network,
        client,
        lan
          ? {
              scaleConns: () => clusterRig('scale-grpc', 'grpc', 'tunnel'),
              scaleAgents: () => agentsRig('scale-agents-grpc', 'grpc'),
              processes,
            }
          : {},
      );
      await probe(dialer);
      if (client.describe() !== 'SDK transport grpc') throw new Error(`expected the SDK to use gRPC, it uses: ${client.describe()}`);
      return dialer;
    });
    return { tunnel, 'tunnel-grpc': grpc, connect, forward };
  };

  if (networks.has('lan')) {
    log('setting up lan paths (direct, ssh -R, tunnel, tunnel-grpc, connect, forward) ...');
    const direct = await attempt('direct (lan)', log, async () =>
      dialerFor('direct', 'lan', useClient('direct-lan', { kind: 'tcp', ports: targetPorts }), { processes: () => ({ target }) }),
    );
    const ssh = await sshSlot('lan', async (port) => port);
    sets.set('lan', { direct, ssh, ...(await tunnelSlots('lan')) });
  }

  if (networks.has('rtt20')) {
    log(`setting up rtt20 paths (latency relays, ${RTT20_ONE_WAY_MS} ms each way) ...`);
    const direct = await attempt('direct (rtt20)', log, async () => {
      const relays = await startRelays('relay-direct', RTT20_ONE_WAY_MS, targetMap);
      register('relay-direct', relays.stop);
      return dialerFor('direct', 'rtt20', useClient('direct-rtt20', { kind: 'tcp', ports: relays.ports }));
    });
    const ssh = await sshSlot('rtt20', async (sshdPort) => {
      const relays = await startRelays('relay-ssh', RTT20_ONE_WAY_MS, { sshd: sshdPort });
      register('relay-ssh', relays.stop);
      const port = relays.ports['sshd'];
      if (port === undefined) throw new Error('relay-ssh reported no port');
      return port;
    });
    const relayed =
      (name: string) =>
      async (hubAgentPort: number): Promise<string> => {
        const relays = await startRelays(name, RTT20_ONE_WAY_MS, { hub: hubAgentPort });
        register(name, relays.stop);
        return `127.0.0.1:${relays.ports['hub'] ?? 0}`;
      };
    sets.set('rtt20', { direct, ssh, ...(await tunnelSlots('rtt20', relayed)) });
  }

  facts['paths'] =
    'tunnel = SDK + agent over our mux transport; tunnel-grpc = SDK transport grpc + agent --transport grpc (ANP-compatible); connect = HTTP CONNECT over TLS (client cert) to the hub, mux agent; forward = `cluster-proxy forward` processes (a local port each) in front of the tunnel path';
  return { sets, facts };
}
