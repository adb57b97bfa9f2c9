export { Tunnel, type TunnelOptions, type TunnelTransport } from './tunnel.js';
export { TunnelSocket, type ConnectOptions } from './tunnel-socket.js';
export { TunnelError, type TunnelErrorReason } from './errors.js';
export { TunnelHttpAgent, TunnelHttpsAgent, type TunnelAgentOptions } from './http-agent.js';
export {
  tunnelConnector,
  routeKubeConfigThroughTunnel,
  type AgentPickingKubeConfig,
  type ConnectorOptions,
  type ConnectorCallback,
} from './kube-client.js';
