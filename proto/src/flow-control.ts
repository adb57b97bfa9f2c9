// Per-connection flow control for connections multiplexed over one AgentService.Connect stream.
//
// ANP has none: a slow reader on one connection stalls the shared stream (ANP's issues
// https://github.com/kubernetes-sigs/apiserver-network-proxy/issues/180 and …/issues/881). With the
// "credit" capability each side may have at most `window` unacknowledged bytes in flight per
// connection; the receiver returns credit as bytes leave its process. The shared stream is then
// always read at once, so HTTP/2 never stalls it on behalf of one connection. See proto/README.md.

/** Sending side: how much more we may send on one connection. `null` window = peer has no credit
 * support (unmodified ANP), so only the shared stream's own backpressure applies. */
export class SendCredit {
  private available: number;
  readonly enabled: boolean;

  /** `onExhausted` runs each time the credit runs out (a flow-control stall: the sender must wait
   * for the receiver). A callback, so metrics live with the owner, not in the protocol package. */
  constructor(window: number | null, private readonly onExhausted?: () => void) {
    this.enabled = window !== null;
    this.available = window ?? Number.POSITIVE_INFINITY;
  }

  canSend(): boolean {
    return this.available > 0;
  }

  /** A chunk may overshoot the remaining credit; the overshoot is bounded by one chunk. */
  consume(bytes: number): void {
    if (!this.enabled) return;
    const had = this.available > 0;
    this.available -= bytes;
    if (had && this.available <= 0) this.onExhausted?.();
  }

  /** Returns true when this grant unblocked a sender that was out of credit. */
  grant(bytes: number): boolean {
    if (!this.enabled) return false;
    const wasBlocked = this.available <= 0;
    this.available += bytes;
    return wasBlocked && this.available > 0;
  }

  get remaining(): number {
    return this.available;
  }
}

/** Where received bytes go: a socket, or a gRPC call wrapped to take Buffers. The callback runs
 * once the chunk has left the sink's own buffer (written to the kernel / handed to HTTP/2). */
export interface ByteSink {
  write(chunk: Buffer, callback: (err?: Error | null) => void): boolean;
}

export interface CreditReturnOptions {
  sink: ByteSink;
  /** The window we granted the sender; credit is reported in batches of window/8. */
  window: number;
  /** Called with bytes that left our buffers; the owner turns it into a CREDIT packet (or nothing
   * for a peer without credit support). */
  report: (bytes: number) => void;
}

/** Receiving side: writes chunks to the sink in order and returns credit as each chunk leaves the
 * sink's buffer (its write callback). Counting per chunk, rather than waiting for 'drain' (which
 * needs an empty buffer), keeps credit flowing while data streams through. The sink's own buffer
 * is the only queue; the sender's credit bounds it to one window. */
export class CreditReturn {
  private pendingBytes = 0;
  private unreported = 0;
  private disposed = false;
  private readonly threshold: number;

  constructor(private readonly opts: CreditReturnOptions) {
    this.threshold = Math.max(1, Math.floor(opts.window / 8));
  }

  /** Bytes handed to the sink that it has not yet flushed. */
  get buffered(): number {
    return this.pendingBytes;
  }

  /** Optional hook: the sink has flushed everything (used to lift stream-wide pressure). */
  onFlushed?: () => void;

  write(chunk: Buffer): void {
    const n = chunk.length;
    this.pendingBytes += n;
    this.opts.sink.write(chunk, (err) => {
      if (this.disposed) return;
      this.pendingBytes -= n;
      if (err) return;
      this.consumed(n);
      if (this.pendingBytes === 0) this.onFlushed?.();
    });
  }

  /** The connection is closed: late callbacks change nothing. */
  dispose(): void {
    this.disposed = true;
    this.pendingBytes = 0;
  }

  private consumed(bytes: number): void {
    this.unreported += bytes;
    if (this.unreported >= this.threshold) {
      const n = this.unreported;
      this.unreported = 0;
      this.opts.report(n);
    }
  }
}

/** Splits a buffer into views of at most `max` bytes (no copies). */
export function* chunks(buf: Buffer, max: number): Generator<Buffer> {
  if (buf.length <= max) {
    yield buf;
    return;
  }
  for (let off = 0; off < buf.length; off += max) yield buf.subarray(off, Math.min(buf.length, off + max));
}
