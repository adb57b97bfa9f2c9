// grpc-js lets a *client* raise its HTTP/2 receive windows (grpc-node.flow_control_window) but not a
// server (grpc-node PR #3058, unreleased). Our hub is the server on both legs, so with 64 KiB windows
// one agent connection could move at most 64 KiB per round trip (~3 MB/s at 20 ms). We hook the one
// place grpc-js builds its http2 server: the initial SETTINGS carry a larger stream window, and each
// new session raises its connection window. If grpc-js internals change, this throws at start-up
// rather than silently running slow; grpc-windows.test.ts checks the windows on a live session.
// The same hook turns Nagle off on accepted sockets.
import type http2 from 'node:http2';
import type net from 'node:net';
import type * as grpc from '@grpc/grpc-js';

interface GrpcServerInternals {
  commonServerOptions?: http2.ServerOptions;
  createHttp2Server?: (credentials: grpc.ServerCredentials) => http2.Http2Server | http2.Http2SecureServer;
}

/** Runs `fn` on every http2 server grpc-js creates for `server` (one per bound address). */
export function onHttp2Server(server: grpc.Server, fn: (h2: http2.Http2Server | http2.Http2SecureServer) => void): void {
  const internals = server as unknown as GrpcServerInternals;
  const create = internals.createHttp2Server;
  if (typeof create !== 'function') throw new Error(HOOK_MISSING);
  internals.createHttp2Server = function patched(this: unknown, credentials: grpc.ServerCredentials) {
    const h2 = create.call(this, credentials);
    fn(h2);
    return h2;
  };
}

const HOOK_MISSING = 'this @grpc/grpc-js version does not expose the hooks used to raise HTTP/2 windows; pin the version in package.json';

export function raiseServerReceiveWindows(server: grpc.Server, streamWindow: number, connectionWindow: number): void {
  const common = (server as unknown as GrpcServerInternals).commonServerOptions;
  if (typeof common !== 'object' || common === null) throw new Error(HOOK_MISSING);
  common.settings = { ...common.settings, initialWindowSize: streamWindow };
  onHttp2Server(server, (h2) => {
    // Node's TLS/HTTP2 servers leave Nagle on; small frames (WINDOW_UPDATE, CREDIT, a 64-byte echo)
    // would then wait for the peer's delayed ACK.
    h2.on('connection', (socket: net.Socket) => socket.setNoDelay(true));
    h2.on('session', (session: http2.ServerHttp2Session) => {
      // setLocalWindowSize throws if the session is already being torn down; nothing to raise then.
      try {
        session.setLocalWindowSize(connectionWindow);
      } catch {
        /* session closing */
      }
    });
  });
}
