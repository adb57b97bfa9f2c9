// How an agent reaches one proxy server: our framed transport over TLS (ALPN "cluster-proxy-mux/1"),
// or ANP's AgentService.Connect over gRPC. Both give a "link": a packet stream plus the server's
// response headers.
import { isIP } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { connectMux, linkIdentityKey, splitHostPort, type Hello } from '@cluster-proxy/proto';
import { connectThroughProxy } from './egress-proxy.js';
import { onlyOnce } from './only-once.js';
import type { AgentTransport, EgressOptions, Link, LinkOptions } from './link.js';

export type { AgentTransport, EgressOptions, Link, LinkOptions };

export async function openMuxLink(opts: LinkOptions): Promise<Link> {
  const hello: Hello = {};
  for (const [k, v] of Object.entries(opts.metadata)) hello[k] = [v];
  const hp = splitHostPort(opts.address);
  if (!hp) throw new Error(`hub address "${opts.address}" is not HOST:PORT`);
  // Through a proxy: CONNECT first, then our TLS (verified against the hub's name) inside the tunnel.
  const socket = opts.egress
    ? await connectThroughProxy({
        proxy: opts.egress.proxy,
        target: hp,
        timeoutMs: opts.egress.connectTimeoutMs,
        ca: opts.egress.ca,
        signal: opts.signal,
      })
    : undefined;
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
    // The stream runs on the TLS socket connectMux made (inside the egress tunnel, if any: TLS is end to end).
    identityKey: () => linkIdentityKey(stream.socket as TLSSocket),
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
  const socket = opts.egress
    ? await connectThroughProxy({
        proxy: opts.egress.proxy,
        target: hp,
        timeoutMs: opts.egress.connectTimeoutMs,
        ca: opts.egress.ca,
        signal: opts.signal,
      })
    : undefined;
  const serverName = opts.serverName ?? (socket && !isIP(hp.host) ? hp.host : undefined);
  try {
    // Loaded on first use (an agent on the mux transport never needs it); node:http2 itself comes with proto.
    const { grpcLink } = await import('./grpc-link.js');
    return await grpcLink(opts, serverName, socket);
  } catch (err) {
    socket?.destroy();
    throw err;
  }
}
