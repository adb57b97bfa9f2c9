// A dead HTTP/2 peer must end its gRPC calls. grpc-js's own keepalive only *closes* a session whose
// ping went unanswered, gracefully: with a dead peer that close never completes, so the calls on it
// never end. And a gRPC agent SIGKILLed while the hub writes to it (uploads) is not always noticed
// from the socket (found by the conformance matrix: it stayed routed, its connections open, for
// good). We ping every session ourselves and destroy it when the peer does not answer: every call on
// it then ends with an error.
import type http2 from 'node:http2';
import type * as grpc from '@grpc/grpc-js';
import { onHttp2Server } from './grpc-windows.js';

export interface WatchdogOptions {
  /** Time between pings. */
  intervalMs: number;
  /** A ping not answered within this destroys the session. */
  timeoutMs: number;
}

export function watchSessions(server: grpc.Server, opts: WatchdogOptions): void {
  onHttp2Server(server, (h2) => h2.on('session', (session: http2.ServerHttp2Session) => watch(session, opts)));
}

function watch(session: http2.ServerHttp2Session, opts: WatchdogOptions): void {
  let deadline: NodeJS.Timeout | null = null;
  let answered = true;
  const kill = (): void => {
    if (!session.destroyed) session.destroy();
  };
  const tick = setInterval(() => {
    if (deadline || session.destroyed) return;
    answered = false;
    deadline = setTimeout(() => {
      deadline = null;
      // After an event-loop stall the timer can run before the answer that already arrived: look
      // again once pending I/O has been handled.
      setImmediate(() => {
        if (!answered) kill();
      });
    }, opts.timeoutMs);
    deadline.unref();
    try {
      // Also while grpc-js closes the session gracefully (shutdown): a live peer answers and keeps it.
      session.ping((err) => {
        answered = true;
        if (deadline) clearTimeout(deadline);
        deadline = null;
        if (err) kill();
      });
    } catch {
      // Not pingable now (destroyed meanwhile): nothing to watch.
      answered = true;
      if (deadline) clearTimeout(deadline);
      deadline = null;
    }
  }, opts.intervalMs);
  tick.unref();
  session.once('close', () => {
    clearInterval(tick);
    if (deadline) clearTimeout(deadline);
  });
}
