#!/usr/bin/env node
// The `cluster-proxy` command.
import { runAgent } from './agent.js';
import { UsageError } from './flags.js';
import { runForward } from './forward.js';
import { runGet } from './get.js';
import { runHub } from './hub.js';
import { runCa } from './ca.js';
import { runDelete, runJoin } from './join.js';
import { runKubeconfig } from './kubeconfig.js';
import { runNoProxy } from './noproxy.js';
import { runQuickstart } from './quickstart.js';
import { runToken } from './token.js';

const commands: Record<string, { summary: string; run: (args: string[]) => Promise<void> }> = {
  hub: { summary: 'run the proxy server', run: runHub },
  agent: { summary: 'run an agent in a managed cluster', run: runAgent },
  quickstart: { summary: 'hub + two demo clusters on this machine, with curl, kubectl and forward lines to try', run: runQuickstart },
  forward: { summary: 'serve a local port through the tunnel', run: runForward },
  kubeconfig: { summary: 'write a kubeconfig that reaches a cluster\'s apiserver through the hub', run: runKubeconfig },
  join: { summary: 'register a managed cluster; writes its agent bootstrap bundle and install manifests', run: runJoin },
  delete: { summary: 'remove a managed cluster (revokes its agents)', run: runDelete },
  ca: { summary: 'rotate the hub CA (add, promote, finish) without cutting agents off; issue client certificates', run: runCa },
  get: { summary: 'clusters, agents, managedclusters or managedclusteraddons (kubectl-style tables)', run: runGet },
  token: { summary: 'issue, list or revoke tokens for the HTTP CONNECT frontend', run: runToken },
  noproxy: { summary: 'audit a NO_PROXY value (check) or explain one decision', run: runNoProxy },
};

const usage = `Usage: cluster-proxy COMMAND [flags]

Commands:
${Object.entries(commands).map(([n, c]) => `  ${n.padEnd(12)} ${c.summary}`).join('\n')}

Run "cluster-proxy COMMAND --help" for a command's flags.
`;

async function main(argv: string[]): Promise<number> {
  const [name, ...rest] = argv;
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    process.stdout.write(usage);
    return name ? 0 : 2;
  }
  const cmd = commands[name];
  if (!cmd) throw new UsageError(`unknown command "${name}"; run "cluster-proxy --help"`);
  await cmd.run(rest);
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    if (err instanceof UsageError) {
      process.stderr.write(`cluster-proxy: ${err.message}\n`);
      process.exit(2);
    }
    // Not a user mistake: keep the stack for a bug report, but lead with one line.
    const e = err as Error;
    process.stderr.write(`cluster-proxy: ${e.message}\n`);
    if (process.env['CLUSTER_PROXY_DEBUG']) process.stderr.write(`${e.stack}\n`);
    process.exit(1);
  },
);
