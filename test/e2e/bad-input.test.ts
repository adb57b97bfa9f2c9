// Malformed, oversized and out-of-order input on the hub's two listeners: the offending stream
// fails, nothing else does. Real hub and agent processes; raw grpc-js calls play the bad peer.
import { readFileSync } from 'node:fs';
import * as grpc from '@grpc/grpc-js';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import type { Tunnel } from '@cluster-proxy/client';
import {
  AGENT_CONNECT_PATH,
  MAX_MESSAGE_BYTES,
  MD_AGENT_ID,
  PROXY_PATH,
  PacketType,
  decodePacket,
  encodePacket,
  packets,
  type Packet,
} from '@cluster-proxy/proto';
import { snapshotHandles, waitFor, waitForHandlesAtMost, type TcpTarget } from '../src/fixtures/index.js';
import {
  expectTablesEmpty,
  startAgent,
  startHub,
  type AgentProcess,
  type CertFiles,
  type HubProcess,
  type TestPki,
} from '../src/harness.js';
import { startEchoHub, type EchoHub } from '../src/e2e-setup.js';
import { echoRoundTripForTest as echoRoundTrip } from '../src/join-helpers.js';

let setup: EchoHub;
let pki: TestPki;
let hub: HubProcess;
let agent: AgentProcess;
let echo: TcpTarget;
let tunnel: Tunnel;
let handles: Map<string, number>;
const rawClients: grpc.Client[] = [];

/** Bytes as they are: lets a test put anything on the wire as one gRPC message. */
const rawBytes = (b: Buffer): Buffer => b;

function rawClient(port: number, cert: CertFiles): grpc.Client {
  const creds = grpc.credentials.createSsl(readFileSync(pki.caPath), readFileSync(cert.keyPath), readFileSync(cert.certPath));
  const client = new grpc.Client(`127.0.0.1:${port}`, creds, {
    'grpc.ssl_target_name_override': 'localhost',
    'grpc.default_authority': 'localhost',
    'grpc.enable_http_proxy': 0,
  });
  rawClients.push(client);
  return client;
}

interface Outcome {
  packets: Packet[];
  status: grpc.StatusObject;
}

/** Everything the call receives until its status, with a deadline so a hang fails clearly. */
function outcome<Req>(call: grpc.ClientDuplexStream<Req, Packet>, what: string, timeoutMs = 10_000): Promise<Outcome> {
  const got: Packet[] = [];
  call.on('data', (p: Packet) => got.push(p));
  call.on('error', () => {}); // the status below carries it
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      call.cancel();
      reject(
        new Error(`${what}: no status within ${timeoutMs} ms (received ${got.map((p) => PacketType[p.type]).join(', ') || 'nothing'})`),
      );
    }, timeoutMs);
    call.on('status', (status: grpc.StatusObject) => {
      clearTimeout(timer);
      resolve({ packets: got, status });
    });
  });
}

/** The first packet matching `pred`, from a call that is still open. */
function nextPacket<Req>(
  call: grpc.ClientDuplexStream<Req, Packet>,
  pred: (p: Packet) => boolean,
  what: string,
  timeoutMs = 10_000,
): Promise<Packet> {
  return new Promise((resolve, reject) => {
    const onData = (p: Packet): void => {
      if (!pred(p)) return;
      cleanup();
      resolve(p);
    };
    const onStatus = (s: grpc.StatusObject): void => {
      cleanup();
      reject(new Error(`${what}: call ended (${grpc.status[s.code]}: ${s.details}) before the packet arrived`));
    };
    const timer = setTimeout(() => {
      cleanup();
      reject(new Error(`${what}: not within ${timeoutMs} ms`));
    }, timeoutMs);
    const cleanup = (): void => {
      clearTimeout(timer);
      call.removeListener('data', onData);
      call.removeListener('status', onStatus);
    };
    call.on('data', onData);
    call.on('status', onStatus);
  });
}

/** The hub still serves the real agent: a fresh SDK dial round-trips, and the process is alive. */
async function expectHubServing(): Promise<void> {
  expect(hub.proc.isRunning()).toBe(true);
  const s = await tunnel.dial('c1:443');
  try {
    expect((await echoRoundTrip(s, Buffer.from('still serving'))).toString()).toBe('still serving');
  } finally {
    s.destroy();
  }
  expect(hub.proc.isRunning()).toBe(true);
}

beforeAll(async () => {
  setup = await startEchoHub(['--dial-timeout', '2s']);
  ({ pki, echo, hub } = setup);
  agent = await setup.startAgent('c1');
});

afterAll(async () => {
  await setup?.stop();
});

beforeEach(() => {
  handles = snapshotHandles();
  tunnel = hub.tunnel();
});

afterEach(async () => {
  tunnel.close();
  for (const c of rawClients.splice(0)) c.close();
  await expectTablesEmpty(hub, [agent]);
  expect((await hub.tables()).agents.map((a) => a.cluster)).toEqual(['c1']);
  await waitForHandlesAtMost(handles, 5000);
});

describe('client frontend (ProxyService.Proxy)', () => {
  it('fails a call that sends bytes that are not a Packet, and keeps serving', async () => {
    const client = rawClient(hub.ports.frontend, pki.client);
    const garbage: Array<[string, Buffer]> = [
      ['truncated varint', Buffer.from([0x08, 0x80])],
      ['unknown packet type 7', Buffer.from([0x08, 0x07])],
      ['type field with the wrong wire type', Buffer.from([0x0a, 0x00])],
      ['payload running past the end', Buffer.from([0x08, 0x04, 0x22, 0x10, 0x08])],
      ['field number 0', Buffer.from([0x00, 0x01])],
    ];
    for (const [what, bytes] of garbage) {
      const call = client.makeBidiStreamRequest(PROXY_PATH, rawBytes, decodePacket, new grpc.Metadata());
      const done = outcome(call, what);
      call.write(bytes);
      const { status, packets: got } = await done;
      expect(status.code, `${what}: ${status.details}`).toBe(grpc.status.INTERNAL);
      expect(status.details, what).toMatch(/deserializ/i);
      expect(
        got.filter((p) => p.type === PacketType.DIAL_RSP || p.type === PacketType.DATA),
        what,
      ).toEqual([]);
      call.end();
    }
    await expectHubServing();
  });

  it('fails a call that sends one message over the size limit with RESOURCE_EXHAUSTED, and keeps serving', async () => {
    const client = rawClient(hub.ports.frontend, pki.client);
    const call = client.makeBidiStreamRequest(PROXY_PATH, rawBytes, decodePacket, new grpc.Metadata());
    const done = outcome(call, 'oversized message');
    // A valid DATA packet, just too big: the size alone must sink it.
    call.write(encodePacket(packets.data(1, Buffer.alloc(MAX_MESSAGE_BYTES + 1024, 1))));
    const { status } = await done;
    expect(status.code, status.details).toBe(grpc.status.RESOURCE_EXHAUSTED);
    call.end();

    // A message right at the limit on another call is not refused for its size: this stream has
    // no dial yet, so the hub answers the early DATA as usual ('backend not initialized').
    const atLimit = client.makeBidiStreamRequest(PROXY_PATH, rawBytes, decodePacket, new grpc.Metadata());
    const limitDone = outcome(atLimit, 'message at the limit');
    const header = encodePacket(packets.data(1, Buffer.alloc(0)));
    const payload = Buffer.alloc(MAX_MESSAGE_BYTES - header.length - 8, 2);
    const msg = encodePacket(packets.data(1, payload));
    expect(msg.length).toBeLessThanOrEqual(MAX_MESSAGE_BYTES);
    atLimit.write(msg);
    const limit = await limitDone;
    expect(limit.status.code, limit.status.details).not.toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(limit.packets.map((p) => (p.type === PacketType.CLOSE_RSP ? p.closeResponse.error : PacketType[p.type]))).toEqual([
      'backend not initialized',
    ]);
    atLimit.end();

    await expectHubServing();
  });

  it('answers DATA before any DIAL_REQ with CLOSE_RSP "backend not initialized"', async () => {
    const client = rawClient(hub.ports.frontend, pki.client);
    const call = client.makeBidiStreamRequest(PROXY_PATH, encodePacket, decodePacket, new grpc.Metadata());
    const done = outcome(call, 'early DATA');
    call.write(packets.data(5, Buffer.from('too early')));
    const { packets: got, status } = await done;
    expect(got).toEqual([packets.closeResponse(5, 'backend not initialized')]);
    expect(status.code, status.details).toBe(grpc.status.OK);
    call.end();
    await expectHubServing();
  });

  it('DATA while the dial is still pending: the stream ends and no connection is left behind', async () => {
    // Its own hub and agent: a connection leaked here must not spill into the other tests.
    const ownHub = await startHub(pki, ['--dial-timeout', '2s']);
    const ownAgent = await startAgent(pki, ownHub, { cluster: 'c1', apiserver: `127.0.0.1:${echo.port}` }).catch(async (err: unknown) => {
      await ownHub.stop();
      throw err;
    });
    try {
      const before = echo.connections();
      const client = rawClient(ownHub.ports.frontend, pki.client);
      const call = client.makeBidiStreamRequest(PROXY_PATH, encodePacket, decodePacket, new grpc.Metadata());
      const done = outcome(call, 'DATA during the dial');
      // Back to back: the DATA reaches the hub long before the agent's DIAL_RSP can.
      call.write(packets.dialRequest('c1:443', 11n));
      call.write(packets.data(0, Buffer.from('impatient')));
      const { packets: got } = await done;
      expect(got.some((p) => p.type === PacketType.CLOSE_RSP || (p.type === PacketType.DIAL_RSP && p.dialResponse.error !== ''))).toBe(
        true,
      );
      call.end();
      // Whatever the hub answered, the dial it started must not outlive the stream: not in its
      // tables, not at the agent, not as a TCP connection to the destination.
      await expectTablesEmpty(ownHub, [ownAgent], 5000);
      await waitFor(() => echo.connections() === before, { timeoutMs: 5000, message: 'no destination connection left open' });
    } finally {
      await Promise.all([ownHub.stop(), ownAgent.stop()]);
    }
  });

  it('fails a stream that sends a second DIAL_REQ, and closes the first connection at the agent', async () => {
    const before = echo.connections();
    const client = rawClient(hub.ports.frontend, pki.client);
    const call = client.makeBidiStreamRequest(PROXY_PATH, encodePacket, decodePacket, new grpc.Metadata());
    const dialed = nextPacket(call, (p) => p.type === PacketType.DIAL_RSP, 'DIAL_RSP');
    call.write(packets.dialRequest('c1:443', 7n));
    const rsp = await dialed;
    expect(rsp.type === PacketType.DIAL_RSP && rsp.dialResponse.error).toBe('');
    const done = outcome(call, 'second DIAL_REQ');
    call.write(packets.dialRequest('c1:443', 8n));
    const { status } = await done;
    expect(status.code, status.details).toBe(grpc.status.INVALID_ARGUMENT);
    call.end();
    await waitFor(() => echo.connections() === before, { timeoutMs: 5000, message: 'destination connection closed' });
    await expectHubServing();
  });

  it('fails a stream whose DATA names another connectID, and closes its connection at the agent', async () => {
    const before = echo.connections();
    const client = rawClient(hub.ports.frontend, pki.client);
    const call = client.makeBidiStreamRequest(PROXY_PATH, encodePacket, decodePacket, new grpc.Metadata());
    const dialed = nextPacket(call, (p) => p.type === PacketType.DIAL_RSP, 'DIAL_RSP');
    call.write(packets.dialRequest('c1:443', 4242n));
    const rsp = await dialed;
    if (rsp.type !== PacketType.DIAL_RSP) throw new Error('unreachable');
    expect(rsp.dialResponse.error).toBe('');
    expect(rsp.dialResponse.random).toBe(4242n);
    const connectID = rsp.dialResponse.connectID;
    expect(connectID).toBeGreaterThan(0);

    // The connection works with its own ID...
    const echoed = nextPacket(call, (p) => p.type === PacketType.DATA, 'echoed DATA');
    call.write(packets.data(connectID, Buffer.from('mine')));
    const back = await echoed;
    expect(back).toEqual(packets.data(connectID, Buffer.from('mine')));
    await waitFor(() => echo.connections() === before + 1, { timeoutMs: 5000, message: 'destination connection open' });

    // ...and a DATA for someone else's connection ends the stream with an error.
    const done = outcome(call, 'foreign connectID');
    call.write(packets.data(connectID + 1000, Buffer.from('not mine')));
    const { status } = await done;
    expect(status.code).not.toBe(grpc.status.OK);
    expect(status.code, status.details).toBe(grpc.status.INVALID_ARGUMENT);
    expect(status.details).toContain(String(connectID + 1000));
    call.end();

    // The agent closed the destination connection; the tables drain (also checked after each test).
    await waitFor(() => echo.connections() === before, { timeoutMs: 5000, message: 'destination connection closed' });
    await waitFor(async () => (await agent.tables()).servers.every((s) => s.connections.length === 0), {
      timeoutMs: 5000,
      message: 'agent table empty',
    });
    await expectHubServing();
  });
});

describe('agent listener (AgentService.Connect)', () => {
  async function connectBadAgent(agentID: string): Promise<grpc.ClientDuplexStream<Buffer, Packet>> {
    const cert = await pki.agent('bad');
    const client = rawClient(hub.ports.agent, cert);
    const md = new grpc.Metadata();
    md.set(MD_AGENT_ID, agentID);
    const call = client.makeBidiStreamRequest(AGENT_CONNECT_PATH, rawBytes, decodePacket, md);
    const headers = new Promise<grpc.Metadata>((resolve) => call.once('metadata', resolve));
    await headers;
    // Registered: the hub routes the cluster's names to it.
    await waitFor(async () => (await hub.tables()).agents.some((a) => a.agentID === agentID && a.cluster === 'bad'), {
      timeoutMs: 5000,
      message: `${agentID} registered`,
    });
    return call;
  }

  async function expectGone(agentID: string): Promise<void> {
    await waitFor(async () => !(await hub.tables()).agents.some((a) => a.agentID === agentID), {
      timeoutMs: 5000,
      message: `${agentID} removed from the hub's tables`,
    });
    // Dials to its cluster fail fast instead of going to a dead stream.
    const err = await tunnel.dial('bad:443').catch((e: unknown) => e);
    expect((err as { reason?: string }).reason).toBe('no_agent');
  }

  it('fails an agent stream that sends bytes that are not a Packet, drops the agent, keeps serving c1', async () => {
    for (const [i, bytes] of [Buffer.from([0x08, 0x80]), Buffer.from([0x08, 0x07]), Buffer.from([0x22, 0x05, 0x08])].entries()) {
      const id = `bad-agent-garbage-${i}`;
      const call = await connectBadAgent(id);
      const done = outcome(call, `agent garbage ${i}`);
      call.write(bytes);
      const { status } = await done;
      expect(status.code, status.details).toBe(grpc.status.INTERNAL);
      call.end();
      await expectGone(id);
    }
    await expectHubServing();
  });

  it('fails an agent stream that sends an oversized message, drops the agent, keeps serving c1', async () => {
    const id = 'bad-agent-oversized';
    const call = await connectBadAgent(id);
    const done = outcome(call, 'agent oversized');
    call.write(encodePacket(packets.data(1, Buffer.alloc(MAX_MESSAGE_BYTES + 1024, 1))));
    const { status } = await done;
    expect(status.code, status.details).toBe(grpc.status.RESOURCE_EXHAUSTED);
    call.end();
    await expectGone(id);
    await expectHubServing();
  });
});
