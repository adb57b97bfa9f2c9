// How an agent reaches one proxy server: our framed transport over TLS (ALPN "cluster-proxy-mux/1"),
// or ANP's AgentService.Connect over gRPC. Both give a "link": a packet stream plus the server's
// response headers.
import { isIP } from 'node:net';
import { connectMux, splitHostPort, type Hello, type Packet, type PacketStream } from '@cluster-proxy/proto';
import { connectThroughProxy } from './egress-proxy.js';
import { startLocalProxyShim } from './egress-shim.js';
import { onlyOnce } from './only-once.js';

export type AgentTransport = 'mux' | 'grpc';

export interface Link {
  readonly transport: AgentTransport;
  readonly stream: PacketStream;
  header(key: string): string[];
  onPacket(listener: (p: Packet) => void): void;
  offPacket(listener: (p: Packet) => void): void;
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
  /** Reach the hub through this HTTP(S) CONNECT proxy (SPEC §8). */
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
  // grpc-js cannot take a socket (grpc-node#2359) and its own proxy support is too narrow (SPEC §8),
  // so through a proxy it dials a loopback shim that CONNECTs each connection for it.
  const hp = splitHostPort(opts.address);
  if (!hp) throw new Error(`hub address "${opts.address}" is not HOST:PORT`);
  let proxyError: Error | null = null;
  const shim = opts.egress
    ? await startLocalProxyShim({ proxy: opts.egress.proxy, target: hp, timeoutMs: opts.egress.connectTimeoutMs, ca: opts.egress.ca, onError: (e) => (proxyError = e) })
    : null;
  const serverName = opts.serverName ?? (shim && !isIP(hp.host) ? hp.host : undefined);
  try {
    // grpc-js is loaded on first use: an agent talking mux to our hub never pays its ~10 MiB.
    const { grpcLink } = await import('./grpc-link.js');
    return await grpcLink(opts, shim ? shim.address : opts.address, serverName, () => void shim?.close());
  } catch (err) {
    await shim?.close();
    // gRPC only saw a reset from the shim; the proxy's answer says what really happened.
    throw proxyError ?? err;
  }
}
