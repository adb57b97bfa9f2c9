// A reusable tunnel: one gRPC channel to the hub's ProxyService, one Proxy stream per connection
// (like konnectivity-client's CreateGRPCTunnel).
import { once } from 'node:events';
import * as grpc from '@grpc/grpc-js';
import { CLIENT_HTTP2_WINDOW, MAX_MESSAGE_BYTES } from '@cluster-proxy/proto';
import { TunnelError } from './errors.js';
import { TunnelSocket, type ConnectOptions } from './tunnel-socket.js';

export interface TunnelOptions {
  /** `host:port` of the hub's gRPC frontend (mTLS), or `unix:///path/to.sock` (plain). */
  address: string;
  /** PEM contents; required for TCP, ignored for a Unix socket. */
  caCert?: Buffer;
  cert?: Buffer;
  key?: Buffer;
  /** TLS name to verify instead of the address host. */
  serverName?: string;
}

export class Tunnel {
  private readonly client: grpc.Client;
  private readonly open = new Set<TunnelSocket>();
  private closed = false;

  constructor(readonly opts: TunnelOptions) {
    const uds = opts.address.startsWith('unix:');
    let creds: grpc.ChannelCredentials;
    if (uds) creds = grpc.credentials.createInsecure();
    else {
      if (!opts.caCert || !opts.cert || !opts.key) throw new Error(`connecting to ${opts.address} over TCP needs caCert, cert and key (mTLS)`);
      creds = grpc.credentials.createSsl(opts.caCert, opts.key, opts.cert);
    }
    const channelOptions: grpc.ChannelOptions = {
      // Raise our receive window so downloads are not capped at 64 KiB per round trip.
      'grpc-node.flow_control_window': CLIENT_HTTP2_WINDOW,
      'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
      'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
      'grpc.enable_http_proxy': 0,
      // Retries buffer every sent message until the call commits; a tunnel never retries a stream.
      'grpc.enable_retries': 0,
      'grpc.keepalive_time_ms': 30_000,
      'grpc.keepalive_timeout_ms': 10_000,
    };
    if (opts.serverName) {
      channelOptions['grpc.ssl_target_name_override'] = opts.serverName;
      channelOptions['grpc.default_authority'] = opts.serverName;
    }
    this.client = new grpc.Client(opts.address, creds, channelOptions);
  }

  /** Like net.connect: returns at once, emits 'connect' when the agent reached the destination. */
  connect(destination: string, opts: ConnectOptions = {}): TunnelSocket {
    if (this.closed) return new TunnelSocket(new TunnelError('tunnelclosed', destination, `tunnel is closed; cannot dial ${destination}`), destination, opts);
    const socket = new TunnelSocket(this.client, destination, opts, (s) => this.open.delete(s));
    this.open.add(socket);
    return socket;
  }

  /** Resolves with an open connection, or rejects with a TunnelError. */
  async dial(destination: string, opts: ConnectOptions = {}): Promise<TunnelSocket> {
    if (this.closed) throw new TunnelError('tunnelclosed', destination, `tunnel is closed; cannot dial ${destination}`);
    const socket = this.connect(destination, opts);
    try {
      await once(socket, 'connect');
    } catch (err) {
      socket.destroy();
      throw err;
    }
    return socket;
  }

  get openConnections(): number {
    return this.open.size;
  }

  /** Closes every connection and the channel. */
  close(): void {
    this.closed = true;
    for (const s of this.open) s.destroy();
    this.open.clear();
    this.client.close();
  }
}
