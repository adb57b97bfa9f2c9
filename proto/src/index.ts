// The package's public surface, folder by folder (proto/README.md says what each module holds).

// wire/: the wire format: ANP's packets and their codec, metadata, limits, errors
export * from './wire/packet.js';
export * from './wire/codec.js';
export * from './wire/identifiers.js';
export * from './wire/metadata.js';
export * from './wire/services.js';
export * from './wire/limits.js';
export * from './wire/errors.js';

// conn/: the connections one stream carries (by dial ID and connect ID), the dispatch of its packets, and
// each connection's half-close per direction
export * from './conn/connection-table.js';
export * from './conn/half-close.js';

// mux/: our framed transport (ALPN cluster-proxy-mux/1)
export * from './mux/framing.js';
export * from './mux/mux-connect.js';

// h2/: our HTTP/2 (the hub's side of gRPC): frames, HPACK, the server session and its streams
export * from './h2/frames.js';
export * from './h2/hpack.js';
export * from './h2/session.js';

// grpc/: gRPC on node:http2 (ANP's transport)
export * from './grpc/grpc-framing.js';
export * from './grpc/grpc-client.js';
export * from './grpc/grpc-client-call.js';
export * from './grpc/session-watchdog.js';
export * from './grpc/h2-transport.js';

// flow/: flow control and the bytes held for peers
export * from './flow/flow-control.js';
export * from './flow/sent-gate.js';
export * from './flow/stream-sender.js';
export * from './flow/memory-budget.js';
export * from './flow/pinned-bytes.js';
export * from './flow/queued-bytes.js';

// http/: HTTP pieces both hub and agent use: the gateway's identity and headers, upgrades, health checks, registration proofs
export * from './http/health-checks.js';
export * from './http/registration-proof.js';
export * from './http/gateway-identity.js';
export * from './http/identity-names.js';
export * from './http/http-headers.js';
export * from './http/http-upgrade.js';
export * from './http/message-parser.js';
export * from './http/chunked.js';
export * from './http/node-http.js';

// runtime/: process runtime: logging, lazy loading, socket options, metrics
export * from './runtime/lazy-log.js';
export * from './runtime/stdio-flushed.js';
export * from './runtime/socket-options.js';
export * from './runtime/lazy-module.js';

import { fileURLToPath } from 'node:url';
/** Directory holding client.proto and agent.proto (for tools that load the .proto files). */
export const PROTO_DIR = fileURLToPath(new URL('..', import.meta.url));
