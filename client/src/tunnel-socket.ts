// A tunneled TCP connection, shaped like net.Socket: a Duplex with connect/timeout/half-close
// semantics, so HTTP clients and TLS can run over it. One gRPC Proxy stream carries it.
//   connecting → open → (ended either way) → closed
import { Duplex } from 'node:stream';
import * as grpc from '@grpc/grpc-js';
import { CAP_HALF_CLOSE, MAX_DATA_CHUNK, MD_CAPABILITIES, PROXY_PATH, PacketType, chunks, classifyDialError, decodePacket, encodePacket, packets, parseCapabilities, type Packet } from '@cluster-proxy/proto';
import { TunnelError } from './errors.js';
import { randomBytes } from 'node:crypto';

export interface ConnectOptions {
  /** Abort a pending dial (reason `context`) or an open connection. */
  signal?: AbortSignal;
  /** Client-side dial deadline (reason `timeout`); the hub also enforces its own. Default 30 s. */
  timeoutMs?: number;
  /** As for net.Socket: when false (default), our side ends once the destination's side ended. */
  allowHalfOpen?: boolean;
}

type SocketState = 'connecting' | 'open' | 'closed';

/** After we close, how long we wait for the hub's CLOSE_RSP before cancelling the stream. */
const CLOSE_ACK_MS = 5000;

function randomDialID(): bigint {
  // Positive int63, like Go's rand.Int63.
  return randomBytes(8).readBigUInt64BE() >> 1n;
}

export class TunnelSocket extends Duplex {
  readonly destination: string;
  connecting = true;
  private state: SocketState = 'connecting';
  private connectID = 0;
  private readonly random = randomDialID();
  /** null when the socket was created on a closed tunnel: it only reports that error. */
  private readonly call: grpc.ClientDuplexStream<Packet, Packet> | null;
  private halfClose = false;
  private readEnded = false;
  private dialTimer: NodeJS.Timeout | null = null;
  private idleTimer: NodeJS.Timeout | null = null;
  private idleMs = 0;
  private closeTimer: NodeJS.Timeout | null = null;
  private pendingWrite: { chunk: Buffer; callback: (err?: Error | null) => void } | null = null;
  private pendingFinal: ((err?: Error | null) => void) | null = null;
  private readonly signal: AbortSignal | undefined;
  bytesRead = 0;
  bytesWritten = 0;

  constructor(client: grpc.Client | TunnelError, destination: string, opts: ConnectOptions = {}, onSettled?: (s: TunnelSocket) => void) {
    super({ allowHalfOpen: opts.allowHalfOpen ?? false, readableHighWaterMark: 256 * 1024, writableHighWaterMark: 256 * 1024 });
    this.destination = destination;
    this.signal = opts.signal;
    this.once('close', () => onSettled?.(this));
    if (client instanceof TunnelError) {
      // Like net.connect, never throw: report the error asynchronously.
      this.call = null;
      this.state = 'closed';
      process.nextTick(() => this.destroy(client));
      return;
    }
    const md = new grpc.Metadata();
    md.set(MD_CAPABILITIES, CAP_HALF_CLOSE);
    const call = client.makeBidiStreamRequest(PROXY_PATH, encodePacket, decodePacket, md);
    this.call = call;
    call.on('metadata', (m: grpc.Metadata) => {
      this.halfClose = parseCapabilities(m.get(MD_CAPABILITIES).map(String).join(',')).has(CAP_HALF_CLOSE);
    });
    call.on('data', this.onPacket);
    call.on('error', (err: grpc.ServiceError) => {
      if (this.state === 'closed') return;
      const reason = err.code === grpc.status.CANCELLED ? 'context' : 'tunnelclosed';
      this.fail(new TunnelError(reason, destination, `tunnel to ${destination} failed: ${grpc.status[err.code] ?? err.code}: ${err.details}`));
    });
    call.on('end', () => {
      if (this.state !== 'closed') this.fail(new TunnelError('tunnelclosed', destination, `hub ended the stream for ${destination} unexpectedly`));
    });
    call.on('status', () => this.releaseCall());
    const timeoutMs = opts.timeoutMs ?? 30_000;
    this.dialTimer = setTimeout(() => this.abandonDial(new TunnelError('timeout', destination, `dial ${destination} timed out after ${timeoutMs} ms`)), timeoutMs);
    if (this.signal?.aborted) queueMicrotask(this.onAbort);
    else this.signal?.addEventListener('abort', this.onAbort, { once: true });
    call.write(packets.dialRequest(destination, this.random));
  }

  /** The stream, in the states that have one (connecting, open): only a socket created on a closed
   * tunnel has none, and it starts out closed. */
  private get live(): grpc.ClientDuplexStream<Packet, Packet> {
    if (!this.call) throw new Error('internal: tunnel socket without a stream');
    return this.call;
  }

  // ------------------------------------------------------------ net.Socket look-alike

  get pending(): boolean {
    return this.state === 'connecting';
  }

  get remoteAddress(): string {
    return this.destination;
  }

  setTimeout(ms: number, callback?: () => void): this {
    this.idleMs = ms;
    if (callback) this.once('timeout', callback);
    this.touch();
    return this;
  }

  setNoDelay(_noDelay?: boolean): this {
    return this; // every write is sent at once
  }

  setKeepAlive(_enable?: boolean, _delay?: number): this {
    return this; // the hub keeps its streams alive
  }

  ref(): this {
    return this;
  }

  unref(): this {
    return this;
  }

  address(): Record<string, never> {
    return {};
  }

  // ------------------------------------------------------------ packets from the hub

  private readonly onPacket = (p: Packet): void => {
    switch (p.type) {
      case PacketType.DIAL_RSP: {
        if (this.state !== 'connecting' || p.dialResponse.random !== this.random) return;
        this.clearDialTimer();
        const r = p.dialResponse;
        if (r.error !== '' || r.connectID === 0) {
          const reason = classifyDialError(r.reason, r.error);
          this.fail(new TunnelError(reason, this.destination, `dial ${this.destination} failed (${reason}): ${r.error || 'no connection ID'}`));
          return;
        }
        this.connectID = r.connectID;
        this.state = 'open';
        this.connecting = false;
        this.touch();
        this.emit('connect');
        this.emit('ready');
        this.flushPending();
        return;
      }
      case PacketType.DATA:
        if (this.state !== 'open') return;
        this.bytesRead += p.data.data.length;
        this.touch();
        if (this.readEnded) return;
        if (!this.push(p.data.data)) this.call?.pause();
        return;
      case PacketType.HALF_CLOSE:
        if (this.state === 'open') this.endReadable();
        return;
      case PacketType.CLOSE_RSP:
        if (this.state === 'closed') {
          this.endCall(); // the acknowledgement of our CLOSE_REQ
          return;
        }
        if (p.closeResponse.error) {
          this.fail(new TunnelError('tunnelclosed', this.destination, `connection to ${this.destination} closed by the hub: ${p.closeResponse.error}`));
          return;
        }
        // The destination closed the connection: deliver what was read, refuse further writes.
        this.state = 'closed';
        this.cleanupTimers();
        this.endCall();
        this.endReadable();
        if (this.pendingWrite) this.pendingWrite.callback(new TunnelError('closed', this.destination, `connection to ${this.destination} was closed by the destination`));
        this.pendingWrite = null;
        if (!this.writableEnded) this.end();
        return;
      default:
        return;
    }
  };

  // ------------------------------------------------------------ Duplex plumbing

  override _read(): void {
    this.call?.resume();
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, callback: (err?: Error | null) => void): void {
    if (this.state === 'connecting') {
      this.pendingWrite = { chunk, callback };
      return;
    }
    if (this.state !== 'open') {
      callback(new TunnelError('closed', this.destination, `connection to ${this.destination} is closed`));
      return;
    }
    this.sendData(chunk, callback);
  }

  private sendData(chunk: Buffer, callback: (err?: Error | null) => void): void {
    let ok = true;
    for (const piece of chunks(chunk, MAX_DATA_CHUNK)) ok = this.live.write(packets.data(this.connectID, piece));
    this.bytesWritten += chunk.length;
    this.touch();
    if (ok) callback();
    else this.live.once('drain', () => callback());
  }

  override _final(callback: (err?: Error | null) => void): void {
    if (this.state === 'connecting') {
      this.pendingFinal = callback;
      return;
    }
    this.sendEnd();
    callback();
  }

  private sendEnd(): void {
    if (this.state !== 'open') return;
    // Half-close needs our hub; towards an ANP hub, ending our side closes the connection.
    if (this.halfClose) this.live.write(packets.halfClose(this.connectID));
    else this.closeConnection();
  }

  private flushPending(): void {
    const w = this.pendingWrite;
    this.pendingWrite = null;
    if (w) this.sendData(w.chunk, w.callback);
    const f = this.pendingFinal;
    this.pendingFinal = null;
    if (f) {
      this.sendEnd();
      f();
    }
  }

  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    this.cleanupTimers();
    this.signal?.removeEventListener('abort', this.onAbort);
    if (this.state === 'connecting') {
      this.live.write(packets.closeDial(this.random));
      this.endCall();
    } else if (this.state === 'open') {
      this.closeConnection();
    }
    this.state = 'closed';
    if (this.pendingWrite) this.pendingWrite.callback(err ?? new TunnelError('closed', this.destination, `connection to ${this.destination} destroyed`));
    this.pendingWrite = null;
    callback(err);
  }

  // ------------------------------------------------------------ teardown

  private readonly onAbort = (): void => {
    if (this.state === 'connecting') this.abandonDial(new TunnelError('context', this.destination, `dial ${this.destination} cancelled`));
    else this.destroy(new TunnelError('context', this.destination, `connection to ${this.destination} cancelled`));
  };

  private abandonDial(err: TunnelError): void {
    if (this.state !== 'connecting') return;
    this.destroy(err);
  }

  /** Full close: CLOSE_REQ, then wait (bounded) for the hub's CLOSE_RSP before ending the stream. */
  private closeConnection(): void {
    if (this.state !== 'open') return;
    this.state = 'closed';
    if (this.live.writableNeedDrain) {
      // Our unsent data would hold a CLOSE_REQ back (the hub paused this stream for lack of credit):
      // cancel the stream instead; the hub treats that as a close, like a TCP reset.
      this.releaseCall();
      return;
    }
    this.live.write(packets.closeRequest(this.connectID));
    this.live.resume();
    this.closeTimer = setTimeout(() => this.releaseCall(), CLOSE_ACK_MS);
  }

  private fail(err: TunnelError): void {
    this.clearDialTimer();
    this.state = 'closed';
    this.endCall();
    this.destroy(err);
  }

  private endReadable(): void {
    if (this.readEnded) return;
    this.readEnded = true;
    this.push(null);
  }

  private endCall(): void {
    if (!this.call) return;
    if (!this.call.writableEnded) this.call.end();
    this.call.resume();
  }

  /** The stream is finished (status received) or abandoned: drop it for good. */
  private releaseCall(): void {
    if (this.closeTimer) clearTimeout(this.closeTimer);
    this.closeTimer = null;
    if (!this.call) return;
    this.call.removeListener('data', this.onPacket);
    this.call.on('error', () => {});
    this.call.cancel();
  }

  private touch(): void {
    if (this.idleMs <= 0) {
      if (this.idleTimer) clearTimeout(this.idleTimer);
      this.idleTimer = null;
      return;
    }
    if (this.idleTimer) this.idleTimer.refresh();
    else this.idleTimer = setTimeout(() => {
      this.idleTimer = null;
      this.emit('timeout');
    }, this.idleMs);
  }

  private clearDialTimer(): void {
    if (this.dialTimer) clearTimeout(this.dialTimer);
    this.dialTimer = null;
  }

  private cleanupTimers(): void {
    this.clearDialTimer();
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = null;
  }
}
