// The hub's parsers of input from across a trust boundary that its main entry point does not export:
// the CONNECT request head, a bearer token's header, and a gateway caller's connection. A subpath of the package
// (`@cluster-proxy/server/parsers`) for the fuzz targets (test/fuzz), which feed them hostile bytes.
export { findHeadEnd, parseAuthority, parseHead } from './connect/request.js';
export { tokenFromHeader } from './http/bearer-token.js';
export { CallerConnection, type CallerHost } from './gateway/caller-connection.js';
