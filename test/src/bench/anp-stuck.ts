// The hub's growth per stuck connection against ANP's proxy-server under the same load: N
// konnectivity-clients (ANP's own, a TLS connection, an HTTP/2 session and a Proxy stream each, as
// kube-apiserver dials: stuck-clients.ts) to a destination that never reads, written into as fast as they are let, through
// one gRPC agent (ours, which speaks ANP's protocol to either server). Measures what a pod is charged:
// the server's anonymous memory (RssAnon) before, at its peak (sampled every 100 ms) and 10 s after the
// clients left, and its sockets' kernel memory while they are full (ss -m's skmem); prints one JSON line.
// The same load on our hub is stuck-destination's `konnectivity` rows on tunnel-grpc.
//
//   node test/dist/bench/anp-stuck.js --proxy-server PATH [--count 1024] [--seconds 20]
//
// PATH: ANP's proxy-server binary; default $ANP_PROXY_SERVER, else the release test/anp-go/go.mod pins, from
// the real peers' cache (scripts/build-real-peers.sh, run first if it is missing), as the tests get it.
import { existsSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { createPki } from '../harness.js';
import { freeLoopbackPort, killAllSpawned, socketMemory, spawnProcess, type ManagedProcess } from '../fixtures/index.js';
import { ANP_VERSIONS, anpBinary } from '../fixtures/anp-real.js';
import { startAgent, waitUntil } from './cluster.js';
import { procStatusKiB, startTargets } from './helpers.js';
import { reapOnDeath } from './reaper.js';
import { MiB } from './stats.js';
import type { StuckJob } from './stuck-client.js';
import { spawnStuckClients } from './stuck-clients.js';
import { refuse, toolArgs } from './tool-args.js';

const USAGE = `Usage: node test/dist/bench/anp-stuck.js [--proxy-server PATH] [--count N] [--seconds S]

N konnectivity-style clients stuck on ANP's own proxy-server (through our gRPC agent); prints one JSON line.
  --proxy-server PATH  ANP's proxy-server binary (default $ANP_PROXY_SERVER, else the pinned release
                       that scripts/build-real-peers.sh builds into its cache, built first if missing)
  --count N            stuck connections (default 1024)
  --seconds S          how long they are written into (default 20)
  --help               show this help
`;

const { values: flags } = toolArgs('anp-stuck', USAGE, {
  options: {
    'proxy-server': { type: 'string' },
    count: { type: 'string', default: '1024' },
    seconds: { type: 'string', default: '20' },
  },
});
const given = flags['proxy-server'] ?? process.env['ANP_PROXY_SERVER'];
const count = Number(flags.count);
const seconds = Number(flags.seconds);
if (!(Number.isInteger(count) && count > 0) || !(seconds > 0))
  refuse('anp-stuck', USAGE, '--count must be a whole number above 0 and --seconds a number above 0');
if (given !== undefined && !existsSync(given)) refuse('anp-stuck', USAGE, `no proxy-server binary at ${given}`);
const log = (m: string): void => void process.stderr.write(`[anp-stuck] ${m}\n`);

async function metricsText(port: number): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${port}/metrics`, { signal: AbortSignal.timeout(5000) });
  return res.text();
}

async function main(): Promise<void> {
  // The pinned current release, built into the real peers' cache if missing (as the tests get it).
  const binary = given ?? (await anpBinary('proxy-server', ANP_VERSIONS[0]!.version));
  const pki = await createPki();
  const stops: (() => Promise<unknown>)[] = [async () => pki.cleanup()];
  let child: ManagedProcess | undefined;
  try {
    const targets = await startTargets();
    stops.push(targets.stop);
    const [serverPort, agentPort, adminPort, healthPort] = [
      await freeLoopbackPort(),
      await freeLoopbackPort(),
      await freeLoopbackPort(),
      await freeLoopbackPort(),
    ];
    // Loopback only; mTLS on both sides with the bench PKI; one replica, no leases, no agent tokens.
    const server = reapOnDeath(
      spawnProcess({
        name: 'anp-proxy-server',
        command: binary,
        args: [
          '--mode=grpc',
          '--server-bind-address=127.0.0.1',
          `--server-port=${serverPort}`,
          '--agent-bind-address=127.0.0.1',
          `--agent-port=${agentPort}`,
          '--admin-bind-address=127.0.0.1',
          `--admin-port=${adminPort}`,
          '--health-bind-address=127.0.0.1',
          `--health-port=${healthPort}`,
          `--server-ca-cert=${pki.caPath}`,
          `--server-cert=${pki.server.certPath}`,
          `--server-key=${pki.server.keyPath}`,
          `--cluster-ca-cert=${pki.caPath}`,
          `--cluster-cert=${pki.server.certPath}`,
          `--cluster-key=${pki.server.keyPath}`,
          '--server-count=1',
          '--proxy-strategies=default',
          '--v=0',
        ],
      }),
    );
    stops.push(async () => server.stop(5000));
    const agent = await startAgent(pki, 'anp', `127.0.0.1:${agentPort}`, { label: 'anp', transport: 'grpc' });
    stops.push(async () => agent.stop(5000));
    await waitUntil('the agent at the proxy-server', server, 20_000, async () =>
      /^konnectivity_network_proxy_server_ready_backend_connections 1$/m.test(await metricsText(healthPort)) ? true : undefined,
    );
    const pid = server.pid!;
    const anon = async (): Promise<number> => (await procStatusKiB(pid, 'RssAnon')) ?? 0;
    await sleep(5000);
    const before = { anon: await anon(), socket: (await socketMemory(pid)) / 1024 };
    let peak = before.anon;
    const sampler = setInterval(
      () =>
        void anon().then((kib) => {
          peak = Math.max(peak, kib);
        }),
      100,
    );
    try {
      const job: StuckJob = {
        spec: {
          kind: 'anp',
          address: `127.0.0.1:${serverPort}`,
          tls: { caPath: pki.caPath, certPath: pki.client.certPath, keyPath: pki.client.keyPath },
          targets: targets.ports,
        },
        count,
        concurrency: 64,
        seconds,
        chunkBytes: 64 * 1024,
        perConnectionLimit: 256 * MiB,
      };
      child = await spawnStuckClients(`stuck-client-anp-${count}`, job);
      const opened = await child.waitForJsonLine((o) => 'opened' in o, 60_000 + count * 100);
      log(`opened ${String(opened['opened'])} of ${count}`);
      const filled = await child.waitForJsonLine((o) => 'filled' in o, (seconds + 60) * 1000);
      const held = { anon: await anon(), socket: (await socketMemory(pid)) / 1024 };
      peak = Math.max(peak, held.anon);
      const mark = child.lineCount();
      child.kill('SIGUSR2');
      await child.waitForJsonLine((o) => 'closed' in o, 60_000, { after: mark });
      await child.stop(10_000);
      await sleep(10_000);
      const after = await anon();
      const growthKiB = peak + held.socket - before.anon - before.socket;
      process.stdout.write(
        `${JSON.stringify({
          server: given === undefined ? `ANP proxy-server ${ANP_VERSIONS[0]!.version}` : `ANP proxy-server at ${given}`,
          count,
          opened: Number(opened['opened']),
          acceptedMiB: Number(filled['filled']) / MiB,
          anonMiB: { before: before.anon / 1024, peak: peak / 1024, held: held.anon / 1024, after: after / 1024 },
          socketMiB: { before: before.socket / 1024, held: held.socket / 1024 },
          growthKiBPerConnection: growthKiB / count,
        })}\n`,
      );
    } finally {
      clearInterval(sampler);
    }
  } finally {
    await child?.stop(5000);
    for (const stop of stops.reverse()) await stop().catch(() => {});
    await killAllSpawned();
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`anp-stuck: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);
