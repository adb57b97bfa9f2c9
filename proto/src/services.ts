// gRPC service definitions for grpc-js, with our codec instead of protobufjs. The paths match the
// package-less ANP protos (`/ProxyService/Proxy`, `/AgentService/Connect`).
import type { ServiceDefinition } from '@grpc/grpc-js';
import { decodePacket, encodePacket } from './codec.js';
import type { Packet } from './packet.js';

const method = (path: string) => ({
  path,
  requestStream: true,
  responseStream: true,
  requestSerialize: encodePacket,
  requestDeserialize: decodePacket,
  responseSerialize: encodePacket,
  responseDeserialize: decodePacket,
  originalName: path.split('/')[2]!,
});

export const AGENT_CONNECT_PATH = '/AgentService/Connect';
export const PROXY_PATH = '/ProxyService/Proxy';

export interface AgentServiceDefinition extends ServiceDefinition {
  Connect: ReturnType<typeof method>;
}
export interface ProxyServiceDefinition extends ServiceDefinition {
  Proxy: ReturnType<typeof method>;
}

export const agentServiceDefinition: AgentServiceDefinition = { Connect: method(AGENT_CONNECT_PATH) };
export const proxyServiceDefinition: ProxyServiceDefinition = { Proxy: method(PROXY_PATH) };

export type { Packet };
