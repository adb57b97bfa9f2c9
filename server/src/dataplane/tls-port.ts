// A TLS listener with two transports chosen by ALPN: our peers ask for "cluster-proxy-mux/1" (framed
// packets over TLS, see proto/src/mux/framing.ts); unmodified ANP peers ask for "h2" and get gRPC,
// handed to our gRPC server (grpc-server.ts) on the already-verified socket. The agent listener (:8091) and the client
// frontend (:8090) are each one of these.
import tls from 'node:tls';
import { FramedPacketStream, MAX_MESSAGE_BYTES, MUX_ALPN, type Hello } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import type { GrpcServer } from './grpc-server.js';
import { avoidPeerCertificateLeak } from '../http/peer-certificate-leak.js';

/** ALPN of the HTTP/1.1 service a port may carry beside gRPC and mux (the hub API). */
export const HTTP1_ALPN = 'http/1.1';

/** Takes the HTTP/1.1 connections of a port (the hub API, wired by the proxy server). */
export interface Http1Service {
  accept(socket: tls.TLSSocket): void;
}

export interface TlsPortOptions {
  /** "agent" or "frontend", for logs. */
  name: string;
  host: string;
  port: number;
  tls: { caCert: Buffer; cert: Buffer; key: Buffer };
  /** The gRPC server that handles "h2" connections. */
  grpcServer: GrpcServer;
  /** A mux peer said hello: answer it (and take over the stream) or refuse. */
  onHello: (stream: FramedPacketStream, hello: Hello, socket: tls.TLSSocket, peer: string) => void;
  /**
   * Serve an HTTP/1.1 service (the hub API) on this port (ALPN "http/1.1"). Its bootstrap endpoint is
   * reached without a client certificate, so TLS then accepts unverified peers and every other protocol
   * checks `socket.authorized` itself.
   */
  http1?: Http1Service;
  log: Logger;
}

/** A peer must say hello this soon after the TLS handshake. */
const HELLO_TIMEOUT_MS = 10_000;

export class TlsPort {
  private readonly server: tls.Server;
  private readonly sockets = new Set<tls.TLSSocket>();
  private readonly refusals = new Map<string, number>();

  constructor(private readonly opts: TlsPortOptions) {
    avoidPeerCertificateLeak();
    this.server = tls.createServer({
      ca: opts.tls.caCert,
      cert: opts.tls.cert,
      key: opts.tls.key,
      requestCert: true,
      rejectUnauthorized: !opts.http1,
      ALPNProtocols: opts.http1 ? [MUX_ALPN, 'h2', HTTP1_ALPN] : [MUX_ALPN, 'h2'],
    });
    this.server.on('secureConnection', this.onConnection);
    this.server.on('tlsClientError', this.onTlsError);
  }

  listen(): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.once('error', (err) => reject(new Error(`cannot listen on ${this.opts.host}:${this.opts.port}: ${err.message}`)));
      this.server.listen(this.opts.port, this.opts.host, () => resolve((this.server.address() as { port: number }).port));
    });
  }

  /** New certificate and trust bundle for handshakes from now on; open connections keep going. */
  setTls(m: { caCert: Buffer; cert: Buffer; key: Buffer }): void {
    this.server.setSecureContext({ ca: m.caCert, cert: m.cert, key: m.key });
  }

  /** Stops accepting and drops mux connections; gRPC sessions are closed by the gRPC server. */
  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const s of this.sockets) s.destroy();
    await closed;
  }

  private readonly onConnection = (socket: tls.TLSSocket): void => {
    socket.setNoDelay(true);
    if (this.opts.http1 && socket.alpnProtocol === HTTP1_ALPN) {
      this.opts.http1.accept(socket);
      return;
    }
    if (!socket.authorized) {
      // Only the hub API takes unverified peers; refuse as TLS would have.
      this.onTlsError(new Error('client certificate not verified'), socket);
      return;
    }
    if (socket.alpnProtocol !== MUX_ALPN) {
      this.opts.grpcServer.injectConnection(socket);
      return;
    }
    this.sockets.add(socket);
    socket.once('close', () => this.sockets.delete(socket));
    socket.on('error', () => {}); // reported through the stream
    const stream = new FramedPacketStream(socket, MAX_MESSAGE_BYTES);
    const peer = `${socket.remoteAddress}:${socket.remotePort}`;
    const timer = setTimeout(() => {
      this.opts.log.warn({ peer }, `${this.opts.name} peer sent no hello in time; closing`);
      socket.destroy();
    }, HELLO_TIMEOUT_MS);
    stream.once('close', () => clearTimeout(timer));
    stream.on('error', (err: Error) => this.opts.log.warn({ peer }, `${this.opts.name} connection failed: ${err.message}`));
    stream.once('hello', (hello: Hello) => {
      clearTimeout(timer);
      this.opts.onHello(stream, hello, socket, peer);
    });
  };

  /** Refused handshakes, with the reason, at most once a minute per peer and reason. */
  private readonly onTlsError = (err: Error, socket: tls.TLSSocket): void => {
    // With a 'tlsClientError' listener Node leaves the failed socket to us (even on handshake timeout).
    socket.destroy();
    const reason = socket.authorizationError ? String(socket.authorizationError) : err.message;
    const peer = socket.remoteAddress ?? 'unknown';
    const key = `${peer} ${reason}`;
    const now = Date.now();
    if ((this.refusals.get(key) ?? 0) > now - 60_000) return;
    if (this.refusals.size > 1000) this.refusals.clear();
    this.refusals.set(key, now);
    this.opts.log.warn({ peer }, `TLS handshake on the ${this.opts.name} listener refused: ${reason}`);
  };
}
