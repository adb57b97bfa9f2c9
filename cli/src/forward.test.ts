// pipeForward's direction from the tunnel to the local client: records of one frame leave in one writev,
// a client that stops reading pauses the tunnel with a bounded queue, and the tunnel's FIN reaches the client.
import net from 'node:net';
import { Duplex } from 'node:stream';
import { once } from 'node:events';
import { pino } from 'pino';
import { afterEach, describe, expect, it } from 'vitest';
import { pipeForward } from './forward.js';

const RECORD = 16 * 1024;
const log = pino({ level: 'silent' });
const cleanups: (() => void)[] = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

/** A tunnel leg as pipeForward sees one: bytes pushed by the test, whatever is written to it discarded. */
function fakeTunnel(): Duplex {
  return new Duplex({
    readableHighWaterMark: 256 * 1024,
    read() {},
    write(_chunk, _enc, cb) {
      cb();
    },
  });
}

/** A forward's accepted socket (`local`, with `writes`: the chunk count of each write it hands the kernel) and its client. */
async function forwarded(remote: Duplex): Promise<{ local: net.Socket; client: net.Socket; writes: number[] }> {
  const writes: number[] = [];
  const server = net.createServer({ allowHalfOpen: true, noDelay: true });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const client = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  const [local] = (await once(server, 'connection')) as [net.Socket];
  const s = local as net.Socket & { _write: Function; _writev: Function };
  const [write, writev] = [s._write, s._writev];
  s._write = function (...args: unknown[]) {
    writes.push(1);
    return write.apply(this, args);
  };
  s._writev = function (chunks: unknown[], cb: unknown) {
    writes.push(chunks.length);
    return writev.call(this, chunks, cb);
  };
  pipeForward(local, remote, 'probe:443', log);
  cleanups.push(() => {
    client.destroy();
    local.destroy();
    remote.destroy();
    server.close();
  });
  return { local, client, writes };
}

describe('forward: tunnel → local client', () => {
  it('the records of one frame (pushed in one turn) leave in one writev, and arrive whole and in order', async () => {
    const remote = fakeTunnel();
    const { client, writes } = await forwarded(remote);
    const records = [0, 1, 2, 3].map((i) => Buffer.alloc(RECORD, i));
    let got = Buffer.alloc(0);
    client.on('data', (c: Buffer) => (got = Buffer.concat([got, c])));
    for (const r of records) remote.push(r);
    await new Promise<void>((resolve) => {
      const check = (): void => void (got.length >= 4 * RECORD ? resolve() : setTimeout(check, 5));
      check();
    });
    expect(got.equals(Buffer.concat(records))).toBe(true);
    expect(writes).toEqual([4]);
  });

  it("a client that stops reading pauses the tunnel; the queue stays within a turn's bytes of the socket's mark", async () => {
    const remote = fakeTunnel();
    const { local, client } = await forwarded(remote);
    client.pause();
    const record = Buffer.alloc(RECORD, 7);
    let pushed = 0;
    // A frame (4 records) per turn until the tunnel is paused and its own buffer is full (push() says false).
    for (let turn = 0; turn < 2000; turn++) {
      let accepted = true;
      for (let i = 0; i < 4; i++) accepted = remote.push(record);
      pushed += 4 * RECORD;
      await new Promise((r) => setImmediate(r));
      if (!accepted) break;
    }
    expect(remote.isPaused()).toBe(true);
    expect(pushed).toBeLessThan(2000 * 4 * RECORD); // it did stop
    expect(local.writableLength).toBeLessThanOrEqual(local.writableHighWaterMark + 4 * RECORD);
    // Reading again drains everything through.
    let got = 0;
    client.on('data', (c: Buffer) => (got += c.length));
    client.resume();
    await new Promise<void>((resolve) => {
      const check = (): void => void (got >= pushed ? resolve() : setTimeout(check, 5));
      check();
    });
    expect(got).toBe(pushed);
  });

  it("the tunnel's end becomes the client's FIN after the bytes", async () => {
    const remote = fakeTunnel();
    const { client } = await forwarded(remote);
    const chunks: Buffer[] = [];
    client.on('data', (c: Buffer) => chunks.push(c));
    remote.push(Buffer.from('last words'));
    remote.push(null);
    await once(client, 'end');
    expect(Buffer.concat(chunks).toString()).toBe('last words');
  });
});
