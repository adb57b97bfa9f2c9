// The gRPC methods of the package-less ANP protos (client.proto, agent.proto), as HTTP/2 paths. Both
// are bidi streams of Packet; grpc-framing.ts frames them, grpc-client-call.ts and the hub's
// grpc-server.ts carry them.
import type { Packet } from './packet.js';

export const AGENT_CONNECT_PATH = '/AgentService/Connect';
export const PROXY_PATH = '/ProxyService/Proxy';

export type { Packet };
