// One tunneled connection as the agent sees it: a TCP socket to the destination, bridged to a
// connectID on one server stream. States:
//   dialing   the dial is in progress (no socket yet)
//   open      the socket is attached; each direction flows until it ends (`directions`, proto's HalfCloseDirections):
//               outbound ended  the destination sent EOF and we sent HALF_CLOSE; the hub's bytes still go to it
//               inbound ended   the hub sent HALF_CLOSE and we ended the socket; the destination's bytes still go to the hub
//               both ended      waiting for the socket to close, then CLOSE_RSP
//   closing   CLOSE_RSP sent; the socket flushes what the destination has not read (bounded)
//   closed    nothing left: socket, timer and listeners released
//
//   dialing ──attach──▶ open
//   open ──destination EOF──▶ open, outbound ended ──HALF_CLOSE──▶ open, both ended
//   open ──HALF_CLOSE──▶ open, inbound ended ──destination EOF (HALF_CLOSE first)──▶ closing
//   dialing, open ──CLOSE_REQ or DIAL_CLS, an error, the socket closing──▶ closing ──socket closed──▶ closed
//   closing is skipped when nothing is left to flush; destroy() (the stream gone) goes to closed from any state.
//   A failed dial: dialFailed() (the owner answers DIAL_RSP; nothing was started).
// finish() sends CLOSE_RSP on the way out; a CLOSE_REQ after that is acknowledged again.
import type net from 'node:net';
import {
  type LazyLog,
  MAX_DATA_CHUNK,
  MAX_MESSAGE_BYTES,
  ReceiveWindow,
  SendCredit,
  SentGate,
  HalfCloseDirections,
  limitUnsentBytes,
  packets,
  type MemoryBudget,
  type StreamSender,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import type { AgentMetrics } from './metrics.js';

/** Unflushed bytes we tolerate per connection from a peer without credit before pausing the stream. */
const LEGACY_BACKLOG = 4 * 1024 * 1024;
/** After CLOSE_REQ we flush what the destination has not read yet, but not forever. */
const CLOSE_FLUSH_MS = 2000;

export type EndpointState = 'dialing' | 'open' | 'closing' | 'closed';

export interface EndpointOwner {
  readonly sender: StreamSender;
  readonly credit: boolean;
  readonly halfClose: boolean;
  /** Window we grant the hub per connection at first (it grows from the budget). */
  readonly window: number;
  /** The agent's memory budget, shared by every connection of every link. */
  readonly budget: MemoryBudget;
  /** Window the hub granted us, or null without credit. */
  readonly peerWindow: number | null;
  forget(conn: EndpointConnection): void;
  readonly metrics: AgentMetrics;
}

export class EndpointConnection {
  /** Set to `closed` by the owner when the dial fails (it answers DIAL_RSP itself). */
  private stateNow: EndpointState = 'dialing';

  get state(): EndpointState {
    return this.stateNow;
  }
  /** While open: which directions ended (inbound: the hub's HALF_CLOSE; outbound: the destination's EOF). */
  readonly directions = new HalfCloseDirections();
  private socket: net.Socket | null = null;
  private writer: ReceiveWindow | null = null;
  private readonly sendCredit: SendCredit;
  /** Destination bytes read beyond the hub's credit: the rest of one read, sent when credit comes. */
  private unsent: Buffer | null = null;
  private flushTimer: NodeJS.Timeout | null = null;
  /** While set, the destination's bytes wait in the socket (see attach's holdReadsMs); cleared when reading starts. */
  private holdTimer: NodeJS.Timeout | null = null;
  readonly abort = new AbortController();
  bytesIn = 0;
  bytesOut = 0;

  constructor(
    private readonly owner: EndpointOwner,
    readonly connectID: number,
    readonly random: bigint,
    readonly address: string,
    private readonly logs: LazyLog<Logger>,
  ) {
    this.sendCredit = new SendCredit(owner.peerWindow, () => owner.metrics.flowControlStalls.inc());
  }

  /** The dial succeeded: start pumping. */
  /** The dial failed before anything was started: the owner answers the hub with DIAL_RSP. */
  dialFailed(): void {
    if (this.stateNow === 'dialing') this.stateNow = 'closed';
  }

  /**
   * `holdReadsMs`: wait that long (or until the first bytes from the client) before reading the destination.
   * konnectivity-client registers a connection only after its receive loop has handed DIAL_RSP on, and drops a
   * DATA that comes right behind it; ANP's proxy-server passes the agent's packets straight on, so behind it
   * a destination that speaks first could lose its first bytes. The bytes wait in the socket meanwhile.
   */
  attach(socket: net.Socket, holdReadsMs = 0): void {
    switch (this.state) {
      case 'dialing':
        break;
      default:
        // The owner attaches only while dialing; a socket that comes later is not wanted.
        socket.destroy();
        return;
    }
    this.stateNow = 'open';
    this.socket = socket;
    socket.setNoDelay(true);
    // Until the destination has kept up with a bulk transfer, one chunk per write. Node writes a
    // socket's queued chunks in one writev and keeps every chunk of it alive until the kernel has taken
    // all of it: a destination that stops reading mid-writev pins chunks already in the kernel, and the
    // TLS records they are views of (10 MiB on the gRPC transport at 1,024 stuck destinations).
    const vectored = socket as { _writev?: unknown };
    vectored._writev = null;
    this.writer = new ReceiveWindow({
      sink: socket,
      initial: this.owner.window,
      budget: this.owner.budget,
      direction: 'to_endpoint',
      report: this.reportCredit,
      // Without credit (an unmodified ANP hub) there is nothing to hold back.
      gate: this.owner.credit ? SentGate.of(socket) : null,
      // The destination keeps up: vectored writes again, and the default unsent
      // allowance (the dialer started it small).
      onBulk: () => {
        delete vectored._writev;
        limitUnsentBytes(socket);
      },
    });
    this.writer.onFlushed = () => this.owner.sender.releaseReads(this);
    if (holdReadsMs > 0) this.holdTimer = setTimeout(this.startReading, holdReadsMs);
    else socket.on('data', this.onSocketData);
    socket.on('end', this.onSocketEnd);
    socket.on('error', this.onSocketError);
    socket.on('close', this.onSocketClose);
  }

  // ------------------------------------------------------------ from the hub

  onData(data: Buffer): void {
    this.onChunks([data], data.length);
  }

  /** One DATA payload as the chunks it arrived in, `n` bytes in all (a mux link does not copy them into one). */
  onChunks(chunks: readonly Buffer[], n: number): void {
    // The client wrote: it has registered the connection, so the destination's bytes may go to it now.
    if (this.holdTimer) this.startReading();
    switch (this.state) {
      case 'open':
        if (this.directions.inbound === 'ended') {
          this.fail('DATA after HALF_CLOSE');
          return;
        }
        break;
      case 'dialing': // no connection yet: the hub has no DIAL_RSP
      case 'closing':
      case 'closed':
        return;
    }
    const writer = this.writer!;
    this.bytesIn += n;
    this.owner.metrics.bytesToEndpoint.inc(n);
    writer.writeChunks(chunks, n);
    if (this.owner.credit) {
      // A peer that negotiated credit and overruns it is broken; cut only this connection.
      if (writer.overrun > MAX_MESSAGE_BYTES) this.fail('flow-control window exceeded');
    } else if (writer.buffered > LEGACY_BACKLOG) {
      this.owner.sender.holdReads(this);
    }
  }

  onCredit(bytes: number): void {
    const unblocked = this.sendCredit.grant(bytes);
    // Nothing more to read from the destination (not yet, or no longer): the credit is only counted.
    if (this.readingDestination() && (unblocked || this.unsent)) this.resumeReading();
  }

  onHalfClose(): void {
    switch (this.state) {
      case 'open':
        if (this.directions.endInbound()) this.socket!.end();
        return; // a repeated HALF_CLOSE: ignored
      default:
        // Not open yet, or closing already: ignored.
        return;
    }
  }

  /** CLOSE_REQ (or DIAL_CLS) from the hub: acknowledge at once, flush what we hold to the destination, close. */
  onCloseRequest(): void {
    switch (this.state) {
      case 'closing':
      case 'closed':
        // Acknowledged already; acknowledge again.
        this.owner.sender.send(packets.closeResponse(this.connectID));
        return;
      default:
        this.finish('');
    }
  }

  /** The server stream is gone: nobody to answer to. */
  destroy(): void {
    switch (this.state) {
      case 'closed':
        return;
      default:
        this.abort.abort();
        this.release();
    }
  }

  // ------------------------------------------------------------ from the destination

  /** Whether the destination is still read: its EOF not seen, the connection not closing. */
  private readingDestination(): boolean {
    switch (this.state) {
      case 'open':
        return this.directions.outbound === 'open';
      default:
        return false;
    }
  }

  private readonly onSocketData = (chunk: Buffer): void => {
    // After EOF no data comes; from closing on the listener is gone.
    if (!this.readingDestination()) return;
    this.bytesOut += chunk.length;
    this.owner.metrics.bytesToServer.inc(chunk.length);
    this.sendWithinCredit(chunk);
    if (this.unsent || !this.sendCredit.canSend() || this.owner.sender.congested) {
      this.socket!.pause();
      if (this.owner.sender.congested) this.owner.sender.whenWritable(this.resumeReading);
    }
  };

  /** Sends as much of `data` as the hub's credit covers; keeps the rest for the next grant. */
  private sendWithinCredit(data: Buffer): void {
    let offset = 0;
    while (offset < data.length) {
      const n = this.sendCredit.allowance(Math.min(MAX_DATA_CHUNK, data.length - offset));
      if (n === 0) break;
      this.owner.sender.send(packets.data(this.connectID, data.subarray(offset, offset + n)));
      this.sendCredit.consume(n);
      offset += n;
    }
    this.unsent = offset < data.length ? data.subarray(offset) : null;
  }

  /** Credit came or the stream drained: send what is left of the last read, then read on if we may. */
  private readonly resumeReading = (): void => {
    // Reading is over (EOF seen, or closing): a late wake-up is ignored.
    if (!this.readingDestination()) return;
    if (this.unsent) this.sendWithinCredit(this.unsent);
    if (this.unsent || !this.sendCredit.canSend()) return;
    if (this.owner.sender.congested) {
      this.owner.sender.whenWritable(this.resumeReading);
      return;
    }
    this.socket!.resume();
  };

  /** The destination ended: what is left of its last read goes out now, whatever the credit (at most one read). */
  private sendUnsent(): void {
    if (!this.unsent) return;
    this.owner.sender.send(packets.data(this.connectID, this.unsent));
    this.sendCredit.consume(this.unsent.length);
    this.unsent = null;
  }

  private readonly onSocketEnd = (): void => {
    switch (this.state) {
      case 'open':
        break;
      default:
        return; // EOF does not come after we closed: ignored
    }
    if (this.directions.outbound === 'ended') return; // EOF comes once
    this.sendUnsent();
    if (this.directions.inbound === 'ended') {
      // Both directions are over: HALF_CLOSE, then CLOSE_RSP.
      this.directions.endOutbound();
      if (this.owner.halfClose) this.owner.sender.send(packets.halfClose(this.connectID));
      this.finish('');
      return;
    }
    if (!this.owner.halfClose) {
      // An ANP server has no half-close: EOF from the destination closes the connection (as ANP's agent does).
      this.finish('');
      return;
    }
    this.directions.endOutbound();
    this.owner.sender.send(packets.halfClose(this.connectID));
  };

  private readonly onSocketError = (err: Error): void => {
    // In every state ('close' follows); the listener stays on the socket so that a late error is never unhandled.
    this.logs.log.debug({ err: err.message }, 'destination socket error');
  };

  private readonly onSocketClose = (hadError: boolean): void => {
    switch (this.state) {
      case 'open':
        if (!hadError) this.sendUnsent();
        this.finish(hadError ? 'connection to destination reset' : '');
        return;
      case 'closing':
        // The flush is over (or cut short by the timer).
        this.enterClosed();
        return;
      case 'dialing':
      case 'closed':
        return;
    }
  };

  /** Closing: the destination has read everything; no need to wait for its FIN. */
  private readonly onSocketFinish = (): void => {
    this.socket?.destroy();
  };

  /** The destination took bytes off the window: return the credit while the hub may still send. */
  private readonly reportCredit = (bytes: number): void => {
    switch (this.state) {
      case 'open':
        if (this.owner.credit) this.owner.sender.send(packets.credit(this.connectID, bytes));
        return;
      default:
        return;
    }
  };

  // ------------------------------------------------------------ teardown

  private fail(why: string): void {
    this.logs.log.warn({ address: this.address }, why);
    this.finish(why);
  }

  /** Sends CLOSE_RSP (once: from any state before closing), then lets the socket flush (bounded) and close. */
  private finish(error: string): void {
    const socket = this.state === 'dialing' ? null : this.socket;
    const flush = socket !== null && !socket.destroyed && error === '' && socket.writableLength > 0;
    this.stateNow = flush ? 'closing' : 'closed';
    this.owner.sender.send(packets.closeResponse(this.connectID, error));
    this.owner.forget(this);
    this.owner.sender.cancelWaiter(this.resumeReading);
    this.owner.sender.releaseReads(this);
    this.writer?.dispose();
    if (!socket) {
      this.abort.abort(); // a dial still in progress is abandoned
      this.release();
      return;
    }
    if (socket.destroyed) {
      this.release();
      return;
    }
    socket.removeListener('data', this.onSocketData);
    if (this.holdTimer) clearTimeout(this.holdTimer);
    this.holdTimer = null;
    if (!flush) {
      socket.destroy();
      this.enterClosed();
      return;
    }
    socket.end();
    socket.once('finish', this.onSocketFinish);
    this.flushTimer = setTimeout(() => socket.destroy(), CLOSE_FLUSH_MS);
    this.flushTimer.unref();
  }

  /** Straight to closed: the window, the stream's waiter and read hold, the socket. */
  private release(): void {
    this.writer?.dispose();
    this.owner.sender.cancelWaiter(this.resumeReading);
    this.owner.sender.releaseReads(this);
    this.socket?.destroy();
    this.enterClosed();
  }

  /** Ends the hold of attach(): the destination's bytes flow from now on. */
  private readonly startReading = (): void => {
    if (!this.holdTimer) return;
    clearTimeout(this.holdTimer);
    this.holdTimer = null;
    if (this.readingDestination()) this.socket?.on('data', this.onSocketData);
  };

  private enterClosed(): void {
    this.stateNow = 'closed';
    if (this.holdTimer) clearTimeout(this.holdTimer);
    this.holdTimer = null;
    if (this.flushTimer) clearTimeout(this.flushTimer);
    this.flushTimer = null;
    const socket = this.socket;
    if (!socket) return;
    socket.removeListener('data', this.onSocketData);
    socket.removeListener('end', this.onSocketEnd);
    socket.removeListener('close', this.onSocketClose);
    socket.removeListener('finish', this.onSocketFinish);
  }
}
