// ANP's own Go programs as peers, in every direction, at the two ANP versions test/anp-go pins (the current
// release and the version our compatibility claim names; docs/testing.md):
//   1. konnectivity-client (our konnectivity-probe, dialing as kube-apiserver's egress selector does) → our hub
//      (its ProxyService frontend on the Unix socket and on mTLS) → our agent → destination;
//   2. ANP's proxy-agent → our hub; our SDK and the hub's HTTP CONNECT frontend dial through it;
//   3. our agent → ANP's proxy-server; konnectivity-probe dials through its Unix socket.
// Each path: a dial and echo, a bulk transfer both ways with sha256, an upload whose reply the destination
// follows with its close (konnectivity-client has no half-close: the destination's close is the end), a
// download to the destination's close, a destination that speaks first to many dials at once, a flood of
// parallel dials, and a dial to a closed port; ANP's server and agent must log no error about ours.
// The JavaScript ANP peers (fixtures/anp-peers.ts, anp-agent.ts) stay for the fast conformance matrix.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Tunnel } from '@cluster-proxy/client';
import {
  connectThrough,
  digestStream,
  freeLoopbackPort,
  killAllSpawned,
  payloadSha256,
  startEchoServer,
  startSourceServer,
  spawnProcess,
  startTcpServer,
  waitFor,
  writePayload,
  type SourceServer,
  type TcpTarget,
  type TrackedServer,
} from '../src/fixtures/index.js';
import {
  ANP_VERSIONS,
  anpBinary,
  probeFrontendArgs,
  runProbe,
  startAnpAgent,
  startAnpServer,
  type AnpAgent,
  type AnpServer,
  type ProbeFrontend,
} from '../src/fixtures/anp-real.js';
import { createPki, expectTablesEmpty, startAgent, startHub, type AgentProcess, type HubProcess, type TestPki } from '../src/harness.js';
import { scrape } from '../src/metrics-text.js';

const MiB = 1024 * 1024;
const BULK = 16 * MiB;
const UPLOAD = 8 * MiB;
const DOWNLOAD = 8 * MiB;
const FLOOD = 100;
/** A destination that speaks first (a banner): this many dials at once, each must get all of it. */
const SERVER_FIRST = 50;
const BANNER = 64 * 1024;
/** Connections whose destination never reads, each written in 8 KiB messages, and what the hub may hold for
 * each: the frontend's first stream window (8 KiB), the rest of a message the agent's last credit took part
 * of (under 8 KiB), and their gRPC and protobuf framing. A 32 KiB window alone would be twice that. */
const STUCK = 16;
const STUCK_CHUNK = 8 * 1024;
const STUCK_HELD_MAX = 8 * 1024 + STUCK_CHUNK + 128;

let pki: TestPki;
let echo: TcpTarget;
let source: SourceServer;
let banner: SourceServer;
let digest: TrackedServer;
/** Accepts and never reads (so never sees a close either); how many it accepted. */
let stall: TrackedServer;
let stalled = 0;
/** A loopback port nobody listens on: a dial to it is refused. */
let closedPort: number;

/** Reads "<n>\n" and then n bytes, answers their sha256 (hex) and closes: an upload whose reply ends it. */
function serveDigest(socket: net.Socket): void {
  let head = '';
  let left = -1;
  const hash = createHash('sha256');
  socket.on('data', (chunk: Buffer) => {
    if (left < 0) {
      const nl = chunk.indexOf(0x0a);
      if (nl < 0) {
        head += chunk.toString('latin1');
        return;
      }
      head += chunk.subarray(0, nl).toString('latin1');
      left = Number(head);
      chunk = chunk.subarray(nl + 1);
    }
    const take = chunk.subarray(0, left);
    hash.update(take);
    left -= take.length;
    if (left === 0) socket.end(hash.digest('hex'));
  });
}

// The programs first: scripts/test.sh has built them; a run without it builds them here (minutes, once).
beforeAll(() => anpBinary('proxy-server', ANP_VERSIONS[0]!.version), 45 * 60_000);

beforeAll(async () => {
  pki = await createPki();
  echo = await startEchoServer();
  source = await startSourceServer(DOWNLOAD);
  banner = await startSourceServer(BANNER);
  digest = await startTcpServer('127.0.0.1', serveDigest);
  stall = await startTcpServer('127.0.0.1', (socket) => {
    stalled++;
    socket.pause();
  });
  closedPort = await freeLoopbackPort();
});

afterAll(async () => {
  await killAllSpawned();
  await Promise.all([echo?.close(), source?.close(), banner?.close(), digest?.close(), stall?.close()]);
  await pki?.cleanup();
});

const dest = (port: number): string => `127.0.0.1:${port}`;

/** klog's error lines (`E1129 03:42:48.544591 …`), but those about the refused dial the tests make. */
const klogErrors = (lines: string[]): string[] => lines.filter((l) => /^E\d{4} /.test(l) && !l.includes('connection refused'));

/**
 * After the destination closed, konnectivity-client's Close() returns nil or "tunnel closed" at random
 * (its select finds both the CLOSE_RSP's answer and the end of the tunnel it tore down on it); any
 * other error is a finding.
 */
const CLOSED_BY_DESTINATION = [undefined, 'tunnel closed'];

/** The first `n` bytes `s` reads (rejects if it ends or fails first). */
function readBytes(s: Duplex, n: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let got = 0;
    const onData = (c: Buffer): void => {
      chunks.push(c);
      got += c.length;
      if (got < n) return;
      s.off('data', onData).off('end', onEnd).off('error', reject);
      s.pause();
      resolve(Buffer.concat(chunks).subarray(0, n));
    };
    const onEnd = (): void => reject(new Error(`ended after ${got} of ${n} bytes`));
    s.on('data', onData).once('end', onEnd).once('error', reject);
  });
}

/** Ends our side and waits for the connection to close without an error. */
async function endCleanly(s: Duplex): Promise<void> {
  const closed = new Promise<void>((resolve, reject) => {
    s.once('error', reject).once('close', () => resolve());
  });
  s.resume();
  s.end();
  await closed;
}

/** The probe's scenarios against a frontend that reaches 127.0.0.1 (every destination above). */
function probeScenarios(version: string, frontend: () => ProbeFrontend, drained: () => Promise<void>): void {
  it('dials and echoes', async () => {
    const r = await runProbe(version, frontend(), 'echo', [
      '--dest',
      dest(echo.port),
      '--message',
      `hello from konnectivity-client ${version}`,
    ]);
    expect(r).toMatchObject({ ok: true, echo: `hello from konnectivity-client ${version}` });
    expect(r.closeError).toBeUndefined();
    await drained();
  });

  it(`moves ${BULK / MiB} MiB both ways at once, intact`, async () => {
    const r = await runProbe(version, frontend(), 'bulk', ['--dest', dest(echo.port), '--bytes', String(BULK)]);
    expect(r).toMatchObject({ ok: true, bytes: BULK });
    expect(r.receivedSha256).toBe(r.sentSha256);
    expect(r.closeError).toBeUndefined();
    await drained();
  });

  it('uploads, gets the reply, then sees the destination close as a clean end', async () => {
    const r = await runProbe(version, frontend(), 'upload', ['--dest', dest(digest.port), '--bytes', String(UPLOAD)]);
    expect(r.error).toBeUndefined();
    expect(r.reply).toBe(r.sentSha256);
    expect(CLOSED_BY_DESTINATION).toContain(r.closeError);
    await drained();
  });

  it(`downloads ${DOWNLOAD / MiB} MiB to the destination's close`, async () => {
    const r = await runProbe(version, frontend(), 'download', ['--dest', dest(source.port)]);
    expect(r).toMatchObject({ ok: true, bytes: DOWNLOAD, sha256: payloadSha256(DOWNLOAD) });
    expect(CLOSED_BY_DESTINATION).toContain(r.closeError);
    await drained();
  });

  // konnectivity-client registers a connection only after its receive loop handed DIAL_RSP on: DATA right
  // behind DIAL_RSP was dropped as "not recognized" (the banner lost, in part or whole, without an error).
  it(`gives a destination that speaks first all its bytes, ${SERVER_FIRST} dials at once`, async () => {
    const r = await runProbe(version, frontend(), 'download', ['--dest', dest(banner.port), '--count', String(SERVER_FIRST)]);
    expect(r.outcomes).toEqual({ [`${BANNER} ${payloadSha256(BANNER)}`]: SERVER_FIRST });
    await drained();
  });

  it(`survives a flood of ${FLOOD} parallel dials, one tunnel each`, async () => {
    const r = await runProbe(version, frontend(), 'flood', ['--dest', dest(echo.port), '--count', String(FLOOD)]);
    expect(r.errors).toEqual({});
    expect(r.succeeded).toBe(FLOOD);
    await drained();
  });

  it('reports a refused destination as a dial failure that says so', async () => {
    const r = await runProbe(version, frontend(), 'dial', ['--dest', dest(closedPort)]);
    expect(r).toMatchObject({ ok: false, stage: 'dial', reason: 'endpoint' });
    expect(r.error).toMatch(/refused/i);
    await drained();
  });
}

for (const v of ANP_VERSIONS) {
  describe(`konnectivity-client ${v.clientVersion} (ANP ${v.version}, ${v.role}) → our hub → our agent`, () => {
    let hub: HubProcess;
    let agent: AgentProcess;
    beforeAll(async () => {
      hub = await startHub(pki, ['--grant', 'go-client=cidr:127.0.0.0/8']);
      agent = await startAgent(pki, hub, {
        cluster: 'go-client',
        apiserver: dest(echo.port),
        args: ['--identifiers', 'cidr=127.0.0.0/8', '--allow', '127.0.0.1:*'],
      });
      await waitFor(async () => (await hub.tables()).agents.some((a) => a.cluster === 'go-client'), {
        timeoutMs: 10_000,
        intervalMs: 50,
        message: 'hub routes go-client',
      });
    });
    afterAll(async () => {
      await agent?.stop();
      await hub?.stop();
    });
    const drained = (): Promise<void> => expectTablesEmpty(hub, [agent]);

    describe("over the Unix socket (kube-apiserver's gRPC egress transport)", () => {
      probeScenarios(v.version, () => ({ uds: hub.ports.frontendUds! }), drained);

      it('reaches a cluster by its name, and hears why a name nobody serves fails', async () => {
        const r = await runProbe(v.version, { uds: hub.ports.frontendUds! }, 'echo', ['--dest', 'go-client:443', '--message', 'by name']);
        expect(r).toMatchObject({ ok: true, echo: 'by name' });
        const none = await runProbe(v.version, { uds: hub.ports.frontendUds! }, 'dial', ['--dest', 'nobody.example:443']);
        expect(none).toMatchObject({ ok: false, stage: 'dial', reason: 'endpoint' });
        expect(none.error).toMatch(/nobody\.example/);
        await drained();
      });
    });

    describe('over mTLS', () => {
      const mtls = (): ProbeFrontend => ({
        address: `127.0.0.1:${hub.ports.frontend}`,
        tls: { caPath: pki.caPath, ...pki.client },
        serverName: 'localhost',
      });
      it('dials and echoes', async () => {
        const r = await runProbe(v.version, mtls(), 'echo', ['--dest', dest(echo.port), '--message', 'over mTLS']);
        expect(r).toMatchObject({ ok: true, echo: 'over mTLS' });
        expect(r.closeError).toBeUndefined();
        await drained();
      });
      it(`moves ${BULK / MiB} MiB both ways, intact`, async () => {
        const r = await runProbe(v.version, mtls(), 'bulk', ['--dest', dest(echo.port), '--bytes', String(BULK)]);
        expect(r).toMatchObject({ ok: true, bytes: BULK });
        await drained();
      });
      // kube-apiserver dials a TLS connection and an HTTP/2 session per proxied connection: a thousand
      // stuck ones must not make the hub hold a window each beside the agent's.
      it(`holds at most ${STUCK_HELD_MAX} bytes at the hub for each of ${STUCK} connections whose destination never reads`, async () => {
        const bin = await anpBinary('konnectivity-probe', v.version);
        const stalledBefore = stalled;
        const clients = spawnProcess({
          name: `konnectivity-stuck-${v.version}`,
          command: bin,
          args: [
            ...probeFrontendArgs(mtls()),
            ...`stuck --dest ${dest(stall.port)} --count ${STUCK} --concurrency ${STUCK} --seconds 3 --chunk ${STUCK_CHUNK} --limit ${4 * MiB}`.split(
              ' ',
            ),
          ],
        });
        try {
          const opened = await clients.waitForJsonLine((o) => 'opened' in o, 30_000);
          expect(opened).toMatchObject({ opened: STUCK, failed: 0 });
          const filled = await clients.waitForJsonLine((o) => 'filled' in o, 30_000);
          expect(filled['blocked'], 'every writer waits for flow control').toBe(STUCK);
          await waitFor(() => stalled - stalledBefore === STUCK, {
            timeoutMs: 10_000,
            message: 'every connection reached the destination',
          });
          const held = (await scrape(hub.ports.health)).value('cluster_proxy_server_memory_held_bytes', { direction: 'to_agent' });
          console.info(`konnectivity-clients: the hub holds ${held} bytes for ${STUCK} stuck connections`);
          expect(held, 'client bytes the hub holds').toBeLessThanOrEqual(STUCK * STUCK_HELD_MAX);
          expect((await hub.tables()).agents.flatMap((a) => a.established)).toHaveLength(STUCK);
          clients.kill('SIGUSR2');
          await clients.waitForJsonLine((o) => 'closed' in o, 30_000);
        } finally {
          await clients.stop(10_000);
          for (const socket of stall.sockets) socket.destroy();
        }
        await drained();
      });
    });
  });

  describe(`ANP proxy-agent ${v.version} (${v.role}) → our hub; our SDK and HTTP CONNECT dial through it`, () => {
    let hub: HubProcess;
    let anpAgent: AnpAgent;
    let tunnel: Tunnel;
    beforeAll(async () => {
      hub = await startHub(pki, ['--grant', 'anp-agent=cidr:127.0.0.0/8']);
      const cert = await pki.agent('anp-agent');
      anpAgent = await startAnpAgent(v.version, {
        server: `127.0.0.1:${hub.ports.agent}`,
        tls: { caPath: pki.caPath, ...cert },
        agentID: `anp-agent-${v.version}`,
        identifiers: 'host=anp-agent&cidr=127.0.0.0/8',
      });
      await waitFor(async () => (await hub.tables()).agents.some((a) => a.cluster === 'anp-agent'), {
        timeoutMs: 10_000,
        intervalMs: 50,
        message: 'hub routes anp-agent',
      });
      tunnel = hub.tunnel();
    });
    afterAll(async () => {
      await anpAgent?.stop();
      await hub?.stop();
    });
    const drained = (): Promise<void> => expectTablesEmpty(hub, []);

    it('dials and echoes (SDK)', async () => {
      const s = await tunnel.dial(dest(echo.port));
      const back = readBytes(s, 18);
      s.write('hello from our SDK');
      expect((await back).toString()).toBe('hello from our SDK');
      // ANP's agent has no half-close: our end is its close, and the connection ends cleanly.
      await endCleanly(s);
      await drained();
    });

    it(`moves ${BULK / MiB} MiB both ways at once, intact (SDK)`, async () => {
      const s = await tunnel.dial(dest(echo.port));
      const back = readBytes(s, BULK);
      await writePayload(s, BULK, { end: false });
      expect(
        createHash('sha256')
          .update(await back)
          .digest('hex'),
      ).toBe(payloadSha256(BULK));
      await endCleanly(s);
      await drained();
    });

    it("uploads, gets the reply and the destination's close (SDK)", async () => {
      const s = await tunnel.dial(dest(digest.port));
      const got = new Promise<string>((resolve, reject) => {
        let reply = '';
        s.setEncoding('utf8')
          .on('data', (d: string) => (reply += d))
          .once('end', () => resolve(reply))
          .once('error', reject);
      });
      s.write(`${UPLOAD}\n`);
      await writePayload(s, UPLOAD, { end: false });
      expect(await got).toBe(payloadSha256(UPLOAD));
      await drained();
    });

    it(`downloads ${DOWNLOAD / MiB} MiB to the destination's close (SDK)`, async () => {
      const s = await tunnel.dial(dest(source.port));
      expect(await digestStream(s)).toEqual({ bytes: DOWNLOAD, sha256: payloadSha256(DOWNLOAD) });
      await drained();
    });

    it(`serves a flood of ${FLOOD} parallel dials (SDK)`, async () => {
      const results = await Promise.all(
        Array.from({ length: FLOOD }, async (_, i) => {
          const s = await tunnel.dial(dest(digest.port));
          const msg = `message ${i} `.repeat(50);
          const reply = new Promise<string>((resolve, reject) => {
            let r = '';
            s.setEncoding('utf8')
              .on('data', (d: string) => (r += d))
              .once('end', () => resolve(r))
              .once('error', reject);
          });
          s.write(`${msg.length}\n${msg}`);
          return (await reply) === createHash('sha256').update(msg).digest('hex');
        }),
      );
      expect(results.filter(Boolean)).toHaveLength(FLOOD);
      await drained();
    });

    it("reports a refused destination with ANP's agent's reason (SDK)", async () => {
      await expect(tunnel.dial(dest(closedPort))).rejects.toThrow(/refused/i);
      await drained();
    });

    it('downloads through the HTTP CONNECT frontend', async () => {
      const s = await connectThrough(
        tls.connect({
          host: '127.0.0.1',
          port: hub.ports.connect!,
          ca: pki.ca.certPem,
          servername: 'localhost',
          cert: readFileSync(pki.client.certPath),
          key: readFileSync(pki.client.keyPath),
        }),
        dest(source.port),
      );
      expect(await digestStream(s)).toEqual({ bytes: DOWNLOAD, sha256: payloadSha256(DOWNLOAD) });
      await drained();
    });

    it('logged no error about our hub (but the refused dial asked for)', () => {
      expect(klogErrors(anpAgent.proc.lines())).toEqual([]);
    });
  });

  describe(`our agent → ANP proxy-server ${v.version} (${v.role}); konnectivity-client ${v.clientVersion} dials through it`, () => {
    let server: AnpServer;
    let agent: AgentProcess;
    beforeAll(async () => {
      server = await startAnpServer(v.version, pki.dir, { caPath: pki.caPath, ...pki.server });
      agent = await startAgent(
        pki,
        { ports: { agent: server.agentPort } },
        { cluster: 'to-anp', apiserver: dest(echo.port), args: ['--allow', '127.0.0.1:*'] },
      );
      await waitFor(() => server.ready(), { timeoutMs: 10_000, intervalMs: 50, message: `proxy-server ${v.version} sees our agent` });
    });
    afterAll(async () => {
      await agent?.stop();
      await server?.stop();
    });
    const drained = (): Promise<void> =>
      waitFor(async () => (await agent.tables()).servers.every((s) => s.connections.length === 0), {
        timeoutMs: 10_000,
        intervalMs: 100,
        message: "our agent's connections drain",
      });

    it("is linked over gRPC (ANP's server speaks nothing else)", async () => {
      const t = await agent.tables();
      expect(t.servers).toHaveLength(1);
      expect(t.servers[0]).toMatchObject({ serverID: `anp-${v.version}`, transport: 'grpc' });
    });

    probeScenarios(v.version, () => ({ uds: server.uds }), drained);

    it('logged no error about our agent (but the refused dial asked for)', () => {
      expect(klogErrors(server.proc.lines())).toEqual([]);
    });
  });
}
