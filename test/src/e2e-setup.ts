// The setup many end-to-end files share: a test PKI, an echo server (the agents' "apiserver"), a hub
// process, and agents started against both. stop() takes it all down again, in that order reversed.
import { killAllSpawned, startEchoServer, type TcpTarget } from './fixtures/index.js';
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
