// A reusable tunnel to the hub's client frontend. Against our hub, every connection shares one
// multiplexed TLS connection (ALPN "cluster-proxy-mux/1", per-connection credit); against any other
// ANP-compatible hub, each connection gets its own gRPC Proxy stream on one channel, as
// konnectivity-client's CreateGRPCTunnel does.
import { CLIENT_HTTP2_WINDOW, GrpcClient, HTTP2_CONNECTION_WINDOW, MAX_MESSAGE_BYTES } from '@cluster-proxy/proto';
import { TunnelError } from './errors.js';
import { GrpcLegFactory, type LegFactory } from './legs.js';
import { MuxUnsupportedError } from '@cluster-proxy/proto';
import { MuxLegFactory } from './mux-session.js';
import { TunnelSocket, type ConnectOptions } from './tunnel-socket.js';

/**
 * How a {@link Tunnel} talks to the hub: `mux` multiplexes every connection over one TLS connection
 * (our framed transport, per-connection credit); `grpc` opens one ANP `Proxy` stream per connection;
 * `auto` tries `mux` and falls back to `grpc` against a hub that does not offer it.
 */
export type TunnelTransport = 'auto' | 'mux' | 'grpc';

/** Where the hub's client frontend is and how to authenticate to it. */
export interface TunnelOptions {
  /** `host:port` of the hub's client frontend (mTLS), or `unix:///path/to.sock` (plain gRPC). */
  address: string;
  /** PEM contents; required for TCP, ignored for a Unix socket. */
  caCert?: Buffer;
  /** PEM client certificate signed by the hub CA (a hub user's, not an agent's); required for TCP. */
  cert?: Buffer;
  /** PEM private key of `cert`; required for TCP. */
  key?: Buffer;
  /** TLS name to verify instead of the address host. */
  serverName?: string;
  /** 'auto' (default): multiplexed when the hub supports it, else gRPC. A Unix socket is always gRPC. */
  transport?: TunnelTransport;
}

/**
 * A reusable tunnel to the hub's client frontend, from which connections to services inside managed
 * clusters are dialed. Against our hub every connection shares one multiplexed TLS connection; against
 * any other ANP-compatible hub each connection gets its own gRPC `Proxy` stream on one HTTP/2 connection.
 * Nothing is connected until the first dial.
 */
export class Tunnel {
  private readonly client: GrpcClient;
  private readonly grpcLegs: GrpcLegFactory;
  private readonly mux: MuxLegFactory | null;
  private transport: TunnelTransport;
  private readonly open = new Set<TunnelSocket>();
  private closed = false;

  /**
   * A tunnel to the hub at `opts.address`; it connects on the first dial.
   * @param opts Where the hub is and the credentials to present.
   * @throws Error when a TCP address comes without `caCert`, `cert` and `key`.
   */
  constructor(readonly opts: TunnelOptions) {
    const uds = opts.address.startsWith('unix:');
    if (!uds && (!opts.caCert || !opts.cert || !opts.key))
      throw new Error(`connecting to ${opts.address} over TCP needs caCert, cert and key (mTLS)`);
    // gRPC on node:http2 (proto's grpc-client.ts); it connects on the first gRPC dial only.
    this.client = new GrpcClient({
      address: opts.address,
      tls: uds ? undefined : { ca: opts.caCert!, cert: opts.cert, key: opts.key, serverName: opts.serverName },
      // A large receive window so downloads are not capped at 64 KiB per round trip.
      streamWindow: CLIENT_HTTP2_WINDOW,
      connectionWindow: HTTP2_CONNECTION_WINDOW,
      maxMessageBytes: MAX_MESSAGE_BYTES,
      keepalive: { intervalMs: 30_000, timeoutMs: 10_000 },
    });
    this.grpcLegs = new GrpcLegFactory(this.client);
    this.transport = uds ? 'grpc' : (opts.transport ?? 'auto');
    this.mux =
      this.transport === 'grpc'
        ? null
        : new MuxLegFactory({ address: opts.address, caCert: opts.caCert!, cert: opts.cert!, key: opts.key!, serverName: opts.serverName });
  }

  /**
   * Like `net.connect`: returns at once; the socket emits `connect` when the agent reached the
   * destination, or `error` with a {@link TunnelError}. Writes made before then wait for the dial.
   * @param destination `host:port` as the agent should dial it, e.g. `cluster1:443` for cluster1's apiserver.
   */
  connect(destination: string, opts: ConnectOptions = {}): TunnelSocket {
    const socket = new TunnelSocket(destination, opts, (s) => this.open.delete(s));
    if (this.closed) {
      socket.failToStart(new TunnelError('tunnelclosed', destination, `tunnel is closed; cannot dial ${destination}`));
      return socket;
    }
    this.open.add(socket);
    this.legs().then(
      (legs) => socket.attach(legs),
      (err: Error) =>
        socket.failToStart(
          new TunnelError(
            'tunnelclosed',
            destination,
            `tunnel to ${destination} failed: cannot reach the hub at ${this.opts.address}: ${err.message}`,
          ),
        ),
    );
    return socket;
  }

  /**
   * Dials and waits: resolves with an open connection, or rejects with a {@link TunnelError}.
   * @param destination `host:port` as the agent should dial it, e.g. `cluster1:443`.
   */
  async dial(destination: string, opts: ConnectOptions = {}): Promise<TunnelSocket> {
    if (this.closed) throw new TunnelError('tunnelclosed', destination, `tunnel is closed; cannot dial ${destination}`);
    const socket = this.connect(destination, opts);
    try {
      await new Promise<void>((resolve, reject) => {
        const done = (): void => {
          socket.off('connect', onConnect);
          socket.off('error', onError);
          socket.off('close', onClose);
        };
        const onConnect = (): void => {
          done();
          resolve();
        };
        const onError = (err: Error): void => {
          done();
          reject(err);
        };
        // Closed (e.g. tunnel.close()) before the agent reached the destination: no 'connect' will come.
        const onClose = (): void => {
          done();
          reject(new TunnelError('tunnelclosed', destination, `tunnel closed before ${destination} was reached`));
        };
        socket.once('connect', onConnect);
        socket.once('error', onError);
        socket.once('close', onClose);
      });
    } catch (err) {
      socket.destroy();
      throw err;
    }
    return socket;
  }

  /** Connections of this tunnel that are dialing or open. */
  get openConnections(): number {
    return this.open.size;
  }

  /** The transport in use: 'mux' or 'grpc' ('auto' until the first dial found out). */
  get activeTransport(): TunnelTransport {
    return this.transport;
  }

  /** Closes every connection and the transport. */
  close(): void {
    this.closed = true;
    for (const s of this.open) s.destroy();
    this.open.clear();
    this.mux?.close();
    this.client.close();
  }

  private async legs(): Promise<LegFactory> {
    if (this.transport === 'grpc' || !this.mux) return this.grpcLegs;
    try {
      await this.mux.ready();
      this.transport = 'mux';
      return this.mux;
    } catch (err) {
      if (err instanceof MuxUnsupportedError && this.transport === 'auto') {
        this.transport = 'grpc'; // an ANP hub: remember
        return this.grpcLegs;
      }
      throw err;
    }
  }
}
