import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import { PassThrough, Readable, Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { endToEndHeaders } from './http-headers.js';
import { hasNoBody, relay, relayResponse } from './http-relay.js';
import { http } from './node-http.js';
import type * as HttpTypes from 'node:http';

function collector(highWaterMark = 16): { sink: Writable; chunks: Buffer[]; release: () => void } {
  const chunks: Buffer[] = [];
  let held: (() => void) | null = null;
  let holding = true;
  const sink = new Writable({
    highWaterMark,
    write(chunk: Buffer, _enc, cb) {
      chunks.push(chunk);
      if (holding) held = cb;
      else cb();
    },
  });
  return {
    sink,
    chunks,
    release: () => {
      holding = false;
      held?.();
    },
  };
}

describe('relay', () => {
  it('moves every byte, ends the destination, and reports success once', async () => {
    const from = Readable.from([Buffer.from('a'), Buffer.from('bc'), Buffer.from('def')]);
    const { sink, chunks, release } = collector();
    release();
    const done: (Error | null)[] = [];
    relay(from, sink, (err) => done.push(err));
    await once(sink, 'finish');
    await new Promise((r) => setImmediate(r));
    expect(Buffer.concat(chunks).toString()).toBe('abcdef');
    expect(done).toEqual([null]);
  });

  it('stops reading while the destination is full, and reads on after its drain', async () => {
    const from = new PassThrough({ highWaterMark: 8 });
    const { sink, chunks, release } = collector(4);
    relay(from, sink, () => {});
    from.write(Buffer.alloc(64, 1));
    await new Promise((r) => setImmediate(r));
    // The destination holds its first write: the source is paused, and more bytes stay queued in it.
    expect(from.isPaused()).toBe(true);
    from.write(Buffer.alloc(64, 2));
    await new Promise((r) => setImmediate(r));
    expect(chunks.length).toBe(1);
    release();
    from.end();
    await once(sink, 'finish');
    expect(Buffer.concat(chunks).length).toBe(128);
  });

  it('a source that closes before its end destroys the destination and reports the failure', async () => {
    const from = new PassThrough();
    const { sink, release } = collector();
    release();
    const done = new Promise<Error | null>((resolve) => relay(from, sink, resolve));
    from.write('partial');
    from.destroy();
    const err = await done;
    expect(err?.message).toMatch(/premature close/i);
    expect(sink.destroyed).toBe(true);
  });

  it('a destination that closes early destroys the source', async () => {
    const from = new PassThrough();
    const { sink, release } = collector();
    release();
    const done = new Promise<Error | null>((resolve) => relay(from, sink, resolve));
    sink.destroy();
    expect(await done).toBeInstanceOf(Error);
    expect(from.destroyed).toBe(true);
  });
});

describe('relayResponse', () => {
  // A real server and client: what the gateway's proxies relay.
  async function withServer(handler: HttpTypes.RequestListener, test: (port: number) => Promise<void>): Promise<void> {
    const server = http.createServer(handler);
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    try {
      await test((server.address() as AddressInfo).port);
    } finally {
      server.closeAllConnections();
      server.close();
    }
  }

  function get(port: number): Promise<HttpTypes.IncomingMessage> {
    return new Promise((resolve, reject) => http.get({ port, host: '127.0.0.1', agent: false }, resolve).once('error', reject));
  }

  it('sends the head at once when no body byte follows (a watch), and the body when it comes', async () => {
    let sendBody: () => void = () => {};
    const upstream = new PassThrough();
    await withServer(
      (_req, res) => {
        res.writeHead(200, { 'content-type': 'text/plain' });
        relayResponse(upstream, res, () => {});
        sendBody = () => upstream.end('event\n');
      },
      async (port) => {
        const res = await get(port);
        expect(res.statusCode).toBe(200);
        sendBody();
        let body = '';
        for await (const chunk of res) body += String(chunk);
        expect(body).toBe('event\n');
      },
    );
  });

  it('a source cut mid-body leaves the caller a broken response, not a clean end', async () => {
    const upstream = new PassThrough();
    await withServer(
      (_req, res) => {
        res.writeHead(200, { 'content-length': '100' });
        relayResponse(upstream, res, () => {});
        upstream.write('x'.repeat(10));
        setImmediate(() => upstream.destroy());
      },
      async (port) => {
        const res = await get(port);
        const failed = await new Promise<boolean>((resolve) => {
          res.resume();
          res.once('end', () => resolve(false));
          res.once('error', () => resolve(true));
          res.once('aborted', () => resolve(true));
        });
        expect(failed).toBe(true);
      },
    );
  });
});

describe('hasNoBody', () => {
  it('is true only without Transfer-Encoding and with no Content-Length above 0', () => {
    const req = (headers: Record<string, string>): HttpTypes.IncomingMessage => ({ headers }) as unknown as HttpTypes.IncomingMessage;
    expect(hasNoBody(req({}))).toBe(true);
    expect(hasNoBody(req({ 'content-length': '0' }))).toBe(true);
    expect(hasNoBody(req({ 'content-length': '5' }))).toBe(false);
    expect(hasNoBody(req({ 'transfer-encoding': 'chunked' }))).toBe(false);
  });
});

describe('endToEndHeaders', () => {
  it('drops hop-by-hop headers and those Connection names, keeps the rest', () => {
    const out = endToEndHeaders({
      connection: ['keep-alive, X-Secret'],
      'x-secret': ['1'],
      'keep-alive': ['timeout=5'],
      'transfer-encoding': ['chunked'],
      'content-type': ['a'],
      accept: ['b', 'c'],
    });
    expect(out).toEqual({ 'content-type': ['a'], accept: ['b', 'c'] });
    expect(endToEndHeaders({ accept: ['x'], authorization: ['y'] }, (n) => n === 'authorization')).toEqual({ accept: ['x'] });
  });
});
