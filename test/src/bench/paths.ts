// The three paths a client can take to a target, in two network settings:
//   lan:   direct = client → target; ssh = client → sshd -R port → ssh → target;
//          tunnel = client → hub frontend (SDK Tunnel, mTLS gRPC) → hub → agent → target
//   rtt20: the same with a 20 ms RTT latency relay on the link a tunnel would cross: between
//          client and target (direct), ssh and sshd (ssh), agent and hub (tunnel).
import type { Duplex } from 'node:stream';
import { createPki } from '../harness.js';
import type { CleanupStack, LogFn } from './cleanup.js';
import { startCluster } from './cluster.js';
import { startRelays, startTargets, type TargetName, type TargetPorts } from './helpers.js';
import { connectTcp, errorMessage, Pinger } from './io.js';
import { removeOnDeath } from './reaper.js';
import { findSshTools, startSshd, startSshTunnel, type Sshd, type SshTools } from './sshd.js';

export type PathName = 'direct' | 'ssh' | 'tunnel';
export const PATH_NAMES: readonly PathName[] = ['direct', 'ssh', 'tunnel'];
export const PATH_LABELS: Readonly<Record<PathName, string>> = { direct: 'direct', ssh: 'ssh -R', tunnel: 'tunnel' };

export type Network = 'lan' | 'rtt20';
/** One-way delay of the rtt20 relays (so 20 ms per round trip). */
export const RTT20_ONE_WAY_MS = 10;

export interface Dialer {
  readonly path: PathName;
  readonly network: Network;
  /** Opens a connection to a target; resolves once the client sees it connected. */
  dial(target: TargetName, timeoutMs: number): Promise<Duplex>;
}

export type PathSlot = { ok: true; dialer: Dialer } | { ok: false; reason: string };
export type PathSet = Record<PathName, PathSlot>;

export interface PathsSetup {
  sets: Map<Network, PathSet>;
  /** Facts worth printing (ssh version/cipher, why a path is unavailable, ...). */
  facts: Record<string, string>;
}

function tcpDialer(path: PathName, network: Network, ports: Record<string, number>): Dialer {
  return {
    path,
    network,
    dial: (target, timeoutMs) => {
      const port = ports[target];
      if (port === undefined) return Promise.reject(new Error(`${path}/${network}: no port for target ${target}`));
      return connectTcp(port, timeoutMs);
    },
  };
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

/** Starts targets, hubs/agents, sshd/ssh and relays for the requested networks. */
export async function setupPaths(networks: ReadonlySet<Network>, cleanup: CleanupStack, log: LogFn): Promise<PathsSetup> {
  const register = (name: string, stop: () => Promise<void>): void => void cleanup.add(name, stop);
  const facts: Record<string, string> = {};
  const sets = new Map<Network, PathSet>();

  log('starting targets ...');
  const targets = await startTargets();
  register('targets', targets.stop);
  const targetPorts: TargetPorts = targets.ports;
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

  const sshSlot = async (network: Network, sshPort: (sshdPort: number) => Promise<number>): Promise<PathSlot> => {
    if (!sshTools || !sshd) return { ok: false, reason: sshUnavailable };
    const tools = sshTools;
    const server = sshd;
    return attempt(`ssh -R (${network})`, log, async () => {
      const tunnel = await startSshTunnel(tools, server, { label: network, sshPort: await sshPort(server.port), targets: targetMap }, register);
      return tcpDialer('ssh', network, tunnel.remotePorts);
    });
  };

  const tunnelSlot = (network: Network, agentHubAddress?: (port: number) => Promise<string>): Promise<PathSlot> =>
    attempt(`tunnel (${network})`, log, async () => {
      const cluster = await startCluster(pki, { label: network, agentHubAddress, onStarted: register });
      return {
        path: 'tunnel',
        network,
        dial: (target, timeoutMs) => cluster.tunnel.dial(`127.0.0.1:${targetPorts[target]}`, { timeoutMs }),
      };
    });

  if (networks.has('lan')) {
    log('setting up lan paths (direct, ssh -R, tunnel) ...');
    const direct = await attempt('direct (lan)', log, async () => tcpDialer('direct', 'lan', targetMap));
    const ssh = await sshSlot('lan', async (port) => port);
    const tunnel = await tunnelSlot('lan');
    sets.set('lan', { direct, ssh, tunnel });
  }

  if (networks.has('rtt20')) {
    log(`setting up rtt20 paths (latency relays, ${RTT20_ONE_WAY_MS} ms each way) ...`);
    const direct = await attempt('direct (rtt20)', log, async () => {
      const relays = await startRelays('relay-direct', RTT20_ONE_WAY_MS, targetMap);
      register('relay-direct', relays.stop);
      return tcpDialer('direct', 'rtt20', relays.ports);
    });
    const ssh = await sshSlot('rtt20', async (sshdPort) => {
      const relays = await startRelays('relay-ssh', RTT20_ONE_WAY_MS, { sshd: sshdPort });
      register('relay-ssh', relays.stop);
      const port = relays.ports['sshd'];
      if (port === undefined) throw new Error('relay-ssh reported no port');
      return port;
    });
    const tunnel = await tunnelSlot('rtt20', async (hubAgentPort) => {
      const relays = await startRelays('relay-tunnel', RTT20_ONE_WAY_MS, { hub: hubAgentPort });
      register('relay-tunnel', relays.stop);
      return `127.0.0.1:${relays.ports['hub'] ?? 0}`;
    });
    sets.set('rtt20', { direct, ssh, tunnel });
  }

  return { sets, facts };
}
