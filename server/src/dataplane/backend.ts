// One agent's Connect stream on the hub: the packets it carries, the dials pending on it and the
// connections established through it. Connection IDs are the agent's; they are only looked up in
// this stream's own tables, so IDs repeated by another stream (a reconnect, a duplicate agent
// stream, an HA peer) can never collide.
import { PacketType, StreamSender, packetTypeName, packets, tapWrites, type DataViewHandler, type FramedPacketStream, type MemoryBudget, type Packet, type PacketStream } from '@cluster-proxy/proto';
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
  /** Window we grant the agent per connection at first. */
  window: number;
  /** Window the agent granted us, or null. */
  peerWindow: number | null;
  /** The hub's memory budget (one per process). */
  budget: MemoryBudget;
  log: Logger;
  metrics?: ServerMetrics;
}

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
  readonly window: number;
  readonly peerWindow: number | null;
  readonly budget: MemoryBudget;
  readonly sender: StreamSender;
  readonly connectedAt = new Date();
  draining = false;
  private closedFlag = false;
  private readonly pending = new Map<bigint, ProxiedConnection>();
  private readonly conns = new Map<number, ProxiedConnection>();
  private readonly log: Logger;
  readonly metrics: ServerMetrics;
  private onClosed: (() => void) | null = null;

  constructor(private readonly channel: AgentChannel, opts: AgentBackendOptions, streamNo: number) {
    this.agentID = opts.agentID;
    this.key = `${opts.agentID}#${streamNo}`;
    this.cluster = opts.cluster;
    this.hosts = opts.hosts;
    this.cidrs = opts.cidrs;
    this.defaultRoute = opts.defaultRoute;
    this.credit = opts.credit;
    this.halfClose = opts.halfClose;
    this.serverDrain = opts.serverDrain ?? false;
    this.window = opts.window;
    this.peerWindow = opts.peerWindow;
    this.budget = opts.budget;
    this.log = opts.log;
    this.metrics = opts.metrics ?? detachedServerMetrics();
    this.sender = new StreamSender(tapWrites(channel.stream, (t) => this.metrics.packet('to_agent', t)));
    channel.onPacket(this.onPacket);
    channel.onDataViews?.(this.onDataViews);
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
    return this.pending.size;
  }

  get establishedCount(): number {
    return this.conns.size;
  }

  get openConnections(): number {
    return this.conns.size + this.pending.size;
  }

  get closed(): boolean {
    return this.closedFlag;
  }

  whenClosed(cb: () => void): void {
    this.onClosed = cb;
  }

  // ------------------------------------------------------------ used by ProxiedConnection

  newDialID(): bigint {
    return ++nextDialID;
  }

  sendDialRequest(conn: ProxiedConnection): void {
    this.pending.set(conn.dialID, conn);
    this.sender.send(packets.dialRequest(conn.address, conn.dialID));
  }

  sendDialClose(conn: ProxiedConnection): void {
    this.sender.send(packets.closeDial(conn.dialID));
  }

  established(conn: ProxiedConnection): void {
    this.conns.set(conn.connectID, conn);
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
    if (this.pending.get(conn.dialID) === conn) this.pending.delete(conn.dialID);
    if (conn.connectID && this.conns.get(conn.connectID) === conn) this.conns.delete(conn.connectID);
  }

  /** The established connections now (a copy: the caller may close them). */
  establishedConnections(): ProxiedConnection[] {
    return [...this.conns.values()];
  }

  summary(): { pending: number; established: { connectID: number; address: string; state: string; bytesToAgent: number; bytesToClient: number }[] } {
    return {
      pending: this.pending.size,
      established: [...this.conns.values()].map((c) => ({ connectID: c.connectID, address: c.address, state: c.state, bytesToAgent: c.bytesToAgent, bytesToClient: c.bytesToClient })),
    };
  }

  // ------------------------------------------------------------ inbound packets

  /** DATA from the agent, its payload not copied into one Buffer. */
  private readonly onDataViews = (connectID: number, chunks: readonly Buffer[], n: number): void => {
    this.metrics.packet('from_agent', PacketType.DATA);
    this.connectionForData(connectID)?.onChunks(chunks, n);
  };

  private connectionForData(connectID: number): ProxiedConnection | undefined {
    const conn = this.conns.get(connectID);
    if (!conn && connectID !== 0) this.sender.send(packets.closeRequest(connectID));
    return conn;
  }

  private readonly onPacket = (p: Packet): void => {
    this.metrics.packet('from_agent', p.type);
    switch (p.type) {
      case PacketType.DIAL_RSP: {
        const r = p.dialResponse;
        const conn = this.pending.get(r.random);
        if (!conn) {
          // Abandoned (timed out or cancelled): do not leave the agent's connection open.
          this.metrics.dialFailure('unrecognized_response');
          if (r.connectID !== 0) this.sender.send(packets.closeRequest(r.connectID));
          return;
        }
        this.pending.delete(r.random);
        conn.onDialResponse(r.connectID, r.error, r.reason);
        return;
      }
      case PacketType.DATA:
        this.connectionForData(p.data.connectID)?.onData(p.data.data);
        return;
      case PacketType.CLOSE_RSP:
        this.conns.get(p.closeResponse.connectID)?.onCloseResponse(p.closeResponse.error);
        return;
      case PacketType.CREDIT:
        this.conns.get(p.credit.connectID)?.onCredit(p.credit.bytes);
        return;
      case PacketType.HALF_CLOSE:
        this.conns.get(p.halfClose.connectID)?.onHalfClose();
        return;
      case PacketType.DIAL_CLS: {
        const conn = this.pending.get(p.closeDial.random);
        if (conn) {
          this.pending.delete(p.closeDial.random);
          conn.backendGone();
        }
        return;
      }
      case PacketType.DRAIN:
        if (!this.draining) this.log.info('agent is draining');
        this.draining = true;
        return;
      default:
        this.log.warn({ type: packetTypeName(p.type) }, 'unexpected packet from agent, ignored');
    }
  };

  /** Shutdown notice to an agent that negotiated it: it stops counting this replica and finds the others. */
  sendServerDrain(): boolean {
    if (this.closedFlag || !this.serverDrain) return false;
    this.sender.send(packets.drain());
    return true;
  }

  /** Ends the stream (if still open) and fails every pending and open connection at once. */
  close(why: string, status?: GrpcStatusError): void {
    if (this.closedFlag) return;
    this.closedFlag = true;
    this.log.info({ pending: this.pending.size, established: this.conns.size }, `agent stream closed: ${why}`);
    const all = [...this.pending.values(), ...this.conns.values()];
    this.pending.clear();
    this.conns.clear();
    this.sender.close();
    this.channel.offPacket(this.onPacket);
    this.channel.onDataViews?.(null);
    for (const c of all) c.backendGone();
    this.channel.close(status);
    this.onClosed?.();
  }
}
