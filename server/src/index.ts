export { ProxyServer, type ProxyServerOptions, type BoundPorts, type TlsFiles } from './proxy-server.js';
export { ProxyCore } from './proxy-core.js';
export { RoutingTable, isValidCidr, cidrContains } from './routing.js';
export { checkIdentifiers, IdentityError, type Grant } from './agent-listener.js';
export { raiseServerReceiveWindows } from './grpc-windows.js';
export * from './pki/index.js';
export { startConnectFrontend, DIAL_FAILURE_STATUS, type ConnectFrontend, type ConnectFrontendOptions, type Principal } from './frontend-connect.js';
export { TokenStore, tokenAllowsCluster, type TokenPrincipal, type TokenInfo, type IssuedToken } from './tokens.js';
export * from './proxy-settings.js';
