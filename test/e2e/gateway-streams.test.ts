// The gateway's streaming verbs with real processes: a hub with --gateway-port, an agent in front of the
// recording HTTPS "apiserver" (test/src/fixtures/recording-apiserver.ts: exec/attach over WebSocket and
// SPDY, port-forward over SPDY and SPDY-in-WebSocket, logs -f, watch), the real kubectl v1.33, and raw
// clients (node:tls, ws) for refusals, backpressure and a hub's graceful stop.
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import WebSocket from 'ws';
import { waitFor, type RecordedRequest, type RecordingApiserver, type RunResult } from '../src/fixtures/index.js';
import {
  expectTablesEmpty,
  startAgent,
  startHub,
  type AgentProcess,
  type HubProcess,
  type TestPki,
  type UserCert,
} from '../src/harness.js';
import { GATEWAY_SA_TOKEN, startGatewayHub, type GatewayHub } from '../src/e2e-setup.js';
import { kubectlBinary, kubectlUnsupported } from './kubectl-binary.js';

const SA_TOKEN = GATEWAY_SA_TOKEN;
const EXEC = '/api/v1/namespaces/default/pods/demo-pod/exec';
let setup: GatewayHub;
let pki: TestPki;
let hub: HubProcess;
let agent: AgentProcess;
let api: RecordingApiserver;
let tmp: string;
let agentKubeconfig: string;
let userCert: UserCert;
const skipKubectl = kubectlUnsupported();

beforeAll(async () => {
  setup = await startGatewayHub('cp-gateway-streams-');
  ({ pki, tmp, api, hub, agent, agentKubeconfig } = setup);
  userCert = await pki.user('alice', ['team-a']);
}, 60_000);

afterEach(async () => {
  // Every session ended: nothing left in the hub's or the agent's tables, nothing open at the apiserver.
  if (hub.proc.isRunning()) await expectTablesEmpty(hub, [agent]);
  await waitFor(() => api.sessions() === 0, { timeoutMs: 5000, message: 'apiserver sessions closed' });
});

afterAll(async () => {
  await setup?.stop();
});

function lastUpgrade(): RecordedRequest {
  const r = api.requests.filter((q) => q.upgrade !== undefined).at(-1);
  if (!r) throw new Error('the apiserver saw no upgrade request');
  return r;
}

/** A raw upgrade request over TLS: the status line, the headers and whatever body came before the close. */
function rawUpgrade(
  gatewayPort: number,
  target: string,
  o: { cert?: boolean; headers?: Record<string, string> } = {},
): Promise<{ status: number; head: string; body: string }> {
  return new Promise((resolve, reject) => {
    const s = tls.connect(
      {
        host: '127.0.0.1',
        port: gatewayPort,
        servername: 'localhost',
        ca: pki.ca.certPem,
        ...(o.cert ? { cert: userCert.cert, key: userCert.key } : {}),
      },
      () => {
        const extra = Object.entries(o.headers ?? {})
          .map(([k, v]) => `${k}: ${v}\r\n`)
          .join('');
        s.write(
          `GET ${target} HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n${extra}\r\n`,
        );
      },
    );
    let text = '';
    s.setEncoding('utf8');
    s.on('data', (d: string) => (text += d));
    s.on('end', () => s.end());
    s.on('close', () => {
      const [head = '', body = ''] = text.split('\r\n\r\n');
      resolve({ status: Number(head.split(' ')[1]), head, body });
    });
    s.on('error', reject);
  });
}

/** A v5.channel.k8s.io WebSocket through the gateway with the user's certificate. */
function channelSocket(gatewayPort: number, target: string): Promise<WebSocket> {
  const ws = new WebSocket(`wss://127.0.0.1:${gatewayPort}${target}`, ['v5.channel.k8s.io'], {
    ca: pki.ca.certPem,
    cert: userCert.cert,
    key: userCert.key,
    servername: 'localhost',
  });
  return new Promise((resolve, reject) => {
    ws.once('open', () => resolve(ws));
    ws.once('error', reject);
    ws.once('unexpected-response', (_req, res) => reject(new Error(`upgrade refused: ${res.statusCode}`)));
  });
}

/** The next stdout message's text. */
function nextStdout(ws: WebSocket): Promise<string> {
  return new Promise((resolve) => {
    const on = (data: Buffer): void => {
      if (data[0] !== 1) return;
      ws.off('message', on);
      resolve(data.subarray(1).toString());
    };
    ws.on('message', on);
  });
}

describe('gateway upgrades: refusals', () => {
  it("no credentials 401, a caller's Impersonate-* 400, an unknown cluster 404: one line each, nothing forwarded", async () => {
    const before = api.requests.length;
    const port = hub.ports.gateway!;
    const none = await rawUpgrade(port, `/cluster1${EXEC}?command=sh`);
    expect(none.status).toBe(401);
    expect(none.head).toMatch(/\r\nwww-authenticate: Bearer realm="cluster-proxy"/i);
    expect(none.body).toMatch(/^no credentials: [^\n]*\n$/);
    const imp = await rawUpgrade(port, `/cluster1${EXEC}?command=sh`, { cert: true, headers: { 'Impersonate-User': 'system:admin' } });
    expect(imp.status).toBe(400);
    expect(imp.body).toMatch(/^impersonate-user: the gateway impersonates the authenticated caller itself[^\n]*\n$/);
    const unknown = await rawUpgrade(port, `/nosuch${EXEC}?command=sh`, { cert: true });
    expect([unknown.status, unknown.body]).toEqual([404, 'cluster nosuch is not known to this hub\n']);
    const bad = await rawUpgrade(port, `/cluster1/api/../${EXEC}`, { cert: true });
    expect(bad.status).toBe(400);
    expect(api.requests.length).toBe(before);
    const line = await hub.proc.waitForJsonLine(
      (o) => o['msg'] === 'gateway request' && o['status'] === 404 && o['upgrade'] === 'SPDY/3.1',
      5000,
    );
    expect(line).toMatchObject({ reason: 'unknown_cluster' });
  });

  it("an apiserver's refusal of the upgrade is passed back as it is", async () => {
    const r = await rawUpgrade(hub.ports.gateway!, '/cluster1/api/v1/namespaces/default/pods/demo-pod/log', { cert: true });
    expect(r.status).toBe(404);
    expect(r.body).toBe('not found\n');
    expect(lastUpgrade().headers['impersonate-user']).toEqual(['alice']);
  });
});

describe('gateway upgrades: raw WebSocket sessions', () => {
  it("exec over v5.channel.k8s.io: the apiserver sees the agent's token and the impersonation headers; stdin echoed; status Success; one audit line with bytes and duration", async () => {
    const ws = await channelSocket(hub.ports.gateway!, `/cluster1${EXEC}?command=cat&stdin=true&stdout=true`);
    expect(ws.protocol).toBe('v5.channel.k8s.io');
    const seen = lastUpgrade();
    expect(seen.url).toBe(`${EXEC}?command=cat&stdin=true&stdout=true`);
    expect(seen.upgrade).toBe('websocket');
    expect(seen.headers['authorization']).toEqual([`Bearer ${SA_TOKEN}`]);
    expect(seen.headers['impersonate-user']).toEqual(['alice']);
    expect(seen.headers['impersonate-group']).toEqual(['team-a']);
    expect(Object.keys(seen.headers).filter((h) => h.startsWith('x-cluster-proxy'))).toEqual([]);
    const echoed = nextStdout(ws);
    ws.send(Buffer.concat([Buffer.of(0), Buffer.from('hello through the gateway')]));
    expect(await echoed).toBe('hello through the gateway');
    const status = new Promise<string>((resolve) => ws.on('message', (d: Buffer) => d[0] === 3 && resolve(d.subarray(1).toString())));
    const closed = new Promise<number>((resolve) => ws.once('close', (code) => resolve(code)));
    ws.send(Buffer.of(255, 0));
    expect(JSON.parse(await status)).toMatchObject({ status: 'Success' });
    expect(await closed).toBe(1000);
    const line = await hub.proc.waitForJsonLine(
      (o) => o['msg'] === 'gateway request' && o['status'] === 101 && o['upgrade'] === 'websocket',
      5000,
    );
    expect(line).toMatchObject({ user: 'alice', cluster: 'cluster1', method: 'GET', path: `/cluster1${EXEC}` });
    expect(line['bytesIn']).toBeGreaterThan(25);
    expect(line['bytesOut']).toBeGreaterThan(25);
    expect(typeof line['durationMs']).toBe('number');
  });

  it('a reader that stops holds the apiserver back: far less than the stream is written while paused, then all of it arrives', async () => {
    const ws = await channelSocket(hub.ports.gateway!, `/cluster1${EXEC}?command=flood&stdout=true`);
    try {
      const target = 96 * 1024 * 1024;
      let received = 0;
      let writtenWhilePaused = 0;
      await new Promise<void>((resolve) => {
        let paused = false;
        ws.on('message', (d: Buffer) => {
          received += d.length - 1;
          if (!paused && received >= 1024 * 1024) {
            paused = true;
            ws.pause();
            setTimeout(() => {
              writtenWhilePaused = api.written();
              ws.resume();
            }, 2000);
          }
          if (received >= target) resolve();
        });
      });
      // Held in flight while the caller did not read: socket buffers (loopback autotunes them to several MiB
      // each) and the tunnel's windows, as the 64 MiB response test allows; nowhere near the 96 MiB read after.
      expect(writtenWhilePaused).toBeGreaterThan(1024 * 1024);
      expect(writtenWhilePaused).toBeLessThan(32 * 1024 * 1024);
    } finally {
      const closed = new Promise<void>((resolve) => ws.once('close', () => resolve()));
      ws.close();
      await closed;
    }
  }, 60_000);
});

describe.skipIf(skipKubectl !== null)('kubectl v1.33 through the gateway: exec, attach, port-forward, logs -f, get -w', () => {
  let kubeconfigFile: string;
  const env = (more: Record<string, string> = {}): NodeJS.ProcessEnv => ({ PATH: process.env['PATH'], HOME: tmp, ...more });
  const kubectl = async (args: string[], o: { stdin?: string; env?: Record<string, string> } = {}): Promise<RunResult> => {
    const child = spawn(await kubectlBinary(), ['--kubeconfig', kubeconfigFile, ...args], { env: env(o.env) });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (s: string) => (stdout += s));
    child.stderr.setEncoding('utf8').on('data', (s: string) => (stderr += s));
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    child.stdin.end(o.stdin ?? '');
    return new Promise((resolve) =>
      child.once('close', (code) => {
        clearTimeout(timer);
        resolve({ code, stdout, stderr });
      }),
    );
  };
  /** A long-running kubectl whose output lines are read as they come. */
  const background = async (
    args: string[],
    more: Record<string, string> = {},
  ): Promise<{ child: ChildProcessWithoutNullStreams; lines: { text: string; at: number }[]; stop: () => Promise<void> }> => {
    const child = spawn(await kubectlBinary(), ['--kubeconfig', kubeconfigFile, ...args], { env: env(more) });
    const lines: { text: string; at: number }[] = [];
    let rest = '';
    const take = (s: string): void => {
      rest += s;
      let i: number;
      while ((i = rest.indexOf('\n')) >= 0) {
        lines.push({ text: rest.slice(0, i), at: Date.now() });
        rest = rest.slice(i + 1);
      }
    };
    child.stdout.setEncoding('utf8').on('data', take);
    child.stderr.setEncoding('utf8').on('data', take);
    const closed = new Promise<void>((resolve) => child.once('close', () => resolve()));
    return {
      child,
      lines,
      stop: async () => {
        child.kill('SIGTERM');
        await closed;
      },
    };
  };

  beforeAll(async () => {
    kubeconfigFile = path.join(tmp, 'user.kubeconfig');
    await writeFile(
      kubeconfigFile,
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        'current-context': 'gw',
        clusters: [
          { name: 'gw', cluster: { server: `https://127.0.0.1:${hub.ports.gateway}/cluster1`, 'certificate-authority': pki.caPath } },
        ],
        users: [{ name: 'u', user: { 'client-certificate': userCert.certPath, 'client-key': userCert.keyPath } }],
        contexts: [{ name: 'gw', context: { cluster: 'gw', user: 'u', namespace: 'default' } }],
      }),
      { mode: 0o600 },
    );
  });

  it('kubectl exec -i -- cat (WebSocket, v5.channel.k8s.io): stdin comes back on stdout', async () => {
    const input = 'line one\nline two\n'.repeat(100);
    const r = await kubectl(['exec', 'demo-pod', '-i', '--', 'cat'], { stdin: input });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe(input);
    const seen = lastUpgrade();
    expect(seen.upgrade).toBe('websocket');
    expect(seen.url).toMatch(
      /^\/api\/v1\/namespaces\/default\/pods\/demo-pod\/exec\?command=cat&container=main&stderr=true&stdin=true&stdout=true/,
    );
    expect(seen.headers['sec-websocket-protocol']?.[0]).toMatch(/^v5\.channel\.k8s\.io/);
    expect(seen.headers['impersonate-user']).toEqual(['alice']);
    expect(seen.headers['authorization']).toEqual([`Bearer ${SA_TOKEN}`]);
  });

  it('kubectl exec -i -- cat over SPDY/3.1 (KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false)', async () => {
    const r = await kubectl(['exec', 'demo-pod', '-i', '--', 'cat'], {
      stdin: 'over spdy\n',
      env: { KUBECTL_REMOTE_COMMAND_WEBSOCKETS: 'false' },
    });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe('over spdy\n');
    const seen = lastUpgrade();
    expect(seen.upgrade).toBe('SPDY/3.1');
    expect(seen.method).toBe('POST');
    expect(seen.headers['impersonate-user']).toEqual(['alice']);
  });

  it('kubectl attach -i: stdin comes back on stdout', async () => {
    const r = await kubectl(['attach', 'demo-pod', '-i', '-q'], { stdin: 'attached\n' });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toBe('attached\n');
    expect(lastUpgrade().url).toMatch(/^\/api\/v1\/namespaces\/default\/pods\/demo-pod\/attach\?/);
  });

  for (const [how, more] of [
    ['SPDY tunnelled in a WebSocket (the default)', {}],
    ['SPDY/3.1 (KUBECTL_PORT_FORWARD_WEBSOCKETS=false)', { KUBECTL_PORT_FORWARD_WEBSOCKETS: 'false' }],
  ] as const) {
    it(`kubectl port-forward over ${how}: several connections, bytes both ways`, async () => {
      const pf = await background(['port-forward', 'pod/demo-pod', ':8080'], more);
      try {
        await waitFor(() => pf.lines.some((l) => /Forwarding from 127\.0\.0\.1:\d+ -> 8080/.test(l.text)), {
          timeoutMs: 20_000,
          message: `port-forward ready: ${pf.lines.map((l) => l.text).join(' | ')}`,
        });
        const localPort = Number(/127\.0\.0\.1:(\d+)/.exec(pf.lines.find((l) => l.text.includes('Forwarding from 127.0.0.1'))!.text)![1]);
        const roundTrip = (payload: Buffer): Promise<Buffer> =>
          new Promise((resolve, reject) => {
            const s = net.connect({ host: '127.0.0.1', port: localPort }, () => s.write(payload));
            const got: Buffer[] = [];
            let n = 0;
            s.on('data', (d: Buffer) => {
              got.push(d);
              n += d.length;
              if (n >= payload.length) {
                s.end();
                resolve(Buffer.concat(got));
              }
            });
            s.on('error', reject);
          });
        const payloads = [0, 1, 2, 3].map((i) => Buffer.alloc(256 * 1024 + i, 65 + i));
        const echoed = await Promise.all(payloads.map(roundTrip));
        for (let i = 0; i < payloads.length; i++) expect(echoed[i]!.equals(payloads[i]!)).toBe(true);
        const seen = lastUpgrade();
        expect(seen.url).toBe('/api/v1/namespaces/default/pods/demo-pod/portforward');
        expect(seen.headers['impersonate-user']).toEqual(['alice']);
        if (Object.keys(more).length === 0) expect(seen.headers['sec-websocket-protocol']?.[0]).toContain('SPDY/3.1+portforward.k8s.io');
        else expect(seen.upgrade).toBe('SPDY/3.1');
      } finally {
        await pf.stop();
      }
    }, 60_000);
  }

  it('kubectl logs -f: lines arrive as they are written, not at the end', async () => {
    const logs = await background(['logs', '-f', 'demo-pod']);
    await new Promise<void>((resolve) => logs.child.once('close', () => resolve()));
    const got = logs.lines.filter((l) => l.text.startsWith('log line'));
    expect(got.map((l) => l.text)).toEqual(['log line 1', 'log line 2', 'log line 3', 'log line 4', 'log line 5']);
    // Written 200 ms apart: streamed through, the first came well before the last.
    expect(got[4]!.at - got[0]!.at).toBeGreaterThan(500);
    expect(api.requests.at(-1)?.url).toMatch(/\/pods\/demo-pod\/log\?.*follow=true/);
  });

  it("kubectl get pods -w: the list, then the watch's events as they happen", async () => {
    const w = await background(['get', 'pods', '-w', '-o', 'name']);
    try {
      await waitFor(() => w.lines.filter((l) => l.text === 'pod/demo-pod-2').length >= 2, {
        timeoutMs: 20_000,
        message: `watch events: ${w.lines.map((l) => l.text).join(' | ')}`,
      });
      expect(w.lines[0]?.text).toBe('pod/demo-pod');
      expect(api.requests.some((r) => /\/pods\?.*watch=true/.test(r.url) && r.headers['impersonate-user']?.[0] === 'alice')).toBe(true);
    } finally {
      await w.stop();
    }
  });
});

describe("a hub's graceful stop with an upgraded session open", () => {
  it('the session works within the grace period and is closed after it; the stop waits for it', async () => {
    const hub2 = await startHub(pki, ['--gateway-port', '0', '--shutdown-grace', '3s']);
    const agent2 = await startAgent(pki, hub2, {
      cluster: 'cluster1',
      apiserver: api.address,
      args: ['--gateway-kubeconfig', agentKubeconfig],
    });
    try {
      const ws = await channelSocket(hub2.ports.gateway!, `/cluster1${EXEC}?command=cat&stdin=true&stdout=true`);
      let closedAt = 0;
      const closed = new Promise<void>((resolve) =>
        ws.once('close', () => {
          closedAt = Date.now();
          resolve();
        }),
      );
      const first = nextStdout(ws);
      ws.send(Buffer.concat([Buffer.of(0), Buffer.from('before')]));
      expect(await first).toBe('before');
      const stoppedAt = Date.now();
      hub2.proc.kill('SIGTERM');
      await hub2.proc.waitForJsonLine((o) => o['msg'] === 'waiting for open connections to finish', 5000);
      await new Promise((r) => setTimeout(r, 1000));
      const during = nextStdout(ws);
      ws.send(Buffer.concat([Buffer.of(0), Buffer.from('during the drain')]));
      expect(await during).toBe('during the drain');
      await closed;
      // Closed by the hub once the 3 s were over, not at the signal.
      expect(closedAt - stoppedAt).toBeGreaterThanOrEqual(2500);
      expect(closedAt - stoppedAt).toBeLessThan(10_000);
      const exit = await hub2.proc.exited;
      expect(exit.code).toBe(0);
      const line = await hub2.proc.waitForJsonLine((o) => o['msg'] === 'gateway request' && o['status'] === 101, 5000);
      expect(line['bytesIn']).toBeGreaterThan(0);
    } finally {
      await agent2.stop();
      await hub2.stop();
    }
  }, 60_000);
});
