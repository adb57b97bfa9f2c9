// One gateway request's connection through an agent's tunnel, as a Duplex that node:http's client
// can use as its socket, and as the Frontend the proxy core drives (dataplane/frontend.ts).
//
//   dialing ──dialSucceeded──► open ──remoteEnded / closed──► ended ──► destroyed
//      └──dialFailed──► failed (the request's createConnection callback gets a GatewayDialError)
//
// Backpressure both ways: bytes from the agent are push()ed; when the reader (the HTTP parser, paused
// while the caller's response is not drained) stops taking them, the sink's callback waits for
// _read(), and the agent gets no credit until then. Bytes to the agent wait in _write until the core
// resumes us (credit towards the agent), so the caller's request body is not read faster than the
// destination takes it.
import type { KeyObject } from 'node:crypto';
import { Duplex } from 'node:stream';
import type { ByteSink, DialFailureReason } from '@cluster-proxy/proto';
import type { Frontend } from '../dataplane/frontend.js';
import type { ProxiedConnection } from '../dataplane/proxied-connection.js';
import type { ProxyCore } from '../dataplane/proxy-core.js';

export type TunnelSocketState = 'dialing' | 'open' | 'ended' | 'failed' | 'destroyed';

/** A dial through the core that failed, with the core's reason (for the gateway's status). */
export class GatewayDialError extends Error {
  override name = 'GatewayDialError';
  constructor(
    readonly reason: DialFailureReason,
    message: string,
  ) {
    super(message);
  }
}

export class TunnelSocket extends Duplex {
  /** What the core drives; a separate object because Frontend.pause/resume (credit towards the agent)
   * are not the Duplex's pause/resume (node:http pauses the socket for its own backpressure). */
  private readonly leg: Frontend;
  state: TunnelSocketState = 'dialing';
  private conn: ProxiedConnection | null = null;
  /** Sink callbacks held until the reader wants more (their bytes count against the agent's window). */
  private unread: ((err?: Error | null) => void)[] = [];
  private corePaused = false;
  private writeDone: (() => void) | null = null;
  private settled = false;

  constructor(
    core: ProxyCore,
    cluster: string,
    /** For the per-client connection limit: who the gateway's caller is. */
    readonly client: string,
    private readonly onDialed: (err: GatewayDialError | null, socket: TunnelSocket) => void,
    /** Default: the agent's reserved gateway destination; a Service's `name.ns.svc:port` otherwise. */
    address?: string,
  ) {
    super({ allowHalfOpen: true });
    const sink: ByteSink = {
      write: (chunk, callback) => {
        if (this.destroyed || this.state === 'ended') {
          process.nextTick(callback, new Error('gateway request closed'));
          return false;
        }
        this.lastActive = performance.now();
        if (this.push(chunk)) {
          process.nextTick(callback);
          return true;
        }
        this.unread.push(callback);
        return false;
      },
    };
    this.leg = {
      sink,
      client,
      halfClose: true,
      dialSucceeded: () => this.dialSucceeded(),
      dialFailed: (reason, message) => this.dialFailed(reason, message),
      remoteEnded: () => this.remoteEnded(),
      closed: (error) => this.tunnelClosed(error),
      pause: () => {
        this.corePaused = true;
      },
      resume: () => this.coreResumed(),
    };
    this.conn = core.dialGateway(cluster, this.leg, address);
  }

  // ------------------------------------------------------------ what node:http calls on a socket

  setNoDelay(): this {
    return this;
  }
  setKeepAlive(): this {
    return this;
  }
  ref(): this {
    return this;
  }
  unref(): this {
    return this;
  }

  /**
   * An idle timeout as net.Socket has one: 'timeout' after `ms` without bytes either way (0: none).
   * The gateway's keep-alive pool (agent-pool.ts) closes connections that idle in it this way.
   */
  setTimeout(ms: number, onTimeout?: () => void): this {
    // As net.Socket: 0 with a callback takes that callback off (node:http does so after each request).
    if (onTimeout) {
      if (ms === 0) this.removeListener('timeout', onTimeout);
      else this.once('timeout', onTimeout);
    }
    this.idleMs = ms;
    this.lastActive = performance.now();
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = null;
    if (ms > 0) this.armIdle(ms);
    return this;
  }

  private idleMs = 0;
  private idleTimer: NodeJS.Timeout | null = null;
  /** When bytes last moved either way (one timer per idle period, not one per chunk). */
  private lastActive = 0;

  private armIdle(ms: number): void {
    this.idleTimer = setTimeout(() => {
      this.idleTimer = null;
      if (this.destroyed || this.idleMs === 0) return;
      const idle = performance.now() - this.lastActive;
      if (idle >= this.idleMs) this.emit('timeout');
      else this.armIdle(this.idleMs - idle);
    }, ms);
    this.idleTimer.unref();
  }

  /** The key of the link this connection rides for the gateway's identity MAC, or null (the agent takes signed identities only). */
  get identityKey(): KeyObject | null {
    return this.conn?.backend.identityKey ?? null;
  }

  /** Whether the agent behind this connection is shutting down (a keep-alive pool does not keep it then). */
  get agentDraining(): boolean {
    return this.conn?.backend.draining ?? true;
  }

  // ------------------------------------------------------------ the core's calls (through `leg`)

  private dialSucceeded(): void {
    if (this.state !== 'dialing') {
      this.conn?.close();
      return;
    }
    this.state = 'open';
    this.settle(null);
  }

  private dialFailed(reason: DialFailureReason, message: string): void {
    if (this.state !== 'dialing') return;
    this.state = 'failed';
    this.conn = null;
    this.settle(new GatewayDialError(reason, message));
  }

  private remoteEnded(): void {
    if (this.state !== 'open') return;
    this.state = 'ended';
    this.push(null);
  }

  private tunnelClosed(error: string): void {
    this.conn = null;
    if (this.destroyed) return;
    if (error) {
      this.destroy(new Error(`tunnel closed: ${error}`));
      return;
    }
    if (this.state === 'open') {
      this.state = 'ended';
      this.push(null);
    }
  }

  private coreResumed(): void {
    if (!this.corePaused) return;
    this.corePaused = false;
    const done = this.writeDone;
    this.writeDone = null;
    done?.();
  }

  // ------------------------------------------------------------ Duplex

  override _read(): void {
    const cbs = this.unread;
    this.unread = [];
    for (const cb of cbs) cb();
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, callback: (err?: Error | null) => void): void {
    if (!this.conn || this.state !== 'open') {
      callback(new Error('gateway request closed'));
      return;
    }
    this.conn.write(chunk);
    this.lastActive = performance.now();
    if (this.corePaused) this.writeDone = () => callback();
    else callback();
  }

  override _final(callback: (err?: Error | null) => void): void {
    this.conn?.endWrite();
    callback();
  }

  override _destroy(err: Error | null, callback: (err?: Error | null) => void): void {
    this.state = 'destroyed';
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = null;
    const conn = this.conn;
    this.conn = null;
    conn?.close();
    const cbs = this.unread;
    this.unread = [];
    for (const cb of cbs) cb(new Error('gateway request closed'));
    this.writeDone = null;
    this.settle(new GatewayDialError('dialclosed', 'the gateway request ended during the dial'));
    callback(err);
  }

  private settle(err: GatewayDialError | null): void {
    if (this.settled) return;
    this.settled = true;
    this.onDialed(err, this);
  }
}
