// `node test/dist/bench/ab.js --build NAME=DIR ...`: the `tunnel` path's one-connection throughput
// and CPU per GiB of several builds of this repository side by side, interleaved round by round on
// one machine, with `ssh -R` measured in the same rounds as a control for machine load. Each build
// brings its own hub, agent (both from DIR's `cluster-proxy` entry) and SDK (DIR/client/dist,
// loaded into this process); the targets, the payload, the timing and the CPU accounting are this
// checkout's, so only the product code differs between the columns. See README.md.
import { readFileSync } from 'node:fs';
import { access, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { createPki } from '../harness.js';
import { startCluster } from './cluster.js';
import { CPU_FIGURE_LABELS, CPU_UNIT, type CpuFigure, type PathProcesses } from './cpu.js';
import { startTargets, type TargetName } from './helpers.js';
import { connectTcp, errorMessage, Pinger } from './io.js';
import { cpuBusy, describeTcpMemory, loadAverage, machineFacts, tcpMemory } from './machine.js';
import type { Dialer } from './paths.js';
import { removeOnDeath } from './reaper.js';
import { runToExit, startBenchRun } from './run.js';
import { FULL_CONFIG, ThroughputRun, type BenchConfig, type Direction } from './scenarios.js';
import { findSshTools, startSshd, startSshTunnel } from './sshd.js';

const USAGE = `Usage: node test/dist/bench/ab.js --build NAME=DIR [--build NAME=DIR ...] [flags]

Measures the tunnel path (SDK -> hub -> mux agent -> target) of every build, and ssh -R as a
control, one connection up and down: MB/s and CPU seconds per GiB of client, hub, agent and target.
Builds, directions and ssh run interleaved, the order alternating from round to round. A DIR is a
built checkout of this repository (pnpm install; npx tsc -b ...), e.g. a git worktree in /tmp.

Flags:
  --build NAME=DIR   a build to measure (repeat; the first is the reference for the ratios)
  --rounds N         rounds (default 3)
  --seconds S        length of each timed transfer (default 2.5)
  --no-ssh           leave out the ssh -R control
  --json FILE        also write the figures as JSON
  --cpu-prof DIR     every build's hub and agent write a V8 CPU profile into DIR when they exit
                     (DIR/hub-ab-NAME.cpuprofile, agent-ab-NAME...; read them with test/dist/bench/cpuprofile.js)
  --help             show this help
`;

const log = (message: string): void => void process.stderr.write(`[ab] ${message}\n`);

/** What this harness needs of a build's SDK (every build since the mux transport has it). */
interface SdkTunnel {
  dial(destination: string, opts: { timeoutMs: number }): Promise<Duplex>;
  close(): void;
  readonly activeTransport: string;
}
type SdkTunnelClass = new (opts: {
  address: string;
  serverName: string;
  caCert: Buffer;
  cert: Buffer;
  key: Buffer;
  transport: 'mux';
}) => SdkTunnel;

interface Build {
  name: string;
  dir: string;
  commit: string;
}

interface Subject {
  name: string;
  runs: Record<Direction, ThroughputRun>;
}

const FIGURES: readonly CpuFigure[] = ['client', 'hub', 'agent', 'target', 'proxy'];

async function exists(file: string): Promise<boolean> {
  return access(file).then(
    () => true,
    () => false,
  );
}

/** The build's `cluster-proxy` entry: cli/dist/main.js, or client/dist/cli/main.js before the CLI had its own package. */
async function cliOf(dir: string): Promise<string> {
  for (const candidate of ['cli/dist/main.js', 'client/dist/cli/main.js']) {
    const file = path.join(dir, candidate);
    if (await exists(file)) return file;
  }
  throw new Error(`${dir}: no built cluster-proxy entry (cli/dist/main.js or client/dist/cli/main.js); build it first`);
}

async function sdkOf(dir: string): Promise<SdkTunnelClass> {
  const file = path.join(dir, 'client/dist/index.js');
  const mod: unknown = await import(pathToFileURL(file).href);
  const Tunnel = typeof mod === 'object' && mod !== null ? (mod as { Tunnel?: unknown }).Tunnel : undefined;
  if (typeof Tunnel !== 'function') throw new Error(`${file} exports no Tunnel`);
  return Tunnel as SdkTunnelClass;
}

async function commitOf(dir: string): Promise<string> {
  // A worktree's .git is a file pointing at its git dir; HEAD there is detached (a hash) or a ref.
  try {
    let gitDir = path.join(dir, '.git');
    const dotGit = await readFile(gitDir, 'utf8').catch(() => undefined);
    if (dotGit?.startsWith('gitdir: ')) gitDir = dotGit.slice(8).trim();
    const head = (await readFile(path.join(gitDir, 'HEAD'), 'utf8')).trim();
    if (!head.startsWith('ref: ')) return head.slice(0, 7);
    const ref = head.slice(5);
    const common = await readFile(path.join(gitDir, 'commondir'), 'utf8').then(
      (c) => path.resolve(gitDir, c.trim()),
      () => gitDir,
    );
    const hash = await readFile(path.join(gitDir, ref), 'utf8').catch(() => readFile(path.join(common, ref), 'utf8'));
    return `${hash.trim().slice(0, 7)} (${ref.replace('refs/heads/', '')})`;
  } catch {
    return 'n/a';
  }
}

async function probe(dialer: Dialer): Promise<void> {
  const socket = await dialer.dial('echo', 15_000);
  try {
    await new Pinger(socket).ping();
  } finally {
    socket.destroy();
  }
}

function median(values: readonly number[]): number | null {
  const v = [...values].sort((x, y) => x - y);
  if (v.length === 0) return null;
  const mid = Math.floor(v.length / 2);
  return v.length % 2 === 1 ? (v[mid] ?? null) : ((v[mid - 1] ?? 0) + (v[mid] ?? 0)) / 2;
}

function fmt(value: number | null, digits = 2): string {
  return value === null || !Number.isFinite(value) ? 'n/a' : value.toFixed(digits);
}

function table(header: readonly string[], body: readonly (readonly string[])[]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...body.map((row) => (row[i] ?? '').length)));
  const line = (cells: readonly string[]): string =>
    cells.map((c, i) => (i < 2 ? c.padEnd(widths[i] ?? 0) : c.padStart(widths[i] ?? 0))).join(' | ');
  return [line(header), widths.map((w) => '-'.repeat(w)).join('-|-'), ...body.map(line)].join('\n');
}

function parse(argv: string[]) {
  return parseArgs({
    args: argv[0] === '--' ? argv.slice(1) : argv,
    options: {
      build: { type: 'string', multiple: true },
      rounds: { type: 'string' },
      seconds: { type: 'string' },
      'no-ssh': { type: 'boolean' },
      json: { type: 'string' },
      'cpu-prof': { type: 'string' },
      help: { type: 'boolean' },
    },
    strict: true,
    allowPositionals: false,
  }).values;
}

async function main(): Promise<number> {
  let values: ReturnType<typeof parse>;
  try {
    values = parse(process.argv.slice(2));
  } catch (err) {
    process.stderr.write(`${errorMessage(err)}\n\n${USAGE}`);
    return 2;
  }
  if (values.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  const rounds = Number(values.rounds ?? 3);
  const seconds = Number(values.seconds ?? 2.5);
  const builds: Build[] = [];
  for (const spec of values.build ?? []) {
    const eq = spec.indexOf('=');
    if (eq <= 0) {
      process.stderr.write(`--build ${spec}: expected NAME=DIR\n\n${USAGE}`);
      return 2;
    }
    const dir = path.resolve(spec.slice(eq + 1));
    builds.push({ name: spec.slice(0, eq), dir, commit: await commitOf(dir) });
  }
  if (builds.length === 0 || !Number.isInteger(rounds) || rounds < 1 || !(seconds > 0)) {
    process.stderr.write(`need at least one --build, --rounds >= 1, --seconds > 0\n\n${USAGE}`);
    return 2;
  }
  const cfg: BenchConfig = { ...FULL_CONFIG, throughputSeconds: seconds };

  // Set-up, then per round and subject two calibrated transfers of `seconds` (a hashed one first).
  const run = startBenchRun(log, (120 + rounds * (builds.length + 1) * (8 * seconds + 20)) * 1000);
  const { stopping } = run;
  const register = (name: string, stop: () => Promise<void>): void => run.cleanup.add(name, stop);
  try {
    const machine = machineFacts(`ab: ${rounds} round(s), transfers ~${seconds} s`);
    const busy = await cpuBusy(1000);
    machine['busy before start'] = busy === undefined ? 'n/a' : `${(busy * 100).toFixed(0)}% of all cores (load average ${loadAverage()})`;
    machine['tcp memory'] = describeTcpMemory(await tcpMemory());

    const targets = await startTargets();
    register('targets', targets.stop);
    const targetPid = targets.proc.pid;
    if (targetPid === undefined) throw new Error('the targets process has no pid');
    const pki = await createPki();
    removeOnDeath(pki.dir);
    register('pki', pki.cleanup);
    const portOf = (target: TargetName): number => targets.ports[target];

    const subjects: Subject[] = [];
    const runsFor = (dialer: Dialer): Record<Direction, ThroughputRun> => ({
      up: new ThroughputRun(dialer, 'up', cfg, 1, true),
      down: new ThroughputRun(dialer, 'down', cfg, 1, true),
    });

    if (!values['no-ssh']) {
      const tools = await findSshTools(log);
      if (tools.ok) {
        const sshd = await startSshd(tools.tools, register);
        const tunnel = await startSshTunnel(
          tools.tools,
          sshd,
          {
            label: 'ab',
            sshPort: sshd.port,
            targets: { echo: portOf('echo'), sink: portOf('sink'), sinkHash: portOf('sinkHash'), source: portOf('source') },
          },
          register,
        );
        const sshPid = tunnel.proc.pid;
        if (sshPid === undefined) throw new Error('ssh has no pid');
        const processes: PathProcesses = { hub: tunnel.sessionPids, agent: [sshPid], target: [targetPid] };
        const dialer: Dialer = {
          path: 'ssh',
          network: 'lan',
          dial: async (target, timeoutMs) => connectTcp(tunnel.remotePorts[target] ?? 0, timeoutMs),
          processes: () => processes,
        };
        await probe(dialer);
        subjects.push({ name: 'ssh -R', runs: runsFor(dialer) });
        machine['ssh'] = `${tools.tools.version}; cipher ${tools.tools.cipher} (default)`;
      } else {
        log(`ssh -R control unavailable: ${tools.reason}`);
      }
    }

    const caCert = readFileSync(pki.caPath);
    const cert = readFileSync(pki.client.certPath);
    const key = readFileSync(pki.client.keyPath);
    for (const build of builds) {
      const cli = await cliOf(build.dir);
      const Tunnel = await sdkOf(build.dir);
      log(`starting ${build.name} (${build.commit}, ${cli}) ...`);
      const cluster = await startCluster(pki, {
        label: `ab-${build.name}`,
        transport: 'mux',
        cli,
        onStarted: register,
        ...(values['cpu-prof'] ? { cpuProfDir: path.resolve(values['cpu-prof']) } : {}),
      });
      const tunnel = new Tunnel({
        address: `127.0.0.1:${cluster.hub.ports.frontend}`,
        serverName: 'localhost',
        caCert,
        cert,
        key,
        transport: 'mux',
      });
      register(`tunnel-${build.name}`, async () => tunnel.close());
      const processes: PathProcesses = { hub: [cluster.hub.pid], agent: [cluster.agentPid], target: [targetPid] };
      const dialer: Dialer = {
        path: 'tunnel',
        network: 'lan',
        dial: (target, timeoutMs) => tunnel.dial(`127.0.0.1:${portOf(target)}`, { timeoutMs }),
        processes: () => processes,
      };
      await probe(dialer);
      if (tunnel.activeTransport !== 'mux') throw new Error(`${build.name}: the SDK uses ${tunnel.activeTransport}, not mux`);
      subjects.push({ name: build.name, runs: runsFor(dialer) });
      machine[`build ${build.name}`] = `${build.commit} ${build.dir}`;
    }

    const loads: { round: number; before: string; after: string; tcpPressureMs: number | null }[] = [];
    for (let round = 0; round < rounds && !stopping(); round++) {
      // Alternate the order of subjects and of directions, so neither always runs first.
      const order = round % 2 === 0 ? subjects : [...subjects].reverse();
      const dirs: Direction[] = round % 2 === 0 ? ['up', 'down'] : ['down', 'up'];
      const before = (await readFile('/proc/loadavg', 'utf8')).trim();
      const tcpBefore = await tcpMemory();
      for (const subject of order) {
        for (const dir of dirs) {
          if (stopping()) break;
          log(`round ${round + 1}/${rounds} ${subject.name} ${dir}: ${await subject.runs[dir].measure()}`);
          await new Promise((resolve) => setTimeout(resolve, cfg.settleMs));
        }
      }
      const after = (await readFile('/proc/loadavg', 'utf8')).trim();
      const tcpAfter = await tcpMemory();
      // Under TCP memory pressure the proxies' throughput (and batch sizes) collapse: such a round is flagged.
      const tcpPressureMs =
        tcpBefore && tcpAfter && Number.isFinite(tcpAfter.pressureMs - tcpBefore.pressureMs)
          ? tcpAfter.pressureMs - tcpBefore.pressureMs
          : null;
      loads.push({ round: round + 1, before, after, tcpPressureMs });
      log(`round ${round + 1}: /proc/loadavg ${before} -> ${after}; TCP memory pressure ${tcpPressureMs ?? 'n/a'} ms`);
    }
    if (stopping()) return 1;
    machine['load after'] = loadAverage();

    const header = [
      'subject',
      'dir',
      'MB/s',
      ...FIGURES.map((f) => `${CPU_FIGURE_LABELS[f].replace('CPU ', '')} ${CPU_UNIT}`),
      'hub+agent per round',
      'MB/s per round',
    ];
    const body: string[][] = [];
    const json: Record<string, unknown>[] = [];
    for (const subject of subjects) {
      for (const dir of ['up', 'down'] as const) {
        const run = subject.runs[dir];
        const v = run.values();
        const r = run.roundValues();
        const { cpu } = run;
        if (!cpu) continue;
        body.push([
          subject.name,
          dir,
          fmt(v[0] ?? null, 1),
          ...FIGURES.map((f) => fmt(cpu.perGiB(f), 3)),
          cpu
            .perRound('proxy')
            .map((x) => x.toFixed(2))
            .join(' '),
          (r[0] ?? []).map((x) => x.toFixed(0)).join(' '),
        ]);
        json.push({
          subject: subject.name,
          dir,
          mbPerSecond: v[0] ?? null,
          mbPerSecondRounds: r[0] ?? [],
          cpuSecondsPerGiB: Object.fromEntries(FIGURES.map((f) => [f, cpu.perGiB(f)])),
          cpuRounds: Object.fromEntries(FIGURES.map((f) => [f, cpu.perRound(f)])),
          cpuBoundPerGiB: Object.fromEntries(FIGURES.map((f) => [f, cpu.boundPerGiB(f)])),
          note: cpu.note(),
        });
      }
    }
    // Each build against the first: hub+agent CPU per GiB and MB/s, per direction.
    const reference = subjects.find((s) => s.name === builds[0]?.name);
    const ratios: string[] = [];
    for (const subject of subjects) {
      if (!reference || subject === reference || !builds.some((b) => b.name === subject.name)) continue;
      for (const dir of ['up', 'down'] as const) {
        const a = subject.runs[dir];
        const b = reference.runs[dir];
        const cpuRatio = (a.cpu?.perGiB('proxy') ?? NaN) / (b.cpu?.perGiB('proxy') ?? NaN);
        const mbRatio = (a.values()[0] ?? NaN) / (b.values()[0] ?? NaN);
        // Round by round the two ran seconds apart, under about the same load: the median of those
        // ratios is steadier than the ratio of totals on a busy machine.
        const perRound = (x: number[], y: number[]): number[] => x.map((v, i) => v / (y[i] ?? NaN)).filter(Number.isFinite);
        const cpuRounds = perRound(a.cpu?.perRound('proxy') ?? [], b.cpu?.perRound('proxy') ?? []);
        const mbRounds = perRound(a.roundValues()[0] ?? [], b.roundValues()[0] ?? []);
        const calm = (r: number[]): number[] => r.filter((_, i) => loads[i]?.tcpPressureMs === 0);
        const calmText = (r: number[]): string =>
          loads.some((l) => l.tcpPressureMs !== 0) ? `, without TCP pressure ${fmt(median(calm(r)))}x` : '';
        ratios.push(
          `${subject.name}/${reference.name} ${dir}: hub+agent CPU/GiB ${fmt(cpuRatio)}x (per round ${cpuRounds.map((r) => r.toFixed(2)).join(' ')}, median ${fmt(median(cpuRounds))}x${calmText(cpuRounds)}), ` +
            `client ${fmt((a.cpu?.perGiB('client') ?? NaN) / (b.cpu?.perGiB('client') ?? NaN))}x, ` +
            `MB/s ${fmt(mbRatio)}x (per round ${mbRounds.map((r) => r.toFixed(2)).join(' ')}, median ${fmt(median(mbRounds))}x${calmText(mbRounds)})`,
        );
      }
    }
    const out = [
      'cluster-proxy A/B: tunnel path, one connection',
      ...Object.entries(machine).map(([k, v]) => `  ${`${k}:`.padEnd(18)} ${v}`),
      '',
      table(header, body),
      '',
      ...ratios,
      '',
      ...loads.map(
        (l) => `round ${l.round}: /proc/loadavg ${l.before} -> ${l.after}; ${l.tcpPressureMs ?? 'n/a'} ms under TCP memory pressure`,
      ),
      ...subjects.flatMap((s) => (['up', 'down'] as const).map((dir) => `note ${s.name} ${dir}: ${s.runs[dir].notes().join('; ')}`)),
    ];
    process.stdout.write(`${out.join('\n')}\n`);
    if (values.json !== undefined) {
      await writeFile(values.json, `${JSON.stringify({ machine, config: { rounds, seconds }, loads, results: json, ratios }, null, 2)}\n`);
      log(`wrote ${values.json}`);
    }
    return 0;
  } finally {
    await run.finish();
  }
}

runToExit(main, log);
