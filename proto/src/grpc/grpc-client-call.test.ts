// GrpcClientCall's states, event by event, over a fake HTTP/2 stream: the test plays the server's
// headers, messages, trailers, END_STREAM, resets and the stream's close, and reads what the call
// emitted and did to the stream. (grpc-client.test.ts runs the same call against a real server.)
import { EventEmitter } from 'node:events';
import http2 from 'node:http2';
import { describe, expect, it } from 'vitest';
import { GrpcClientCall } from './grpc-client-call.js';
import { GrpcStatus, writeGrpcMessage, type GrpcCallStatus } from './grpc-framing.js';
import { packets, type Packet } from '../wire/packet.js';

const { NGHTTP2_CANCEL } = http2.constants;

class FakeStream extends EventEmitter {
  destroyed = false;
  writableEnded = false;
  readableEnded = false;
  writableNeedDrain = false;
  rstCode: number | undefined = undefined;
  /** What the call did to the stream. */
  readonly did: string[] = [];
  cork(): void {}
  uncork(): void {}
  write(_chunk: Buffer, cb?: () => void): boolean {
    if (cb) this.did.push('write');
    return true;
  }
  end(): void {
    this.writableEnded = true;
    this.did.push('end');
  }
  /** RST_STREAM; as Node's does, it also ends our side. */
  close(code: number): void {
    this.rstCode = code;
    this.writableEnded = true;
    this.did.push(`close:${code}`);
  }
  pause(): void {
    this.did.push('pause');
  }
  resume(): void {
    this.did.push('resume');
  }
  // The server's side.
  respond(headers: Record<string, string | number> = { ':status': 200, 'content-type': 'application/grpc' }): void {
    this.emit('response', headers);
  }
  /** Messages, all in one DATA frame. */
  send(...ps: Packet[]): void {
    const parts: Buffer[] = [];
    const sink = { cork: () => {}, uncork: () => {}, write: (b: Buffer) => parts.push(b) > 0 };
    for (const p of ps) writeGrpcMessage(sink as never, p);
    this.emit('data', Buffer.concat(parts));
  }
  /** Trailers and END_STREAM. */
  finish(status = '0'): void {
    this.emit('trailers', { 'grpc-status': status });
    this.readableEnded = true;
    this.emit('end');
  }
  /** The stream is gone (after END_STREAM both ways, a reset, or the connection's end). */
  gone(): void {
    this.destroyed = true;
    this.emit('close');
  }
}

function setup() {
  const stream = new FakeStream();
  const session = { destroyed: false, request: () => stream } as unknown as http2.ClientHttp2Session;
  const call = new GrpcClientCall(session, '/ProxyService/Proxy', {}, 1 << 16);
  /** What the call emitted (data as the connectIDs of its DATA packets). */
  const heard: string[] = [];
  const statuses: GrpcCallStatus[] = [];
  for (const e of ['metadata', 'end', 'error', 'close']) call.on(e, () => heard.push(e));
  call.on('data', (p: Packet) => heard.push(`data:${'data' in p ? p.data.connectID : '?'}`));
  call.on('status', (s: GrpcCallStatus) => (statuses.push(s), heard.push(`status:${s.code}`)));
  const took = (): string[] => heard.splice(0);
  return { call, stream, session, took, statuses };
}

const d = (id: number): Packet => packets.data(id, Buffer.from('x'));

describe('GrpcClientCall: the whole call', () => {
  it('open → streaming → ending → finished → closed, as the server answers, ends and its stream closes', () => {
    const { call, stream, took } = setup();
    expect(call.state).toBe('open');
    stream.respond();
    expect(call.state).toBe('streaming');
    stream.send(d(1), d(2));
    expect(took()).toEqual(['metadata', 'data:1', 'data:2']);
    call.write(d(3), () => {});
    call.end();
    expect(stream.did).toEqual(['write', 'end']);
    stream.finish();
    expect(call.state).toBe('finished');
    expect(took()).toEqual(['end', 'status:0']);
    stream.gone();
    expect(call.state).toBe('closed');
    expect(took()).toEqual(['close']);
    // Late: nothing more.
    stream.emit('data', Buffer.alloc(8));
    stream.emit('end');
    stream.emit('close');
    call.cancel();
    expect(took()).toEqual([]);
  });

  it("packets right behind the headers wait for the first 'data' listener, attached ticks later (a dial sent to a newly connected agent)", async () => {
    const stream = new FakeStream();
    const session = { destroyed: false, request: () => stream } as unknown as http2.ClientHttp2Session;
    const call = new GrpcClientCall(session, '/AgentService/Connect', {}, 1 << 16);
    const metadata = new Promise((r) => call.once('metadata', r));
    stream.respond();
    stream.send(d(1));
    await metadata;
    expect(stream.did).toEqual(['pause']);
    const got: Packet[] = [];
    call.on('data', (p: Packet) => got.push(p));
    await Promise.resolve();
    expect(got).toEqual([d(1)]);
    expect(stream.did).toEqual(['pause', 'resume']);
  });

  it('a paused reader: the packets and the status wait (ending, then closing when the stream goes), all in order on resume', () => {
    const { call, stream, took } = setup();
    stream.respond();
    took();
    call.pause();
    stream.send(d(1), d(2));
    stream.finish();
    expect(call.state).toBe('ending');
    stream.gone();
    expect(call.state).toBe('closing');
    expect(took()).toEqual([]);
    call.resume();
    expect(call.state).toBe('closed');
    expect(took()).toEqual(['data:1', 'data:2', 'end', 'status:0', 'close']);
  });

  it('a reader that pauses on a packet gets the rest on resume; the stream resumes only then', () => {
    const { call, stream, took } = setup();
    stream.respond();
    call.once('data', () => call.pause());
    stream.send(d(1), d(2));
    expect(took()).toEqual(['metadata', 'data:1']);
    call.once('data', () => call.pause());
    call.resume();
    expect(took()).toEqual(['data:2']);
    expect(stream.did).toEqual(['pause', 'pause']); // paused again during the resume: the stream stays paused
    call.resume();
    expect(stream.did.at(-1)).toBe('resume');
  });
});

describe('GrpcClientCall: DATA as views (onDataViews)', () => {
  it('DATA goes to the handler as the chunks it arrived in, in order with other packets, also across a pause; null: packets again', () => {
    const { call, stream, took } = setup();
    /** Everything the reader got, in order: packets from 'data' (as setup records them), views from the handler. */
    const order: string[] = [];
    call.onDataViews((connectID, chunks, length) => {
      order.push(...took(), `views:${connectID}:${Buffer.concat(chunks).toString()}:${length}`);
    });
    stream.respond();
    took();
    call.pause();
    const parts: Buffer[] = [];
    const sink = { cork: () => {}, uncork: () => {}, write: (b: Buffer) => parts.push(b) > 0 };
    writeGrpcMessage(sink as never, packets.closeRequest(7));
    writeGrpcMessage(sink as never, packets.data(7, Buffer.from('hello world')));
    const bytes = Buffer.concat(parts);
    for (let i = 0; i < bytes.length; i += 7) stream.emit('data', bytes.subarray(i, i + 7)); // cut anywhere
    expect(order).toEqual([]);
    call.resume();
    expect(order).toEqual(['data:?', 'views:7:hello world:11']); // CLOSE_REQ (not DATA: setup hears no connectID), then the DATA
    call.onDataViews(null);
    stream.send(d(3));
    expect(took()).toEqual(['data:3']);
  });
});

describe('GrpcClientCall: refusals and errors', () => {
  it('trailers-only: no transition at the headers; END_STREAM delivers the status', () => {
    const { call, stream, took, statuses } = setup();
    stream.respond({ ':status': 200, 'content-type': 'application/grpc', 'grpc-status': '7', 'grpc-message': 'refused' });
    expect(call.state).toBe('open');
    stream.readableEnded = true;
    stream.emit('end');
    expect(call.state).toBe('finished');
    expect(took()).toEqual(['error', 'status:7']);
    expect(statuses[0]!.details).toBe('refused');
  });

  it('an HTTP error: ending (the stream is reset); its close delivers the status', () => {
    const { call, stream, took } = setup();
    stream.respond({ ':status': 503, 'content-type': 'text/plain' });
    expect(call.state).toBe('ending');
    expect(stream.did).toEqual([`close:${NGHTTP2_CANCEL}`]);
    stream.emit('data', Buffer.from('upstream down')); // the body: not ours to read
    stream.gone();
    expect(call.state).toBe('closed');
    expect(took()).toEqual(['error', `status:${GrpcStatus.UNAVAILABLE}`, 'close']);
  });

  it('a message over the limit: ending, reset; the packets before it still come first', () => {
    const { call, stream, took, statuses } = setup();
    stream.respond();
    call.pause();
    stream.send(d(1));
    const head = Buffer.alloc(5);
    head.writeUInt32BE((1 << 16) + 1, 1);
    stream.emit('data', head);
    expect(call.state).toBe('ending');
    expect(call.write(d(2))).toBe(false); // the status is known: no more writes
    stream.gone();
    call.resume();
    expect(took()).toEqual(['metadata', 'data:1', 'error', `status:${GrpcStatus.RESOURCE_EXHAUSTED}`, 'close']);
    expect(statuses[0]!.details).toMatch(/larger than max/);
  });

  it("the stream gone while streaming: UNAVAILABLE with the connection's error; a reset by the server: from its code", () => {
    const first = setup();
    first.stream.respond();
    first.stream.emit('error', Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' }));
    first.stream.gone();
    expect(first.call.state).toBe('closed');
    expect(first.statuses[0]).toMatchObject({ code: GrpcStatus.UNAVAILABLE, details: 'socket hang up' });
    const second = setup();
    second.stream.respond();
    second.stream.rstCode = http2.constants.NGHTTP2_REFUSED_STREAM;
    second.stream.emit('error', Object.assign(new Error('reset'), { code: 'ERR_HTTP2_STREAM_ERROR' }));
    second.stream.gone();
    expect(second.statuses[0]).toMatchObject({ code: GrpcStatus.UNAVAILABLE, details: 'Received RST_STREAM with code 7' });
  });

  it('the server ends without a status: UNKNOWN when the stream closes', () => {
    const { call, stream, statuses } = setup();
    stream.respond();
    stream.readableEnded = true;
    stream.emit('end');
    expect(call.state).toBe('streaming');
    stream.gone();
    expect(statuses[0]).toMatchObject({ code: GrpcStatus.UNKNOWN });
  });
});

describe('GrpcClientCall: cancel', () => {
  it('while streaming: RST_STREAM CANCEL, CANCELLED at once (finished); closed when the stream goes; cancel again does nothing', () => {
    const { call, stream, took } = setup();
    stream.respond();
    took();
    call.cancel();
    expect(call.state).toBe('finished');
    expect(stream.did).toEqual([`close:${NGHTTP2_CANCEL}`]);
    expect(took()).toEqual(['error', `status:${GrpcStatus.CANCELLED}`]);
    stream.send(d(1)); // in flight: dropped
    call.cancel();
    stream.gone();
    expect(call.state).toBe('closed');
    expect(took()).toEqual(['close']);
    expect(stream.did).toEqual([`close:${NGHTTP2_CANCEL}`]);
  });

  it('after the status: our side is ended (END_STREAM), not reset', () => {
    const { call, stream } = setup();
    stream.respond();
    stream.finish();
    call.cancel();
    call.cancel();
    expect(stream.did).toEqual(['end']);
    expect(call.state).toBe('finished');
  });

  it('while the status waits for a paused reader (ending, closing): the status goes out at once, without the packets', () => {
    const { call, stream, took } = setup();
    stream.respond();
    call.pause();
    stream.send(d(1));
    stream.finish();
    took();
    call.cancel();
    expect(call.state).toBe('finished');
    expect(took()).toEqual(['end', 'status:0']);
    const second = setup();
    second.stream.respond();
    second.call.pause();
    second.stream.send(d(1));
    second.stream.emit('error', Object.assign(new Error('socket hang up'), { code: 'ECONNRESET' }));
    second.stream.gone();
    expect(second.call.state).toBe('closing');
    second.took();
    second.call.cancel();
    expect(second.call.state).toBe('closed');
    expect(second.took()).toEqual(['error', `status:${GrpcStatus.UNAVAILABLE}`, 'close']);
  });
});

describe('GrpcClientCall: without a stream', () => {
  it('a call that failed to start: failing, then on the next tick the status and closed', async () => {
    const call = GrpcClientCall.failed(GrpcStatus.UNAVAILABLE, 'client closed');
    const heard: string[] = [];
    for (const e of ['error', 'status', 'close']) call.on(e, () => heard.push(e));
    expect(call.state).toBe('failing');
    expect(call.write(d(1))).toBe(false);
    call.end();
    await new Promise((r) => process.nextTick(r));
    expect(call.state).toBe('closed');
    expect(heard).toEqual(['error', 'status', 'close']);
  });

  it('cancelled before that tick: CANCELLED at once, closed on the tick', async () => {
    const call = GrpcClientCall.failed(GrpcStatus.UNAVAILABLE, 'client closed');
    const heard: string[] = [];
    call.on('status', (s: GrpcCallStatus) => heard.push(`status:${s.code}`));
    call.on('close', () => heard.push('close'));
    call.cancel();
    expect(call.state).toBe('finished');
    await new Promise((r) => process.nextTick(r));
    expect(call.state).toBe('closed');
    expect(heard).toEqual([`status:${GrpcStatus.CANCELLED}`, 'close']);
  });
});
