// TunnelSocket's states, event by event, over a fake leg that records what the socket sends and does
// (the hub's packets and the leg's failure are played by the test).
import { setImmediate as tick } from 'node:timers/promises';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { PacketType, packets, type Packet } from '@cluster-proxy/proto';
import type { TunnelError } from './errors.js';
import type { Leg, LegHandlers } from './legs.js';
import { TunnelSocket } from './tunnel-socket.js';

function setup(opts: { halfClose?: boolean; signal?: AbortSignal; timeoutMs?: number; allowHalfOpen?: boolean } = {}) {
  /** What the socket did with its leg: packets by type (DATA with its bytes), and its calls. */
  const did: string[] = [];
  let handlers: LegHandlers | null = null;
  let random = 0n;
  const writers: (() => void)[] = [];
  const leg = {
    halfClose: opts.halfClose ?? true,
    backedUp: false,
    readyForData: true,
    send: (p: Packet) => {
      if (p.type === PacketType.DIAL_REQ) random = p.dialRequest.random;
      did.push(p.type === PacketType.DATA ? `DATA:${p.data.data.length}` : PacketType[p.type]!);
      return true;
    },
    whenWritable: (cb: () => void) => void writers.push(cb),
    received: (n: number, accepted: boolean) => void did.push(`received:${n}:${accepted}`),
    resumeReading: () => void did.push('resumeReading'),
    allowance: (n: number) => n,
    end: () => void did.push('end'),
    abort: () => void did.push('abort'),
  };
  const socket = new TunnelSocket('db:5432', { signal: opts.signal, timeoutMs: opts.timeoutMs, allowHalfOpen: opts.allowHalfOpen ?? true });
  const errors: TunnelError[] = [];
  socket.on('error', (e: TunnelError) => errors.push(e));
  const attach = (): void => socket.attach({ open: (_r: bigint, h: LegHandlers) => ((handlers = h), leg as Leg) });
  const fromHub = (p: Packet): void => handlers!.onPacket(p);
  const chunksFromHub = (chunks: Buffer[]): void =>
    handlers!.onChunks(
      chunks,
      chunks.reduce((n, c) => n + c.length, 0),
    );
  const answer = (): void => fromHub(packets.dialResponse(random, 4));
  const state = (): string => (socket as unknown as { state: string }).state;
  /** The state and, while open, which directions ended: [state, inbound, outbound]. */
  const where = (): string[] => {
    const d = (socket as unknown as { directions: { inbound: string; outbound: string } }).directions;
    return [state(), d.inbound, d.outbound];
  };
  /** What the socket did since the last call. */
  const took = (): string[] => did.splice(0);
  return {
    socket,
    leg,
    attach,
    fromHub,
    chunksFromHub,
    answer,
    state,
    where,
    took,
    errors,
    writers,
    fail: (why: string) => handlers!.onFailure(why),
    random: () => random,
  };
}

/** A socket whose dial has been answered, with the record so far taken off. */
function opened(opts: Parameters<typeof setup>[0] = {}) {
  const t = setup(opts);
  t.attach();
  t.answer();
  t.took();
  return t;
}

afterEach(() => {
  vi.useRealTimers();
});

describe('TunnelSocket: dialing', () => {
  it('attach sends DIAL_REQ; DIAL_RSP opens it; writes and end() made meanwhile follow in order', async () => {
    const { socket, attach, answer, state, where, took } = setup();
    let connected = false;
    socket.on('connect', () => (connected = true));
    expect(state()).toBe('starting');
    socket.write(Buffer.alloc(10));
    socket.end();
    attach();
    expect(state()).toBe('dialing');
    expect(socket.pending).toBe(true);
    await tick();
    expect(took()).toEqual(['DIAL_REQ']);
    answer();
    expect(connected).toBe(true);
    expect(socket.connecting).toBe(false);
    expect(took()).toEqual(['DATA:10', 'HALF_CLOSE']);
    expect(where()).toEqual(['open', 'open', 'ended']);
  });

  it('DIAL_RSP with an error: closed with its reason, the leg finished; a second answer is ignored', async () => {
    const { socket, attach, fromHub, state, took, errors, random } = setup();
    attach();
    took();
    fromHub(packets.dialResponse(random(), 0, 'connection refused', 'endpoint'));
    expect(state()).toBe('closed');
    expect(took()).toEqual(['end']);
    await tick();
    expect(errors.map((e) => e.reason)).toEqual(['endpoint']);
    expect(socket.destroyed).toBe(true);
    fromHub(packets.dialResponse(random(), 4));
    expect(state()).toBe('closed');
  });

  it('destroyed while dialing: DIAL_CLS, the leg finished; DIAL_RSP coming later is ignored', () => {
    const { socket, attach, answer, state, took } = setup();
    attach();
    took();
    socket.destroy();
    expect(state()).toBe('closed');
    expect(took()).toEqual(['DIAL_CLS', 'end']);
    answer();
    expect(socket.connecting).toBe(true);
    expect(took()).toEqual([]);
  });

  it('the dial deadline: closed with `timeout`; abort: closed with `context`', async () => {
    vi.useFakeTimers();
    const first = setup({ timeoutMs: 1000 });
    first.attach();
    vi.advanceTimersByTime(1000);
    expect(first.state()).toBe('closed');
    expect(first.took()).toEqual(['DIAL_REQ', 'DIAL_CLS', 'end']);
    const abort = new AbortController();
    const second = setup({ signal: abort.signal });
    abort.abort();
    expect(second.state()).toBe('closed');
    second.attach(); // the transport came too late
    expect(second.took()).toEqual([]);
    vi.useRealTimers();
    await tick();
    expect([first.errors[0]?.reason, second.errors[0]?.reason]).toEqual(['timeout', 'context']);
  });

  it('no transport: failToStart closes it before any leg', async () => {
    const { socket, state, errors } = setup();
    socket.failToStart(Object.assign(new Error('no hub'), { reason: 'tunnelclosed' }) as TunnelError);
    expect(state()).toBe('closed');
    await tick();
    expect(errors.map((e) => e.message)).toEqual(['no hub']);
  });
});

describe('TunnelSocket: half-close', () => {
  it('the hub half-closes: later DATA is ignored, we still write; end() makes it ended; once all is read, the Duplex closes it', async () => {
    const { socket, fromHub, state, where, took } = opened();
    fromHub(packets.data(4, Buffer.alloc(5)));
    fromHub(packets.halfClose(4));
    expect(where()).toEqual(['open', 'ended', 'open']);
    fromHub(packets.data(4, Buffer.alloc(7)));
    fromHub(packets.halfClose(4));
    expect(socket.bytesRead).toBe(5);
    socket.write(Buffer.alloc(3));
    socket.end();
    await tick();
    expect(where()).toEqual(['open', 'ended', 'ended']);
    expect(took()).toEqual(['received:5:true', 'DATA:3', 'HALF_CLOSE']);
    socket.resume(); // the reader takes the rest and the end: both sides are done, the Duplex destroys itself
    await new Promise((r) => socket.once('close', r));
    expect(state()).toBe('closing');
    expect(took()).toEqual(['CLOSE_REQ', 'resumeReading']);
  });

  it("a payload handed over as chunks is read in order and counted once, with the reader's answer to the last chunk", async () => {
    const { socket, chunksFromHub, took } = opened();
    socket.pause();
    chunksFromHub([Buffer.from('ab'), Buffer.from('cd'), Buffer.from('e')]);
    expect(socket.bytesRead).toBe(5);
    expect(took()).toEqual(['received:5:true']);
    const full = socket.readableHighWaterMark;
    chunksFromHub([Buffer.alloc(full), Buffer.alloc(1)]); // past the Duplex's high-water mark: the reader is full
    expect(took()).toEqual([`received:${full + 1}:false`]);
    expect(Buffer.concat([socket.read(5) as Buffer]).toString()).toBe('abcde');
    socket.destroy();
  });

  it("we half-close first: the destination's bytes still arrive; its HALF_CLOSE makes it ended, CLOSE_RSP closed", async () => {
    const { socket, fromHub, state, where, took } = opened();
    socket.end();
    await tick();
    expect(where()).toEqual(['open', 'open', 'ended']);
    fromHub(packets.data(4, Buffer.alloc(5)));
    expect(took()).toEqual(['HALF_CLOSE', 'received:5:true']);
    fromHub(packets.halfClose(4));
    expect(where()).toEqual(['open', 'ended', 'ended']);
    fromHub(packets.closeResponse(4));
    expect(state()).toBe('closed');
    expect(took()).toEqual(['end']);
  });

  it('towards a hub without half-close, end() closes: CLOSE_REQ', async () => {
    const { socket, state, took } = opened({ halfClose: false });
    socket.end();
    await tick();
    expect(state()).toBe('closing');
    expect(took()).toEqual(['CLOSE_REQ', 'resumeReading']);
  });
});

describe('TunnelSocket: closing', () => {
  it('destroy while open: CLOSE_REQ, closing until CLOSE_RSP; destroy and CLOSE_RSP again change nothing', () => {
    vi.useFakeTimers();
    const { socket, fromHub, state, took } = opened();
    socket.destroy();
    expect(state()).toBe('closing');
    expect(took()).toEqual(['CLOSE_REQ', 'resumeReading']);
    socket.destroy();
    fromHub(packets.closeResponse(4));
    expect(state()).toBe('closed');
    expect(took()).toEqual(['end']);
    fromHub(packets.closeResponse(4));
    expect(took()).toEqual([]);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('no CLOSE_RSP within 5 s: the leg is aborted', () => {
    vi.useFakeTimers();
    const { socket, state, took } = opened();
    socket.destroy();
    took();
    vi.advanceTimersByTime(5000);
    expect(state()).toBe('closed');
    expect(took()).toEqual(['abort']);
  });

  it('close while half-closed: CLOSE_REQ as from open', async () => {
    const { socket, fromHub, state, took } = opened();
    fromHub(packets.halfClose(4));
    socket.destroy();
    expect(state()).toBe('closing');
    expect(took()).toEqual(['CLOSE_REQ', 'resumeReading']);
  });

  it('unsent bytes would hold CLOSE_REQ back: the leg is aborted instead', () => {
    const { socket, leg, state, took } = opened();
    leg.backedUp = true;
    socket.destroy();
    expect(state()).toBe('closed');
    expect(took()).toEqual(['abort']);
  });

  it('the destination closes (CLOSE_RSP): what was read is still delivered, writes are refused', async () => {
    const { socket, fromHub, state, took, errors } = opened();
    fromHub(packets.data(4, Buffer.alloc(5)));
    fromHub(packets.closeResponse(4));
    expect(state()).toBe('closed');
    expect(took()).toEqual(['received:5:true', 'end']);
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    await new Promise((r) => socket.once('end', r));
    expect(Buffer.concat(chunks).length).toBe(5);
    expect(socket.writableEnded).toBe(true);
    expect(errors).toEqual([]);
  });

  it('CLOSE_RSP with an error: closed with `tunnelclosed`, the leg finished', async () => {
    const { fromHub, state, took, errors } = opened();
    fromHub(packets.closeResponse(4, 'agent disconnected'));
    expect([state(), ...took()]).toEqual(['closed', 'end']);
    await tick();
    expect(errors.map((e) => `${e.reason}: ${e.message}`)).toEqual([
      'tunnelclosed: connection to db:5432 closed by the hub: agent disconnected',
    ]);
  });
});

describe('TunnelSocket: the leg breaks', () => {
  it('while open: closed with `tunnelclosed`; later, after the close: the leg is let go', async () => {
    const { fail, state, took, errors } = opened();
    fail('hub gone');
    expect(state()).toBe('closed');
    expect(took()).toEqual(['end']);
    fail('stream ended');
    expect(took()).toEqual(['abort']);
    await tick();
    expect(errors.map((e) => e.reason)).toEqual(['tunnelclosed']);
  });

  it('while closing: no answer needed any more, the leg is aborted and the timer stopped', () => {
    vi.useFakeTimers();
    const { socket, fail, state, took } = opened();
    socket.destroy();
    took();
    fail('stream ended');
    expect(state()).toBe('closed');
    expect(took()).toEqual(['abort']);
    expect(vi.getTimerCount()).toBe(0);
  });

  it('a write waiting for the leg when the connection closes fails; the late wake-up sends nothing', async () => {
    const { socket, leg, writers, fromHub, took } = opened();
    leg.readyForData = false;
    const results: (Error | null | undefined)[] = [];
    socket.write(Buffer.alloc(10), (err) => results.push(err));
    expect(writers.length).toBe(1);
    fromHub(packets.closeResponse(4, 'reset'));
    writers.shift()!();
    await tick();
    expect(results.map((e) => (e as TunnelError | null)?.reason)).toEqual(['closed']);
    expect(took().filter((d) => d.startsWith('DATA'))).toEqual([]);
  });
});
