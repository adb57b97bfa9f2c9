// What the hub's gateway and the agent share for HTTP upgrades (kubectl exec, attach, port-forward over
// WebSocket or SPDY): after the 101, two byte streams spliced both ways. Neither side understands the
// protocol spoken on them; they only move bytes, with backpressure and half-close:
//
//   open ──one side ended──► half-closed ──the other ended──► closing (flushing) ──both closed──► closed
//     └──────────── either side failed or closed early: both destroyed ──────────────────────────┘
//
// A reader that stops holds the writer back: a write() that returns false pauses the other side until
// 'drain', so at most a socket's buffers are held per direction, never a whole stream.
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { endToEndHeaders } from './http-headers.js';
import { http } from './node-http.js';

export type SpliceState = 'open' | 'half-closed' | 'closing' | 'closed';

export interface SpliceResult {
  /** Bytes read from `a` and written to `b`, and the other way. */
  aToB: number;
  bToA: number;
  /** Why the session ended other than by both sides ending cleanly (one line), if it did. */
  error?: string;
}

export interface Splice {
  readonly done: Promise<SpliceResult>;
  state(): SpliceState;
  /** Ends the session now (drain over, shutdown): both sides destroyed. */
  close(reason: string): void;
}

/** Pipes `a` ⇄ `b` until both directions ended and both sides closed, or either failed. */
export function splice(a: Duplex, b: Duplex): Splice {
  let state: SpliceState = 'open';
  let aToB = 0;
  let bToA = 0;
  let error: string | undefined;
  let ended = 0;
  let closed = 0;
  const detach: (() => void)[] = [];
  let resolveDone!: (r: SpliceResult) => void;
  const done = new Promise<SpliceResult>((r) => (resolveDone = r));

  const on = <A extends unknown[]>(s: Duplex, event: string, fn: (...args: A) => void): void => {
    const listener = fn as (...args: unknown[]) => void;
    s.on(event, listener);
    detach.push(() => s.off(event, listener));
  };
  const abort = (why: string): void => {
    if (state === 'closed') return;
    error ??= why;
    a.destroy();
    b.destroy();
  };
  const direction = (src: Duplex, dst: Duplex, count: (n: number) => void): void => {
    let srcEnded = false;
    on(src, 'data', (chunk: Buffer) => {
      count(chunk.length);
      if (!dst.write(chunk)) src.pause();
    });
    on(dst, 'drain', () => src.resume());
    on(src, 'end', () => {
      srcEnded = true;
      ended++;
      state = ended === 1 ? 'half-closed' : 'closing';
      dst.end();
    });
    on(src, 'error', (err: Error) => abort(err.message));
    const onClose = (): void => {
      closed++;
      // Closed before its bytes all came through: nothing more can reach it or come from it.
      if (!srcEnded || !src.writableFinished) abort('one side closed before the session ended');
      if (closed === 2) {
        state = 'closed';
        for (const d of detach) d();
        // A late 'error' after close must not throw.
        a.on('error', () => {});
        b.on('error', () => {});
        resolveDone({ aToB, bToA, ...(error ? { error } : {}) });
      }
    };
    // Either side may already be gone (the peer left during the handshake): its 'close' was emitted.
    if (src.closed) process.nextTick(onClose);
    else on(src, 'close', onClose);
  };
  direction(a, b, (n) => (aToB += n));
  direction(b, a, (n) => (bToA += n));
  if (a.destroyed || b.destroyed) abort('one side closed before the session began');
  return { done, state: () => state, close: (reason) => abort(reason) };
}

/** A response head as bytes: status line and the headers (node's rawHeaders: name, value, name, value…). */
export function responseHead(status: number, statusMessage: string, rawHeaders: readonly string[]): Buffer {
  let text = `HTTP/1.1 ${status} ${statusMessage.replace(/[\r\n]/g, ' ')}\r\n`;
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) text += `${rawHeaders[i]}: ${rawHeaders[i + 1]}\r\n`;
  return Buffer.from(`${text}\r\n`, 'latin1');
}

/**
 * The head for passing a non-101 answer to an upgrade back on a raw socket: its end-to-end headers and
 * `Connection: close` (without a length the body ends with the connection).
 */
export function passedBackHead(res: IncomingMessage): Buffer {
  const out = endToEndHeaders(res.headersDistinct);
  out['connection'] = ['close'];
  const raw: string[] = [];
  for (const [k, vs] of Object.entries(out)) for (const v of vs) raw.push(k, v);
  return responseHead(res.statusCode ?? 502, res.statusMessage ?? '', raw);
}

/** A whole one-line text answer for a raw socket (a refusal where node:http no longer writes); the connection closes after it. */
export function textAnswer(status: number, message: string, headers: Readonly<Record<string, string>> = {}): Buffer {
  const body = `${message.replace(/\s+/g, ' ').trim()}\n`;
  const raw = [
    'Content-Type',
    'text/plain; charset=utf-8',
    'Content-Length',
    String(Buffer.byteLength(body)),
    'X-Content-Type-Options',
    'nosniff',
    ...Object.entries(headers).flat(),
    'Connection',
    'close',
  ];
  return Buffer.concat([responseHead(status, http.STATUS_CODES[status] ?? 'Error', raw), Buffer.from(body)]);
}
