// Property tests of the state machine that owns an upgraded gateway connection (proto's splice(): open →
// half-closed → closing → closed, backpressure and half-close both ways): random interleavings of data from
// either side, readers that stop and start, ends in either order, and a reset of either side. Invariants:
// no byte lost, duplicated or reordered; each end reaches the other side exactly once; a reset ends the
// session with an error and both sides closed; the splice's listeners are gone at the end.
import { duplexPair, type Duplex } from 'node:stream';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { splice } from '@cluster-proxy/proto';

type Side = 'client' | 'server';
type Action =
  | { op: 'write'; side: Side; size: number }
  | { op: 'end'; side: Side }
  | { op: 'pause' | 'resume'; side: Side }
  | { op: 'reset'; side: Side }
  | { op: 'tick' };

const side = fc.constantFrom<Side>('client', 'server');
const actionArb: fc.Arbitrary<Action> = fc.oneof(
  { arbitrary: fc.record({ op: fc.constant('write' as const), side, size: fc.integer({ min: 1, max: 40_000 }) }), weight: 6 },
  { arbitrary: fc.record({ op: fc.constant('end' as const), side }), weight: 1 },
  { arbitrary: fc.record({ op: fc.constantFrom('pause' as const, 'resume' as const), side }), weight: 2 },
  { arbitrary: fc.record({ op: fc.constant('reset' as const), side }), weight: 1 },
  { arbitrary: fc.constant({ op: 'tick' as const }), weight: 4 },
);

const tick = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

interface Peer {
  socket: Duplex;
  written: Buffer[];
  got: Buffer[];
  ends: number;
  ended: boolean;
  reset: boolean;
  closed: boolean;
}

/** The session's listeners on a socket ('data', 'end', 'drain', 'close'), less Node's own end() bookkeeping. */
function listeners(s: Duplex): number {
  return ['data', 'end', 'drain', 'close'].reduce((n, e) => n + s.listeners(e).filter((f) => !String(f).includes('onFinish')).length, 0);
}

function peer(socket: Duplex): Peer {
  const p: Peer = { socket, written: [], got: [], ends: 0, ended: false, reset: false, closed: false };
  socket.on('data', (c: Buffer) => p.got.push(Buffer.from(c)));
  socket.on('end', () => p.ends++);
  socket.on('close', () => (p.closed = true));
  socket.on('error', () => {});
  return p;
}

async function run(actions: readonly Action[]): Promise<void> {
  const [clientSocket, a] = duplexPair();
  const [b, serverSocket] = duplexPair();
  const peers: Record<Side, Peer> = { client: peer(clientSocket), server: peer(serverSocket) };
  const baseline = { a: listeners(a), b: listeners(b) };
  const session = splice(a, b);
  let pattern = 0;
  for (const act of actions) {
    if (act.op === 'tick') {
      await tick();
      continue;
    }
    const p = peers[act.side];
    if (p.reset || p.closed) continue;
    if (act.op === 'write' && !p.ended) {
      const data = Buffer.alloc(act.size);
      for (let k = 0; k < act.size; k++) data[k] = (pattern++ * 7 + (act.side === 'client' ? 1 : 2)) & 0xff;
      p.written.push(data);
      p.socket.write(data);
    } else if (act.op === 'end' && !p.ended) {
      p.ended = true;
      p.socket.end();
    } else if (act.op === 'pause') p.socket.pause();
    else if (act.op === 'resume') p.socket.resume();
    else if (act.op === 'reset') {
      // A reset as the splice's socket sees it (an in-memory pair's destroy() reads as a FIN to its other end).
      p.reset = true;
      (act.side === 'client' ? a : b).destroy(Object.assign(new Error('read ECONNRESET'), { code: 'ECONNRESET' }));
      p.socket.destroy();
    }
  }
  // Settle: readers read, and both sides end (unless one was reset).
  for (const p of Object.values(peers)) {
    p.socket.resume();
    if (!p.reset && !p.ended && !p.closed) {
      p.ended = true;
      p.socket.end();
    }
  }
  const result = await Promise.race([
    session.done,
    new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`the session did not end (state ${session.state()})`)), 5000)),
  ]);
  for (let i = 0; i < 5; i++) await tick();
  expect(session.state()).toBe('closed');
  const reset = peers.client.reset || peers.server.reset;
  for (const [from, to] of [
    ['client', 'server'],
    ['server', 'client'],
  ] as const) {
    const sent = Buffer.concat(peers[from].written);
    const got = Buffer.concat(peers[to].got);
    if (reset) {
      expect(sent.subarray(0, got.length).equals(got), `${from} → ${to}: bytes before the reset differ`).toBe(true);
      expect(peers[to].ends).toBeLessThanOrEqual(1);
    } else {
      expect(got.length, `${from} → ${to}: ${got.length} of ${sent.length} bytes`).toBe(sent.length);
      expect(got.equals(sent), `${from} → ${to}: bytes lost, duplicated or reordered`).toBe(true);
      expect(peers[to].ends, `${from} → ${to}: the end arrived ${peers[to].ends} times`).toBe(1);
    }
  }
  if (reset) expect(result.error).toBeDefined();
  else {
    expect(result.error).toBeUndefined();
    expect(result.aToB).toBe(Buffer.concat(peers.client.written).length);
    expect(result.bToA).toBe(Buffer.concat(peers.server.written).length);
  }
  expect(a.destroyed && b.destroyed).toBe(true);
  // The splice's listeners are gone: nothing of the session is held by its sockets.
  expect(listeners(a)).toBe(baseline.a);
  expect(listeners(b)).toBe(baseline.b);
  clientSocket.destroy();
  serverSocket.destroy();
}

describe('splice: random interleavings (fast-check)', () => {
  it('no byte lost, duplicated or reordered; one end each way; a reset closes both; listeners gone', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(actionArb, { maxLength: 40 }), (actions) => run(actions)),
      { seed: 20261129, numRuns: 120 },
    );
  }, 60_000);
});
