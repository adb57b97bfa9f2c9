// One authenticated upgrade request (kubectl exec, attach, port-forward; WebSocket or SPDY/3.1), forwarded
// to the agent of its cluster like a plain request (forward.ts: the same tunneled connection, identity
// assertion and header rules) and then, on 101, spliced: the gateway does not speak the upgraded
// protocol, it moves bytes both ways with backpressure and half-close (proto http-upgrade.ts).
//
//   pending (head sent, waiting for the agent's answer) ──101──► open … closed (the splice's states)
//      └──any other answer: passed back as it is, the connection closes after it
//      └──dial failed or the agent broke: a one-line refusal (forward.ts's statuses)
import type net from 'node:net';
import { pipeline, type Duplex } from 'node:stream';
import { GATEWAY_HOST, passedBackHead, responseHead, splice, type GatewayIdentity, type Splice, http } from '@cluster-proxy/proto';
import type { GatewayCaller } from './auth.js';
import type { GatewayRequest } from './caller-connection.js';
import {
  callerHeaders,
  failureOf,
  IdentityHandoff,
  headTooLarge,
  responseTimer,
  serviceConnection,
  serviceHost,
  type ForwardContext,
  type ServiceDestination,
} from './forward.js';
import { TunnelSocket } from './tunnel-socket.js';
import type * as HttpTypes from 'node:http';

export interface UpgradeResult {
  status: number;
  bytesIn: number;
  bytesOut: number;
  error?: string;
}

export interface UpgradeContext extends Pick<ForwardContext, 'core' | 'signing' | 'responseTimeoutMs'> {
  /** A one-line error answer on the raw socket (while nothing was sent yet). */
  refuse: (socket: Duplex, status: number, message: string) => void;
  /** The session after its 101, so a stopping gateway can close it. */
  opened?: (session: Splice) => void;
}

export function forwardUpgrade(
  ctx: UpgradeContext,
  caller: GatewayCaller,
  identity: GatewayIdentity,
  cluster: string,
  path: string,
  req: GatewayRequest,
  socket: net.Socket,
  head: Buffer,
  service?: ServiceDestination,
): Promise<UpgradeResult> {
  return new Promise((resolve) => {
    let done = false;
    const finish = (r: UpgradeResult): void => {
      if (done) return;
      done = true;
      socket.off('close', callerLeft);
      resolve(r);
    };
    // Both directions are ours to end (a caller's FIN must not end our side before the agent's answer).
    socket.allowHalfOpen = true;
    const callerLeft = (): void => {
      disarm();
      upstream.destroy();
      finish({ status: 499, bytesIn: 0, bytesOut: 0, error: 'the caller went away before the upgrade' });
    };

    // A Service gets the request as its caller sent it (no identity: it is reached, not impersonated through).
    const headers: Record<string, string | string[]> = {
      ...callerHeaders(req),
      host: service ? `${serviceHost(service.target)}:${service.target.port}` : GATEWAY_HOST,
    };
    const handoff = service ? null : new IdentityHandoff(ctx, identity, cluster, path, req);
    // An upgrade carries no body: what follows the head belongs to the upgraded protocol.
    delete headers['content-length'];
    delete headers['transfer-encoding'];
    headers['connection'] = 'Upgrade';
    headers['upgrade'] = req.headersDistinct['upgrade'] ?? [];
    const tooLarge = headTooLarge(req.method, path, headers, handoff?.maxBytes() ?? 0);
    if (tooLarge) {
      ctx.refuse(socket, 431, tooLarge);
      finish({ status: 431, bytesIn: 0, bytesOut: 0, error: tooLarge });
      return;
    }

    const upstream = http.request({
      method: req.method,
      path,
      headers,
      createConnection: service
        ? serviceConnection(ctx.core, cluster, caller, service)
        : (((_opts: unknown, oncreate: (err: Error | null, s?: TunnelSocket) => void) => {
            new TunnelSocket(ctx.core, cluster, caller.name, (err, s) => (err ? oncreate(err) : oncreate(null, s)));
            return undefined;
          }) as unknown as HttpTypes.RequestOptions['createConnection']),
    });
    socket.once('close', callerLeft);
    const disarm = responseTimer(upstream, ctx.responseTimeoutMs);

    let answered = false;
    upstream.on('upgrade', (res: HttpTypes.IncomingMessage, tunnel: Duplex, upHead: Buffer) => {
      disarm();
      answered = true;
      socket.off('close', callerLeft);
      if (socket.destroyed) {
        tunnel.destroy();
        finish({ status: 499, bytesIn: 0, bytesOut: 0, error: 'the caller went away before the upgrade' });
        return;
      }
      const status = res.statusCode ?? 101;
      socket.write(responseHead(status, res.statusMessage ?? 'Switching Protocols', res.rawHeaders));
      if (upHead.length > 0) socket.write(upHead);
      // Bytes the caller sent before our 101 (protocols wait for it; kept in order all the same).
      if (head.length > 0) tunnel.write(head);
      const session = splice(socket, tunnel);
      ctx.opened?.(session);
      void session.done.then((r) =>
        finish({ status, bytesIn: head.length + r.aToB, bytesOut: upHead.length + r.bToA, ...(r.error ? { error: r.error } : {}) }),
      );
    });

    // Not upgraded (the apiserver's 400/403/404…, or the agent's own refusal): passed back as it is.
    upstream.on('response', (res) => {
      disarm();
      answered = true;
      socket.off('close', callerLeft);
      const status = res.statusCode ?? 502;
      socket.write(passedBackHead(res));
      let bytesOut = 0;
      res.on('data', (c: Buffer) => (bytesOut += c.length));
      // Without a length the body ends with the connection (the framing was the agent's).
      pipeline(res, socket, (err) =>
        finish({ status, bytesIn: 0, bytesOut, ...(err ? { error: `response cut off: ${err.message}` } : {}) }),
      );
    });

    upstream.on('error', (err) => {
      disarm();
      socket.off('close', callerLeft);
      if (answered) return; // after a 101 or an answer the splice or the pipeline reports
      const m = failureOf(err, service);
      ctx.refuse(socket, m.status, m.why);
      finish({ status: m.status, bytesIn: 0, bytesOut: 0, error: err.message });
    });
    // The identity is authenticated for the connection the request gets (forward.ts), so the head waits for it.
    if (handoff) handoff.whenConnected(upstream, () => upstream.end());
    else upstream.end();
  });
}
