// Per-connection flow control for connections multiplexed over one AgentService.Connect stream.
//
// ANP has none: a slow reader on one connection stalls the shared stream (ANP #180, #881). With the
// "credit" capability each side may have at most `window` unacknowledged bytes in flight per
// connection; the receiver returns credit as bytes leave its process. The shared stream is then
// always read at once, so HTTP/2 never stalls it on behalf of one connection. See proto/README.md.

/** Sending side: how much more we may send on one connection. `null` window = peer has no credit
 * support (unmodified ANP), so only the shared stream's own backpressure applies. */
export class SendCredit {
  private available: number;
  readonly enabled: boolean;

  constructor(window: number | null) {
    this.enabled = window !== null;
    this.available = window ?? Number.POSITIVE_INFINITY;
  }

  canSend(): boolean {
    return this.available > 0;
  }

  /** A chunk may overshoot the remaining credit; the overshoot is bounded by one chunk. */
  consume(bytes: number): void {
    if (this.enabled) this.available -= bytes;
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

/** Where received bytes go: a socket, or a gRPC call wrapped to take Buffers. */
export interface ByteSink {
  write(chunk: Buffer): boolean;
  once(event: 'drain', listener: () => void): unknown;
  removeListener(event: 'drain', listener: () => void): unknown;
}

export interface CreditReturnOptions {
  sink: ByteSink;
  /** The window we granted the sender; credit is reported in batches of window/8. */
  window: number;
  /** Called with bytes that left our buffers; the owner turns it into a CREDIT packet (or nothing
   * for a peer without credit support). */
  report: (bytes: number) => void;
}

/** Receiving side: writes chunks to the sink in order and returns credit once the sink has
 * accepted them (write() === true, or after 'drain'). The sink's own buffer is the only queue; the
 * sender's credit bounds it to one window. */
export class CreditReturn {
  private pendingBytes = 0;
  private unreported = 0;
  private waitingForDrain = false;
  private readonly threshold: number;

  constructor(private readonly opts: CreditReturnOptions) {
    this.threshold = Math.max(1, Math.floor(opts.window / 8));
  }

  /** Bytes handed to the sink that it has not yet flushed. */
  get buffered(): number {
    return this.pendingBytes;
  }

  write(chunk: Buffer): void {
    const accepted = this.opts.sink.write(chunk);
    if (accepted && !this.waitingForDrain) {
      this.consumed(chunk.length);
      return;
    }
    this.pendingBytes += chunk.length;
    if (!this.waitingForDrain) {
      this.waitingForDrain = true;
      this.opts.sink.once('drain', this.onDrain);
    }
  }

  /** Stop listening to the sink (connection closed). */
  dispose(): void {
    if (this.waitingForDrain) this.opts.sink.removeListener('drain', this.onDrain);
    this.waitingForDrain = false;
    this.pendingBytes = 0;
  }

  private readonly onDrain = (): void => {
    this.waitingForDrain = false;
    const bytes = this.pendingBytes;
    this.pendingBytes = 0;
    this.consumed(bytes);
    this.onFlushed?.();
  };

  /** Optional hook: the sink has flushed everything (used to lift stream-wide pressure). */
  onFlushed?: () => void;

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
