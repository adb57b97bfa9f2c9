// One AgentService.Connect stream to one proxy-server replica. It announces who we are (agentID,
// agentIdentifiers, capabilities), reads serverID/serverCount from the response headers, and then
// serves DIAL_REQ / DATA / CLOSE_REQ / DIAL_CLS / CREDIT / HALF_CLOSE for the connections it carries.
import { EventEmitter } from 'node:events';
import * as grpc from '@grpc/grpc-js';
import {
  AGENT_CONNECT_PATH, CAP_CREDIT, CAP_HALF_CLOSE, HTTP2_CONNECTION_WINDOW, MAX_MESSAGE_BYTES, MD_AGENT_ID, MD_AGENT_IDENTIFIERS,
  MD_CAPABILITIES, MD_SERVER_COUNT, MD_SERVER_ID, MD_WINDOW, PacketType, StreamSender, decodePacket, encodePacket, packetTypeName,
  packets, parseCapabilities, type Packet,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { EndpointConnection, type EndpointOwner } from './endpoint-connection.js';
import { DialFailure, type TargetDialer } from './target-dialer.js';

export interface ServerConnectionOptions {
  /** host:port of the hub's agent listener (or its load balancer). */
  address: string;
  credentials: grpc.ChannelCredentials;
  /** Extra channel options, e.g. grpc.ssl_target_name_override. */
  channelOptions?: grpc.ChannelOptions;
  agentID: string;
  identifiers: string;
  window: number;
  dialer: TargetDialer;
  log: Logger;
  /** New dials are refused while this returns true. */
  isDraining: () => boolean;
  nextConnectID: () => number;
  headerTimeoutMs: number;
  keepaliveTimeMs: number;
  keepaliveTimeoutMs: number;
}

export interface ConnectionSummary {
  connectID: number;
  address: string;
  state: string;
  bytesIn: number;
  bytesOut: number;
}

type CallState = 'connecting' | 'open' | 'closed';

/** Emits 'closed' (error: Error | null) exactly once. */
export class ServerConnection extends EventEmitter implements EndpointOwner {
  serverID = '';
  serverCount = 1;
  credit = false;
  halfClose = false;
  peerWindow: number | null = null;
  readonly window: number;
  readonly sender: StreamSender;
  private state: CallState = 'connecting';
  private readonly client: grpc.Client;
  private readonly call: grpc.ClientDuplexStream<Packet, Packet>;
  private readonly conns = new Map<number, EndpointConnection>();
  private readonly byRandom = new Map<bigint, EndpointConnection>();
  private readonly log: Logger;

  constructor(private readonly opts: ServerConnectionOptions) {
    super();
    this.window = opts.window;
    this.log = opts.log;
    this.client = new grpc.Client(opts.address, opts.credentials, {
      ...opts.channelOptions,
      // Every ServerConnection needs its own TCP connection (one per replica behind a load balancer).
      'grpc.use_local_subchannel_pool': 1,
      'grpc-node.flow_control_window': HTTP2_CONNECTION_WINDOW,
      'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
      'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
      'grpc.keepalive_time_ms': opts.keepaliveTimeMs,
      'grpc.keepalive_timeout_ms': opts.keepaliveTimeoutMs,
      'grpc.keepalive_permit_without_calls': 1,
      'grpc.enable_http_proxy': 0,
      // Retries buffer every sent message until the call commits; a tunnel never retries a stream.
      'grpc.enable_retries': 0,
    });
    const md = new grpc.Metadata();
    md.set(MD_AGENT_ID, opts.agentID);
    if (opts.identifiers) md.set(MD_AGENT_IDENTIFIERS, opts.identifiers);
    md.set(MD_CAPABILITIES, [CAP_CREDIT, CAP_HALF_CLOSE].join(','));
    md.set(MD_WINDOW, String(opts.window));
    this.call = this.client.makeBidiStreamRequest(AGENT_CONNECT_PATH, encodePacket, decodePacket, md);
    this.sender = new StreamSender(this.call);
    this.call.on('data', this.onPacket);
    this.call.on('error', (err: grpc.ServiceError) => this.shutdown(new Error(describeStatus(err))));
    this.call.on('end', () => this.shutdown(new Error('server ended the stream')));
  }

  /** Resolves once the server's headers arrived (serverID, serverCount, capabilities). */
  ready(): Promise<void> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        cleanup();
        const err = new Error(`no response headers from ${this.opts.address} within ${this.opts.headerTimeoutMs} ms`);
        this.shutdown(err);
        reject(err);
      }, this.opts.headerTimeoutMs);
      const onMetadata = (md: grpc.Metadata): void => {
        cleanup();
        try {
          this.readHeaders(md);
          this.state = 'open';
          resolve();
        } catch (err) {
          this.shutdown(err as Error);
          reject(err);
        }
      };
      const onClosed = (err: Error | null): void => {
        cleanup();
        reject(err ?? new Error('stream closed before headers'));
      };
      const cleanup = (): void => {
        clearTimeout(timer);
        this.call.removeListener('metadata', onMetadata);
        this.removeListener('closed', onClosed);
      };
      this.call.once('metadata', onMetadata);
      this.once('closed', onClosed);
    });
  }

  private readHeaders(md: grpc.Metadata): void {
    const id = md.get(MD_SERVER_ID);
    const count = md.get(MD_SERVER_COUNT);
    // ANP's agent requires exactly one of each.
    if (id.length !== 1 || count.length !== 1) throw new Error(`server ${this.opts.address} sent no serverID/serverCount headers: not a proxy server?`);
    this.serverID = String(id[0]);
    const n = Number(count[0]);
    if (!Number.isInteger(n) || n < 1) throw new Error(`server ${this.opts.address} sent an invalid serverCount "${String(count[0])}"`);
    this.serverCount = n;
    const caps = parseCapabilities(md.get(MD_CAPABILITIES).map(String).join(','));
    this.credit = caps.has(CAP_CREDIT);
    this.halfClose = caps.has(CAP_HALF_CLOSE);
    if (this.credit) {
      const w = Number(md.get(MD_WINDOW)[0]);
      if (!Number.isSafeInteger(w) || w <= 0) throw new Error(`server ${this.opts.address} announced credit without a valid window`);
      this.peerWindow = w;
    }
  }

  get isOpen(): boolean {
    return this.state === 'open';
  }

  get connectionCount(): number {
    return this.conns.size;
  }

  summary(): ConnectionSummary[] {
    return [...this.conns.values()].map((c) => ({ connectID: c.connectID, address: c.address, state: c.state, bytesIn: c.bytesIn, bytesOut: c.bytesOut }));
  }

  /** Tell the server we are going away: it stops sending new dials here (ANP's DRAIN). */
  sendDrain(): void {
    if (this.state === 'open') this.sender.send(packets.drain());
  }

  /** Closes the stream and every connection it carries. */
  close(): void {
    this.shutdown(null);
  }

  forget(conn: EndpointConnection): void {
    this.conns.delete(conn.connectID);
    if (this.byRandom.get(conn.random) === conn) this.byRandom.delete(conn.random);
  }

  // ------------------------------------------------------------ inbound packets

  private readonly onPacket = (p: Packet): void => {
    switch (p.type) {
      case PacketType.DIAL_REQ:
        this.onDialRequest(p.dialRequest.random, p.dialRequest.address, p.dialRequest.protocol);
        return;
      case PacketType.DATA: {
        const conn = this.conns.get(p.data.connectID);
        if (!conn) {
          // ANP: tell the server so it tears down its half.
          this.sender.send(packets.closeResponse(p.data.connectID, 'unrecognized connectID'));
          return;
        }
        conn.onData(p.data.data);
        return;
      }
      case PacketType.CLOSE_REQ: {
        const conn = this.conns.get(p.closeRequest.connectID);
        if (!conn) {
          this.sender.send(packets.closeResponse(p.closeRequest.connectID, 'Unknown connectID'));
          return;
        }
        conn.onCloseRequest();
        return;
      }
      case PacketType.DIAL_CLS: {
        // ANP's agent ignores DIAL_CLS; we abandon the dial (or close the connection it produced).
        const conn = this.byRandom.get(p.closeDial.random);
        if (conn) conn.onCloseRequest();
        return;
      }
      case PacketType.CREDIT:
        this.conns.get(p.credit.connectID)?.onCredit(p.credit.bytes);
        return;
      case PacketType.HALF_CLOSE:
        this.conns.get(p.halfClose.connectID)?.onHalfClose();
        return;
      default:
        this.log.warn({ type: packetTypeName(p.type) }, 'unexpected packet from server, ignored');
    }
  };

  private onDialRequest(random: bigint, address: string, protocol: string): void {
    const refuse = (reason: string, message: string): void => {
      this.log.info({ address, reason }, `dial refused: ${message}`);
      this.sender.send(packets.dialResponse(random, 0, message, reason));
    };
    if (this.opts.isDraining()) return refuse('draining', 'agent is draining');
    if (this.byRandom.has(random)) return refuse('unknown', 'duplicate dial ID');
    let target;
    try {
      target = this.opts.dialer.resolve(address, protocol);
    } catch (err) {
      if (err instanceof DialFailure) return refuse(err.reason, err.message);
      throw err;
    }
    const conn = new EndpointConnection(this, this.opts.nextConnectID(), random, address, this.log);
    this.conns.set(conn.connectID, conn);
    this.byRandom.set(random, conn);
    const started = process.hrtime.bigint();
    this.opts.dialer.dial(target, conn.abort.signal).then(
      (socket) => {
        if (conn.state !== 'dialing' || this.state === 'closed') {
          socket.destroy();
          return;
        }
        conn.attach(socket);
        this.sender.send(packets.dialResponse(random, conn.connectID));
        this.log.debug({ connectID: conn.connectID, address, ms: Number(process.hrtime.bigint() - started) / 1e6 }, 'dial ok');
      },
      (err: unknown) => {
        if (conn.state !== 'dialing') return; // abandoned: CLOSE_RSP already sent
        this.forget(conn);
        conn.state = 'closed';
        const f = err instanceof DialFailure ? err : new DialFailure('unknown', String(err));
        this.log.info({ address, reason: f.reason }, f.message);
        this.sender.send(packets.dialResponse(random, 0, f.message, f.reason));
      },
    );
  }

  // ------------------------------------------------------------ teardown

  private shutdown(err: Error | null): void {
    if (this.state === 'closed') return;
    this.state = 'closed';
    for (const conn of [...this.conns.values()]) conn.destroy();
    this.conns.clear();
    this.byRandom.clear();
    this.sender.close();
    this.call.removeListener('data', this.onPacket);
    this.call.on('error', () => {}); // late errors after cancel are expected
    this.call.cancel();
    this.client.close();
    this.emit('closed', err);
  }
}

function describeStatus(err: grpc.ServiceError): string {
  const name = grpc.status[err.code] ?? String(err.code);
  return `${name}: ${err.details || err.message}`;
}
