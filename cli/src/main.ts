#!/usr/bin/env -S node --max-semi-space-size=2 --initial-old-space-size=64
// The `cluster-proxy` command.
// The flush alone, not the protocol library's index: this file stays light for every command.
import { stdioFlushed } from '@cluster-proxy/proto/stdio-flushed';
import { UsageError } from './flags.js';
import { oneLineMessage } from './one-line.js';
import { unsupportedNode, versionLine } from './version.js';

// Each command is imported only when it runs: `cluster-proxy agent` must not load hub code
// (or the Kubernetes client) into the agent's memory.
// `dataPlane`: the command carries tunnel bytes for a long time, so it gets the memory settings of memory/data-plane.ts.
// `shortYoungGarbage`: young garbage is kept short while its budget is held (memory/young-buffers.ts); the agent
// only, whose pod has a memory limit: on the hub it cost a bulk beside 1,024 konnectivity-style clients
// most of its speed, and its own peaks meet their goal without it.
type Command = { summary: string; dataPlane?: true; shortYoungGarbage?: true; load: () => Promise<(args: string[]) => Promise<void>> };

const commands: Record<string, Command> = {
  hub: { summary: 'run the proxy server', dataPlane: true, load: async () => (await import('./hub.js')).runHub },
  agent: {
    summary: 'run an agent in a managed cluster',
    dataPlane: true,
    shortYoungGarbage: true,
    load: async () => (await import('./agent.js')).runAgent,
  },
  quickstart: {
    summary: 'hub + two demo clusters on this machine, with curl, kubectl and forward lines to try',
    dataPlane: true,
    load: async () => (await import('./quickstart.js')).runQuickstart,
  },
  forward: {
    summary: 'serve a local port through the tunnel',
    dataPlane: true,
    load: async () => (await import('./forward.js')).runForward,
  },
  kubeconfig: {
    summary: "write a kubeconfig that reaches a cluster's apiserver through the hub",
    load: async () => (await import('./kubeconfig.js')).runKubeconfig,
  },
  join: {
    summary: 'register a managed cluster; writes its agent bootstrap bundle and install manifests',
    load: async () => (await import('./join.js')).runJoin,
  },
  delete: { summary: 'remove a managed cluster (revokes its agents)', load: async () => (await import('./join.js')).runDelete },
  ca: {
    summary: 'rotate the hub CA (add, promote, finish) without cutting agents off; issue client and agent certificates',
    load: async () => (await import('./ca.js')).runCa,
  },
  get: {
    summary: 'clusters, agents, managedclusters or managedclusteraddons (kubectl-style tables)',
    load: async () => (await import('./get.js')).runGet,
  },
  token: { summary: 'issue, list or revoke tokens for the HTTP CONNECT frontend', load: async () => (await import('./token.js')).runToken },
  'proxy-config': {
    summary: 'render the egress-proxy settings for containerd, kubelet, kubeadm, pods and charts',
    load: async () => (await import('./proxy-config.js')).runProxyConfig,
  },
  noproxy: {
    summary: 'audit a NO_PROXY value (check) or explain one decision',
    load: async () => (await import('./noproxy.js')).runNoProxy,
  },
};

const usage = `Usage: cluster-proxy COMMAND [flags]

Commands:
${Object.entries(commands)
  .map(([n, c]) => `  ${n.padEnd(12)} ${c.summary}`)
  .join('\n')}
  ${'version'.padEnd(12)} the version, the commit it was built from and the Node.js it runs on

Run "cluster-proxy COMMAND --help" for a command's flags; "cluster-proxy --version" for the version.
`;

async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  // Before anything else: every test and measurement runs on this Node line, an older one says so in one line.
  const oldNode = unsupportedNode();
  if (oldNode) {
    process.stderr.write(`${oldNode}\n`);
    return 1;
  }
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    process.stdout.write(usage);
    return name ? 0 : 2;
  }
  if (name === '--version' || name === 'version') {
    process.stdout.write(`${versionLine()}\n`);
    return 0;
  }
  const cmd = commands[name];
  if (!cmd) throw new UsageError(`unknown command "${name}"; run "cluster-proxy --help"`);
  if (cmd.dataPlane) await (await import('./memory/data-plane.js')).tuneForDataPlane({ shortYoungGarbage: cmd.shortYoungGarbage === true });
  const run = await cmd.load();
  await run(rest);
  return 0;
}

/** Every command ends here: exit only once stdout and stderr are flushed. */
async function exit(code: number): Promise<never> {
  await stdioFlushed();
  process.exit(code);
}

main(process.argv.slice(2)).then(
  (code) => exit(code),
  (err: unknown) => {
    if (err instanceof UsageError) {
      process.stderr.write(`cluster-proxy: ${oneLineMessage(err.message)}\n`);
      return exit(2);
    }
    // Not a user mistake: keep the stack for a bug report, but lead with one line.
    const message = err instanceof Error ? err.message : String(err);
    process.stderr.write(`cluster-proxy: ${oneLineMessage(message)}\n`);
    if (process.env['CLUSTER_PROXY_DEBUG'] && err instanceof Error) process.stderr.write(`${err.stack}\n`);
    return exit(1);
  },
);
