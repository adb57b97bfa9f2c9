// `cluster-proxy quickstart`: a hub, two demo clusters (an agent each, in front of a demo HTTPS
// "apiserver"), and a local forward per cluster, so a newcomer can curl through the tunnel at once.
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { Agent } from '@cluster-proxy/agent';
import { ProxyServer, ensureHubPki, issueAgentCert, issueServerCert, readPemPair, writePemPair } from '@cluster-proxy/server';
import { Tunnel } from '../tunnel.js';
import { serveForward } from './forward.js';
import { createLogger } from './logging.js';
import { helpText, parseFlags, str, type FlagSpecs } from './flags.js';

const quickstartFlags: FlagSpecs = {
  'data-dir': { type: 'string', default: '.cluster-proxy/quickstart', help: 'where PKI, ports and quickstart.json go' },
  'log-level': { type: 'string', default: 'warn', help: 'log level of the embedded hub and agents' },
};

export const quickstartUsage = helpText('cluster-proxy quickstart [--data-dir DIR]', 'Runs a hub, two demo clusters with agents, and a local forward to each; prints what to try. Ctrl+C stops it.', quickstartFlags);

const CLUSTERS = ['cluster1', 'cluster2'];

/** A tiny HTTPS server that answers like a kube-apiserver on /version and /healthz. */
function startDemoApiserver(cluster: string, tls: { certPem: string; keyPem: string }): Promise<https.Server> {
  const server = https.createServer({ cert: tls.certPem, key: tls.keyPem }, (req, res) => {
    if (req.url === '/healthz' || req.url === '/readyz' || req.url === '/livez') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end('ok');
      return;
    }
    if (req.url === '/version') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(`${JSON.stringify({ major: '1', minor: '33', gitVersion: 'v1.33.0-demo', platform: 'linux/amd64', cluster }, null, 2)}\n`);
      return;
    }
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'NotFound', code: 404, message: `demo apiserver of ${cluster} only serves /version and /healthz` }));
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

export async function runQuickstart(args: string[]): Promise<void> {
  const { flags } = parseFlags(args, quickstartFlags);
  if (flags['help']) {
    process.stdout.write(quickstartUsage);
    return;
  }
  const dir = path.resolve(str(flags, 'data-dir')!);
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const log = createLogger(str(flags, 'log-level')!, 'quickstart');
  const progress = (msg: string): void => {
    process.stderr.write(`${msg}\n`);
  };
  progress(`Preparing certificates in ${dir}/pki ...`);
  const pki = await ensureHubPki(path.join(dir, 'pki'), { hostnames: ['localhost'] });
  const ca = await readPemPair(path.join(dir, 'pki'), 'ca');
  const tls = { caCert: await readFile(pki.caCert), cert: await readFile(pki.serverCert), key: await readFile(pki.serverKey) };
  const server = new ProxyServer({ bindAddress: '127.0.0.1', agentPort: 0, frontendPort: 0, frontendUds: path.join(dir, 'frontend.sock'), healthPort: 0, adminPort: 0, tls, dataDir: dir, log: log.child({ component: 'hub' }) });
  const ports = await server.start();
  const agents: Agent[] = [];
  const apiservers: https.Server[] = [];
  const forwards: net.Server[] = [];
  const tunnel = new Tunnel({ address: `127.0.0.1:${ports.frontend}`, caCert: tls.caCert, cert: await readFile(pki.clientCert), key: await readFile(pki.clientKey), serverName: 'localhost' });
  const clusters: Record<string, { apiserver: string; forward: string }> = {};
  for (const cluster of CLUSTERS) {
    const api = await startDemoApiserver(cluster, issueServerCert(ca, { commonName: `${cluster}-apiserver`, dnsNames: [cluster, 'localhost', 'kubernetes.default.svc'], ipAddresses: ['127.0.0.1'] }));
    apiservers.push(api);
    const apiAddr = `127.0.0.1:${(api.address() as net.AddressInfo).port}`;
    const creds = issueAgentCert(ca, { cluster });
    await writePemPair(path.join(dir, 'agents'), cluster, creds);
    const agent = new Agent({ cluster, namespace: 'open-cluster-management-agent-addon', hubAddress: `127.0.0.1:${ports.agent}`, serverName: 'localhost', caCert: tls.caCert, cert: Buffer.from(creds.certPem), key: Buffer.from(creds.keyPem), apiserver: apiAddr, allow: [], log: log.child({ component: 'agent', cluster }) });
    agent.start();
    agents.push(agent);
    const fwd = await serveForward(tunnel, `${cluster}:443`, { host: '127.0.0.1', port: 0 }, log);
    forwards.push(fwd);
    clusters[cluster] = { apiserver: apiAddr, forward: `127.0.0.1:${(fwd.address() as net.AddressInfo).port}` };
  }
  progress('Waiting for the agents to connect ...');
  const deadline = Date.now() + 15_000;
  while (agents.some((a) => a.connectedServers === 0) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  const info = {
    hub: { agent: `127.0.0.1:${ports.agent}`, frontend: `127.0.0.1:${ports.frontend}`, frontendUds: ports.frontendUds, health: `127.0.0.1:${ports.health}`, admin: `127.0.0.1:${ports.admin}` },
    ca: pki.caCert,
    client: { cert: pki.clientCert, key: pki.clientKey },
    clusters,
  };
  await writeFile(path.join(dir, 'quickstart.json'), `${JSON.stringify(info, null, 2)}\n`);
  const cli = `node ${path.relative(process.cwd(), process.argv[1] ?? 'client/dist/cli/main.js')}`;
  const lines = [
    '',
    `cluster-proxy quickstart is running (details in ${path.join(dir, 'quickstart.json')}).`,
    '',
    'Each demo cluster\'s apiserver is forwarded through the tunnel (client -> hub -> agent -> apiserver):',
    ...CLUSTERS.map((c) => `  curl -sk https://${clusters[c]!.forward}/version`),
    '',
    'Forward another local port yourself:',
    `  ${cli} forward cluster1 cluster1:443 --listen 127.0.0.1:16443 --frontend ${info.hub.frontend} --server-name localhost --ca-cert ${pki.caCert} --cert ${pki.clientCert} --key ${pki.clientKey}`,
    '  curl -sk https://127.0.0.1:16443/healthz',
    '',
    `Hub connection table: curl -s http://${info.hub.admin}/debug/connections`,
    '',
    'Press Ctrl+C to stop.',
    '',
  ];
  process.stdout.write(lines.join('\n'));
  await new Promise<void>((resolve) => {
    let stopping = false;
    const stop = (): void => {
      if (stopping) process.exit(1);
      stopping = true;
      progress('Stopping ...');
      for (const f of forwards) f.close();
      tunnel.close();
      for (const a of agents) a.stop();
      for (const a of apiservers) {
        a.closeAllConnections();
        a.close();
      }
      void server.stop(2000).then(resolve);
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
}
