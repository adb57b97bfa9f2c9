// One tunneled connection as the agent sees it: a TCP socket to the destination, bridged to a
// connectID on one server stream. States: dialing → open → (half-closed either way) → closed.
// Every path to `closed` goes through finish(), which sends CLOSE_RSP at most once and releases
// the socket, timers and listeners.
import type net from 'node:net';
import { LazyLog, MAX_DATA_CHUNK, MAX_MESSAGE_BYTES, ReceiveWindow, SendCredit, packets, type MemoryBudget, type StreamSender } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import type { AgentMetrics } from './metrics.js';

/** Unflushed bytes we tolerate per connection from a peer without credit before pausing the stream. */
const LEGACY_BACKLOG = 4 * 1024 * 1024;
/** After CLOSE_REQ we flush what the destination has not read yet, but not forever. */
const CLOSE_FLUSH_MS = 2000;

export type EndpointState = 'dialing' | 'open' | 'closed';

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
  state: EndpointState = 'dialing';
  /** The destination sent FIN (we sent HALF_CLOSE). */
  private localEnded = false;
  /** The hub sent HALF_CLOSE (we ended the socket). */
  private remoteEnded = false;
  private socket: net.Socket | null = null;
  private writer: ReceiveWindow | null = null;
  private readonly sendCredit: SendCredit;
  /** Destination bytes read beyond the hub's credit: the rest of one read, sent when credit comes. */
  private unsent: Buffer | null = null;
  private flushTimer: NodeJS.Timeout | null = null;
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
  attach(socket: net.Socket): void {
    this.state = 'open';
    this.socket = socket;
    socket.setNoDelay(true);
    this.writer = new ReceiveWindow({
      sink: socket,
      initial: this.owner.window,
      budget: this.owner.budget,
      direction: 'to_endpoint',
      report: (bytes) => {
        if (this.owner.credit && this.state === 'open') this.owner.sender.send(packets.credit(this.connectID, bytes));
      },
    });
    this.writer.onFlushed = () => this.owner.sender.releaseReads(this);
    socket.on('data', this.onSocketData);
    socket.on('end', this.onSocketEnd);
    socket.on('error', this.onSocketError);
    socket.on('close', this.onSocketClose);
  }

  // ------------------------------------------------------------ from the hub

  onData(data: Buffer): void {
    if (this.state !== 'open' || !this.writer) return;
    if (this.remoteEnded) {
      this.fail('DATA after HALF_CLOSE');
      return;
    }
    this.bytesIn += data.length;
    this.owner.metrics.bytes.inc({ direction: 'to_endpoint' }, data.length);
    this.writer.write(data);
    if (this.owner.credit) {
      // A peer that negotiated credit and overruns it is broken; cut only this connection.
      if (this.writer.overrun > MAX_MESSAGE_BYTES) this.fail('flow-control window exceeded');
    } else if (this.writer.buffered > LEGACY_BACKLOG) {
      this.owner.sender.holdReads(this);
    }
  }

  onCredit(bytes: number): void {
    if (this.sendCredit.grant(bytes) || this.unsent) this.resumeReading();
  }

  onHalfClose(): void {
    if (this.state !== 'open' || this.remoteEnded) return;
    this.remoteEnded = true;
    this.socket?.end();
  }

  /** CLOSE_REQ from the hub: acknowledge at once, flush what we hold to the destination, close. */
  onCloseRequest(): void {
    if (this.state === 'closed') {
      this.owner.sender.send(packets.closeResponse(this.connectID));
      return;
    }
    this.finish('');
  }

  /** The server stream is gone: nobody to answer to. */
  destroy(): void {
    this.abort.abort();
    this.release();
  }

  // ------------------------------------------------------------ from the destination

  private readonly onSocketData = (chunk: Buffer): void => {
    this.bytesOut += chunk.length;
    this.owner.metrics.bytes.inc({ direction: 'to_server' }, chunk.length);
    this.sendWithinCredit(chunk);
    if (this.unsent || !this.sendCredit.canSend() || this.owner.sender.congested) {
      this.socket?.pause();
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

  private readonly resumeReading = (): void => {
    if (this.state !== 'open' || !this.socket) return;
    if (this.unsent) this.sendWithinCredit(this.unsent);
    if (this.unsent || !this.sendCredit.canSend()) return;
    if (this.owner.sender.congested) {
      this.owner.sender.whenWritable(this.resumeReading);
      return;
    }
    this.socket.resume();
  };

  /** The destination ended: what is left of its last read goes out now, whatever the credit (at most one read). */
  private sendUnsent(): void {
    if (!this.unsent) return;
    this.owner.sender.send(packets.data(this.connectID, this.unsent));
    this.sendCredit.consume(this.unsent.length);
    this.unsent = null;
  }

  private readonly onSocketEnd = (): void => {
    if (this.state !== 'open') return;
    this.sendUnsent();
    if (!this.owner.halfClose) {
      // An ANP server has no half-close: EOF from the destination closes the connection (as ANP's agent does).
      this.finish('');
      return;
    }
    this.localEnded = true;
    this.owner.sender.send(packets.halfClose(this.connectID));
    if (this.remoteEnded) this.finish('');
  };

  private readonly onSocketError = (err: Error): void => {
    this.logs.log.debug({ err: err.message }, 'destination socket error');
  };

  private readonly onSocketClose = (hadError: boolean): void => {
    if (this.flushTimer) clearTimeout(this.flushTimer);
    this.flushTimer = null;
    if (this.state !== 'open') return;
    if (!hadError) this.sendUnsent();
    this.finish(hadError ? 'connection to destination reset' : '');
  };

  // ------------------------------------------------------------ teardown

  private fail(why: string): void {
    this.logs.log.warn({ address: this.address }, why);
    this.finish(why);
  }

  /** Sends CLOSE_RSP once, then lets the socket flush (bounded) and close. */
  private finish(error: string): void {
    if (this.state === 'closed') return;
    const wasOpen = this.state === 'open';
    this.state = 'closed';
    this.owner.sender.send(packets.closeResponse(this.connectID, error));
    this.owner.forget(this);
    this.owner.sender.cancelWaiter(this.resumeReading);
    this.owner.sender.releaseReads(this);
    this.writer?.dispose();
    if (!wasOpen) this.abort.abort(); // a dial still in progress is abandoned
    const socket = this.socket;
    if (!socket || !wasOpen || socket.destroyed) {
      this.release();
      return;
    }
    socket.removeListener('data', this.onSocketData);
    if (error !== '' || socket.writableLength === 0) {
      socket.destroy();
      return;
    }
    socket.end();
    socket.once('finish', () => socket.destroy());
    this.flushTimer = setTimeout(() => socket.destroy(), CLOSE_FLUSH_MS);
    this.flushTimer.unref();
  }

  private release(): void {
    this.state = 'closed';
    this.writer?.dispose();
    this.owner.sender.cancelWaiter(this.resumeReading);
    this.owner.sender.releaseReads(this);
    if (this.flushTimer) clearTimeout(this.flushTimer);
    this.flushTimer = null;
    this.socket?.destroy();
  }
}
