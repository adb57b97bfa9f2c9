// ProxyService.Proxy: one stream carries one tunneled connection (ANP's gRPC frontend). Works with
// an unmodified konnectivity-client and with our SDK, which also negotiates half-close.
//   await-dial → DIAL_REQ → dialing → DIAL_RSP ok → open → CLOSE_REQ/CLOSE_RSP → done
import {
  CAP_HALF_CLOSE,
  MD_CAPABILITIES,
  PacketType,
  packetTypeName,
  packets,
  parseCapabilities,
  type ByteSink,
  type DialFailureReason,
  type Packet,
  KONNECTIVITY_FIRST_DATA_HOLD_MS,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { certificatePrincipal, principalName } from '../http/principal.js';
import type { Frontend } from './frontend.js';
import { GrpcStatus, type GrpcCallHandler, type GrpcServerCall, type GrpcStatusError } from './grpc-server.js';
import { grpcCodeName } from './metrics.js';
import type { ProxyCore } from './proxy-core.js';
import type { ProxiedConnection } from './proxied-connection.js';
import type { AgentWait } from './agent-wait.js';

/** The response metadata to a client that negotiates half-close (our SDK). */
const HALF_CLOSE_METADATA = { [MD_CAPABILITIES]: CAP_HALF_CLOSE };

type FrontendState = 'await-dial' | 'dialing' | 'open' | 'done';

/** Each client certificate's name, made once (a connection keeps the certificate object: see GrpcServerCall.peerCertificate). */
const clientNames = new WeakMap<object, string>();

function clientName(call: GrpcServerCall): string {
  const cert = call.peerCertificate();
  if (!cert) return 'unix-socket';
  let name = clientNames.get(cert);
  if (name === undefined) {
    name = principalName(certificatePrincipal(cert.subject?.CN));
    clientNames.set(cert, name);
  }
  return name;
}

/** One Proxy stream. It is its own sink (bytes towards the client): an idle stream holds no closures for it. */
export class GrpcFrontend implements Frontend, ByteSink, GrpcCallHandler {
  readonly halfClose: boolean;
  readonly client: string;
  readonly sink: ByteSink = this;
  private state: FrontendState = 'await-dial';
  private conn: ProxiedConnection | null = null;
  /** The dial waits for an agent of its cluster to connect to this replica (agent-wait.ts). */
  private agentWait: AgentWait | null = null;
  private address = '';
  private clientRandom = 0n;
  private connectID = 0;
  /** True once the client ended its side of the stream while the connection was not done. */
  private clientEnded = false;
  /** Writes to an ANP client held right after DIAL_RSP (KONNECTIVITY_FIRST_DATA_HOLD_MS), in order; null: none held. */
  private held: (() => void)[] | null = null;
  private holdTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly call: GrpcServerCall,
    private readonly core: ProxyCore,
    private readonly parentLog: Logger,
    private readonly onDone: (f: GrpcFrontend) => void,
  ) {
    this.client = clientName(call);
    const caps = parseCapabilities(call.metadata.get(MD_CAPABILITIES).map(String).join(','));
    this.halfClose = caps.has(CAP_HALF_CLOSE);
    call.sendMetadataWithFirstMessage(this.halfClose ? HALF_CLOSE_METADATA : undefined);
    call.setHandler(this);
    call.onDataViews(this.onDataViews);
  }

  /** A child logger with this connection's IDs, made when it logs (rarely: pino's child() per dial shows in the dial rate). */
  private get log(): Logger {
    return this.parentLog.child(
      this.state === 'await-dial'
        ? {}
        : { clientDialID: String(this.clientRandom), ...(this.connectID ? { connectID: this.connectID } : {}) },
    );
  }

  // ------------------------------------------------------------ ByteSink (bytes towards the client)

  write(chunk: Buffer, callback: (err?: Error | null) => void): boolean {
    if (this.held) {
      this.held.push(() => this.write(chunk, callback));
      return true;
    }
    const p = packets.data(this.connectID, chunk);
    this.core.metrics.packet('to_client', p.type);
    return this.call.write(p, callback);
  }

  writeChunks(chunks: readonly Buffer[], length: number, callback: (err?: Error | null) => void): void {
    if (this.held) {
      this.held.push(() => this.writeChunks(chunks, length, callback));
      return;
    }
    this.core.metrics.packet('to_client', PacketType.DATA);
    this.call.writeData(this.connectID, chunks, length, callback);
  }

  // ------------------------------------------------------------ the call's events

  /** The client ended its side of the stream: close whatever we hold. */
  onCallEnd(): void {
    this.clientEnded ||= this.state !== 'done';
    this.clientGone();
  }

  /**
   * The client went away. A cancel is a stream error unless we had finished the stream ourselves first
   * (a client may reset the stream after its half-close; our SDK cancels after reading the status).
   */
  onCallCancelled(): void {
    if (this.state !== 'done' || this.clientEnded) this.core.metrics.streamError('from_client', 'Canceled');
    this.clientGone();
  }

  onCallError(err: Error & GrpcStatusError): void {
    if (this.state !== 'done') this.core.metrics.streamError('from_client', grpcCodeName(err.code));
    this.clientGone();
  }

  get description(): { state: FrontendState; connectID: number; address: string } {
    return { state: this.state, connectID: this.connectID, address: this.address };
  }

  private send(p: Packet): void {
    this.core.metrics.packet('to_client', p.type);
    this.call.write(p);
  }

  /** A packet from the client (none is taken once the stream is done). */
  onCallPacket(p: Packet): void {
    if (this.state === 'done') return;
    this.core.metrics.packet('from_client', p.type);
    switch (p.type) {
      case PacketType.DIAL_REQ:
        if (this.state !== 'await-dial') return this.protocolError('second DIAL_REQ on one stream');
        this.clientRandom = p.dialRequest.random;
        this.state = 'dialing';
        this.address = p.dialRequest.address;
        this.dial(p.dialRequest.address, p.dialRequest.protocol);
        return;
      case PacketType.DATA:
        this.onClientData(p.data.connectID, [p.data.data], p.data.data.length);
        return;
      case PacketType.HALF_CLOSE:
        if (this.state === 'open') this.conn?.endWrite();
        return;
      case PacketType.CLOSE_REQ:
        if (this.state === 'open') this.conn?.close();
        else if (this.state === 'await-dial') {
          this.send(packets.closeResponse(p.closeRequest.connectID, 'backend not initialized'));
          this.finish();
        }
        return;
      case PacketType.DIAL_CLS:
        if (this.state === 'dialing') {
          this.conn?.cancelDial();
          this.finish();
        }
        return;
      default:
        this.log.warn({ type: packetTypeName(p.type) }, 'unexpected packet from client, ignored');
    }
  }

  /** DATA with its payload as the HTTP/2 chunks it arrived in (not copied into one Buffer). */
  private readonly onDataViews = (connectID: number, chunks: readonly Buffer[], length: number): void => {
    this.core.metrics.packet('from_client', PacketType.DATA);
    this.onClientData(connectID, chunks, length);
  };

  private onClientData(connectID: number, chunks: readonly Buffer[], length: number): void {
    // The client wrote: it has registered the connection, what waited for that may go.
    this.releaseHeld();
    if (this.state !== 'open' || !this.conn) {
      this.send(packets.closeResponse(connectID, 'backend not initialized'));
      return this.finish();
    }
    if (connectID !== this.connectID)
      return this.protocolError(`DATA for connectID ${connectID} on the stream of connectID ${this.connectID}`);
    this.conn.writeChunks(chunks, length);
  }

  /** At once, or once an agent of the destination's cluster has connected here. */
  private dial(address: string, protocol: string): void {
    this.agentWait = this.core.awaitAgent(address, protocol, this, () => {
      this.agentWait = null;
      if (this.state === 'dialing') this.conn = this.core.dial(address, protocol, this);
    });
    if (!this.agentWait) this.conn = this.core.dial(address, protocol, this);
  }

  // ------------------------------------------------------------ Frontend (called by the core)

  dialSucceeded(connectID: number): void {
    if (this.state !== 'dialing') return;
    this.connectID = connectID;
    this.state = 'open';
    if (this.halfClose) {
      this.send(packets.dialResponse(this.clientRandom, connectID));
      return;
    }
    // An ANP client: the destination's bytes wait a moment behind DIAL_RSP (KONNECTIVITY_FIRST_DATA_HOLD_MS).
    this.held = [];
    this.core.metrics.packet('to_client', PacketType.DIAL_RSP);
    this.call.write(packets.dialResponse(this.clientRandom, connectID), () => {
      if (this.held) this.holdTimer = setTimeout(this.releaseHeld, KONNECTIVITY_FIRST_DATA_HOLD_MS);
    });
  }

  /** The stream is over: what was held is dropped with it. */
  private dropHeld(): void {
    if (this.holdTimer) clearTimeout(this.holdTimer);
    this.holdTimer = null;
    this.held = null;
  }

  private readonly releaseHeld = (): void => {
    if (this.holdTimer) clearTimeout(this.holdTimer);
    this.holdTimer = null;
    const held = this.held;
    this.held = null;
    if (held) for (const write of held) write();
  };

  dialFailed(reason: DialFailureReason, message: string): void {
    if (this.state === 'done') return;
    this.send(packets.dialResponse(this.clientRandom, 0, message, reason));
    this.finish();
  }

  remoteEnded(): void {
    if (this.state === 'open') this.send(packets.halfClose(this.connectID));
  }

  closed(error: string): void {
    if (this.state === 'done') return;
    // CLOSE_RSP goes behind the bytes held for an ANP client, once they may go.
    if (this.held) {
      this.held.push(() => this.closed(error));
      return;
    }
    this.send(packets.closeResponse(this.connectID, error));
    this.finish();
  }

  heldBytes(): number {
    return this.call.heldBytes;
  }

  pause(): void {
    this.call.pause();
  }

  /** Reads of this client's stream are stopped: its connection waits for room towards the agent. */
  get paused(): boolean {
    return this.call.isPaused;
  }

  resume(): void {
    this.call.resume();
  }

  // ------------------------------------------------------------ teardown

  private protocolError(message: string): void {
    this.log.warn(`client protocol error: ${message}`);
    this.agentWait?.cancel();
    this.agentWait = null;
    this.conn?.close();
    if (this.state === 'done') return;
    this.state = 'done';
    this.dropHeld();
    this.call.onDataViews(null);
    this.call.endWithStatus(GrpcStatus.INVALID_ARGUMENT, message);
    this.onDone(this);
  }

  private clientGone(): void {
    if (this.state === 'done') return;
    // Pending dials are abandoned (DIAL_CLS to the agent); open connections get CLOSE_REQ.
    this.conn?.close();
    this.finish();
  }

  private finish(): void {
    if (this.state === 'done') return;
    this.state = 'done';
    this.dropHeld();
    // Whatever we leave, the connection must not outlive the stream: a dial waiting for an agent or
    // pending at one is abandoned, an open connection closed (a no-op when it is already closed).
    this.agentWait?.cancel();
    this.agentWait = null;
    this.conn?.close();
    this.call.onDataViews(null);
    if (!this.call.writableEnded) this.call.end();
    this.call.resume(); // drain anything still queued so the stream can complete
    this.onDone(this);
  }
}
