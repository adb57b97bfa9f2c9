// `cluster-proxy quickstart`: a hub (with its HTTP CONNECT frontend and HTTP gateway on TLS), two demo
// clusters (an agent each, in front of a demo HTTPS "apiserver"), a token, kubeconfigs per cluster (CONNECT
// and gateway) and a local forward per cluster, so a newcomer can curl and kubectl through the tunnel at once. Everything runs
// in this process on loopback; DIR/quickstart.json says where. Ctrl+C stops it (exit code 0).
import { constants as fsConstants } from 'node:fs';
import { access, mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { Agent } from '@cluster-proxy/agent';
import { generateKeyPairSync } from 'node:crypto';
import { LeaseRenewer } from '@cluster-proxy/agent';
import { Hub, ensureHubPki, issueServerCert, openStore, readPemPair, signAgentPublicKey, writePemPair } from '@cluster-proxy/server';
import { Tunnel } from '@cluster-proxy/client';
import { serveForward } from './forward.js';
import { createLogger } from './logging.js';
import { buildKubeconfig, proxyUrl } from './kubeconfig.js';
import { issueToken } from './token.js';
import { Progress, cliWords, paint, shellCommand } from './ui.js';
import { duration, helpText, parseFlags, str, type FlagSpecs } from './flags.js';

const quickstartFlags: FlagSpecs = {
  'data-dir': {
    type: 'string',
    default: '.cluster-proxy/quickstart',
    help: 'where PKI, ports.json, tokens, kubeconfigs and quickstart.json go',
  },
  'log-level': { type: 'string', default: 'warn', help: 'log level of the embedded hub and agents (JSON lines on stdout)' },
  'agent-timeout': { type: 'string', default: '15s', help: 'how long to wait for the demo agents to connect' },
};

export const quickstartUsage = helpText(
  'cluster-proxy quickstart [--data-dir DIR]',
  'Runs a hub, two demo clusters (cluster1, cluster2: an agent in front of a demo HTTPS apiserver each), a token,\n' +
    'a kubeconfig and a local forward per cluster; prints curl and kubectl lines to try. Ctrl+C stops it.',
  quickstartFlags,
);

export const QUICKSTART_CLUSTERS = ['cluster1', 'cluster2'] as const;
const TOKEN_NAME = 'quickstart';
/** scripts/quickstart.sh points this at the kubectl it unpacked when none is on PATH. */
function kubectlCommand(): string {
  return process.env['CLUSTER_PROXY_KUBECTL'] || 'kubectl';
}

/** The demo apiservers take any bearer token; kubectl needs one, or it prompts for a username. */
const DEMO_APISERVER_TOKEN = 'demo';

/** What DIR/quickstart.json holds (absolute paths, loopback addresses). */
export interface QuickstartInfo {
  hub: {
    serverID: string;
    agent: string;
    frontend: string;
    frontendUds: string | null;
    connect: string;
    gateway: string;
    health: string;
    admin: string;
  };
  ca: string;
  client: { cert: string; key: string };
  token: { name: string; id: string; value: string };
  clusterNames: string[];
  clusters: Record<string, { apiserver: string; forward: string; kubeconfig: string; gatewayKubeconfig: string }>;
  commands: { curl: string[]; kubectl: string[]; forward: string; forwardCurl: string; gatewayCurl: string[]; gatewayKubectl: string[] };
}

/**
 * A tiny HTTPS server that answers like a kube-apiserver on /version, /healthz and SelfSubjectReview
 * (`kubectl auth whoami`): the token's user, or whom the request impersonates (the gateway's caller).
 */
function startDemoApiserver(cluster: string, tls: { certPem: string; keyPem: string }): Promise<https.Server> {
  const server = https.createServer({ cert: tls.certPem, key: tls.keyPem }, (req, res) => {
    const url = (req.url ?? '/').split('?')[0];
    if (url === '/apis/authentication.k8s.io/v1/selfsubjectreviews' && req.method === 'POST') {
      req.resume();
      const user = req.headers['impersonate-user'];
      const userInfo =
        typeof user === 'string'
          ? { username: user, groups: [...(req.headersDistinct['impersonate-group'] ?? []), 'system:authenticated'] }
          : { username: 'demo-admin', groups: ['system:masters', 'system:authenticated'] };
      res.writeHead(201, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          kind: 'SelfSubjectReview',
          apiVersion: 'authentication.k8s.io/v1',
          metadata: { creationTimestamp: null },
          status: { userInfo },
        }),
      );
      return;
    }
    if (url === '/healthz' || url === '/readyz' || url === '/livez') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end('ok');
      return;
    }
    if (url === '/version') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(`${JSON.stringify({ major: '1', minor: '33', gitVersion: 'v1.33.0-demo', platform: 'linux/amd64', cluster }, null, 2)}\n`);
      return;
    }
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify({
        kind: 'Status',
        apiVersion: 'v1',
        status: 'Failure',
        reason: 'NotFound',
        code: 404,
        message: `demo apiserver of ${cluster} only serves /version, /healthz and SelfSubjectReviews`,
      }),
    );
  });
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve(server));
  });
}

/** A free loopback port for the forward command we print (the user starts it later). */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as net.AddressInfo;
      s.close(() => resolve(port));
    });
  });
}

async function onPath(cmd: string): Promise<boolean> {
  for (const dir of (process.env['PATH'] ?? '').split(path.delimiter).filter(Boolean)) {
    try {
      await access(path.join(dir, cmd), fsConstants.X_OK);
      return true;
    } catch {
      // next
    }
  }
  return false;
}

class Interrupted extends Error {}

/**
 * One quickstart run. Its state changes in setState() only:
 *
 *   starting ──every step done──▶ running ──Ctrl+C──▶ stopping ──▶ stopped
 *   starting ──Ctrl+C or a failed step──▶ stopping ──▶ stopped
 *
 * What each step starts is pushed onto `closers` and stopped in reverse order by stop(). A second Ctrl+C while
 * stopping exits at once (130).
 */
type QuickstartState = 'starting' | 'running' | 'stopping' | 'stopped';

interface HubParts {
  hub: Hub;
  store: Awaited<ReturnType<typeof openStore>>;
  ports: Awaited<ReturnType<Hub['start']>>;
  pki: Awaited<ReturnType<typeof ensureHubPki>>;
  ca: Awaited<ReturnType<typeof readPemPair>>;
  tls: { caCert: Buffer; cert: Buffer; key: Buffer };
}

class Quickstart {
  private state: QuickstartState = 'starting';
  private readonly closers: (() => unknown)[] = [];
  private interrupted = false;
  private wake: () => void = () => {};
  private readonly stopRequested = new Promise<void>((resolve) => (this.wake = resolve));
  private readonly progress = new Progress();
  private readonly agents: Agent[] = [];
  private readonly apiservers: Record<string, string> = {};

  constructor(
    private readonly dir: string,
    private readonly agentTimeoutMs: number,
    private readonly log: ReturnType<typeof createLogger>,
  ) {}

  /** Starts everything, prints what to try, and returns once stopped (Ctrl+C). */
  async run(): Promise<void> {
    process.on('SIGINT', this.onSignal);
    process.on('SIGTERM', this.onSignal);
    try {
      try {
        const parts = await this.startHub();
        await this.startClusters(parts);
        await this.waitForAgents(parts);
        await this.waitForAddons(parts);
        const info = await this.writeAccess(parts);
        await this.printWelcome(info);
        this.setState('running');
        await this.stopRequested;
        this.progress.line(`${process.stderr.isTTY ? '\n' : ''}Stopping ...`); // after the terminal's "^C"
      } catch (err) {
        if (!(err instanceof Interrupted)) {
          await this.stop();
          throw err;
        }
        this.progress.line('Interrupted; stopping ...');
      }
      await this.stop();
      this.progress.line('Stopped.');
    } finally {
      process.off('SIGINT', this.onSignal);
      process.off('SIGTERM', this.onSignal);
    }
  }

  private setState(next: QuickstartState): void {
    this.log.debug({ from: this.state, to: next }, 'quickstart state');
    this.state = next;
  }

  private readonly onSignal = (): void => {
    if (this.interrupted) process.exit(130);
    this.interrupted = true;
    this.wake();
  };

  /** Between steps: a Ctrl+C during one stops the run. */
  private check(): void {
    if (this.interrupted) throw new Interrupted();
  }

  /** Stops what was started, newest first; a failure to stop one thing is logged and the rest still stop. */
  private async stop(): Promise<void> {
    if (this.state === 'stopping' || this.state === 'stopped') return;
    this.setState('stopping');
    for (const close of this.closers.reverse()) {
      try {
        await close();
      } catch (err) {
        this.log.warn({ err: (err as Error).message }, 'while stopping');
      }
    }
    this.setState('stopped');
  }

  private async startHub(): Promise<HubParts> {
    const { dir, log, progress } = this;
    await mkdir(dir, { recursive: true, mode: 0o700 });
    const pkiDir = path.join(dir, 'pki');
    const pki = await progress.step(`Preparing certificates in ${pkiDir}`, () => ensureHubPki(pkiDir, { hostnames: ['localhost'] }));
    this.check();
    const ca = await readPemPair(pkiDir, 'ca');
    const tls = { caCert: await readFile(pki.caCert), cert: await readFile(pki.serverCert), key: await readFile(pki.serverKey) };
    const udsPath = path.join(dir, 'frontend.sock');
    const store = await openStore({ type: 'embedded', dataDir: dir, warn: (m) => log.warn(m) });
    this.closers.push(() => store.close());
    const hub = new Hub({
      store,
      signer: ca,
      log: log.child({ component: 'hub' }),
      tlsFiles: { ca: pki.caCert, cert: pki.serverCert, key: pki.serverKey, caKey: pki.caKey },
      managedPkiDir: pkiDir,
      server: {
        bindAddress: '127.0.0.1',
        agentPort: 0,
        frontendPort: 0,
        frontendUds: udsPath.length < 100 ? udsPath : undefined,
        healthPort: 0,
        adminPort: 0,
        connectPort: 0,
        gatewayPort: 0,
        tls,
        dataDir: dir,
      },
    });
    const ports = await progress.step(
      'Starting the hub (agent listener, gRPC and HTTP CONNECT frontends, HTTP gateway, addon manager, embedded store)',
      () => hub.start(),
      (p) => `CONNECT on 127.0.0.1:${p.connect}, gateway on 127.0.0.1:${p.gateway}`,
    );
    this.closers.push(() => hub.stop(2000));
    this.check();
    return { hub, store, ports, pki, ca, tls };
  }

  /** Per demo cluster: an HTTPS apiserver, its registration (as `cluster-proxy join` makes it), an agent and its lease. */
  private async startClusters({ store, ports, ca, tls }: HubParts): Promise<void> {
    const { dir, log } = this;
    await this.progress.step(
      `Starting demo clusters ${QUICKSTART_CLUSTERS.join(', ')} (an HTTPS apiserver and an agent each)`,
      async () => {
        for (const cluster of QUICKSTART_CLUSTERS) {
          const api = await startDemoApiserver(
            cluster,
            issueServerCert(ca, {
              commonName: `${cluster}-apiserver`,
              dnsNames: [cluster, 'localhost', 'kubernetes.default.svc'],
              ipAddresses: ['127.0.0.1'],
            }),
          );
          this.closers.push(
            () =>
              new Promise<void>((r) => {
                api.closeAllConnections();
                api.close(() => r());
              }),
          );
          const apiserver = `127.0.0.1:${(api.address() as net.AddressInfo).port}`;
          this.apiservers[cluster] = apiserver;
          // Registered like `cluster-proxy join` does; the agent's key is made here and its certificate bound to the cluster.
          const mc =
            (await store.get('ManagedCluster', { name: cluster })) ??
            (await store.create('ManagedCluster', {
              apiVersion: 'cluster.open-cluster-management.io/v1',
              kind: 'ManagedCluster',
              metadata: { name: cluster },
              spec: { hubAcceptsClient: true, leaseDurationSeconds: 60 },
            }));
          const keys = generateKeyPairSync('rsa', {
            modulusLength: 2048,
            publicKeyEncoding: { type: 'spki', format: 'pem' },
            privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
          });
          const creds = {
            certPem: signAgentPublicKey(ca, { cluster, publicKeyPem: keys.publicKey, clusterUid: mc.metadata.uid }),
            keyPem: keys.privateKey,
          };
          await writePemPair(path.join(dir, 'agents'), cluster, creds);
          const agentLog = log.child({ component: 'agent', cluster });
          // The agent's own credentials for its apiserver (a pod's service account, in a real cluster): the gateway's requests use them.
          const agentKubeconfig = path.join(dir, 'agents', `${cluster}-apiserver.kubeconfig`);
          await writeFile(
            agentKubeconfig,
            buildKubeconfig({
              cluster,
              server: `https://${apiserver}`,
              caPems: [tls.caCert.toString('utf8')],
              userToken: DEMO_APISERVER_TOKEN,
            }),
            { mode: 0o600 },
          );
          const agent = new Agent({
            cluster,
            namespace: 'open-cluster-management-agent-addon',
            hubAddress: `127.0.0.1:${ports.agent}`,
            serverName: 'localhost',
            caCert: tls.caCert,
            cert: Buffer.from(creds.certPem),
            key: Buffer.from(creds.keyPem),
            apiserver,
            allow: [],
            log: agentLog,
            gateway: { kubeconfig: agentKubeconfig },
          });
          agent.start();
          const lease = new LeaseRenewer({
            agent,
            hub: { address: `127.0.0.1:${ports.agent}`, caCert: tls.caCert, serverName: 'localhost' },
            apiserver,
            leaseDurationMs: 60_000,
            log: agentLog,
          });
          lease.start();
          this.closers.push(() => {
            lease.stop();
            agent.stop();
          });
          this.agents.push(agent);
        }
      },
    );
    this.check();
  }

  private async waitForAgents({ hub }: HubParts): Promise<void> {
    const { agentTimeoutMs, agents } = this;
    const routes = hub.server.core.routes;
    await this.progress.step(
      'Waiting for the agents to connect',
      async () => {
        const deadline = Date.now() + agentTimeoutMs;
        const connected = (): boolean =>
          QUICKSTART_CLUSTERS.every((c) => routes.backends().some((b) => b.cluster === c)) && agents.every((a) => a.connectedServers > 0);
        while (!connected()) {
          this.check();
          if (Date.now() > deadline) {
            const missing = QUICKSTART_CLUSTERS.filter((c) => !routes.backends().some((b) => b.cluster === c));
            throw new Error(
              `the demo agents did not connect within ${agentTimeoutMs / 1000}s (missing: ${missing.join(', ')}); rerun with --log-level info to see why`,
            );
          }
          await new Promise((r) => setTimeout(r, 50));
        }
      },
      () => `${QUICKSTART_CLUSTERS.length} connected`,
    );
    this.check();
  }

  private async waitForAddons({ store }: HubParts): Promise<void> {
    const { agentTimeoutMs } = this;
    await this.progress.step(
      'Waiting for the addons to report Available',
      async () => {
        const deadline = Date.now() + agentTimeoutMs;
        // Available, and the agent's first health report in (Degraded known), so the printed table is settled.
        const settled = (conds: { type: string; status: string }[] | undefined): boolean =>
          !!conds?.some((k) => k.type === 'Available' && k.status === 'True') &&
          !!conds.some((k) => k.type === 'Degraded' && k.status !== 'Unknown');
        const available = async (): Promise<boolean> => {
          const { items } = await store.list('ManagedClusterAddOn');
          return QUICKSTART_CLUSTERS.every((c) => items.some((a) => a.metadata.namespace === c && settled(a.status?.conditions)));
        };
        while (!(await available())) {
          this.check();
          if (Date.now() > deadline)
            throw new Error(
              `the demo addons did not turn Available within ${agentTimeoutMs / 1000}s; rerun with --log-level info to see why`,
            );
          await new Promise((r) => setTimeout(r, 100));
        }
      },
      () => 'cluster-proxy Available on both',
    );
    this.check();
  }

  /** A token, kubeconfigs (CONNECT and gateway) and a local forward per cluster, the commands to try, and quickstart.json. */
  private async writeAccess({ hub, ports, pki, tls }: HubParts): Promise<QuickstartInfo> {
    const { dir, log } = this;
    // A token for curl and the kubeconfigs. The old one of a previous run in this directory goes.
    const tokens = hub.server.tokens!;
    await tokens.revoke(TOKEN_NAME);
    const token = await issueToken(tokens, { name: TOKEN_NAME, clusters: '*' });

    const tunnel = new Tunnel({
      address: `127.0.0.1:${ports.frontend}`,
      caCert: tls.caCert,
      cert: await readFile(pki.clientCert),
      key: await readFile(pki.clientKey),
      serverName: 'localhost',
    });
    this.closers.push(() => tunnel.close());
    const caPem = tls.caCert.toString('utf8');
    const clusters: QuickstartInfo['clusters'] = {};
    for (const cluster of QUICKSTART_CLUSTERS) {
      const kubeconfig = path.join(dir, `${cluster}.kubeconfig`);
      // The demo apiservers' certificates come from the hub CA, so one CA verifies both the hub
      // (the https proxy) and the apiserver: no insecure-skip-tls-verify.
      await writeFile(
        kubeconfig,
        buildKubeconfig({
          cluster,
          server: `https://${cluster}`,
          proxyUrl: proxyUrl(TOKEN_NAME, token.token, '127.0.0.1', ports.connect!),
          caPems: [caPem],
          userToken: DEMO_APISERVER_TOKEN,
        }),
        { mode: 0o600 },
      );
      // Through the gateway: the cluster's apiserver sees the token's user, by impersonation.
      const gatewayKubeconfig = path.join(dir, `${cluster}-gateway.kubeconfig`);
      await writeFile(
        gatewayKubeconfig,
        buildKubeconfig({ cluster, server: `https://127.0.0.1:${ports.gateway}/${cluster}`, caPems: [caPem], userToken: token.token }),
        { mode: 0o600 },
      );
      const fwd = await serveForward(tunnel, `${cluster}:443`, { host: '127.0.0.1', port: 0 }, log);
      this.closers.push(() => new Promise<void>((r) => fwd.close(() => r())));
      clusters[cluster] = {
        apiserver: this.apiservers[cluster]!,
        forward: `127.0.0.1:${(fwd.address() as net.AddressInfo).port}`,
        kubeconfig,
        gatewayKubeconfig,
      };
    }
    this.check();

    const cli = cliWords();
    const connect = `127.0.0.1:${ports.connect}`;
    const curlConnect = (cluster: string): string =>
      shellCommand([
        'curl',
        '-sS',
        '--proxy',
        `https://${connect}`,
        '--proxy-cacert',
        pki.caCert,
        '--proxy-header',
        `Proxy-Authorization: Bearer ${token.token}`,
        '--cacert',
        pki.caCert,
        `https://${cluster}/version`,
      ]);
    const fwdPort = await freePort();
    const commands: QuickstartInfo['commands'] = {
      curl: QUICKSTART_CLUSTERS.map(curlConnect),
      kubectl: QUICKSTART_CLUSTERS.map((c) =>
        shellCommand([kubectlCommand(), '--kubeconfig', clusters[c]!.kubeconfig, 'get', '--raw', '/version']),
      ),
      forward: shellCommand([
        ...cli,
        'forward',
        'cluster2',
        'cluster2:443',
        '--listen',
        `127.0.0.1:${fwdPort}`,
        '--frontend',
        `127.0.0.1:${ports.frontend}`,
        '--server-name',
        'localhost',
        '--ca-cert',
        pki.caCert,
        '--cert',
        pki.clientCert,
        '--key',
        pki.clientKey,
      ]),
      forwardCurl: shellCommand(['curl', '-sS', '--cacert', pki.caCert, `https://127.0.0.1:${fwdPort}/version`]),
      gatewayCurl: QUICKSTART_CLUSTERS.map((c) =>
        shellCommand([
          'curl',
          '-sS',
          '--cacert',
          pki.caCert,
          '-H',
          `Authorization: Bearer ${token.token}`,
          `https://127.0.0.1:${ports.gateway}/${c}/version`,
        ]),
      ),
      gatewayKubectl: QUICKSTART_CLUSTERS.map((c) =>
        shellCommand([kubectlCommand(), '--kubeconfig', clusters[c]!.gatewayKubeconfig, 'auth', 'whoami']),
      ),
    };
    const info: QuickstartInfo = {
      hub: {
        serverID: ports.serverID,
        agent: `127.0.0.1:${ports.agent}`,
        frontend: `127.0.0.1:${ports.frontend}`,
        frontendUds: ports.frontendUds,
        connect,
        gateway: `127.0.0.1:${ports.gateway}`,
        health: `127.0.0.1:${ports.health}`,
        admin: `127.0.0.1:${ports.admin}`,
      },
      ca: pki.caCert,
      client: { cert: pki.clientCert, key: pki.clientKey },
      token: { name: token.name, id: token.id, value: token.token },
      clusterNames: [...QUICKSTART_CLUSTERS],
      clusters,
      commands,
    };
    const infoFile = path.join(dir, 'quickstart.json');
    await writeFile(infoFile, `${JSON.stringify(info, null, 2)}\n`, { mode: 0o600 });
    this.closers.push(() => rm(infoFile, { force: true }));
    return info;
  }

  private async printWelcome({ commands, clusters }: QuickstartInfo): Promise<void> {
    const { dir } = this;
    const cli = cliWords();
    const p = paint(process.stdout);
    const kubectlNote =
      kubectlCommand() !== 'kubectl' || (await onPath('kubectl'))
        ? []
        : [p.dim('  (kubectl is not on your PATH: install it to try these)')];
    const lines = [
      '',
      p.bold(
        `cluster-proxy quickstart is running: a hub and two demo clusters (${QUICKSTART_CLUSTERS.join(', ')}), each an agent in front of a demo apiserver.`,
      ),
      `Listeners, CA, client certificate and token: ${path.join(dir, 'quickstart.json')}`,
      '',
      p.bold("curl through the hub's HTTP CONNECT frontend (token auth):"),
      ...commands.curl.map((c) => `  ${c}`),
      '',
      p.bold('kubectl with a generated kubeconfig (proxy-url to the same frontend):'),
      ...commands.kubectl.map((c) => `  ${c}`),
      ...kubectlNote,
      '',
      p.bold("The HTTP gateway, https://HUB/CLUSTER/PATH: the cluster sees the token's user (kubectl auth whoami says who):"),
      ...commands.gatewayCurl.map((c) => `  ${c}`),
      ...commands.gatewayKubectl.map((c) => `  ${c}`),
      '',
      p.bold('A local port forwarded through the tunnel (client certificate); run it in another terminal, then curl it:'),
      `  ${commands.forward}`,
      `  ${commands.forwardCurl}`,
      '',
      `Already forwarded: ${QUICKSTART_CLUSTERS.map((c) => `${c} on https://${clusters[c]!.forward}`).join(', ')}.`,
      `Connected clusters: ${shellCommand([...cli, 'get', 'clusters', '--data-dir', dir])}`,
      `Addon health:       ${shellCommand([...cli, 'get', 'managedclusteraddons', '-A', '--data-dir', dir])}`,
      `Register another:   ${shellCommand([...cli, 'join', 'cluster3', '--data-dir', dir])}`,
      '',
      'Press Ctrl+C to stop.',
      '',
    ];
    process.stdout.write(lines.join('\n'));
  }
}

export async function runQuickstart(args: string[]): Promise<void> {
  const { flags } = parseFlags(args, quickstartFlags);
  if (flags['help']) {
    process.stdout.write(quickstartUsage);
    return;
  }
  const log = createLogger(str(flags, 'log-level')!, 'quickstart');
  await new Quickstart(path.resolve(str(flags, 'data-dir')!), duration(flags, 'agent-timeout'), log).run();
}
