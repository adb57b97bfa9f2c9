// One agent's Connect stream on the hub: the packets it carries, the dials pending on it and the
// connections established through it. Connection IDs are the agent's; they are only looked up in
// this stream's own tables, so IDs repeated by another stream (a reconnect, a duplicate agent
// stream, an HA peer) can never collide.
import {
  ConnectionTable,
  StreamSender,
  packetTypeName,
  packets,
  tapWrites,
  type DataViewHandler,
  type FramedPacketStream,
  type MemoryBudget,
  type Packet,
  type PacketStream,
} from '@cluster-proxy/proto';
import type { KeyObject } from 'node:crypto';
import type { Logger } from 'pino';
import { detachedServerMetrics, grpcCodeName, type ServerMetrics } from './metrics.js';
import type { ConnectionBackend, ProxiedConnection } from './proxied-connection.js';
import type { Routable } from './routing.js';
import type { GrpcServerCall, GrpcStatusError } from './grpc-server.js';

/** An agent's stream of packets, whatever carries it (a gRPC call, or our framed TLS transport). */
export interface AgentChannel {
  readonly transport: 'grpc' | 'mux';
  readonly stream: PacketStream;
  onPacket(listener: (p: Packet) => void): void;
  offPacket(listener: (p: Packet) => void): void;
  /** DATA payloads as the chunks they arrived in (not copied into one Buffer); null: as packets again. */
  onDataViews?(handler: DataViewHandler | null): void;
  /** Called once when the agent side ends or breaks. */
  onGone(listener: (why: string) => void): void;
  /** Ends our side: normally, or with an error status the agent will see. */
  close(error?: GrpcStatusError): void;
}

/** `metrics` counts stream errors (segment from_agent). */
export function grpcAgentChannel(call: GrpcServerCall, metrics?: ServerMetrics): AgentChannel {
  return {
    transport: 'grpc',
    stream: call,
    onPacket: (l) => call.on('data', l),
    offPacket: (l) => call.removeListener('data', l),
    // No onDataViews: handed on as HTTP/2 chunks, a gRPC agent's downloads went 8 % slower
    // (`throughput-down` on tunnel-grpc, 423–461 against 471–508 MB/s; in the hub's CPU profile the
    // copy saved 0.19 s, and writing on from the many small views cost more: TLS writev +0.13 s,
    // garbage collection +0.07 s). Clients' uploads did not.
    onGone: (l) => {
      call.on('end', () => l('agent ended the stream'));
      call.on('error', (err: Error & { code?: number }) => {
        metrics?.streamError('from_agent', grpcCodeName(err.code));
        l(`stream error: ${err.message}`);
      });
      call.on('cancelled', () => {
        metrics?.streamError('from_agent', 'Canceled');
        l('agent stream cancelled');
      });
    },
    close: (error) => {
      if (error) call.endWithStatus(error.code, error.details);
      else if (!call.writableEnded) call.end();
    },
  };
}

export function muxAgentChannel(stream: FramedPacketStream, metrics?: ServerMetrics): AgentChannel {
  return {
    transport: 'mux',
    stream,
    onPacket: (l) => stream.on('data', l),
    offPacket: (l) => stream.removeListener('data', l),
    onDataViews: (h) => stream.onDataViews(h),
    onGone: (l) => {
      stream.on('end', () => l('agent ended the stream'));
      stream.on('error', (err: Error) => {
        metrics?.streamError('from_agent', 'Unavailable');
        l(`stream error: ${err.message}`);
      });
      stream.on('close', () => l('agent connection closed'));
    },
    close: () => stream.end(),
  };
}

export interface AgentBackendOptions {
  agentID: string;
  cluster: string;
  hosts: string[];
  cidrs: string[];
  defaultRoute: boolean;
  credit: boolean;
  halfClose: boolean;
  /** The agent understands DRAIN from the server (we are shutting down). */
  serverDrain?: boolean;
  /** The link's key for the gateway's identity MAC (CAP_GATEWAY_HMAC in effect), or null: identities are signed. */
  identityKey?: KeyObject | null;
  /** Window we grant the agent per connection at first. */
  window: number;
  /** Window the agent granted us, or null. */
  peerWindow: number | null;
  /** The hub's memory budget (one per process). */
  budget: MemoryBudget;
  log: Logger;
  metrics?: ServerMetrics;
}

/** open: dials go to the agent; draining: the agent sent DRAIN (routes pick another while there is
 * one); closed: the stream ended and every connection on it failed. Changed only by enter(). */
export type AgentBackendState = 'open' | 'draining' | 'closed';

let nextDialID = BigInt(Date.now()) << 16n; // process-wide, so dial IDs never repeat across agents

export class AgentBackend implements Routable, ConnectionBackend {
  readonly key: string;
  readonly agentID: string;
  readonly cluster: string;
  readonly hosts: string[];
  readonly cidrs: string[];
  readonly defaultRoute: boolean;
  readonly credit: boolean;
  readonly halfClose: boolean;
  readonly serverDrain: boolean;
  readonly identityKey: KeyObject | null;
  readonly window: number;
  readonly peerWindow: number | null;
  readonly budget: MemoryBudget;
  readonly sender: StreamSender;
  readonly connectedAt = new Date();
  private state: AgentBackendState = 'open';
  /** Our dials by dial ID until the agent answers, established connections by the agent's connect ID. */
  private readonly conns: ConnectionTable<ProxiedConnection>;
  private readonly log: Logger;
  readonly metrics: ServerMetrics;
  private onClosed: (() => void) | null = null;

  constructor(
    private readonly channel: AgentChannel,
    opts: AgentBackendOptions,
    streamNo: number,
  ) {
    this.agentID = opts.agentID;
    this.key = `${opts.agentID}#${streamNo}`;
    this.cluster = opts.cluster;
    this.hosts = opts.hosts;
    this.cidrs = opts.cidrs;
    this.defaultRoute = opts.defaultRoute;
    this.credit = opts.credit;
    this.halfClose = opts.halfClose;
    this.serverDrain = opts.serverDrain ?? false;
    this.identityKey = opts.identityKey ?? null;
    this.window = opts.window;
    this.peerWindow = opts.peerWindow;
    this.budget = opts.budget;
    this.log = opts.log;
    this.metrics = opts.metrics ?? detachedServerMetrics();
    this.sender = new StreamSender(tapWrites(channel.stream, (t) => this.metrics.packet('to_agent', t)));
    this.conns = new ConnectionTable<ProxiedConnection>({
      send: (p) => this.sender.send(p),
      unknown: 'close-request',
      count: (t) => this.metrics.packet('from_agent', t),
      events: {
        dialResponse: (conn, p) => conn.onDialResponse(p.dialResponse.connectID, p.dialResponse.error, p.dialResponse.reason),
        staleDialResponse: () => this.metrics.dialFailure('unrecognized_response'),
        closeResponse: (conn, p) => conn.onCloseResponse(p.closeResponse.error),
        dialClose: (conn) => {
          this.conns.forget(conn, conn.dialID, 0);
          conn.backendGone();
        },
        drain: () => this.enter('draining'),
        unexpected: (type) => this.log.warn({ type: packetTypeName(type) }, 'unexpected packet from agent, ignored'),
      },
    });
    channel.onPacket(this.conns.dispatch);
    channel.onDataViews?.(this.conns.dispatchDataViews);
    channel.onGone((why) => this.close(why));
  }

  get transport(): 'grpc' | 'mux' {
    return this.channel.transport;
  }

  /** This stream's logger (agentID and cluster on every line); connections make children of it. */
  get logger(): Logger {
    return this.log;
  }

  get pendingCount(): number {
    return this.conns.pendingCount;
  }

  get establishedCount(): number {
    return this.conns.openCount;
  }

  get openConnections(): number {
    return this.conns.openCount + this.conns.pendingCount;
  }

  get closed(): boolean {
    return this.state === 'closed';
  }

  /** The agent said it is going away (DRAIN). */
  get draining(): boolean {
    return this.state === 'draining';
  }

  /** Every change of state, logged here. */
  private enter(state: AgentBackendState, why = ''): void {
    if (this.state === state || this.state === 'closed') return;
    this.state = state;
    if (state === 'draining') this.log.info('agent is draining');
    else this.log.info({ pending: this.conns.pendingCount, established: this.conns.openCount }, `agent stream closed: ${why}`);
  }

  whenClosed(cb: () => void): void {
    this.onClosed = cb;
  }

  // ------------------------------------------------------------ used by ProxiedConnection

  newDialID(): bigint {
    return ++nextDialID;
  }

  sendDialRequest(conn: ProxiedConnection): void {
    this.conns.addDial(conn.dialID, conn);
    this.sender.send(packets.dialRequest(conn.address, conn.dialID));
  }

  sendDialClose(conn: ProxiedConnection): void {
    this.sender.send(packets.closeDial(conn.dialID));
  }

  established(conn: ProxiedConnection): void {
    this.conns.add(conn.connectID, conn);
  }

  sendCredit(conn: ProxiedConnection, bytes: number): void {
    if (this.credit && conn.state === 'open') this.sender.send(packets.credit(conn.connectID, bytes));
  }

  sendHalfClose(conn: ProxiedConnection): void {
    this.sender.send(packets.halfClose(conn.connectID));
  }

  sendCloseRequest(conn: ProxiedConnection): void {
    this.sender.send(packets.closeRequest(conn.connectID));
  }

  forget(conn: ProxiedConnection): void {
    this.conns.forget(conn, conn.dialID, conn.connectID);
  }

  /** The established connections now (a copy: the caller may close them). */
  establishedConnections(): ProxiedConnection[] {
    return this.conns.openConnections();
  }

  summary(): {
    pending: number;
    established: { connectID: number; address: string; state: string; bytesToAgent: number; bytesToClient: number }[];
  } {
    return {
      pending: this.conns.pendingCount,
      established: this.conns.openConnections().map((c) => ({
        connectID: c.connectID,
        address: c.address,
        state: c.state,
        bytesToAgent: c.bytesToAgent,
        bytesToClient: c.bytesToClient,
      })),
    };
  }

  /** Shutdown notice to an agent that negotiated it: it stops counting this replica and finds the others. */
  sendServerDrain(): boolean {
    if (this.state === 'closed' || !this.serverDrain) return false;
    this.sender.send(packets.drain());
    return true;
  }

  /** Ends the stream (if still open) and fails every pending and open connection at once. */
  close(why: string, status?: GrpcStatusError): void {
    if (this.state === 'closed') return;
    this.enter('closed', why);
    const all = this.conns.takeAll();
    this.sender.close();
    this.channel.offPacket(this.conns.dispatch);
    this.channel.onDataViews?.(null);
    for (const c of all) c.backendGone();
    this.channel.close(status);
    this.onClosed?.();
  }
}
