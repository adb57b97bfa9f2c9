// Connection-end conformance matrix: every client path × every agent transport × every way a
// connection can end, with real processes (hub, agents, `cluster-proxy forward`), real TLS, and a
// sha256 of every byte. Paths: our SDK over mux and over gRPC, a bare ANP-protocol gRPC client
// (what konnectivity-client sends: no extension metadata), `forward`, and the HTTP CONNECT
// frontend over TLS (client certificate, token), its Unix socket and its loopback plain listener.
// Agents: ours over mux and over gRPC, and a bare ANP-protocol agent (no extensions).
//
// Where a peer has no half-close (an ANP client or agent), the expected behaviour is ANP's: the
// first end from either side closes the connection. The table printed at the end says which cell
// passed; kill cells show how long the client took to see the error.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Tunnel } from '@cluster-proxy/client';
import {
  connectThrough,
  killAllSpawned,
  payloadBlock,
  payloadSha256,
  runCommand,
  snapshotHandles,
  spawnProcess,
  waitFor,
  waitForHandlesAtMost,
  writePayload,
  type ManagedProcess,
} from '../src/fixtures/index.js';
import { AnpClientConn } from '../src/fixtures/anp-peers.js';
import { RESET_AS_EOF_NOTE, libuvReportsQueuedReset } from '../src/fixtures/reset-probe.js';
import { startMatrixTarget, type MatrixTarget, type TargetConn } from '../src/fixtures/matrix-target.js';
import { CLI, createPki, startAgent, startHub, type AgentProcess, type HubProcess, type TestPki } from '../src/harness.js';

const MiB = 1024 * 1024;
const ANP_AGENT = fileURLToPath(new URL('../dist/fixtures/anp-agent.js', import.meta.url));
/** How long a client may take to learn of an end, a reset or a death (the issue's bound). */
const PROMPT_MS = 2000;

const AGENTS = ['mux', 'grpc', 'anp'] as const;
type AgentKind = (typeof AGENTS)[number];
const PATHS = [
  'sdk-mux',
  'sdk-grpc',
  'anp-client',
  'forward',
  'connect-tls-cert',
  'connect-tls-token',
  'connect-uds',
  'connect-plain',
] as const;
type PathName = (typeof PATHS)[number];
const CASES = [
  'upload-fin-reply',
  'upload-64MiB-fin-reply',
  'download-eof',
  'both-ways',
  'dest-closes-first',
  'dest-resets',
  'client-aborts',
  'agent-kill-download',
  'agent-kill-upload',
  'hub-kill',
] as const;
type CaseName = (typeof CASES)[number];

const cluster = (kind: AgentKind): string => `matrix-${kind}`;
/** Both ends understand half-close (else ANP's behaviour: the first end closes). */
const halfClose = (p: PathName, a: AgentKind): boolean => p !== 'anp-client' && a !== 'anp';
/** A Unix socket has no reset: a broken tunnel can only close it (the one path where an error reads as EOF). */
const canReset = (p: PathName): boolean => p !== 'connect-uds';
const NO_RST = 'EOF (no RST on UDS)';
/**
 * Uploads killed together. Eight concurrent uploads through one gRPC agent stall before the kill
 * (the hub waited for credit the agent never sent, first seen with grpc-js before our own gRPC on node:http2 replaced it), so uploads
 * are killed in pairs.
 */
const UPLOAD_GROUP = Number(process.env['MATRIX_UPLOAD_GROUP'] ?? 2);

let pki: TestPki;
let hub: HubProcess;
let target: MatrixTarget;
const agents = new Map<AgentKind, { proc: ManagedProcess; tables?: AgentProcess['tables'] }>();
const forwards = new Map<AgentKind, { proc: ManagedProcess; port: number }>();
let tunnelMux: Tunnel;
let tunnelGrpc: Tunnel;
let token: string;
let connectPorts: { tls: number; uds: string; plain: number };
let handles: Map<string, number>;
/** `${path}|${agent}|${case}` → what the cell showed. */
const cells = new Map<string, string>();
/** Clean EOFs seen where a reset was due, in any attempt: a retry must not hide one. */
const cleanEofs: string[] = [];
const open = new Set<Duplex>();

// ------------------------------------------------------------ processes

async function startAgentOf(kind: AgentKind, h: HubProcess): Promise<{ proc: ManagedProcess; tables?: AgentProcess['tables'] }> {
  if (kind !== 'anp') {
    const a = await startAgent(pki, h, {
      cluster: cluster(kind),
      apiserver: `127.0.0.1:${target.port}`,
      args: ['--transport', kind, '--keepalive-time', '1s', '--keepalive-timeout', '2s'],
    });
    return { proc: a.proc, tables: a.tables };
  }
  const cert = await pki.agent(cluster(kind));
  const proc = spawnProcess({
    name: 'anp-agent',
    command: process.execPath,
    args: [
      ANP_AGENT,
      '--hub',
      `127.0.0.1:${h.ports.agent}`,
      '--ca',
      pki.caPath,
      '--cert',
      cert.certPath,
      '--key',
      cert.keyPath,
      '--server-name',
      'localhost',
      '--cluster',
      cluster(kind),
      '--target',
      `127.0.0.1:${target.port}`,
    ],
  });
  await proc.waitForJsonLine((o) => o['msg'] === 'connected', 15_000);
  return { proc };
}

/** The hub routes the cluster again (after an agent start). */
async function routed(h: HubProcess, kind: AgentKind): Promise<void> {
  await waitFor(async () => (await h.tables()).agents.some((a) => a.cluster === cluster(kind)), {
    timeoutMs: 10_000,
    intervalMs: 50,
    message: `hub routes ${cluster(kind)}`,
  });
}

async function startForward(kind: AgentKind, h: HubProcess): Promise<{ proc: ManagedProcess; port: number }> {
  const proc = spawnProcess({
    name: `forward-${kind}`,
    command: process.execPath,
    args: [
      CLI,
      'forward',
      cluster(kind),
      `${cluster(kind)}:443`,
      '--listen',
      '127.0.0.1:0',
      '--frontend',
      `127.0.0.1:${h.ports.frontend}`,
      '--server-name',
      'localhost',
      '--ca-cert',
      pki.caPath,
      '--cert',
      pki.client.certPath,
      '--key',
      pki.client.keyPath,
      '--log-level',
      'warn',
    ],
  });
  const line = await proc.waitForLine((l) => l.startsWith('Forwarding '), 15_000);
  return { proc, port: Number(/:(\d+) ->/.exec(line)![1]) };
}

// ------------------------------------------------------------ client paths

async function openPath(
  p: PathName,
  kind: AgentKind,
  h: { tunnelMux: Tunnel; tunnelGrpc: Tunnel; hub: HubProcess; forwardPort: number },
): Promise<Duplex> {
  const dest = `${cluster(kind)}:443`;
  const tlsOpts = { ca: pki.ca.certPem, servername: 'localhost', allowHalfOpen: true } as const;
  let conn: Duplex;
  switch (p) {
    case 'sdk-mux':
    case 'sdk-grpc': {
      const s = (p === 'sdk-mux' ? h.tunnelMux : h.tunnelGrpc).connect(dest, { allowHalfOpen: true });
      conn = s;
      await new Promise<void>((resolve, reject) => {
        s.once('connect', resolve);
        s.once('error', reject);
      });
      break;
    }
    case 'anp-client': {
      const c = new AnpClientConn(
        `127.0.0.1:${h.hub.ports.frontend}`,
        {
          ca: Buffer.from(pki.ca.certPem),
          cert: readFileSync(pki.client.certPath),
          key: readFileSync(pki.client.keyPath),
          serverName: 'localhost',
        },
        dest,
      );
      conn = c;
      await c.connected;
      break;
    }
    case 'forward': {
      const s = net.connect({ host: '127.0.0.1', port: h.forwardPort, allowHalfOpen: true });
      conn = s;
      await new Promise<void>((resolve, reject) => {
        s.once('connect', resolve);
        s.once('error', reject);
      });
      break;
    }
    case 'connect-tls-cert':
      conn = await connectThrough(
        tls.connect({
          ...tlsOpts,
          port: connectPorts.tls,
          host: '127.0.0.1',
          cert: readFileSync(pki.client.certPath),
          key: readFileSync(pki.client.keyPath),
        }),
        dest,
      );
      break;
    case 'connect-tls-token':
      conn = await connectThrough(tls.connect({ ...tlsOpts, port: connectPorts.tls, host: '127.0.0.1' }), dest, {
        auth: `Bearer ${token}`,
      });
      break;
    case 'connect-uds':
      conn = await connectThrough(net.connect({ path: connectPorts.uds, allowHalfOpen: true }), dest);
      break;
    case 'connect-plain':
      conn = await connectThrough(net.connect({ host: '127.0.0.1', port: connectPorts.plain, allowHalfOpen: true }), dest, {
        auth: `Bearer ${token}`,
      });
      break;
  }
  open.add(conn);
  conn.once('close', () => open.delete(conn));
  return conn;
}

const mainHub = (kind: AgentKind): { tunnelMux: Tunnel; tunnelGrpc: Tunnel; hub: HubProcess; forwardPort: number } => ({
  tunnelMux,
  tunnelGrpc,
  hub,
  forwardPort: forwards.get(kind)!.port,
});

// ------------------------------------------------------------ reading what comes back

type End = 'eof' | 'error';
interface Outcome {
  end: End;
  bytes: number;
  sha256: string;
  /** The first bytes (up to 256), for short answers. */
  head: string;
  error: string;
  /** When the end was seen (performance.now()). */
  at: number;
}

/** Reads `conn` to its end (EOF or error), hashing every byte; `until(n)` resolves after n bytes. */
class Reader {
  private readonly hash = createHash('sha256');
  bytes = 0;
  private head = '';
  readonly done: Promise<Outcome>;
  private waiters: { n: number; resolve: () => void }[] = [];

  constructor(readonly conn: Duplex) {
    this.done = new Promise<Outcome>((resolve) => {
      const finish = (end: End, error = ''): void =>
        resolve({ end, bytes: this.bytes, sha256: this.hash.digest('hex'), head: this.head, error, at: performance.now() });
      let settled = false;
      conn.on('data', (chunk: Buffer) => {
        if (settled) return;
        this.hash.update(chunk);
        this.bytes += chunk.length;
        if (this.head.length < 256) this.head += chunk.subarray(0, 256 - this.head.length).toString('latin1');
        this.waiters = this.waiters.filter((w) => (this.bytes >= w.n ? (w.resolve(), false) : true));
      });
      conn.once('end', () => {
        if (!settled) (settled = true), finish('eof');
      });
      conn.on('error', (err: Error & { code?: string }) => {
        if (!settled) (settled = true), finish('error', err.code ?? err.message);
      });
      conn.once('close', () => {
        if (!settled) (settled = true), finish('error', 'closed without an end of stream');
      });
      conn.resume(); // a CONNECT socket was paused after its response head
    });
  }

  until(n: number): Promise<void> {
    if (this.bytes >= n) return Promise.resolve();
    return new Promise<void>((resolve) => this.waiters.push({ n, resolve }));
  }
}

function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout;
  return Promise.race([
    p,
    new Promise<T>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: nothing within ${ms} ms`)), ms))),
  ]).finally(() => clearTimeout(timer));
}

/** Keeps writing payload until a write fails; resolves with the error. */
async function writeUntilFailure(conn: Duplex, stop: { stopped: boolean }): Promise<string> {
  const block = payloadBlock();
  return new Promise<string>((resolve) => {
    let done = false;
    const fail = (err: Error & { code?: string }): void => {
      if (done) return;
      done = true;
      resolve(err.code ?? err.message);
    };
    conn.on('error', fail);
    conn.once('close', () => fail(new Error('closed')));
    const pump = (): void => {
      while (!done && !stop.stopped) {
        if (conn.destroyed || conn.writableEnded) return fail(new Error('closed'));
        if (!conn.write(block, (err) => err && fail(err))) {
          conn.once('drain', pump);
          return;
        }
      }
    };
    pump();
  });
}

/**
 * The target's record of the first connection after `before` connections that sent `command` (the agents'
 * health probes of their apiserver address land on the target too, at any time, without a command).
 */
async function targetConn(before: number, command: string): Promise<TargetConn> {
  return waitFor(() => target.conns.slice(before).find((c) => c.command === command), {
    timeoutMs: 5000,
    intervalMs: 10,
    message: `the target saw no "${command}" connection`,
  });
}

async function settle(conn: Duplex): Promise<void> {
  if (!conn.destroyed) conn.destroy();
  await within(
    new Promise<void>((resolve) => (conn.closed ? resolve() : conn.once('close', () => resolve()))),
    5000,
    'client connection close',
  ).catch(() => {});
}

/** Hub and agent tables back to zero, no target connection left. */
async function expectDrained(h: HubProcess = hub, timeoutMs = 10_000): Promise<void> {
  await waitFor(
    async () => {
      const t = await h.tables();
      if (t.frontends.length > 0 || t.agents.some((a) => a.pending > 0 || a.established.length > 0)) return false;
      for (const a of agents.values()) {
        if (!a.tables || !a.proc.isRunning()) continue;
        if ((await a.tables()).servers.some((s) => s.connections.length > 0)) return false;
      }
      return target.open() === 0;
    },
    { timeoutMs, intervalMs: 25, message: 'connection tables and target did not drain' },
  ).catch(async (err: Error) => {
    throw new Error(
      `${err.message}: hub ${JSON.stringify(await h.tables()).slice(0, 1500)}; target open ${JSON.stringify(target.conns.filter((c) => !c.closed))}`,
    );
  });
}

function record(p: PathName, a: AgentKind, c: CaseName, what: string): void {
  cells.set(`${p}|${a}|${c}`, what);
}

/** Runs one cell, recording ok (with a detail) or FAIL in the table. */
async function cell(p: PathName, a: AgentKind, c: CaseName, body: () => Promise<string>): Promise<void> {
  try {
    record(p, a, c, await body());
  } catch (err) {
    record(p, a, c, 'FAIL');
    throw err;
  }
}

// ------------------------------------------------------------ set-up

beforeAll(async () => {
  handles = snapshotHandles();
  pki = await createPki();
  target = await startMatrixTarget();
  hub = await startHub(pki, [
    '--connect-uds',
    path.join(pki.dir, 'connect.sock'),
    '--connect-plain',
    '127.0.0.1:0',
    '--connect-plain-allow-tokens',
    '--dial-timeout',
    '5s',
  ]);
  const ports = JSON.parse(readFileSync(path.join(hub.dataDir, 'ports.json'), 'utf8')) as {
    connect: number;
    connectUds: string;
    connectPlain: number;
  };
  connectPorts = { tls: ports.connect, uds: ports.connectUds, plain: ports.connectPlain };
  const issued = await runCommand(process.execPath, [CLI, 'token', 'issue', '--name', 'matrix', '--data-dir', hub.dataDir], {
    timeoutMs: 20_000,
  });
  expect(issued.code, issued.stderr).toBe(0);
  token = issued.stdout.trim();
  for (const kind of AGENTS) {
    agents.set(kind, await startAgentOf(kind, hub));
    await routed(hub, kind);
    forwards.set(kind, await startForward(kind, hub));
  }
  tunnelMux = hub.tunnel('mux');
  tunnelGrpc = hub.tunnel('grpc');
}, 120_000);

afterEach(async () => {
  for (const c of [...open]) await settle(c);
  await expectDrained();
});

afterAll(async () => {
  for (const c of [...open]) await settle(c);
  for (const f of forwards.values()) await f.proc.stop(5000);
  for (const a of agents.values()) await a.proc.stop(5000);
  await hub?.stop();
  await target?.close();
  await killAllSpawned();
  await pki?.cleanup();
  printTable();
  await waitForHandlesAtMost(handles, 5000);
}, 60_000);

function printTable(): void {
  const rows = PATHS.flatMap((p) => AGENTS.map((a) => [`${p} → ${a}`, ...CASES.map((c) => cells.get(`${p}|${a}|${c}`) ?? '-')]));
  const header = ['path → agent', ...CASES];
  const width = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (r: string[]): string => `| ${r.map((v, i) => v.padEnd(width[i]!)).join(' | ')} |`;
  const passed = [...cells.values()].filter((v) => v !== 'FAIL' && v !== 'n/a' && v !== 'not run').length;
  const failed = [...cells.values()].filter((v) => v === 'FAIL').length;
  console.log(
    [
      `Connection-end conformance matrix: ${PATHS.length} paths × ${AGENTS.length} agents × ${CASES.length} cases; ${passed} passed, ${failed} failed (ms = time to see the error after the SIGKILL)`,
      line(header),
      `|${width.map((w) => '-'.repeat(w + 2)).join('|')}|`,
      ...rows.map(line),
    ].join('\n'),
  );
}

// ------------------------------------------------------------ cases

async function uploadFinReply(p: PathName, a: AgentKind, size: number): Promise<string> {
  const before = target.conns.length;
  const conn = await openPath(p, a, mainHub(a));
  const reader = new Reader(conn);
  conn.write('upload\n');
  await writePayload(conn, size);
  const out = await within(reader.done, 60_000, 'reply after FIN');
  const rec = await targetConn(before, 'upload');
  await waitFor(() => rec.closed, { timeoutMs: 10_000, intervalMs: 10, message: 'target connection closed' });
  expect(rec.bytesIn, 'every uploaded byte reached the target').toBe(size);
  expect(rec.sawEnd, "the client's end reached the target as EOF").toBe(true);
  if (halfClose(p, a)) {
    expect(out).toMatchObject({ end: 'eof', head: `${payloadSha256(size)} ${size}\n` });
    return 'reply ok';
  }
  // ANP: the client's end is a close; the reply has nowhere to go, and the client learns of the close.
  expect(out.end, out.error).toBe('eof');
  expect(out.bytes).toBe(0);
  return 'closed (ANP)';
}

for (const p of PATHS) {
  describe(`path ${p}`, () => {
    for (const a of AGENTS) {
      describe(`agent ${a}`, () => {
        it('upload, FIN, then the reply (small)', () => cell(p, a, 'upload-fin-reply', () => uploadFinReply(p, a, 1000)));

        it('upload 64 MiB, FIN, then the reply', () => cell(p, a, 'upload-64MiB-fin-reply', () => uploadFinReply(p, a, 64 * MiB)), 120_000);

        it(
          'download to EOF: every byte, then a clean end',
          () =>
            cell(p, a, 'download-eof', async () => {
              const size = 16 * MiB + 123;
              const conn = await openPath(p, a, mainHub(a));
              const reader = new Reader(conn);
              conn.write(`download ${size}\n`);
              const out = await within(reader.done, 60_000, 'download');
              expect(out).toMatchObject({ end: 'eof', bytes: size, sha256: payloadSha256(size) });
              conn.end();
              return 'ok';
            }),
          90_000,
        );

        // One retry: once in the first full runs, an echo through the gRPC agent stalled with ~300 KB
        // short; reported, not yet found.
        it('both directions at once (8 MiB echoed)', { retry: 1, timeout: 90_000 }, () =>
          cell(p, a, 'both-ways', async () => {
            const size = 8 * MiB;
            const conn = await openPath(p, a, mainHub(a));
            const reader = new Reader(conn);
            conn.write('echo\n');
            await Promise.all([writePayload(conn, size, { end: false }), within(reader.until(size), 30_000, 'echo')]);
            expect(reader.bytes).toBe(size);
            conn.end();
            const out = await within(reader.done, PROMPT_MS * 5, 'end after the echo');
            expect(out).toMatchObject({ end: 'eof', bytes: size, sha256: payloadSha256(size) });
            return 'ok';
          }),
        );

        it('the destination closes first: EOF after its bytes, then a write fails, promptly', () =>
          cell(p, a, 'dest-closes-first', async () => {
            const conn = await openPath(p, a, mainHub(a));
            const reader = new Reader(conn);
            const t0 = performance.now();
            conn.write('closefirst\n');
            const out = await within(reader.done, PROMPT_MS, 'EOF after the destination closed');
            expect(out).toMatchObject({ end: 'eof', head: 'hello\n' });
            const eofMs = out.at - t0;
            const t1 = performance.now();
            const failed = await within(writeUntilFailure(conn, { stopped: false }), PROMPT_MS, 'a write after the close failing');
            expect(failed).not.toBe('');
            return `ok ${Math.round(eofMs)}/${Math.round(performance.now() - t1)}ms`;
          }));

        it('the destination resets: the client sees an error (an ANP agent reports it as a close)', () =>
          cell(p, a, 'dest-resets', async () => {
            const conn = await openPath(p, a, mainHub(a));
            const reader = new Reader(conn);
            conn.write('reset\n');
            const out = await within(reader.done, PROMPT_MS, 'the reset');
            if (a === 'anp') {
              // ANP's agent sends CLOSE_RSP without an error for a reset destination: nobody past it can know.
              expect(out.end).toBe('eof');
              return 'closed (ANP agent)';
            }
            if (!canReset(p)) {
              expect(out.end).toBe('eof');
              return NO_RST;
            }
            expect(out.end, `got a clean EOF after ${out.bytes} bytes`).toBe('error');
            return 'error';
          }));

        it('the client aborts mid-transfer: the target sees it, tables return to zero', () =>
          cell(p, a, 'client-aborts', async () => {
            const before = target.conns.length;
            const conn = await openPath(p, a, mainHub(a));
            const reader = new Reader(conn);
            conn.write('source\n');
            await within(reader.until(2 * MiB), 30_000, 'download start');
            const rec = await targetConn(before, 'source');
            const t0 = performance.now();
            conn.destroy();
            await waitFor(() => rec.closed, { timeoutMs: PROMPT_MS, intervalMs: 5, message: 'the target did not see the abort' });
            const ms = performance.now() - t0;
            await expectDrained();
            return `ok ${Math.round(ms)}ms`;
          }));
      });
    }
  });
}

// ------------------------------------------------------------ deaths

/** Opens every path to `kind`'s cluster, gets each transfer going, SIGKILLs, and checks each client sees an error. */
async function killMidTransfer(
  kind: AgentKind,
  mode: 'download' | 'upload',
  paths: readonly PathName[],
  env: ReturnType<typeof mainHub>,
  kill: () => void,
  c: CaseName,
): Promise<void> {
  const before = target.conns.length;
  const conns = await Promise.all(paths.map((p) => openPath(p, kind, env)));
  const stop = { stopped: false };
  const outcomes = conns.map((conn) => {
    const reader = new Reader(conn);
    if (mode === 'download') {
      conn.write('source\n');
      return { reader, writer: null };
    }
    conn.write('sink\n');
    return { reader, writer: writeUntilFailure(conn, stop) };
  });
  if (mode === 'download') await within(Promise.all(outcomes.map((o) => o.reader.until(2 * MiB))), 30_000, 'downloads under way');
  else {
    // (The agents' health probes of their apiserver address land on the target too: commands tell them apart.)
    const uploads = (): TargetConn[] => target.conns.slice(before).filter((r) => r.command === 'sink');
    await waitFor(() => uploads().length === paths.length && uploads().every((r) => r.bytesIn >= 2 * MiB), {
      timeoutMs: 30_000,
      intervalMs: 20,
      message: 'uploads under way',
    });
  }
  const t0 = performance.now();
  kill();
  const results = await Promise.all(
    outcomes.map(async (o, i) => {
      const p = paths[i]!;
      try {
        const seen =
          mode === 'download'
            ? await within(o.reader.done, PROMPT_MS, `${p}: the death`)
            : await within(
                Promise.race([
                  o.reader.done,
                  o.writer!.then((error) => ({ end: 'error' as End, error, at: performance.now(), bytes: 0, sha256: '', head: '' })),
                ]),
                PROMPT_MS,
                `${p}: the death`,
              );
        const ms = Math.round(seen.at - t0);
        if (seen.end !== 'error' && canReset(p)) {
          cleanEofs.push(`${p} → ${kind} (${c}): a clean EOF after ${seen.bytes} bytes`);
          throw new Error(
            `${p}: a clean EOF after ${seen.bytes} bytes instead of an error${libuvReportsQueuedReset() ? '' : ` (${RESET_AS_EOF_NOTE})`}`,
          );
        }
        record(p, kind, c, seen.end === 'error' ? `err ${ms}ms` : `${NO_RST} ${ms}ms`);
        return null;
      } catch (err) {
        record(p, kind, c, 'FAIL');
        return (err as Error).message;
      }
    }),
  );
  stop.stopped = true;
  for (const conn of conns) await settle(conn);
  expect(results.filter(Boolean)).toEqual([]);
}

describe('deaths', () => {
  for (const kind of AGENTS) {
    for (const mode of ['download', 'upload'] as const) {
      // One retry, for a late or missing end under load; a clean EOF fails at the end of 'deaths' even if the retry passes.
      it(`agent ${kind} SIGKILLed mid-${mode}: every path sees an error, never a clean EOF, within 2 s`, {
        retry: 1,
        timeout: 120_000,
      }, async () => {
        // Downloads: all paths at once. Uploads: UPLOAD_GROUP paths per kill.
        const groups =
          mode === 'download'
            ? [PATHS]
            : PATHS.reduce<PathName[][]>((g, p, i) => (i % UPLOAD_GROUP === 0 ? g.push([p]) : g[g.length - 1]!.push(p), g), []);
        const c: CaseName = mode === 'download' ? 'agent-kill-download' : 'agent-kill-upload';
        for (const group of groups) {
          const a = agents.get(kind)!;
          try {
            await killMidTransfer(kind, mode, group, mainHub(kind), () => a.proc.kill('SIGKILL'), c);
          } finally {
            a.proc.kill('SIGKILL'); // if the transfers never got under way
            await a.proc.exited;
            agents.set(kind, await startAgentOf(kind, hub));
            await routed(hub, kind);
          }
        }
      });
    }

    it(`hub SIGKILLed mid-transfer (agent ${kind}): the SDK, ANP client and forward see an error within 2 s`, async () => {
      const hub2 = await startHub(pki, ['--connect-port', 'off']);
      const agent2 = await startAgentOf(kind, hub2);
      try {
        await routed(hub2, kind);
        const fwd = await startForward(kind, hub2);
        const env = { tunnelMux: hub2.tunnel('mux'), tunnelGrpc: hub2.tunnel('grpc'), hub: hub2, forwardPort: fwd.port };
        try {
          // A CONNECT client's TCP connection ends where the hub dies: the kernel closes it with a FIN
          // (or a RST), which nothing of ours can turn into an error; not a cell of the matrix.
          for (const p of PATHS) if (p.startsWith('connect-')) record(p, kind, 'hub-kill', 'n/a');
          await killMidTransfer(
            kind,
            'download',
            ['sdk-mux', 'sdk-grpc', 'anp-client', 'forward'],
            env,
            () => hub2.proc.kill('SIGKILL'),
            'hub-kill',
          );
        } finally {
          env.tunnelMux.close();
          env.tunnelGrpc.close();
          await fwd.proc.stop(5000);
        }
      } finally {
        await agent2.proc.stop(5000);
        await hub2.stop();
      }
      await waitFor(() => target.open() === 0, {
        timeoutMs: 10_000,
        intervalMs: 25,
        message: 'target connections of the killed hub closed',
      });
    }, 90_000);
  }

  it('no death, in any attempt, read as a clean EOF on a path that can reset', () => {
    expect(cleanEofs).toEqual([]);
  });
});
