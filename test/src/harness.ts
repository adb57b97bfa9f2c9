// End-to-end harness: a throwaway PKI, and real `cluster-proxy hub` / `cluster-proxy agent`
// processes on loopback, with helpers to read their connection tables.
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { existsSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Tunnel, type TunnelTransport } from '@cluster-proxy/client';
import { createCA, issueAgentCert, issueClientCert, issueServerCert, writePemPair, type PemPair } from '@cluster-proxy/server';
import { spawnProcess, waitFor, type ManagedProcess } from './fixtures/index.js';

export const CLI = fileURLToPath(new URL('../../cli/dist/main.js', import.meta.url));

/**
 * The flags a `cluster-proxy` entry script's first line gives node (`#!/usr/bin/env -S node FLAGS`,
 * cli/src/memory/gc-tuning.ts): tests and benchmarks start the hub and agent as `node FLAGS main.js`, as the
 * command itself would run (another build's script may have none).
 */
export function cliLaunchFlags(cli: string = CLI): string[] {
  let flags = launchFlagsRead.get(cli);
  if (!flags) {
    const first = readFileSync(cli, 'utf8').split('\n', 1)[0] ?? '';
    const m = /^#!\S*env -S node((?: \S+)*)$/.exec(first);
    launchFlagsRead.set(cli, (flags = m?.[1] ? m[1].trim().split(' ') : []));
  }
  return [...flags];
}
/** Read once per entry script: every hub and agent a test starts asks. */
const launchFlagsRead = new Map<string, string[]>();

export interface CertFiles {
  certPath: string;
  keyPath: string;
}

export interface TestPki {
  dir: string;
  ca: PemPair;
  caPath: string;
  server: CertFiles;
  client: CertFiles;
  agent(cluster: string, opts?: { notBefore?: Date; notAfter?: Date; ca?: PemPair; name?: string }): Promise<CertFiles>;
  /** A hub user's client certificate (CN = user, O = groups): PEM for TLS clients, files for kubeconfigs. */
  user(commonName: string, groups?: string[]): Promise<UserCert>;
  cleanup(): Promise<void>;
}

export interface UserCert extends CertFiles {
  cert: Buffer;
  key: Buffer;
}

export async function createPki(): Promise<TestPki> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'cp-e2e-'));
  const ca = createCA({ commonName: 'e2e-ca' });
  const caFiles = await writePemPair(dir, 'ca', ca);
  const server = await writePemPair(
    dir,
    'server',
    issueServerCert(ca, { commonName: 'hub', dnsNames: ['localhost'], ipAddresses: ['127.0.0.1', '::1'] }),
  );
  const client = await writePemPair(dir, 'client', issueClientCert(ca, { commonName: 'e2e-user' }));
  let n = 0;
  return {
    dir,
    ca,
    caPath: caFiles.certPath,
    server,
    client,
    agent: async (cluster, opts = {}) =>
      writePemPair(
        dir,
        opts.name ?? `agent-${cluster}-${++n}`,
        issueAgentCert(opts.ca ?? ca, { cluster, notBefore: opts.notBefore, notAfter: opts.notAfter }),
      ),
    user: async (commonName, groups = []) => {
      const u = issueClientCert(ca, { commonName, organization: groups });
      return { cert: Buffer.from(u.certPem), key: Buffer.from(u.keyPem), ...(await writePemPair(dir, `user-${commonName}-${++n}`, u)) };
    },
    cleanup: () => rm(dir, { recursive: true, force: true }),
  };
}

export interface HubTables {
  agents: {
    agentID: string;
    cluster: string;
    draining: boolean;
    hosts: string[];
    pending: number;
    established: { connectID: number; address: string; state: string; bytesToAgent: number; bytesToClient: number }[];
  }[];
  frontends: { state: string; connectID: number; address: string }[];
}

export interface HubProcess {
  proc: ManagedProcess;
  dataDir: string;
  ports: {
    agent: number;
    frontend: number;
    admin: number;
    health: number;
    frontendUds: string | null;
    connect: number | null;
    gateway?: number | null;
    serverID: string;
  };
  tunnel(transport?: TunnelTransport): Tunnel;
  tables(): Promise<HubTables>;
  stop(): Promise<void>;
}

/**
 * `opts.dataDir`: a data directory prepared beforehand (e.g. a store filled in advance); default a new one.
 * `opts.cli`: another build's entry script (the skew tests' previous release); default this checkout's.
 */
export async function startHub(
  pki: TestPki,
  extraArgs: string[] = [],
  opts: { dataDir?: string; cli?: string; bindAddress?: string | null } = {},
): Promise<HubProcess> {
  const cli = opts.cli ?? CLI;
  const dataDir = opts.dataDir ?? (await mkdtemp(path.join(pki.dir, 'hub-')));
  const proc = spawnProcess({
    name: 'hub',
    command: process.execPath,
    // Started as the command's first line starts it (node's launch flags), as a deployment would run it.
    // `bindAddress`: null leaves the flag out (the hub's default: every address of both families).
    args: [
      ...cliLaunchFlags(cli),
      cli,
      'hub',
      '--data-dir',
      dataDir,
      ...(opts.bindAddress === null ? [] : ['--bind-address', opts.bindAddress ?? '127.0.0.1']),
      '--agent-port',
      '0',
      '--frontend-port',
      '0',
      '--health-port',
      '0',
      '--admin-port',
      '0',
      '--frontend-uds',
      path.join(dataDir, 'frontend.sock'),
      '--connect-port',
      '0',
      '--ca-cert',
      pki.caPath,
      '--server-cert',
      pki.server.certPath,
      '--server-key',
      pki.server.keyPath,
      ...extraArgs,
    ],
  });
  await proc.waitForJsonLine((o) => o['msg'] === 'proxy server listening', 15_000);
  const ports = JSON.parse(await readFile(path.join(dataDir, 'ports.json'), 'utf8')) as HubProcess['ports'];
  const tunnels: Tunnel[] = [];
  return {
    proc,
    dataDir,
    ports,
    tunnel: (transport = 'auto') => {
      const t = new Tunnel({
        address: `127.0.0.1:${ports.frontend}`,
        serverName: 'localhost',
        caCert: Buffer.from(pki.ca.certPem),
        cert: readFileSync(pki.client.certPath),
        key: readFileSync(pki.client.keyPath),
        transport,
      });
      tunnels.push(t);
      return t;
    },
    tables: async () => (await getJson(ports.admin, '/debug/connections')) as HubTables,
    stop: async () => {
      for (const t of tunnels) t.close();
      await proc.stop(8000);
    },
  };
}

export interface AgentTables {
  agentID: string;
  servers: { serverID: string; transport: string; connections: { connectID: number; address: string; state: string }[] }[];
}

export interface AgentProcess {
  proc: ManagedProcess;
  healthPort: number;
  tables(): Promise<AgentTables>;
  stop(): Promise<void>;
}

export interface AgentStartOptions {
  cluster: string;
  apiserver: string;
  cert?: CertFiles;
  args?: string[];
  /** Wait until it reports a server connection (default true). */
  waitConnected?: boolean;
  /** Runs the agent under another command (e.g. `unshare` with a private /etc/hosts). */
  wrap?: (command: string, args: string[]) => { command: string; args: string[] };
  /** Another build's entry script (the skew tests' previous release); default this checkout's. */
  cli?: string;
}

/** `hub`: our hub, or any server whose agent port is given (ANP's proxy-server). */
export async function startAgent(pki: TestPki, hub: { ports: { agent: number } }, opts: AgentStartOptions): Promise<AgentProcess> {
  const cert = opts.cert ?? (await pki.agent(opts.cluster));
  const cli = opts.cli ?? CLI;
  const args = [
    ...cliLaunchFlags(cli),
    cli,
    'agent',
    '--cluster',
    opts.cluster,
    '--hub',
    `127.0.0.1:${hub.ports.agent}`,
    '--server-name',
    'localhost',
    '--ca-cert',
    pki.caPath,
    '--cert',
    cert.certPath,
    '--key',
    cert.keyPath,
    '--apiserver',
    opts.apiserver,
    '--health-bind-address',
    '127.0.0.1',
    '--health-port',
    '0',
    ...(opts.args ?? []),
  ];
  const command = opts.wrap ? opts.wrap(process.execPath, args) : { command: process.execPath, args };
  const proc = spawnProcess({ name: `agent-${opts.cluster}`, ...command });
  const up = await proc.waitForJsonLine((o) => o['msg'] === 'agent health listener up', 15_000);
  const healthPort = Number(up['healthPort']);
  if (opts.waitConnected ?? true) await proc.waitForJsonLine((o) => o['msg'] === 'connected to proxy server', 15_000);
  return {
    proc,
    healthPort,
    tables: async () => (await getJson(healthPort, '/debug/connections')) as AgentTables,
    stop: async () => {
      await proc.stop(8000);
    },
  };
}

/** A debug or health request that never answers fails after this, so a poll around it retries instead of hanging. */
const LOCAL_HTTP_TIMEOUT_MS = 5000;

export async function getJson(port: number, pathName: string): Promise<unknown> {
  const res = await fetch(`http://127.0.0.1:${port}${pathName}`, { signal: AbortSignal.timeout(LOCAL_HTTP_TIMEOUT_MS) });
  if (!res.ok) throw new Error(`GET ${pathName} on port ${port}: HTTP ${res.status}`);
  return res.json();
}

export async function getStatus(port: number, pathName: string): Promise<{ status: number; body: string }> {
  const res = await fetch(`http://127.0.0.1:${port}${pathName}`, { signal: AbortSignal.timeout(LOCAL_HTTP_TIMEOUT_MS) });
  return { status: res.status, body: await res.text() };
}

/** The connection tables of the hub and of every given agent drain to empty. */
export async function expectTablesEmpty(hub: HubProcess, agents: AgentProcess[], timeoutMs = 10_000): Promise<void> {
  await waitFor(
    async () => {
      const h = await hub.tables();
      const hubBusy = h.frontends.length > 0 || h.agents.some((a) => a.pending > 0 || a.established.length > 0);
      if (hubBusy) return false;
      for (const a of agents) {
        if (!a.proc.isRunning()) continue;
        const t = await a.tables();
        if (t.servers.some((s) => s.connections.length > 0)) return false;
      }
      return true;
    },
    { timeoutMs, intervalMs: 100, message: 'connection tables did not drain' },
  ).catch(async (err: Error) => {
    const detail = JSON.stringify({
      hub: await hub.tables(),
      agents: await Promise.all(agents.filter((a) => a.proc.isRunning()).map((a) => a.tables())),
    });
    throw new Error(`${err.message}: ${detail.slice(0, 2000)}`);
  });
}

export function hubUdsExists(hub: HubProcess): boolean {
  return hub.ports.frontendUds !== null && existsSync(hub.ports.frontendUds);
}
