// Client-side I/O primitives for the measurements: TCP connect with a deadline, echo ping-pong,
// reading a stream to its end, and a scope that destroys every socket of a measurement when it
// finishes, fails or runs out of time (so nothing a measurement opened outlives it).
import net from 'node:net';
import type { Duplex } from 'node:stream';

export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** Connects to 127.0.0.1:port with TCP_NODELAY; rejects after `timeoutMs`. */
export function connectTcp(port: number, timeoutMs: number): Promise<net.Socket> {
  return new Promise<net.Socket>((resolve, reject) => {
    const socket = net.connect({ host: '127.0.0.1', port, noDelay: true });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error(`connect to 127.0.0.1:${port} timed out after ${timeoutMs} ms`));
    }, timeoutMs);
    const onError = (err: Error): void => {
      clearTimeout(timer);
      reject(err);
    };
    socket.once('error', onError);
    socket.once('connect', () => {
      clearTimeout(timer);
      socket.off('error', onError);
      socket.on('error', () => {}); // later errors surface through whoever reads or writes
      resolve(socket);
    });
  });
}

/** Sockets of one measurement; `run` destroys them all when the work settles or the deadline passes. */
export class SocketScope {
  private readonly sockets = new Set<Duplex>();
  private closed = false;

  track<S extends Duplex>(socket: S): S {
    if (this.closed) {
      socket.destroy();
      throw new Error('measurement already finished');
    }
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
    return socket;
  }

  destroyAll(): void {
    this.closed = true;
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
  }

  /** Runs `work` with a fresh scope; rejects if it takes longer than `timeoutMs`. */
  static async run<T>(what: string, timeoutMs: number, work: (scope: SocketScope) => Promise<T>): Promise<T> {
    const scope = new SocketScope();
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: did not finish within ${(timeoutMs / 1000).toFixed(0)} s`)), timeoutMs);
    });
    try {
      return await Promise.race([work(scope), timeout]);
    } finally {
      clearTimeout(timer);
      scope.destroyAll();
    }
  }
}

/**
 * Ping-pong over an echo connection: ping() writes `size` bytes (a sequence number in front) and
 * resolves with the round-trip time in ms once exactly those bytes came back.
 */
export class Pinger {
  private readonly message: Buffer;
  private readonly received: Buffer;
  private got = 0;
  private seq = 0;
  private waiter: { resolve: () => void; reject: (err: Error) => void } | null = null;
  private failure: Error | null = null;

  constructor(
    private readonly socket: Duplex,
    private readonly size = 64,
  ) {
    this.message = Buffer.alloc(size, 0x5a);
    this.received = Buffer.alloc(size);
    socket.on('data', this.onData);
    socket.on('error', this.onError);
    socket.on('end', this.onEnd);
    socket.on('close', this.onClose);
  }

  private readonly onError = (err: Error): void => this.fail(err);
  private readonly onEnd = (): void => this.fail(new Error(`echo connection ended after ${this.got} of ${this.size} bytes`));
  private readonly onClose = (): void => this.fail(new Error('echo connection closed'));

  /** Stops listening to the socket (which stays open, flowing, with nothing arriving on an echo). */
  detach(): void {
    this.socket.off('data', this.onData);
    this.socket.off('error', this.onError);
    this.socket.off('end', this.onEnd);
    this.socket.off('close', this.onClose);
  }

  private readonly onData = (chunk: Buffer): void => {
    if (this.waiter === null || this.got + chunk.length > this.size) {
      this.fail(new Error(`echo returned ${this.got + chunk.length} bytes for a ${this.size}-byte message`));
      return;
    }
    chunk.copy(this.received, this.got);
    this.got += chunk.length;
    if (this.got < this.size) return;
    this.got = 0;
    const waiter = this.waiter;
    this.waiter = null;
    if (!this.received.equals(this.message)) waiter.reject(new Error('echo returned different bytes'));
    else waiter.resolve();
  };

  private fail(err: Error): void {
    this.failure ??= err;
    const waiter = this.waiter;
    this.waiter = null;
    waiter?.reject(err);
  }

  ping(): Promise<number> {
    if (this.failure) return Promise.reject(this.failure);
    this.message.writeUInt32BE(++this.seq >>> 0, 0);
    return new Promise<number>((resolve, reject) => {
      const started = performance.now();
      this.waiter = { resolve: () => resolve(performance.now() - started), reject };
      this.socket.write(this.message);
    });
  }
}

/** Collects everything up to EOF (at most `limit` bytes), e.g. the sink's reply line. */
export function readToEnd(stream: Duplex, limit = 4096): Promise<Buffer> {
  return new Promise<Buffer>((resolve, reject) => {
    const parts: Buffer[] = [];
    let bytes = 0;
    stream.on('data', (chunk: Buffer) => {
      bytes += chunk.length;
      if (bytes > limit) stream.destroy(new Error(`reply longer than ${limit} bytes`));
      else parts.push(chunk);
    });
    stream.once('end', () => resolve(Buffer.concat(parts)));
    stream.once('error', reject);
    stream.once('close', () => reject(new Error(`connection closed before EOF after ${bytes} reply bytes`)));
  });
}

/** Counts bytes up to EOF without keeping them. */
export function countToEnd(stream: Duplex): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    let bytes = 0;
    stream.on('data', (chunk: Buffer) => {
      bytes += chunk.length;
    });
    stream.once('end', () => resolve(bytes));
    stream.once('error', reject);
    stream.once('close', () => reject(new Error(`connection closed before EOF after ${bytes} bytes`)));
  });
}
