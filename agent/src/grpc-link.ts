// The gRPC link (ANP's AgentService.Connect over grpc-js), in its own module so that grpc-js is only
// loaded by agents that use it (`--transport grpc`, or `auto` against an ANP hub).
import * as grpc from '@grpc/grpc-js';
import { AGENT_CONNECT_PATH, HTTP2_CONNECTION_WINDOW, MAX_MESSAGE_BYTES, decodePacket, encodePacket } from '@cluster-proxy/proto';
import type { Link, LinkOptions } from './links.js';
import { onlyOnce } from './only-once.js';

export function grpcLink(opts: LinkOptions, address: string, serverName: string | undefined, onClose: () => void): Promise<Link> {
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
