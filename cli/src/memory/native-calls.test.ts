import net from 'node:net';
import {
  DEFAULT_UNSENT_LIMIT,
  canTrimAllocator,
  limitUnsentBytes,
  trimAllocator,
  unsentBytesOf,
  unsentLimitOf,
  useNativeCalls,
} from '@cluster-proxy/proto';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { loadNativeCalls } from './native-calls.js';

const linux = process.platform === 'linux';
const open: Array<net.Socket | net.Server> = [];

beforeAll(() => useNativeCalls(loadNativeCalls()));
afterAll(() => useNativeCalls(null));

afterEach(async () => {
  const all = open.splice(0);
  for (const s of all) if (s instanceof net.Socket) s.destroy();
  for (const s of all) if (s instanceof net.Server) await new Promise((r) => s.close(r));
});

async function connectedPair(): Promise<{ client: net.Socket; server: net.Socket }> {
  let accepted!: (s: net.Socket) => void;
  const serverSide = new Promise<net.Socket>((r) => (accepted = r));
  const srv = net.createServer((s) => {
    open.push(s);
    accepted(s);
  });
  open.push(srv);
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const client = net.connect((srv.address() as net.AddressInfo).port, '127.0.0.1');
  open.push(client);
  await new Promise((r) => client.once('connect', r));
  return { client, server: await serverSide };
}

describe.runIf(linux)('limitUnsentBytes (Linux)', () => {
  it('sets TCP_NOTSENT_LOWAT on a connected TCP socket, as the kernel reads it back', async () => {
    const { client, server } = await connectedPair();
    expect(unsentLimitOf(client)).toBe(0); // the kernel default: no limit of its own
    expect(limitUnsentBytes(client)).toBe(true);
    expect(unsentLimitOf(client)).toBe(DEFAULT_UNSENT_LIMIT);
    expect(limitUnsentBytes(server, 64 * 1024)).toBe(true);
    expect(unsentLimitOf(server)).toBe(64 * 1024);
  });

  it('keeps what the kernel takes from a writer bounded when the reader stops', async () => {
    const { client, server } = await connectedPair();
    server.pause();
    limitUnsentBytes(client);
    const chunk = Buffer.alloc(64 * 1024);
    // Write until Node queues in user space: everything before that went into the kernel.
    let toKernel = 0;
    for (let i = 0; i < 1024 && client.writableLength === 0; i++) {
      client.write(chunk);
      await new Promise((r) => setImmediate(r));
      toKernel = client.bytesWritten - client.writableLength;
    }
    // The receiver's buffer (Linux starts it at 128 KiB) plus our limit, with a segment's slack; without the
    // limit the sender's queue grows to tcp_wmem's maximum (4 MiB by default).
    expect(toKernel).toBeLessThan(1024 * 1024);
  });

  it('reads what the kernel has not sent: nothing while the reader reads, bytes once it stops', async () => {
    const { client, server } = await connectedPair();
    expect(unsentBytesOf(client)).toBe(0);
    server.pause();
    const chunk = Buffer.alloc(64 * 1024);
    for (let i = 0; i < 256 && (unsentBytesOf(client) ?? 0) === 0; i++) {
      client.write(chunk);
      await new Promise((r) => setImmediate(r));
    }
    const stuck = unsentBytesOf(client)!;
    expect(stuck).toBeGreaterThan(0);
    expect(stuck).toBeLessThanOrEqual(client.bytesWritten - client.writableLength);
    server.resume();
    for (let i = 0; i < 500 && unsentBytesOf(client) !== 0; i++) await new Promise((r) => setTimeout(r, 5));
    expect(unsentBytesOf(client)).toBe(0);
  });

  it('says false, and changes nothing, for what is not a connected TCP socket', async () => {
    const unconnected = new net.Socket();
    expect(limitUnsentBytes(unconnected)).toBe(false);
    expect(unsentLimitOf(unconnected)).toBeNull();
    expect(unsentBytesOf(unconnected)).toBeNull();
  });
});

describe('without the system calls installed (the SDK, or a platform koffi does not cover)', () => {
  it('changes nothing and says so', async () => {
    const { client } = await connectedPair();
    useNativeCalls(null);
    try {
      expect(limitUnsentBytes(client)).toBe(false);
      expect(unsentLimitOf(client)).toBeNull();
      expect(unsentBytesOf(client)).toBeNull();
      expect(canTrimAllocator()).toBe(false);
      expect(trimAllocator()).toBe(false);
    } finally {
      useNativeCalls(loadNativeCalls());
    }
  });
});

describe('trimAllocator', () => {
  it('runs where glibc is, and says so', () => {
    expect(trimAllocator()).toBe(canTrimAllocator());
    if (linux && process.report?.getReport) {
      const glibc = (process.report.getReport() as { header?: { glibcVersionRuntime?: string } }).header?.glibcVersionRuntime;
      if (glibc) expect(canTrimAllocator()).toBe(true);
    }
  });
});
