// An upgrade request through the gateway (kubectl exec, attach, port-forward: WebSocket or SPDY/3.1),
// sent on to the apiserver by the agent with its own credentials and the impersonation headers
// (impersonating-proxy.ts made them), on a TLS connection of its own (an upgraded connection is never
// returned to a pool). The agent does not speak the upgraded protocol:
//
//   pending (head sent to the apiserver) ──101──► the 101 passed back, then spliced (proto http-upgrade.ts:
//   open → half-closed → closing → closed, backpressure both ways)
//      └──any other answer: passed back as it is, the tunnel connection closes after it
//      └──apiserver unreachable: 502, one line
import type http from 'node:http';
import https from 'node:https';
import type net from 'node:net';
import { pipeline, type Duplex } from 'node:stream';
import { passedBackHead, responseHead, splice, textAnswer } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { apiserverRequest, apiserverUnreachable, type Prepared } from './apiserver-request.js';
import type { RequestHead } from './apiserver-relay.js';

/** A one-line answer on the raw tunnel end; the connection closes after it. */
export function rawAnswer(socket: Duplex, status: number, message: string): void {
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  socket.end(textAnswer(status, message));
}

export function upgradeToApiserver(p: Prepared, req: RequestHead, socket: Duplex, head: Buffer, log: Logger): void {
  const { kube, headers, identity } = p;
  const started = Date.now();
  const path = req.url;
  // No body on an upgrade request: what follows the head belongs to the upgraded protocol.
  delete headers['content-length'];
  delete headers['transfer-encoding'];
  headers['connection'] = 'Upgrade';
  headers['upgrade'] = req.headersDistinct['upgrade'] ?? [];
  // Its own connection: an upgraded one never goes back to a pool.
  const upstream = https.request(apiserverRequest(kube, req.method, path, headers, false));
  let answered = false;
  const hubLeft = (): void => {
    if (!answered) upstream.destroy();
  };
  socket.once('close', hubLeft);

  upstream.on('upgrade', (res: http.IncomingMessage, api: net.Socket, apiHead: Buffer) => {
    answered = true;
    socket.off('close', hubLeft);
    if (socket.destroyed) {
      api.destroy();
      return;
    }
    api.allowHalfOpen = true; // each direction ends on its own (the splice's half-close)
    socket.write(responseHead(res.statusCode ?? 101, res.statusMessage ?? 'Switching Protocols', res.rawHeaders));
    if (apiHead.length > 0) socket.write(apiHead);
    if (head.length > 0) api.write(head);
    const session = splice(socket, api);
    void session.done.then((r) => {
      // The path without its query (a query may carry a command line).
      const q = path.indexOf('?');
      log.info(
        {
          user: identity.user,
          method: req.method,
          path: q < 0 ? path : path.slice(0, q),
          upgrade: req.headersDistinct['upgrade']?.join(', '),
          bytesIn: head.length + r.aToB,
          bytesOut: apiHead.length + r.bToA,
          durationMs: Date.now() - started,
          ...(r.error ? { error: r.error } : {}),
        },
        'gateway session',
      );
    });
  });

  upstream.on('response', (res) => {
    answered = true;
    socket.off('close', hubLeft);
    socket.write(passedBackHead(res));
    // Without a length the body ends with the connection.
    pipeline(res, socket, () => {});
  });

  upstream.on('error', (err) => {
    socket.off('close', hubLeft);
    if (answered) return;
    answered = true;
    log.warn({ err: err.message }, 'gateway upgrade: the apiserver could not be reached');
    rawAnswer(socket, 502, apiserverUnreachable(err));
  });
  upstream.end();
}
