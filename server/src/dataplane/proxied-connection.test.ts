// The hub relays between two credit windows: a client may still deliver what it was granted after the
// hub paused it, but the agent must never receive more than its credit (plus one chunk), or it cuts
// the connection. Driven packet by packet with a recording backend and frontend.
import pino from 'pino';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { MAX_CONNECTION_WINDOW, MemoryBudget, PacketType, packets, type Packet } from '@cluster-proxy/proto';
import type { AgentBackend } from './backend.js';
import type { Frontend } from './frontend.js';
import { ServerMetrics } from './metrics.js';
import { ProxiedConnection } from './proxied-connection.js';

const WINDOW = 1024 * 1024;

function setup(opts: { clientHalfClose?: boolean; sink?: Frontend['sink']; onBulk?: () => void } = {}) {
  const sent: Packet[] = [];
  const events: string[] = [];
  const waiters: Array<() => void> = [];
  const sender = {
    send: (p: Packet) => {
      sent.push(p);
    },
    sendData: (id: number, chunks: readonly Buffer[], n: number) => {
      sent.push(packets.data(id, chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, n)));
    },
    congested: false,
    queued: 0,
    whenWritable: (w: () => void) => {
      waiters.push(w);
    },
    cancelWaiter: () => {},
    releaseReads: () => {},
    holdReads: () => {},
  };
  const backend = {
    agentID: 'a1',
    peerWindow: WINDOW,
    window: WINDOW,
    budget: new MemoryBudget(256 * 1024 * 1024, { maxWindow: MAX_CONNECTION_WINDOW }),
    credit: true,
    halfClose: true,
    metrics: new ServerMetrics(),
    sender,
    sendDialRequest: () => {},
    sendDialClose: () => {},
    forget: () => {},
    established: () => {},
    sendCredit: () => {},
    sendCloseRequest: () => {
      events.push('CLOSE_REQ');
    },
    sendHalfClose: () => {
      events.push('HALF_CLOSE');
    },
  } as unknown as AgentBackend;
  const frontend: Frontend = {
    sink: opts.sink ?? { write: () => true },
    client: 'test',
    halfClose: opts.clientHalfClose ?? true,
    dialSucceeded: () => {},
    dialFailed: () => {},
    remoteEnded: () => {
      events.push('remoteEnded');
    },
    closed: (e) => {
      events.push(`closed:${e}`);
    },
    pause: () => {
      events.push('pause');
    },
    resume: () => {
      events.push('resume');
    },
    onBulk: opts.onBulk,
  };
  const conn = new ProxiedConnection(backend, frontend, 1n, 'c1:443', pino({ level: 'silent' }));
  conn.startDial(60_000);
  conn.onDialResponse(7, '', '');
  const dataBytes = (): number =>
    sent.filter((p) => p.type === PacketType.DATA).reduce((n, p) => n + (p as { data: { data: Uint8Array } }).data.data.length, 0);
  const lastData = (): Uint8Array => (sent.filter((p) => p.type === PacketType.DATA).at(-1) as { data: { data: Uint8Array } }).data.data;
  const dataInOrder = (): Buffer =>
    Buffer.concat(sent.filter((p) => p.type === PacketType.DATA).map((p) => Buffer.from((p as { data: { data: Uint8Array } }).data.data)));
  /** The shared stream drained: its waiters run. */
  const drain = (): void => {
    sender.congested = false;
    sender.queued = 0;
    for (const w of waiters.splice(0)) w();
  };
  return { conn, events, dataBytes, dataInOrder, lastData, sender, drain };
}

describe('ProxiedConnection: a client that keeps up with what the agent sends', () => {
  it('the frontend hears it once (onBulk: its socket may keep more unsent); never about a client that takes nothing', () => {
    let bulk = 0;
    const fast = setup({
      sink: {
        write: (_chunk, cb) => {
          cb();
          return true;
        },
      },
      onBulk: () => bulk++,
    });
    for (let i = 0; i < 64; i++) fast.conn.onData(Buffer.alloc(64 * 1024));
    expect(bulk).toBe(1);
    fast.conn.close();

    let stuckBulk = 0;
    const stuck = setup({ sink: { write: () => false }, onBulk: () => stuckBulk++ });
    for (let i = 0; i < WINDOW / (64 * 1024); i++) stuck.conn.onData(Buffer.alloc(64 * 1024));
    expect(stuckBulk).toBe(0);
    stuck.conn.close();
  });
});

describe('ProxiedConnection: client bytes towards an agent with credit', () => {
  it('never sends more than the credit while the agent grants none; the rest follows the credit, in order', () => {
    const { conn, events, dataBytes, dataInOrder } = setup();
    const input = Buffer.alloc(3 * WINDOW);
    for (let i = 0; i < input.length; i++) input[i] = i % 251;
    // The client keeps delivering after pause() (what it had been granted): 64 KiB pieces.
    for (let off = 0; off < input.length; off += 64 * 1024) conn.write(input.subarray(off, off + 64 * 1024));
    expect(events).toContain('pause');
    expect(dataBytes()).toBe(WINDOW);
    conn.onCredit(WINDOW);
    expect(dataBytes()).toBe(2 * WINDOW);
    expect(events.filter((e) => e === 'resume')).toEqual([]); // bytes still waiting: the client stays paused
    conn.onCredit(2 * WINDOW);
    expect(dataBytes()).toBe(input.length);
    expect(dataInOrder().equals(input)).toBe(true);
    expect(events.at(-1)).toBe('resume');
    conn.close();
  });

  it('credit or not, bytes wait once the shared stream holds 8 MiB the agent has not read; they go when it drains', () => {
    const { conn, dataBytes, sender, drain } = setup();
    conn.onCredit(64 * WINDOW); // the agent granted far more than the stream should hold
    sender.congested = true;
    sender.queued = 4 * WINDOW; // congested, but below the limit: credit is what counts
    conn.write(Buffer.alloc(WINDOW));
    expect(dataBytes()).toBe(WINDOW);
    sender.queued = 8 * WINDOW;
    conn.write(Buffer.alloc(WINDOW));
    expect(dataBytes()).toBe(WINDOW);
    drain();
    expect(dataBytes()).toBe(2 * WINDOW);
    conn.close();
  });

  it('a half-close waits for the bytes before it; so does a close, then CLOSE_REQ', () => {
    const { conn, events, dataBytes } = setup();
    conn.write(Buffer.alloc(2 * WINDOW));
    conn.endWrite();
    expect(events).not.toContain('HALF_CLOSE');
    conn.onCredit(2 * WINDOW);
    expect(dataBytes()).toBe(2 * WINDOW);
    expect(events).toContain('HALF_CLOSE');

    // A close: what waits goes first, within the credit, then CLOSE_REQ.
    const second = setup();
    second.conn.write(Buffer.alloc(2 * WINDOW));
    second.conn.close();
    expect(second.dataBytes()).toBe(WINDOW);
    expect(second.events).not.toContain('CLOSE_REQ');
    second.conn.onCredit(WINDOW);
    expect(second.dataBytes()).toBe(2 * WINDOW);
    expect(second.events).toContain('CLOSE_REQ');
  });

  it('a close whose last bytes get no credit (a destination that stopped reading) drops them after a while and sends CLOSE_REQ', () => {
    vi.useFakeTimers();
    try {
      const { conn, events, dataBytes } = setup();
      conn.write(Buffer.alloc(2 * WINDOW));
      conn.close();
      expect(dataBytes()).toBe(WINDOW);
      vi.advanceTimersByTime(1999);
      expect(events).not.toContain('CLOSE_REQ');
      vi.advanceTimersByTime(1);
      expect(events).toContain('CLOSE_REQ');
      conn.onCredit(WINDOW); // late credit: nothing more goes out
      expect(dataBytes()).toBe(WINDOW);
      conn.onCloseResponse('');
      expect(events.at(-1)).toBe('closed:');
    } finally {
      vi.useRealTimers();
    }
  });

  it('what is left waiting for credit is copied out of the message it came in, which would stay alive with it', () => {
    const { conn, dataInOrder, lastData } = setup();
    const message = Buffer.alloc(WINDOW + WINDOW / 2);
    for (let i = 0; i < message.length; i++) message[i] = i % 253;
    conn.write(message); // the credit takes the first WINDOW, half a window waits
    expect(lastData().buffer).toBe(message.buffer);
    conn.onCredit(WINDOW);
    expect(dataInOrder().equals(message)).toBe(true);
    expect(lastData().buffer.byteLength).toBe(WINDOW / 2);
    conn.close();
  });

  it('a client that keeps sending far beyond any window is cut off (nothing buffered without bound)', () => {
    const { conn, events } = setup();
    // More than twice the largest window (4 MiB) plus a message beyond the credit.
    for (let i = 0; i < 60; i++) conn.write(Buffer.alloc(256 * 1024));
    expect(events).toContain('CLOSE_REQ');
  });
});

describe('ProxiedConnection: the destination ends first', () => {
  it('a client with half-close gets the half-close and the connection stays open for its writes', () => {
    const { conn, events } = setup();
    conn.onHalfClose();
    expect(events).toEqual(['remoteEnded']);
    expect(conn.state).toBe('open');
    conn.close();
  });

  it('an ANP client (no half-close) gets the close, as behind an ANP agent: CLOSE_REQ to the agent, then CLOSE_RSP to the client', () => {
    const { conn, events } = setup({ clientHalfClose: false });
    conn.onHalfClose();
    expect(events).toEqual(['CLOSE_REQ']);
    expect(conn.state).toBe('closing');
    conn.onCloseResponse('');
    expect(events).toEqual(['CLOSE_REQ', 'closed:']);
    expect(conn.state).toBe('closed');
  });
});

describe('ProxiedConnection: the stall policy (--stall-timeout)', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  it('a client held back while none of its bytes reach the agent is stalled towards the agent; bytes that go restart the clock', () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const { conn, dataBytes } = setup();
    expect(conn.stall(Date.now())).toBeNull();
    conn.write(Buffer.alloc(WINDOW + 4096)); // more than the agent's credit: the client is paused
    vi.advanceTimersByTime(3000);
    expect(conn.stall(Date.now())).toEqual({ direction: 'to_agent', ms: 3000 });
    conn.onCredit(1024); // a trickle goes: it moved
    expect(dataBytes()).toBe(WINDOW + 1024);
    expect(conn.stall(Date.now())).toEqual({ direction: 'to_agent', ms: 0 });
    vi.advanceTimersByTime(500);
    expect(conn.stall(Date.now())?.ms).toBe(500);
    conn.onCredit(WINDOW); // everything went, the client is resumed: no stall
    expect(conn.stall(Date.now())).toBeNull();
  });

  it('bytes for a client that takes none of them are stalled towards the client, from when the first began to wait', () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    const callbacks: Array<(err?: Error | null) => void> = [];
    const { conn } = setup({
      sink: {
        write: (_chunk, cb) => {
          callbacks.push(cb);
          return false;
        },
      },
    });
    conn.onData(Buffer.alloc(1000));
    vi.advanceTimersByTime(2000);
    conn.onData(Buffer.alloc(1000));
    vi.advanceTimersByTime(1000);
    expect(conn.stall(Date.now())).toEqual({ direction: 'to_client', ms: 3000 });
    callbacks.shift()!(); // the client took the first chunk: it moves
    expect(conn.stall(Date.now())).toEqual({ direction: 'to_client', ms: 0 });
    callbacks.shift()!();
    expect(conn.stall(Date.now())).toBeNull();
  });

  it('closing a stalled connection drops what waits, asks the agent to close at once, and tells the client why once the agent has', async () => {
    const { conn, events, dataBytes } = setup();
    conn.write(Buffer.alloc(WINDOW + 4096));
    conn.closeStalled('to_agent', 300_000);
    expect(conn.state).toBe('closing');
    expect(events.at(-1)).toBe('CLOSE_REQ');
    conn.onCredit(WINDOW); // late credit: the dropped bytes stay dropped
    expect(dataBytes()).toBe(WINDOW);
    conn.write(Buffer.alloc(10)); // the client's late bytes go nowhere
    expect(dataBytes()).toBe(WINDOW);
    expect(conn.stall(Date.now())).toBeNull();
    conn.onCloseResponse('');
    expect(conn.state).toBe('closed');
    expect(events.at(-1)).toBe(
      "closed:closed by the proxy server: the destination took none of the client's bytes for 300 s (--stall-timeout)",
    );
    const counted = (await conn.backend.metrics.stalledCloses.get()).values;
    expect(counted).toEqual([expect.objectContaining({ labels: { direction: 'to_agent' }, value: 1 })]);
  });

  it('only an open connection is closed so: a closing one keeps its own course', () => {
    const { conn, events } = setup();
    conn.close();
    const before = [...events];
    conn.closeStalled('to_client', 300_000);
    expect(events).toEqual(before);
    expect(conn.state).toBe('closing');
  });
});
