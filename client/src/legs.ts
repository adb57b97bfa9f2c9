// What carries one tunneled connection between the SDK and the hub: its own gRPC Proxy stream
// (ANP's way, works with any hub), or a share of one multiplexed TLS connection (our hub).
import {
  CAP_HALF_CLOSE,
  MD_CAPABILITIES,
  PROXY_PATH,
  parseCapabilities,
  type GrpcCallError,
  type GrpcClient,
  type Packet,
} from '@cluster-proxy/proto';

export interface LegHandlers {
  onPacket(p: Packet): void;
  /** A DATA payload as the chunks it arrived in (`length` bytes; a shared connection does not copy them into one). */
  onChunks(chunks: readonly Buffer[], length: number): void;
  /** The leg broke (stream error, hub gone). */
  onFailure(message: string): void;
}

export interface Leg {
  /** Whether the hub understands HALF_CLOSE on this leg (known once DIAL_RSP arrived). */
  readonly halfClose: boolean;
  /** Sends a packet. For DATA, false means: wait for whenWritable() before sending more. */
  send(p: Packet): boolean;
  whenWritable(cb: () => void): void;
  /** `bytes` of DATA reached the reader; `accepted` is push()'s answer (false: stop the flow). */
  received(bytes: number, accepted: boolean): void;
  /** The reader wants more. */
  resumeReading(): void;
  /** True when unsent data would hold a control packet back (then abort instead of closing). */
  readonly backedUp: boolean;
  /**
   * False while DATA should wait (no credit, or the shared transport is over its high-water mark):
   * with many connections writing at once, each would otherwise queue a whole chunk on it.
   */
  readonly readyForData: boolean;
  /** How many of `bytes` may go out now as DATA (the hub's credit on a shared connection; all of them on a stream of its own). */
  allowance(bytes: number): number;
  /** Finished normally (our close was acknowledged, or the dial failed). */
  end(): void;
  /** Give up at once. */
  abort(): void;
}

export interface LegFactory {
  open(random: bigint, handlers: LegHandlers): Leg;
}

/** One gRPC Proxy stream per connection, exactly as konnectivity-client does. */
export class GrpcLegFactory implements LegFactory {
  constructor(private readonly client: GrpcClient) {}

  open(_random: bigint, h: LegHandlers): Leg {
    const call = this.client.call(PROXY_PATH, { [MD_CAPABILITIES]: CAP_HALF_CLOSE });
    let halfClose = false;
    let released = false;
    const release = (): void => {
      if (released) return;
      released = true;
      call.removeAllListeners('data');
      call.onDataViews(null);
      call.on('error', () => {});
      call.cancel();
    };
    call.on('metadata', (m: Record<string, string[]>) => {
      halfClose = parseCapabilities((m[MD_CAPABILITIES] ?? []).join(',')).has(CAP_HALF_CLOSE);
    });
    call.on('data', (p: Packet) => h.onPacket(p));
    call.onDataViews((_connectID, chunks, length) => h.onChunks(chunks, length));
    call.on('error', (err: GrpcCallError) => h.onFailure(err.message));
    call.on('end', () => h.onFailure('hub ended the stream'));
    call.on('status', release);
    return {
      get halfClose() {
        return halfClose;
      },
      send: (p) => call.write(p),
      whenWritable: (cb) => call.once('drain', cb),
      received: (_bytes, accepted) => {
        if (!accepted) call.pause();
      },
      resumeReading: () => call.resume(),
      get backedUp() {
        return call.writableNeedDrain;
      },
      get readyForData() {
        return !call.writableNeedDrain;
      },
      allowance: (bytes) => bytes,
      end: () => {
        if (!call.writableEnded) call.end();
        call.resume(); // let the status arrive
      },
      abort: release,
    };
  }
}
