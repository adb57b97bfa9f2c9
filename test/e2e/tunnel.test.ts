// The tunnel core end to end: real hub and agent processes, mTLS gRPC on loopback, real TCP targets.
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { TunnelError, type Tunnel } from '@cluster-proxy/client';
import {
  digestStream,
  killAllSpawned,
  payloadBlock,
  payloadSha256,
  snapshotHandles,
  startBlackhole,
  startEchoServer,
  startSinkServer,
  startSourceServer,
  startStallServer,
  waitFor,
  waitForHandlesAtMost,
  writePayload,
  type Blackhole,
  type SinkServer,
  type SourceServer,
  type TcpTarget,
} from '../src/fixtures/index.js';
import {
  createPki,
  expectTablesEmpty,
  getStatus,
  startAgent,
  startHub,
  type AgentProcess,
  type HubProcess,
  type TestPki,
} from '../src/harness.js';
import { echoRoundTripForTest as echoRoundTrip } from '../src/join-helpers.js';

const MiB = 1024 * 1024;

// Everything runs twice: over our multiplexed transport (agent and SDK) and over gRPC, the way an
// unmodified ANP agent and konnectivity-client talk to the hub.
for (const transport of ['mux', 'grpc'] as const) {
  describe(`over ${transport}`, () => {
    let pki: TestPki;
    let hub: HubProcess;
    let agent: AgentProcess;
    let echo: TcpTarget;
    let sink: SinkServer;
    let source: SourceServer;
    let blackhole: Blackhole;
    let tunnel: Tunnel;
    let handles: Map<string, number>;
    const extraAgents: AgentProcess[] = [];

    function expectTunnelError(err: unknown, reason: string, destination: string): TunnelError {
      expect(err).toBeInstanceOf(TunnelError);
      const e = err as TunnelError;
      expect(e.reason).toBe(reason);
      expect(e.message).toContain(destination);
      return e;
    }

    beforeAll(async () => {
      pki = await createPki();
      [echo, sink, blackhole] = await Promise.all([startEchoServer(), startSinkServer(), startBlackhole()]);
      source = await startSourceServer(20 * MiB);
      hub = await startHub(pki, ['--dial-timeout', '2s', '--grant', 'c1=cidr:127.0.0.0/8']);
      agent = await startAgent(pki, hub, {
        cluster: 'c1',
        apiserver: `127.0.0.1:${echo.port}`,
        args: ['--allow', '127.0.0.1:*', '--identifiers', 'cidr=127.0.0.0/8', '--dial-timeout', '10s', '--transport', transport],
      });
    });

    afterAll(async () => {
      await Promise.all([hub?.stop(), agent?.stop(), ...extraAgents.map((a) => a.stop())]);
      await killAllSpawned();
      await Promise.all([echo?.close(), sink?.close(), source?.close(), blackhole?.close()]);
      await pki?.cleanup();
    });

    beforeEach(() => {
      handles = snapshotHandles();
      tunnel = hub.tunnel(transport);
    });

    afterEach(async () => {
      tunnel.close();
      await expectTablesEmpty(hub, [agent, ...extraAgents.filter((a) => a.proc.isRunning())]);
      await waitForHandlesAtMost(handles, 5000);
    });

    describe('tunnel core', () => {
      it("round-trips bytes to a cluster apiserver name (c1:443 → the agent's --apiserver)", async () => {
        const s = await tunnel.dial('c1:443');
        const reply = await echoRoundTrip(s, Buffer.from('ping'));
        expect(reply.toString()).toBe('ping');
        // Both legs really use the transport under test.
        expect(tunnel.activeTransport).toBe(transport);
        expect((await agent.tables()).servers.map((x) => x.transport)).toEqual([transport]);
        s.destroy();
      });

      it("also reaches the cluster by its namespaced name and by OCM's service-proxy host", async () => {
        for (const name of [
          'c1.open-cluster-management-agent-addon:443',
          'cluster-ed5a0b2f5b0a8fe4fd48f6d3a1ed9a47bb5c2ba4b2bfcb41.open-cluster-management.proxy:443',
        ]) {
          // The second name is only right if it matches sha256("c1"); compute it rather than trust the literal.
          const dest = name.startsWith('cluster-')
            ? `cluster-${createHash('sha256').update('c1').digest('hex').slice(0, 48)}.open-cluster-management.proxy:443`
            : name;
          const s = await tunnel.dial(dest);
          expect((await echoRoundTrip(s, Buffer.from('x'))).toString()).toBe('x');
          s.destroy();
        }
      });

      it('uploads 20 MiB intact (sha256)', async () => {
        const s = await tunnel.dial(`127.0.0.1:${sink.port}`);
        const result = sink.nextResult(30_000);
        await writePayload(s, 20 * MiB, { end: true });
        const r = await result;
        expect(r).toEqual({ bytes: 20 * MiB, sha256: payloadSha256(20 * MiB) });
        s.resume(); // like net.Socket, 'close' follows only once the readable side was consumed
        await once(s, 'close');
      });

      it('128 connections uploading at once through one tunnel all arrive intact (the shared transport is not overrun)', async () => {
        const n = 128;
        const size = 2 * MiB;
        const sockets = await Promise.all(Array.from({ length: n }, () => tunnel.dial(`127.0.0.1:${sink.port}`)));
        const results = Array.from({ length: n }, () => sink.nextResult(60_000));
        await Promise.all(sockets.map((s) => writePayload(s, size, { end: true })));
        for (const r of await Promise.all(results)) expect(r).toEqual({ bytes: size, sha256: payloadSha256(size) });
        await Promise.all(
          sockets.map((s) => {
            s.resume();
            return once(s, 'close');
          }),
        );
      });

      it('one 96 MiB write() goes through piece by piece, intact, while another connection on the tunnel keeps answering', async () => {
        // More than the shared transport's 64 MiB queue limit: sent all at once it would end the tunnel.
        const size = 96 * MiB;
        const block = payloadBlock();
        const big = Buffer.concat(Array.from({ length: Math.ceil(size / block.length) }, () => block)).subarray(0, size);
        const other = await tunnel.dial('c1:443');
        const s = await tunnel.dial(`127.0.0.1:${sink.port}`);
        const result = sink.nextResult(60_000);
        const written = new Promise<void>((resolve, reject) => s.write(big, (err) => (err ? reject(err) : resolve())));
        s.end();
        // The neighbour connection round-trips while the big write is in flight.
        let trips = 0;
        let done = false;
        void written.finally(() => {
          done = true;
        });
        while (!done && trips < 1000) {
          expect((await echoRoundTrip(other, Buffer.from(`trip-${trips}`))).toString()).toBe(`trip-${trips}`);
          trips++;
        }
        await written;
        expect(await result).toEqual({ bytes: size, sha256: payloadSha256(size) });
        expect(trips).toBeGreaterThan(0);
        other.destroy();
        s.resume();
        await once(s, 'close');
      });

      it('downloads 20 MiB intact (sha256)', async () => {
        const s = await tunnel.dial(`127.0.0.1:${source.port}`);
        const d = await digestStream(s);
        expect(d).toEqual({ bytes: 20 * MiB, sha256: source.expectedSha256 });
      });

      it('carries 100 concurrent connections', async () => {
        const sockets = await Promise.all(Array.from({ length: 100 }, () => tunnel.dial('c1:443')));
        const replies = await Promise.all(sockets.map((s, i) => echoRoundTrip(s, Buffer.from(`conn-${i}-`.repeat(100)))));
        replies.forEach((r, i) => expect(r.toString()).toBe(`conn-${i}-`.repeat(100)));
        for (const s of sockets) s.destroy();
      });

      it('half-closes: the destination sees EOF and can still answer', async () => {
        const s = await tunnel.dial('c1:443', { allowHalfOpen: true });
        const all = digestStream(s);
        s.end(Buffer.from('last words'));
        const d = await all;
        expect(d.bytes).toBe('last words'.length);
      });

      // Not waiting: the refusal comes before a client deadline shorter than any wait the hub or agent could add
      // (the hub's agent wait is 5 s, its dial timeout longer); a dial that waited would end with `timeout`.
      it('fails a dial to a closed port with `endpoint`, without waiting', async () => {
        const closed = await startEchoServer();
        const port = closed.port;
        await closed.close();
        const err = await tunnel.dial(`127.0.0.1:${port}`, { timeoutMs: 4000 }).catch((e: unknown) => e);
        expectTunnelError(err, 'endpoint', `127.0.0.1:${port}`);
        expect((err as Error).message).toMatch(/connection refused/);
      });

      it('fails a dial to an unknown cluster with `no_agent`, without waiting', async () => {
        const err = await tunnel.dial('nowhere:443', { timeoutMs: 4000 }).catch((e: unknown) => e);
        expectTunnelError(err, 'no_agent', 'nowhere:443');
      });

      it('refuses destinations outside the agent allowlist with `forbidden`', async () => {
        // 127.0.0.2 routes to c1 by cidr, but the agent only allows 127.0.0.1:*.
        const err = await tunnel.dial('127.0.0.2:80').catch((e: unknown) => e);
        expectTunnelError(err, 'forbidden', '127.0.0.2:80');
      });

      it('fails a dial to a blackhole with `timeout` at the hub deadline (2 s)', async () => {
        const t0 = Date.now();
        const err = await tunnel.dial(`${blackhole.host}:${blackhole.port}`).catch((e: unknown) => e);
        const elapsed = Date.now() - t0;
        expectTunnelError(err, 'timeout', `${blackhole.host}:${blackhole.port}`);
        expect(elapsed).toBeGreaterThanOrEqual(1900);
        expect(elapsed).toBeLessThan(8000);
        // The hub told the agent to give up: its table empties (checked in afterEach too).
        await waitFor(async () => (await agent.tables()).servers.every((s) => s.connections.length === 0), {
          timeoutMs: 3000,
          message: 'agent abandoned the dial',
        });
      });

      it('honours the client deadline and abort signal (`timeout`, `context`)', async () => {
        const dest = `${blackhole.host}:${blackhole.port}`;
        expectTunnelError(await tunnel.dial(dest, { timeoutMs: 300 }).catch((e: unknown) => e), 'timeout', dest);
        const ac = new AbortController();
        const p = tunnel.dial(dest, { signal: ac.signal });
        setTimeout(() => ac.abort(), 200);
        expectTunnelError(await p.catch((e: unknown) => e), 'context', dest);
      });

      it('client cancelling pending dials never leaves a destination connection open', async () => {
        const target = await startSinkServer();
        try {
          for (let i = 0; i < 30; i++) {
            const ac = new AbortController();
            const p = tunnel.dial(`127.0.0.1:${target.port}`, { signal: ac.signal }).then(
              (s) => s.destroy(),
              () => undefined,
            );
            // Cancel at different points of the dial: at once, after a tick, after a few ms.
            if (i % 3 === 0) ac.abort();
            else if (i % 3 === 1) queueMicrotask(() => ac.abort());
            else setTimeout(() => ac.abort(), i % 5);
            await p;
          }
          await waitFor(() => target.connections() === 0, { timeoutMs: 5000, message: 'destination connections closed' });
        } finally {
          await target.close();
        }
      });

      it('does not block other connections when one reader stalls (client → destination)', async () => {
        // Connection A: the destination never reads, so A's window fills up. The stall server lives only
        // in this test: its paused sockets would never notice the close otherwise.
        const stall = await startStallServer();
        try {
          const a = await tunnel.dial(`127.0.0.1:${stall.port}`);
          const chunk = Buffer.alloc(256 * 1024);
          let written = 0;
          // Write until A stops accepting: the agent's credit, the hub's stream window and our buffer are full.
          for (let i = 0; i < 400; i++) {
            written += chunk.length;
            if (!a.write(chunk)) {
              const drained = await Promise.race([once(a, 'drain').then(() => true), new Promise((r) => setTimeout(() => r(false), 1000))]);
              if (!drained) break;
            }
          }
          expect(written).toBeLessThan(100 * MiB);
          // Connection B moves 50 MiB each way past the stalled A.
          const b = await tunnel.dial(`127.0.0.1:${sink.port}`);
          const up = sink.nextResult(60_000);
          await writePayload(b, 50 * MiB, { end: true });
          expect(await up).toEqual({ bytes: 50 * MiB, sha256: payloadSha256(50 * MiB) });
          b.resume();
          const big = await startSourceServer(50 * MiB);
          try {
            const c = await tunnel.dial(`127.0.0.1:${big.port}`);
            expect(await digestStream(c)).toEqual({ bytes: 50 * MiB, sha256: big.expectedSha256 });
          } finally {
            await big.close();
          }
          // A is still open; what reached the agent is bounded by its credit window (4 MiB) plus what the
          // kernel buffers towards the destination, not by what the client tried to send.
          const h = await hub.tables();
          const stalled = h.agents.flatMap((x) => x.established).find((e) => e.address === `127.0.0.1:${stall.port}`);
          expect(stalled).toBeDefined();
          expect(stalled!.bytesToAgent).toBeLessThan(24 * MiB);
          a.destroy();
        } finally {
          // The hub gives the bytes A still had waiting 2 s to get credit before it closes towards the agent.
          await waitFor(async () => (await hub.tables()).agents.every((x) => x.established.length === 0), {
            timeoutMs: 10_000,
            message: 'stalled connection closed',
          });
          await stall.close();
        }
      });

      it('does not block other connections when one client stops reading (destination → client)', async () => {
        const big = await startSourceServer(512 * MiB);
        try {
          const a = await tunnel.dial(`127.0.0.1:${big.port}`);
          a.pause(); // never read A
          await new Promise((r) => setTimeout(r, 500));
          const c = await tunnel.dial(`127.0.0.1:${source.port}`);
          expect(await digestStream(c)).toEqual({ bytes: 20 * MiB, sha256: source.expectedSha256 });
          // What the agent read from A's destination is bounded by credit + the client's HTTP/2 window,
          // far below the 512 MiB on offer.
          const agentSide = await agent.tables();
          const h = await hub.tables();
          const atHub = h.agents.flatMap((x) => x.established).find((e) => e.address === `127.0.0.1:${big.port}`);
          expect(agentSide.servers.length).toBe(1);
          expect(atHub).toBeDefined();
          // The SDK's 8 MiB receive window plus the hub's 4 MiB credit window, and a chunk or two.
          expect(atHub!.bytesToClient).toBeLessThan(16 * MiB);
          a.destroy();
        } finally {
          await big.close();
        }
      });

      it('reaches the plain gRPC frontend on the Unix socket', async () => {
        const { Tunnel } = await import('@cluster-proxy/client');
        const t = new Tunnel({ address: `unix://${hub.ports.frontendUds}` });
        try {
          const s = await t.dial('c1:443');
          expect((await echoRoundTrip(s, Buffer.from('uds'))).toString()).toBe('uds');
          s.destroy();
        } finally {
          t.close();
        }
      });

      it('reports server readiness and agent readiness', async () => {
        expect((await getStatus(hub.ports.health, '/readyz?verbose')).body).toContain('[+]listeners ok');
        const r = await getStatus(agent.healthPort, '/readyz?verbose');
        expect(r.status).toBe(200);
        expect(r.body).toContain('[+]tunnel ok');
      });
    });

    describe('agent failures', () => {
      it('agent killed mid-transfer: the client gets an error within 2 s, not a hang', async () => {
        const big = await startSourceServer(1024 * MiB);
        const victim = await startAgent(pki, hub, {
          cluster: 'victim',
          apiserver: `127.0.0.1:${big.port}`,
          args: ['--transport', transport],
        });
        try {
          const s = await tunnel.dial('victim:443');
          let received = 0;
          s.on('data', (d: Buffer) => {
            received += d.length;
          });
          await waitFor(() => received > 2 * MiB, { timeoutMs: 10_000, message: 'transfer started' });
          const errored = new Promise<{ err: unknown; at: number }>((resolve) =>
            s.once('error', (err) => resolve({ err, at: Date.now() })),
          );
          const t0 = Date.now();
          victim.proc.kill('SIGKILL');
          const { err, at } = await errored;
          expectTunnelError(err, 'tunnelclosed', 'victim:443');
          expect(at - t0).toBeLessThan(2000);
        } finally {
          await victim.stop();
          await big.close();
        }
      });

      it('agent restart: new dials succeed once it is back', async () => {
        const first = await startAgent(pki, hub, {
          cluster: 'restart',
          apiserver: `127.0.0.1:${echo.port}`,
          args: ['--transport', transport],
        });
        const s1 = await tunnel.dial('restart:443');
        expect((await echoRoundTrip(s1, Buffer.from('one'))).toString()).toBe('one');
        s1.destroy();
        await first.stop();
        // The hub may still hold the drained agent's stream for a moment after the process exited ("draining"); then no agent.
        const gone = await waitFor(
          async () => {
            const e = await tunnel.dial('restart:443').catch((err: unknown) => err);
            return e instanceof TunnelError && e.reason === 'no_agent' ? e : null;
          },
          { timeoutMs: 10_000, intervalMs: 50, message: 'the hub to say no agent is connected for restart:443' },
        );
        expectTunnelError(gone, 'no_agent', 'restart:443');
        const second = await startAgent(pki, hub, {
          cluster: 'restart',
          apiserver: `127.0.0.1:${echo.port}`,
          args: ['--transport', transport],
        });
        try {
          const s2 = await tunnel.dial('restart:443');
          expect((await echoRoundTrip(s2, Buffer.from('two'))).toString()).toBe('two');
          s2.destroy();
          await expectTablesEmpty(hub, [second]);
        } finally {
          await second.stop();
        }
      });

      it('agent SIGTERM drains: DRAIN reaches the hub, open connections finish, new dials are refused, then it exits', async () => {
        const a = await startAgent(pki, hub, {
          cluster: 'drainer',
          apiserver: `127.0.0.1:${echo.port}`,
          args: ['--drain-grace', '3s', '--transport', transport],
        });
        const open = await tunnel.dial('drainer:443');
        a.proc.kill('SIGTERM');
        await waitFor(async () => (await hub.tables()).agents.some((x) => x.cluster === 'drainer' && x.draining), {
          timeoutMs: 5000,
          message: 'hub saw DRAIN',
        });
        // The open connection still works during the grace period.
        expect((await echoRoundTrip(open, Buffer.from('still here'))).toString()).toBe('still here');
        expectTunnelError(await tunnel.dial('drainer:443').catch((e: unknown) => e), 'draining', 'drainer:443');
        open.destroy();
        const exit = await a.proc.exited;
        expect(exit.code).toBe(0);
      });
    });

    describe('authentication', () => {
      it('refuses an agent whose certificate comes from another CA', async () => {
        const { createCA } = await import('@cluster-proxy/server');
        const other = createCA({ commonName: 'rogue' });
        const cert = await pki.agent('rogue', { ca: other });
        const a = await startAgent(pki, hub, { cluster: 'rogue', apiserver: `127.0.0.1:${echo.port}`, cert, waitConnected: false });
        try {
          await a.proc.waitForJsonLine((o) => String(o['msg']).startsWith('cannot connect to hub'), 10_000);
          await hub.proc.waitForJsonLine(
            (o) => /TLS handshake on the agent listener refused: .*(SIGNATURE|ISSUER|UNABLE|self)/i.test(String(o['msg'])),
            10_000,
          );
          expect((await hub.tables()).agents.some((x) => x.cluster === 'rogue')).toBe(false);
          expect((await getStatus(a.healthPort, '/readyz')).status).toBe(503);
        } finally {
          await a.stop();
        }
      });

      it('refuses an agent with an expired certificate', async () => {
        const day = 86_400_000;
        const cert = await pki.agent('expired', { notBefore: new Date(Date.now() - 3 * day), notAfter: new Date(Date.now() - day) });
        const a = await startAgent(pki, hub, { cluster: 'expired', apiserver: `127.0.0.1:${echo.port}`, cert, waitConnected: false });
        try {
          await a.proc.waitForJsonLine((o) => /expired/.test(String(o['msg'])), 10_000);
          // The hub names the reason too (a TLS refusal tells the agent nothing).
          await hub.proc.waitForJsonLine(
            (o) => /TLS handshake on the agent listener refused: CERT_HAS_EXPIRED/.test(String(o['msg'])),
            10_000,
          );
          expect((await hub.tables()).agents.some((x) => x.cluster === 'expired')).toBe(false);
        } finally {
          await a.stop();
        }
      });

      it("refuses an agent that claims another cluster's host", async () => {
        const cert = await pki.agent('c3');
        const a = await startAgent(pki, hub, {
          cluster: 'c3',
          apiserver: `127.0.0.1:${echo.port}`,
          cert,
          args: ['--identifiers', 'host=c1'],
          waitConnected: false,
        });
        try {
          const line = await a.proc.waitForJsonLine((o) => String(o['msg']).includes('may not register host=c1'), 10_000);
          expect(String(line['msg'])).toContain('PERMISSION_DENIED');
          const t = await hub.tables();
          expect(t.agents.filter((x) => x.cluster === 'c3')).toEqual([]);
          // c1 still routes to the real c1 agent.
          const s = await tunnel.dial('c1:443');
          expect((await echoRoundTrip(s, Buffer.from('mine'))).toString()).toBe('mine');
          s.destroy();
        } finally {
          await a.stop();
        }
      });

      it('refuses an agent certificate on the client frontend', async () => {
        const { Tunnel } = await import('@cluster-proxy/client');
        const { readFileSync } = await import('node:fs');
        const cert = await pki.agent('c1');
        const t = new Tunnel({
          address: `127.0.0.1:${hub.ports.frontend}`,
          serverName: 'localhost',
          caCert: Buffer.from(pki.ca.certPem),
          cert: readFileSync(cert.certPath),
          key: readFileSync(cert.keyPath),
          transport,
        });
        try {
          const err = await t.dial('c1:443').catch((e: unknown) => e);
          expectTunnelError(err, 'tunnelclosed', 'c1:443');
          expect((err as Error).message).toContain('agent certificates may not use the client frontend');
        } finally {
          t.close();
        }
      });
    });
  });
}
