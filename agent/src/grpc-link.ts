// The gRPC link: ANP's AgentService.Connect, on node:http2 through proto's GrpcClient (no grpc-js).
// Imported only when a gRPC link is opened (`--transport grpc`, or `auto` against an ANP hub).
import type { Duplex } from 'node:stream';
import {
  AGENT_CONNECT_PATH,
  GrpcClient,
  HTTP2_CONNECTION_WINDOW,
  HTTP2_STREAM_WINDOW,
  MAX_MESSAGE_BYTES,
  linkIdentityKey,
  type GrpcCallError,
} from '@cluster-proxy/proto';
import type { Link, LinkOptions } from './link.js';
import { onlyOnce } from './only-once.js';

/**
 * Ping interval per hub address after a "too_many_pings" GOAWAY (ANP's agent listener enforces 30 s):
 * doubled each time and kept for the agent's later links, so it does not trip the server again.
 */
const pingIntervals = new Map<string, number>();

/** Opens AgentService.Connect on its own connection (`socket`: an egress-proxy tunnel to run TLS over). */
export function grpcLink(opts: LinkOptions, serverName: string | undefined, socket: Duplex | undefined): Promise<Link> {
  // One client per link: every link needs its own TCP connection (one per replica behind a load balancer).
  const client = new GrpcClient({
    address: opts.address,
    tls: { ca: opts.caCert, cert: opts.cert, key: opts.key, serverName },
    socket,
    streamWindow: HTTP2_STREAM_WINDOW,
    connectionWindow: HTTP2_CONNECTION_WINDOW,
    maxMessageBytes: MAX_MESSAGE_BYTES,
    keepalive: { intervalMs: Math.max(opts.keepaliveTimeMs, pingIntervals.get(opts.address) ?? 0), timeoutMs: opts.keepaliveTimeoutMs },
    onTooManyPings: (next) => pingIntervals.set(opts.address, next),
    refWhenIdle: true,
  });
  const call = client.call(AGENT_CONNECT_PATH, opts.metadata);
  let closed = false;
  const close = (): void => {
    if (closed) return;
    closed = true;
    call.removeAllListeners('data');
    call.on('error', () => {}); // late errors after cancel are expected
    call.cancel();
    client.close();
  };
  return new Promise((resolve, reject) => {
    let settled = false;
    const fail = (err: Error): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal.removeEventListener('abort', onAbort);
      close();
      reject(err);
    };
    const onAbort = (): void => fail(new Error('cancelled'));
    const timer = setTimeout(
      () => fail(new Error(`no response headers from ${opts.address} within ${opts.headerTimeoutMs} ms`)),
      opts.headerTimeoutMs,
    );
    opts.signal.addEventListener('abort', onAbort, { once: true });
    const onError = (err: GrpcCallError): void => fail(err);
    call.on('error', onError);
    call.once('metadata', (headers: Record<string, string[]>) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal.removeEventListener('abort', onAbort);
      call.removeListener('error', onError);
      resolve({
        transport: 'grpc',
        stream: call,
        header: (key) => headers[key] ?? [],
        onPacket: (l) => call.on('data', l),
        offPacket: (l) => call.removeListener('data', l),
        onDataViews: (h) => call.onDataViews(h),
        // One client per link and the call on its first session: that session's TLS socket is the link's.
        identityKey: () => {
          const s = client.currentTlsSocket;
          return s ? linkIdentityKey(s) : null;
        },
        onGone: (l) => {
          const once = onlyOnce(l);
          call.on('error', (err: GrpcCallError) => once(err));
          call.on('end', () => once(new Error('server ended the stream')));
        },
        close,
      });
    });
  });
}
