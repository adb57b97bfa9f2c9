// How an agent reaches one proxy server: our framed transport over TLS (ALPN "cluster-proxy-mux/1"),
// or ANP's AgentService.Connect over gRPC. Both give a "link": a packet stream plus the server's
// response headers.
import { isIP } from 'node:net';
import * as grpc from '@grpc/grpc-js';
import { AGENT_CONNECT_PATH, HTTP2_CONNECTION_WINDOW, MAX_MESSAGE_BYTES, connectMux, decodePacket, encodePacket, splitHostPort, type Hello, type Packet, type PacketStream } from '@cluster-proxy/proto';
import { connectThroughProxy } from './egress-proxy.js';
import { startLocalProxyShim } from './egress-shim.js';

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

function onlyOnce(l: (err: Error) => void): (err: Error) => void {
  let called = false;
  return (err) => {
    if (called) return;
    called = true;
    l(err);
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
    return await grpcLink(opts, shim ? shim.address : opts.address, serverName, () => void shim?.close());
  } catch (err) {
    await shim?.close();
    // gRPC only saw a reset from the shim; the proxy's answer says what really happened.
    throw proxyError ?? err;
  }
}

function grpcLink(opts: LinkOptions, address: string, serverName: string | undefined, onClose: () => void): Promise<Link> {
  const client = new grpc.Client(address, grpc.credentials.createSsl(opts.caCert, opts.key, opts.cert), {
    ...(serverName ? { 'grpc.ssl_target_name_override': serverName, 'grpc.default_authority': serverName } : {}),
    // Every link needs its own TCP connection (one per replica behind a load balancer).
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
  for (const [k, v] of Object.entries(opts.metadata)) md.set(k, v);
  const call = client.makeBidiStreamRequest(AGENT_CONNECT_PATH, encodePacket, decodePacket, md);
  let closed = false;
  const close = (): void => {
    if (closed) return;
    closed = true;
    call.removeAllListeners('data');
    call.on('error', () => {}); // late errors after cancel are expected
    call.cancel();
    client.close();
    onClose();
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
    const timer = setTimeout(() => fail(new Error(`no response headers from ${opts.address} within ${opts.headerTimeoutMs} ms`)), opts.headerTimeoutMs);
    opts.signal.addEventListener('abort', onAbort, { once: true });
    const onError = (err: grpc.ServiceError): void => fail(new Error(describeStatus(err)));
    call.on('error', onError);
    call.once('metadata', (headers: grpc.Metadata) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal.removeEventListener('abort', onAbort);
      call.removeListener('error', onError);
      resolve({
        transport: 'grpc',
        stream: call,
        header: (key) => headers.get(key).map(String),
        onPacket: (l) => call.on('data', l),
        offPacket: (l) => call.removeListener('data', l),
        onGone: (l) => {
          const once = onlyOnce(l);
          call.on('error', (err: grpc.ServiceError) => once(new Error(describeStatus(err))));
          call.on('end', () => once(new Error('server ended the stream')));
        },
        close,
      });
    });
  });
}

function describeStatus(err: grpc.ServiceError): string {
  const name = grpc.status[err.code] ?? String(err.code);
  return `${name}: ${err.details || err.message}`;
}
