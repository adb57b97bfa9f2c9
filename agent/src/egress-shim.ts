// A loopback TCP listener whose every connection is piped through a new CONNECT tunnel (see
// egress-proxy.ts) to one fixed target. For transports that cannot be handed a ready socket (grpc-js
// dials addresses itself): point them at the shim's 127.0.0.1:PORT and keep TLS end to end (the shim
// only moves bytes; the hub's TLS handshake goes through it untouched, so the hub's certificate must
// still match the name the transport verifies, e.g. via grpc.ssl_target_name_override).
//
// Per connection: the client's first bytes wait in the socket's buffer (at most its high-water mark,
// then in the kernel) while the tunnel is being opened; then pipe() both ways, so a
// slow side applies backpressure to the other. A failure on one side resets the other (the peer sees
// ECONNRESET, not a clean end of stream that could pass for success); a tunnel that cannot be opened
// resets the client and is reported through onError.
import net from 'node:net';
import type tls from 'node:tls';
import { connectThroughProxy, type EgressProxyError } from './egress-proxy.js';

export interface LocalProxyShimOptions {
  proxy: URL;
  target: { host: string; port: number };
  /** CONNECT timeout per connection (TCP + TLS to the proxy + its answer). */
  timeoutMs: number;
  /** CA bundle for an https:// proxy. */
  ca?: Buffer | string;
  /** Loopback address to listen on (default 127.0.0.1); the port is always ephemeral. */
  host?: '127.0.0.1' | '::1';
  /** Called once per connection whose tunnel could not be opened (the client has been reset). */
  onError?: (err: EgressProxyError) => void;
  /** Extra CONNECT request headers (e.g. User-Agent). */
  headers?: Record<string, string>;
}

export interface LocalProxyShim {
  readonly host: string;
  readonly port: number;
  /** HOST:PORT to dial, e.g. "127.0.0.1:40123". */
  readonly address: string;
  /** Accepted connections not yet closed (including ones still waiting for their tunnel). */
  connections(): number;
  /** Stops listening, aborts pending tunnels, destroys live connections; resolves once all are closed. */
  close(): Promise<void>;
}

export async function startLocalProxyShim(opts: LocalProxyShimOptions): Promise<LocalProxyShim> {
  const listenHost = opts.host ?? '127.0.0.1';
  if (listenHost !== '127.0.0.1' && listenHost !== '::1') throw new Error(`proxy shim must listen on loopback, not ${String(listenHost)}`);
  const clients = new Set<net.Socket>();
  const sockets = new Set<net.Socket | tls.TLSSocket>();
  const pending = new Set<AbortController>();
  let closing = false;

  const track = (s: net.Socket | tls.TLSSocket): void => {
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  };

  // allowHalfOpen: a client's FIN is forwarded (pipe ends the tunnel's write side) while the answer
  // keeps flowing back; the socket is destroyed once both directions are done.
  const server = net.createServer({ allowHalfOpen: true }, (client) => {
    if (closing) {
      client.destroy();
      return;
    }
    clients.add(client);
    track(client);
    client.once('close', () => clients.delete(client));
    client.setNoDelay(true);
    client.on('error', () => {}); // reported through the pair's teardown below

    const abort = new AbortController();
    pending.add(abort);
    const onEarlyClose = (): void => abort.abort();
    client.once('close', onEarlyClose);

    connectThroughProxy({
      proxy: opts.proxy,
      target: opts.target,
      timeoutMs: opts.timeoutMs,
      signal: abort.signal,
      allowHalfOpen: true,
      ...(opts.ca !== undefined ? { ca: opts.ca } : {}),
      ...(opts.headers !== undefined ? { headers: opts.headers } : {}),
    }).then(
      (upstream) => {
        pending.delete(abort);
        client.off('close', onEarlyClose);
        track(upstream);
        upstream.on('error', () => {});
        if (client.destroyed || closing) {
          upstream.destroy();
          return;
        }
        upstream.setNoDelay(true);
        // An error (or a close before both directions ended) on one side resets the other.
        upstream.once('close', (hadError) => {
          if (hadError || !upstream.readableEnded) reset(client);
        });
        client.once('close', (hadError) => {
          if (hadError || !client.readableEnded) upstream.destroy();
        });
        client.pipe(upstream);
        upstream.pipe(client);
      },
      (err: EgressProxyError) => {
        pending.delete(abort);
        client.off('close', onEarlyClose);
        reset(client);
        if (err.kind !== 'aborted' || !closing) opts.onError?.(err);
      },
    );
  });

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host: listenHost, port: 0 }, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const addr = server.address();
  if (addr === null || typeof addr === 'string') throw new Error('proxy shim: server.address() returned no TCP address');
  let closed: Promise<void> | undefined;

  return {
    host: listenHost,
    port: addr.port,
    address: `${listenHost.includes(':') ? `[${listenHost}]` : listenHost}:${addr.port}`,
    connections: () => clients.size,
    close() {
      closed ??= (async () => {
        closing = true;
        const stopped = new Promise<void>((resolve) => server.close(() => resolve()));
        for (const a of pending) a.abort();
        await Promise.all([...sockets].map((s) => new Promise<void>((resolve) => {
          if (s.closed) {
            resolve();
            return;
          }
          s.once('close', () => resolve());
          s.destroy();
        })));
        await stopped;
      })();
      return closed;
    },
  };
}

/** Destroys with a TCP RST when possible, so the peer sees ECONNRESET rather than a clean FIN. */
function reset(socket: net.Socket): void {
  if (socket.destroyed) return;
  try {
    socket.resetAndDestroy();
  } catch {
    socket.destroy();
  }
}
