export * from './packet.js';
export * from './codec.js';
export * from './identifiers.js';
export * from './metadata.js';
export * from './services.js';
export * from './limits.js';
export * from './flow-control.js';
export * from './errors.js';
export * from './stream-sender.js';
export * from './framing.js';
export * from './mux-connect.js';
export * from './health-checks.js';
export * from './grpc-framing.js';
export * from './grpc-client.js';
export * from './session-watchdog.js';
export * from './h2-transport.js';

import { fileURLToPath } from 'node:url';
/** Directory holding client.proto and agent.proto (for tools that load the .proto files). */
export const PROTO_DIR = fileURLToPath(new URL('..', import.meta.url));
export * from './registration-proof.js';
export * from './lazy-log.js';
export * from './memory-budget.js';
export * from './gateway-identity.js';
export * from './http-headers.js';
export * from './stdio-flushed.js';
export * from './http-upgrade.js';
export * from './socket-options.js';
export * from './pinned-bytes.js';
