// How the HTTP gateway's two proxies (the hub's gateway, the agent's impersonating proxy) move one
// request's bodies: what stream.pipeline() does for two streams, for a fraction of its cost per request
// (pipeline() makes an AbortController and, when it finishes, an AbortError DOMException with a stack
// trace, plus end-of-stream watchers on both sides; with small kube GETs that was a tenth of the
// gateway's CPU). Same contract: backpressure (write() → false → pause until 'drain'), the destination
// ended after the source's last byte, either side failing or closing early destroys the other, and
// `done` is called once.
import type { Readable, Writable } from 'node:stream';
import type * as HttpTypes from 'node:http';

/** An error for a side that closed before its end (as pipeline's ERR_STREAM_PREMATURE_CLOSE). */
export class PrematureCloseError extends Error {
  override name = 'PrematureCloseError';
  readonly code = 'ERR_STREAM_PREMATURE_CLOSE';
  constructor() {
    super('Premature close');
  }
}

/** Relays `from` into `to` and ends it; `done(null)` once `to` finished, `done(err)` once either failed (both destroyed). */
export function relay(from: Readable, to: Writable, done: (err: Error | null) => void): void {
  relayBody(from, to, done);
}

/**
 * relay() for a response whose head `res.writeHead()` took: the head goes out with the body's first bytes
 * when they come in the same turn (one write, not two), and on its own soon after when they do not (a
 * watch's head goes out at once, not with its first event).
 */
export function relayResponse(from: Readable, res: HttpTypes.ServerResponse, done: (err: Error | null) => void): void {
  const state = relayBody(from, res, done);
  setImmediate(() => {
    if (!state.wrote && !state.settled && !res.destroyed && !res.writableEnded) res.flushHeaders();
  });
}

function relayBody(from: Readable, to: Writable, done: (err: Error | null) => void): { wrote: boolean; settled: boolean } {
  const state = { wrote: false, settled: false };
  let settled = false;
  const settle = (err: Error | null): void => {
    if (settled) return;
    settled = state.settled = true;
    from.removeListener('data', onData);
    to.removeListener('drain', onDrain);
    if (err) {
      from.destroy();
      to.destroy();
    }
    done(err);
  };
  const onData = (chunk: Buffer): void => {
    state.wrote = true;
    if (!to.write(chunk)) from.pause();
  };
  const onDrain = (): void => void from.resume();
  from.on('data', onData);
  to.on('drain', onDrain);
  from.once('end', () => to.end());
  from.once('error', (err: Error) => settle(err));
  from.once('close', () => {
    if (!from.readableEnded) settle(from.errored ?? new PrematureCloseError());
  });
  to.once('error', (err: Error) => settle(err));
  to.once('finish', () => settle(null));
  to.once('close', () => {
    if (!to.writableFinished) settle(to.errored ?? new PrematureCloseError());
  });
  return state;
}

/**
 * True if `req`'s head says it has no body (neither Transfer-Encoding nor a Content-Length above 0):
 * node's parser then reads none, and its request is relayed by ending the next hop's at once.
 */
export function hasNoBody(req: HttpTypes.IncomingMessage): boolean {
  if (req.headers['transfer-encoding'] !== undefined) return false;
  const length = req.headers['content-length'];
  return length === undefined || length === '0';
}
