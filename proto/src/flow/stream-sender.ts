// The shared Connect stream as seen by one of its ends: sends packets with backpressure and lets
// connections wait for it to become writable, and pauses reading the stream while some connection
// of an unmodified ANP peer (which knows no credit) has too much unflushed data.
import { PacketType, packets, type Packet } from '../wire/packet.js';

export interface PacketStream {
  write(packet: Packet): boolean;
  /** A DATA packet whose payload is `chunks` (`length` bytes), written without copying them into one
   * Buffer; streams without it are given one packet (our framed transport has it, gRPC does not). */
  writeData?(connectID: number, chunks: readonly Buffer[], length: number): boolean;
  /** Bytes written and not yet handed to the network. */
  readonly writableLength: number;
  once(event: 'drain', listener: () => void): unknown;
  removeListener(event: 'drain', listener: () => void): unknown;
  pause(): unknown;
  resume(): unknown;
}

export class StreamSender {
  private congestedFlag = false;
  private closed = false;
  private readonly waiters = new Set<() => void>();
  private readonly readHolds = new Set<unknown>();

  constructor(private readonly stream: PacketStream) {}

  /** True while the stream's buffer is full; senders should pause their sources. */
  get congested(): boolean {
    return this.congestedFlag;
  }

  /** Bytes queued on the stream, not yet handed to the network. */
  get queued(): number {
    return this.stream.writableLength;
  }

  send(packet: Packet): void {
    if (this.closed) return;
    this.wrote(this.stream.write(packet));
  }

  /** Sends `length` (> 0) bytes in `chunks` as one DATA packet. */
  sendData(connectID: number, chunks: readonly Buffer[], length: number): void {
    if (this.closed) return;
    if (this.stream.writeData) this.wrote(this.stream.writeData(connectID, chunks, length));
    else this.wrote(this.stream.write(packets.data(connectID, chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, length))));
  }

  private wrote(accepted: boolean): void {
    if (!accepted && !this.congestedFlag) {
      this.congestedFlag = true;
      this.stream.once('drain', this.onDrain);
    }
  }

  /** Calls `waiter` once, after the next 'drain' (or now if not congested). */
  whenWritable(waiter: () => void): void {
    if (!this.congestedFlag) {
      waiter();
      return;
    }
    this.waiters.add(waiter);
  }

  cancelWaiter(waiter: () => void): void {
    this.waiters.delete(waiter);
  }

  /** Pause reading the stream on behalf of `key` until releaseReads(key). */
  holdReads(key: unknown): void {
    if (this.readHolds.size === 0 && !this.closed) this.stream.pause();
    this.readHolds.add(key);
  }

  releaseReads(key: unknown): void {
    if (!this.readHolds.delete(key)) return;
    if (this.readHolds.size === 0 && !this.closed) this.stream.resume();
  }

  get readsHeld(): number {
    return this.readHolds.size;
  }

  close(): void {
    this.closed = true;
    if (this.congestedFlag) this.stream.removeListener('drain', this.onDrain);
    this.congestedFlag = false;
    this.waiters.clear();
    this.readHolds.clear();
  }

  private readonly onDrain = (): void => {
    this.congestedFlag = false;
    const waiters = [...this.waiters];
    this.waiters.clear();
    for (let i = 0; i < waiters.length; i++) {
      waiters[i]!();
      if (this.congestedFlag) {
        // Someone filled the buffer again. Those who had no turn go first at the next drain, ahead of
        // any who asked again during this one: else a connection always ready to send (a client with a
        // large window) would fill every drain first and starve the ones behind it.
        const askedAgain = [...this.waiters];
        this.waiters.clear();
        for (const rest of waiters.slice(i + 1)) this.waiters.add(rest);
        for (const w of askedAgain) this.waiters.add(w);
        return;
      }
    }
  };
}

/** The same stream, with `onWrite` called for every packet written (metrics count packets here). */
export function tapWrites(stream: PacketStream, onWrite: (type: PacketType) => void): PacketStream {
  const writeData = stream.writeData?.bind(stream);
  return {
    write: (p) => {
      onWrite(p.type);
      return stream.write(p);
    },
    ...(writeData && {
      writeData: (connectID: number, chunks: readonly Buffer[], length: number) => {
        onWrite(PacketType.DATA);
        return writeData(connectID, chunks, length);
      },
    }),
    get writableLength() {
      return stream.writableLength;
    },
    once: (event, listener) => stream.once(event, listener),
    removeListener: (event, listener) => stream.removeListener(event, listener),
    pause: () => stream.pause(),
    resume: () => stream.resume(),
  };
}
