// How an agent reaches one proxy server: our framed transport over TLS (ALPN "cluster-proxy-mux/1"),
// or ANP's AgentService.Connect over gRPC. Both give a "link": a packet stream plus the server's
// response headers.
import { isIP } from 'node:net';
import { connectMux, splitHostPort, type DataViewHandler, type Hello, type Packet, type PacketStream } from '@cluster-proxy/proto';
import { connectThroughProxy } from './egress-proxy.js';
import { onlyOnce } from './only-once.js';

export type AgentTransport = 'mux' | 'grpc';

export interface Link {
  readonly transport: AgentTransport;
  readonly stream: PacketStream;
  header(key: string): string[];
  onPacket(listener: (p: Packet) => void): void;
  offPacket(listener: (p: Packet) => void): void;
  /** DATA payloads as the chunks they arrived in (not copied into one Buffer); null: as packets again. */
  onDataViews?(handler: DataViewHandler | null): void;
  /** Called at most once, when the link ends or breaks. */
  onGone(listener: (err: Error) => void): void;
  close(): void;
}

export interface LinkOptions {
  address: string;
  caCert: Buffer;
  cert: Buffer;
  key: Buffer;
  serverName?: string;
  /** Metadata we send (agentID, identifiers, capabilities, window). */
  metadata: Record<string, string>;
  headerTimeoutMs: number;
  keepaliveTimeMs: number;
  keepaliveTimeoutMs: number;
  /** Aborts a link that is still being opened. */
  signal: AbortSignal;
  /** Reach the hub through this HTTP(S) CONNECT proxy (contract §8). */
  egress?: EgressOptions;
}

export interface EgressOptions {
  proxy: URL;
  /** CA bundle for an https:// proxy. */
  ca?: Buffer;
  connectTimeoutMs: number;
}


export async function openMuxLink(opts: LinkOptions): Promise<Link> {
  const hello: Hello = {};
  for (const [k, v] of Object.entries(opts.metadata)) hello[k] = [v];
  const hp = splitHostPort(opts.address);
  if (!hp) throw new Error(`hub address "${opts.address}" is not HOST:PORT`);
  // Through a proxy: CONNECT first, then our TLS (verified against the hub's name) inside the tunnel.
  const socket = opts.egress ? await connectThroughProxy({ proxy: opts.egress.proxy, target: hp, timeoutMs: opts.egress.connectTimeoutMs, ca: opts.egress.ca, signal: opts.signal }) : undefined;
  const serverName = opts.serverName ?? (socket && !isIP(hp.host) ? hp.host : undefined);
  const { stream, hello: answer } = await connectMux({ ...opts, serverName, hello, timeoutMs: opts.headerTimeoutMs, socket });
  stream.startKeepalive(opts.keepaliveTimeMs, opts.keepaliveTimeoutMs);
  return {
    transport: 'mux',
    stream,
    header: (key) => answer[key] ?? [],
    onPacket: (l) => stream.on('data', l),
    offPacket: (l) => stream.removeListener('data', l),
    onDataViews: (h) => stream.onDataViews(h),
    onGone: (l) => {
      const once = onlyOnce(l);
      stream.on('error', (err: Error) => once(err));
      stream.on('end', () => once(new Error('server ended the stream')));
      stream.on('close', () => once(new Error('connection closed')));
    },
    close: () => stream.destroy(),
  };
}


export async function openGrpcLink(opts: LinkOptions): Promise<Link> {
  const hp = splitHostPort(opts.address);
  if (!hp) throw new Error(`hub address "${opts.address}" is not HOST:PORT`);
  // Through a proxy: CONNECT first, then TLS (verified against the hub's name) and HTTP/2 inside the tunnel.
  const socket = opts.egress ? await connectThroughProxy({ proxy: opts.egress.proxy, target: hp, timeoutMs: opts.egress.connectTimeoutMs, ca: opts.egress.ca, signal: opts.signal }) : undefined;
  const serverName = opts.serverName ?? (socket && !isIP(hp.host) ? hp.host : undefined);
  try {
    // Loaded on first use, like grpc-js was; node:http2 itself comes with proto (a Node built-in).
    const { grpcLink } = await import('./grpc-link.js');
    return await grpcLink(opts, serverName, socket);
  } catch (err) {
    socket?.destroy();
    throw err;
  }
}
