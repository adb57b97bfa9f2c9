// One tunneled connection on the hub: a frontend (client leg) bridged to a connectID on one agent
// stream. States:
//   pending  DIAL_REQ sent, waiting for DIAL_RSP (deadline timer running)
//   open     bytes flow both ways; either side may half-close
//   closing  the client closed: what still waits for credit goes first (CLOSE_FLUSH_MS at most),
//            then CLOSE_REQ to the agent, waiting for CLOSE_RSP (timer running); or the stall policy
//            closed it (closeStalled): nothing waiting is kept, CLOSE_REQ at once
//   closed   removed from every table; the frontend has been told
import {
  LazyLog,
  MAX_DATA_CHUNK,
  MAX_MESSAGE_BYTES,
  ReceiveWindow,
  SendCredit,
  classifyDialError,
  queueChunks,
  takeQueued,
  unpinned,
  type DialFailureReason,
  type MemoryBudget,
  type QueuedBytes,
  type StreamSender,
} from '@cluster-proxy/proto';
import type { KeyObject } from 'node:crypto';
import type { Logger } from 'pino';
import type { Frontend } from './frontend.js';
import type { ServerMetrics } from './metrics.js';

/**
 * What a connection needs of the agent stream it rides; AgentBackend (backend.ts) implements it. Declared
 * here rather than imported, so the stream and its connections do not import each other.
 */
export interface ConnectionBackend {
  readonly cluster: string;
  /** The agent announced it is shutting down (DRAIN): its open connections finish, nothing new goes to it. */
  readonly draining: boolean;
  /** Window we grant the agent per connection at first (it grows from the budget). */
  readonly window: number;
  /** The hub's memory budget. */
  readonly budget: MemoryBudget;
  /** Window the agent granted us, or null (no credit). */
  readonly peerWindow: number | null;
  readonly credit: boolean;
  readonly halfClose: boolean;
  /** The link's key for the gateway's identity MAC, or null (tunnel-socket.ts). */
  readonly identityKey?: KeyObject | null;
  readonly sender: StreamSender;
  readonly metrics: ServerMetrics;
  sendDialRequest(conn: ProxiedConnection): void;
  sendDialClose(conn: ProxiedConnection): void;
  established(conn: ProxiedConnection): void;
  sendCredit(conn: ProxiedConnection, bytes: number): void;
  sendHalfClose(conn: ProxiedConnection): void;
  sendCloseRequest(conn: ProxiedConnection): void;
  forget(conn: ProxiedConnection): void;
}

export type ProxiedState = 'pending' | 'open' | 'closing' | 'closed';

/** Which way bytes could not move: client bytes towards the destination, or destination bytes towards the client. */
export type StallDirection = 'to_agent' | 'to_client';

/** How long we wait for the agent's CLOSE_RSP before dropping our half anyway. */
const CLOSE_ACK_TIMEOUT_MS = 10_000;
/** After the client closed, how long its last bytes may wait for the agent's credit before they are
 * dropped (an ANP client closes right after its last write; a stuck destination must not hold on). */
const CLOSE_FLUSH_MS = 2000;
/**
 * With credit, the agent's grants bound what we send it, but what it granted waits in our socket
 * buffer until it reads: past this much queued on the shared stream, connections wait for it to drain
 * as they do for an agent without credit. (A busy agent once granted its whole 64 MiB budget, all of it
 * sat in the hub's buffer, and the hub cut the stream as not reading.)
 */
const CREDIT_STREAM_QUEUE_LIMIT = 8 * 1024 * 1024;
/** Unflushed bytes per connection we accept from an agent without credit before pausing its stream. */
const LEGACY_BACKLOG = 4 * 1024 * 1024;

export class ProxiedConnection {
  state: ProxiedState = 'pending';
  connectID = 0;
  private timer: NodeJS.Timeout | null = null;
  private toAgentCredit: SendCredit;
  private toClient: ReceiveWindow | null = null;
  private frontendPaused = false;
  /** When client bytes last went to the agent, or the client was last held back (a stall policy's clock). */
  private toAgentMovedAt = 0;
  /** Why the hub itself closed the connection (the stall policy): what the client hears instead of the agent's answer. */
  private closeError: string | null = null;
  /** The client sent HALF_CLOSE / the agent sent HALF_CLOSE. */
  private clientEnded = false;
  private agentEnded = false;
  readonly startedAt = process.hrtime.bigint();
  bytesToAgent = 0;
  /**
   * Client bytes beyond the agent's credit, in order, each with the frontend's callback for when it
   * has gone to the agent (the mux frontend returns its client's credit then). A paused client still
   * delivers what it was granted or what its HTTP/2 stream window holds; far more than the agent's
   * largest window is a client that ignores flow control.
   */
  private waiting: QueuedBytes[] = [];
  private waitingBytes = 0;
  /** Half-close or CLOSE_REQ held back until the waiting bytes are sent. */
  private afterWaiting: (() => void) | null = null;
  private get maxWaitingBytes(): number {
    return 2 * this.backend.budget.maxWindow + MAX_MESSAGE_BYTES;
  }
  bytesToClient = 0;
  private establishedAt = 0n;
  /** dialID (and, once open, connectID) on every line about this connection. */
  private readonly logs: LazyLog<Logger>;
  private get log(): Logger {
    return this.logs.log;
  }

  constructor(
    readonly backend: ConnectionBackend,
    readonly frontend: Frontend,
    readonly dialID: bigint,
    readonly address: string,
    log: Logger,
    /** Runs once, when the connection reaches `closed` (the core's admission counts). */
    private readonly onClosed: () => void = () => {},
  ) {
    this.logs = new LazyLog(log, { dialID: String(dialID) });
    this.toAgentCredit = new SendCredit(backend.peerWindow, () => backend.metrics.flowControlStalls.inc({ direction: 'to_agent' }));
  }

  // ------------------------------------------------------------ dialing

  startDial(deadlineMs: number): void {
    this.timer = setTimeout(() => {
      this.timer = null;
      if (this.state !== 'pending') return;
      // Tell the agent to abandon the dial; a late DIAL_RSP is answered with CLOSE_REQ by the backend.
      this.backend.sendDialClose(this);
      this.backend.metrics.dialFailure('backend_dial_timeout');
      this.failDial('timeout', `dial to ${this.address} timed out after ${deadlineMs} ms (no answer from the agent)`);
    }, deadlineMs);
    this.backend.sendDialRequest(this);
  }

  /** The client gave up on a pending dial (DIAL_CLS or stream gone). */
  cancelDial(): void {
    if (this.state !== 'pending') return;
    this.backend.metrics.dialFailure('frontend_close');
    this.backend.sendDialClose(this);
    this.clearTimer();
    this.enterClosed();
  }

  onDialResponse(connectID: number, error: string, reason: string): void {
    if (this.state !== 'pending') return;
    this.clearTimer();
    if (error !== '' || connectID === 0) {
      this.backend.metrics.dialFailure('error_response');
      this.failDial(classifyDialError(reason, error), error || `dial to ${this.address} failed`);
      return;
    }
    this.connectID = connectID;
    this.state = 'open';
    this.establishedAt = process.hrtime.bigint();
    this.backend.metrics.dialDuration.observe(Number(this.establishedAt - this.startedAt) / 1e9);
    this.logs.bind({ connectID });
    this.toClient = new ReceiveWindow({
      sink: this.frontend.sink,
      initial: this.backend.window,
      budget: this.backend.budget,
      direction: 'to_client',
      report: (bytes) => this.backend.sendCredit(this, bytes),
      onBulk: () => this.frontend.onBulk?.(),
    });
    this.toClient.onFlushed = () => this.backend.sender.releaseReads(this);
    this.backend.established(this);
    this.frontend.dialSucceeded(connectID);
  }

  private failDial(reason: DialFailureReason, message: string): void {
    this.clearTimer();
    this.enterClosed();
    this.frontend.dialFailed(reason, message);
  }

  // ------------------------------------------------------------ client → agent

  /**
   * Bytes from the client, sent to the agent as far as its credit reaches; the rest waits here until
   * CREDIT comes (a client keeps sending for a moment after pause(): what it was granted, or what its
   * HTTP/2 window holds). Pauses the client when the credit or the stream runs out. `sent` runs once
   * the bytes have gone to the agent (never if the connection is dropped first).
   */
  write(data: Buffer, sent?: () => void): void {
    this.writeChunks([data], data.length, sent);
  }

  /** As write(), for one payload that arrived as several chunks (`length` bytes): they stay views. */
  writeChunks(chunks: readonly Buffer[], length: number, sent?: () => void): void {
    if (this.state !== 'open' || this.clientEnded) return;
    this.backend.metrics.bytesMoved('to_agent', length);
    queueChunks(this.waiting, chunks, sent);
    this.waitingBytes += length;
    this.holding(length);
    this.sendWaiting();
    if (this.waitingBytes > this.maxWaitingBytes) {
      this.log.warn({ waiting: this.waitingBytes }, 'client kept sending after it was paused; closing the connection');
      this.dropWaiting();
      this.close();
      return;
    }
    if (this.waitingBytes > 0 || !this.toAgentCredit.canSend() || this.backend.sender.congested) this.pauseFrontend();
  }

  /**
   * Sends waiting client bytes while the agent's credit lasts and the shared stream takes them (an
   * agent without credit is held back by the stream alone).
   */
  private sendWaiting(): void {
    while (this.waiting.length > 0) {
      const sender = this.backend.sender;
      if (sender.congested && (!this.backend.credit || sender.queued >= CREDIT_STREAM_QUEUE_LIMIT)) {
        this.backend.sender.whenWritable(this.onWritable);
        break;
      }
      const n = this.toAgentCredit.allowance(Math.min(MAX_DATA_CHUNK, this.waitingBytes));
      if (n === 0) break;
      const taken = takeQueued(this.waiting, n);
      sender.sendData(this.connectID, taken.chunks, n);
      this.toAgentMovedAt = Date.now();
      this.toAgentCredit.consume(n);
      this.bytesToAgent += n;
      this.waitingBytes -= n;
      this.holding(-n);
      for (const done of taken.sent) done();
    }
    // What is left waits for credit, as long as the destination stalls: it must not keep alive the
    // part of its frame or message that went. Only the head: the rest are views of whole TLS records or
    // of HTTP/2 read buffers (64 KiB), and copying every waiting view took back the gRPC path's gain
    // (hub 1.5 against 1.4 s/GiB on `throughput-up`).
    const head = this.waiting[0];
    if (head) head.chunk = unpinned(head.chunk);
    if (this.waitingBytes === 0 && this.afterWaiting) {
      const next = this.afterWaiting;
      this.afterWaiting = null;
      next();
    }
  }

  /** The client will send no more (half-close). ANP agents do not know half-close: we close instead. */
  endWrite(): void {
    if (this.state !== 'open' || this.clientEnded) return;
    this.clientEnded = true;
    // After the bytes still waiting for credit.
    const end = (): void => {
      if (this.state !== 'open') return;
      if (this.backend.halfClose) this.backend.sendHalfClose(this);
      else this.close();
    };
    if (this.waitingBytes > 0) this.afterWaiting = end;
    else end();
  }

  /** The client closed the connection (CLOSE_REQ, or its stream ended). */
  close(): void {
    if (this.state === 'pending') {
      this.cancelDial();
      return;
    }
    if (this.state !== 'open') return;
    this.state = 'closing';
    this.releaseFrontendPressure();
    // Bytes still waiting go first, within the agent's credit: never past it (the agent would hold
    // them, or the link would), and not for long when the destination stopped reading.
    this.afterWaiting = this.sendCloseRequest;
    if (this.waitingBytes === 0) {
      this.afterWaiting = null;
      this.sendCloseRequest();
      return;
    }
    this.timer = setTimeout(() => {
      this.timer = null;
      this.log.info({ dropped: this.waitingBytes }, 'closed by the client; its last bytes got no credit in time and are dropped');
      this.dropWaiting();
      this.afterWaiting = null;
      this.sendCloseRequest();
    }, CLOSE_FLUSH_MS);
    this.sendWaiting();
  }

  /**
   * How long bytes have been unable to move one way, and which way (the longer, if both): the client
   * held back while none of its bytes went to the agent, or bytes for the client that it does not take.
   * Null unless open and stalled.
   */
  stall(now: number): { direction: StallDirection; ms: number } | null {
    if (this.state !== 'open') return null;
    const toAgent = this.frontendPaused ? now - this.toAgentMovedAt : -1;
    const toClient = this.toClient && this.toClient.buffered > 0 ? this.toClient.stalledFor(now) : -1;
    if (toAgent < 0 && toClient < 0) return null;
    return toAgent >= toClient ? { direction: 'to_agent', ms: toAgent } : { direction: 'to_client', ms: toClient };
  }

  /**
   * The stall policy (--stall-timeout): bytes could not move `direction` for `ms`. What waits here is
   * dropped, the agent is asked to close the destination now, and the client hears why once it has.
   */
  closeStalled(direction: StallDirection, ms: number): void {
    if (this.state !== 'open') return;
    const where =
      direction === 'to_agent' ? "the destination took none of the client's bytes" : "the client took none of the destination's bytes";
    this.closeError = `closed by the proxy server: ${where} for ${Math.round(ms / 1000)} s (--stall-timeout)`;
    this.log.info(
      { direction, stalledMs: ms, waiting: this.waitingBytes, buffered: this.toClient?.buffered ?? 0 },
      'closing a stalled connection',
    );
    this.backend.metrics.stalledCloses.inc({ direction });
    this.state = 'closing';
    this.dropWaiting();
    this.afterWaiting = null;
    this.releaseFrontendPressure();
    this.sendCloseRequest();
  }

  private readonly sendCloseRequest = (): void => {
    if (this.state !== 'closing') return;
    this.clearTimer();
    this.backend.sendCloseRequest(this);
    this.timer = setTimeout(() => {
      this.timer = null;
      this.log.warn('agent did not acknowledge CLOSE_REQ; dropping the connection');
      this.finish('agent did not acknowledge close');
    }, CLOSE_ACK_TIMEOUT_MS);
  };

  // ------------------------------------------------------------ agent → client

  onData(data: Buffer): void {
    this.onChunks([data], data.length);
  }

  /** One DATA payload as the chunks it arrived in, `n` bytes in all (a mux agent's are not copied into one). */
  onChunks(chunks: readonly Buffer[], n: number): void {
    if (this.state !== 'open' || !this.toClient) return;
    this.bytesToClient += n;
    const metrics = this.backend.metrics;
    metrics.bytesMoved('to_client', n);
    const start = performance.now();
    this.toClient.writeChunks(chunks, n);
    metrics.frontendWriteDuration.observe((performance.now() - start) / 1000);
    if (this.backend.credit) {
      if (this.toClient.overrun > MAX_MESSAGE_BYTES) {
        this.log.warn('agent exceeded its flow-control window; closing the connection');
        this.close();
      }
    } else if (this.toClient.buffered > LEGACY_BACKLOG) {
      this.backend.sender.holdReads(this);
    }
  }

  onCredit(bytes: number): void {
    const unblocked = this.toAgentCredit.grant(bytes);
    if (this.waitingBytes > 0 && (this.state === 'open' || this.state === 'closing')) this.sendWaiting();
    if (unblocked) this.maybeResumeFrontend();
  }

  /**
   * The destination sent FIN. A client that negotiated half-close gets it as such; an ANP client
   * (konnectivity-client) knows only close, so the connection closes, as behind ANP's own agent:
   * CLOSE_REQ to the agent, and its CLOSE_RSP reaches the client through finish().
   */
  onHalfClose(): void {
    if (this.state !== 'open' || this.agentEnded) return;
    this.agentEnded = true;
    if (this.frontend.halfClose) this.frontend.remoteEnded();
    else this.close();
  }

  /** CLOSE_RSP from the agent: the destination side is closed. */
  onCloseResponse(error: string): void {
    if (this.state === 'closed' || this.state === 'pending') return;
    this.finish(error);
  }

  /** The agent stream is gone. */
  backendGone(): void {
    if (this.state === 'pending') {
      this.backend.metrics.dialFailure('backend_close');
      this.failDial('dialclosed', `agent for ${this.address} disconnected during the dial`);
    } else if (this.state !== 'closed') this.finish('agent disconnected');
  }

  // ------------------------------------------------------------ helpers

  private pauseFrontend(): void {
    if (!this.frontendPaused) {
      this.frontendPaused = true;
      this.toAgentMovedAt = Date.now();
      this.frontend.pause();
    }
    if (this.backend.sender.congested) this.backend.sender.whenWritable(this.maybeResumeFrontend);
  }

  private readonly maybeResumeFrontend = (): void => {
    if (this.state !== 'open' || !this.frontendPaused) return;
    if (!this.toAgentCredit.canSend() || this.waitingBytes > 0) return;
    if (this.backend.sender.congested) {
      this.backend.sender.whenWritable(this.maybeResumeFrontend);
      return;
    }
    this.frontendPaused = false;
    this.frontend.resume();
  };

  /** The shared stream drained: what waited for it goes out, then the client may go on. */
  private readonly onWritable = (): void => {
    if (this.state !== 'open' && this.state !== 'closing') return;
    this.sendWaiting();
    this.maybeResumeFrontend();
  };

  private releaseFrontendPressure(): void {
    this.backend.sender.cancelWaiter(this.onWritable);
    this.backend.sender.cancelWaiter(this.maybeResumeFrontend);
    this.backend.sender.releaseReads(this);
  }

  private finish(error: string): void {
    this.dropWaiting();
    this.afterWaiting = null;
    if (this.establishedAt !== 0n)
      this.backend.metrics.connectionDuration.observe(Number(process.hrtime.bigint() - this.establishedAt) / 1e9);
    this.clearTimer();
    this.releaseFrontendPressure();
    this.toClient?.dispose();
    this.enterClosed();
    this.frontend.closed(this.closeError ?? error);
  }

  /** Every way to `closed` ends here: out of the agent stream's tables and the core's counts. */
  private enterClosed(): void {
    if (this.state === 'closed') return;
    this.state = 'closed';
    this.backend.forget(this);
    this.onClosed();
  }

  /** Waiting bytes count in the hub's gauge of what it holds (towards the agent). */
  private holding(delta: number): void {
    this.backend.budget.held('to_agent', delta, this.waitingBytes);
  }

  private dropWaiting(): void {
    const dropped = this.waitingBytes;
    this.waiting = [];
    this.waitingBytes = 0;
    this.holding(-dropped);
  }

  private clearTimer(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }
}
