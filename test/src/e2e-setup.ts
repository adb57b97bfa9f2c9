// Setups end-to-end files share. startEchoHub: a test PKI, an echo server (the agents' "apiserver"), a
// hub process, and agents started against both. startGatewayHub: a hub with its HTTP gateway and
// cluster1's agent in front of a recording apiserver. stop() takes either down again.
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { issueServerCert } from '@cluster-proxy/server';
import {
  killAllSpawned,
  startEchoServer,
  startRecordingApiserver,
  writeAgentKubeconfig,
  type RecordingApiserver,
  type TcpTarget,
} from './fixtures/index.js';
import { createPki, startAgent, startHub, type AgentProcess, type AgentStartOptions, type HubProcess, type TestPki } from './harness.js';

export interface EchoHub {
  pki: TestPki;
  echo: TcpTarget;
  hub: HubProcess;
  /** An agent for `cluster` whose apiserver is the echo server; stop() stops it too. */
  startAgent(cluster: string, opts?: Omit<AgentStartOptions, 'cluster' | 'apiserver'>): Promise<AgentProcess>;
  /** Stops the agents started here, the hub and every process the test spawned, the echo server; removes the PKI. */
  stop(): Promise<void>;
}

/** `hubArgs` may be made from the PKI (e.g. `--ca-key` in its directory). */
export async function startEchoHub(hubArgs: string[] | ((pki: TestPki) => string[]) = []): Promise<EchoHub> {
  const agents: AgentProcess[] = [];
  let pki: TestPki | undefined;
  let echo: TcpTarget | undefined;
  let hub: HubProcess | undefined;
  const stop = async (): Promise<void> => {
    await Promise.all(agents.splice(0).map((a) => a.stop()));
    await hub?.stop();
    await killAllSpawned();
    await echo?.close();
    await pki?.cleanup();
  };
  try {
    pki = await createPki();
    echo = await startEchoServer();
    hub = await startHub(pki, typeof hubArgs === 'function' ? hubArgs(pki) : hubArgs);
  } catch (err) {
    await stop();
    throw err;
  }
  const started = { pki, echo, hub };
  return {
    ...started,
    async startAgent(cluster, opts = {}) {
      const agent = await startAgent(started.pki, started.hub, { ...opts, cluster, apiserver: `127.0.0.1:${started.echo.port}` });
      agents.push(agent);
      return agent;
    },
    stop,
  };
}

/** The agent's service-account token for the recording apiserver (what the gateway's agent sends it). */
export const GATEWAY_SA_TOKEN = 'agent-service-account-token';

export interface GatewayHub {
  pki: TestPki;
  /** A temp directory, removed by stop(). */
  tmp: string;
  /** The recording HTTPS "apiserver" of cluster1 (certificate from the test CA). */
  api: RecordingApiserver;
  hub: HubProcess;
  /** cluster1's agent, with --gateway-kubeconfig for `api`. */
  agent: AgentProcess;
  /** That kubeconfig (GATEWAY_SA_TOKEN as its token). */
  agentKubeconfig: string;
  /** Stops the agent, the hub and every process the test spawned, the apiserver; removes tmp and the PKI. */
  stop(): Promise<void>;
}

/** A hub with --gateway-port (and `hubArgs`) and cluster1's agent in front of a recording apiserver. */
export async function startGatewayHub(tmpPrefix: string, hubArgs: (pki: TestPki) => string[] = () => []): Promise<GatewayHub> {
  let pki: TestPki | undefined;
  let tmp: string | undefined;
  let api: RecordingApiserver | undefined;
  let hub: HubProcess | undefined;
  let agent: AgentProcess | undefined;
  const stop = async (): Promise<void> => {
    await agent?.stop();
    await hub?.stop();
    await killAllSpawned();
    await api?.close();
    if (tmp) await rm(tmp, { recursive: true, force: true });
    await pki?.cleanup();
  };
  try {
    pki = await createPki();
    tmp = await mkdtemp(path.join(os.tmpdir(), tmpPrefix));
    api = await startRecordingApiserver(issueServerCert(pki.ca, { commonName: 'cluster1-apiserver', ipAddresses: ['127.0.0.1'] }));
    hub = await startHub(pki, ['--gateway-port', '0', ...hubArgs(pki)]);
    // The agent's own credentials for its apiserver, as a pod's service account would give them.
    const agentKubeconfig = await writeAgentKubeconfig(path.join(tmp, 'agent.kubeconfig'), {
      server: `https://${api.address}`,
      caPath: pki.caPath,
      token: GATEWAY_SA_TOKEN,
    });
    agent = await startAgent(pki, hub, { cluster: 'cluster1', apiserver: api.address, args: ['--gateway-kubeconfig', agentKubeconfig] });
    return { pki, tmp, api, hub, agent, agentKubeconfig, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}
