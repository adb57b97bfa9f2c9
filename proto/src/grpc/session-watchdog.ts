// A dead HTTP/2 peer must end its gRPC calls, on both ends of a gRPC session (our server and our
// client). A graceful close (GOAWAY) of a session whose peer is dead never completes, so the calls on
// it would never end (grpc-js's keepalive did just that). And a peer that vanishes without a reset (a
// host gone, a network cut) is not noticed from the socket at all. We ping every session ourselves and
// destroy it when the peer does not answer: every call on it then ends with an error. (A peer whose
// kernel resets the connection is seen within a second: see h2-transport.ts.)
/** What the watchdog needs of a session: node:http2's (our gRPC clients) and ours (h2/session.ts, the hub) both have it. */
export interface PingableSession {
  readonly destroyed: boolean;
  destroy(): void;
  ping(callback: (err: Error | null) => void): boolean;
  once(event: 'close', listener: () => void): unknown;
}

export interface WatchdogOptions {
  /** Time between pings. */
  intervalMs: number;
  /** A ping not answered within this destroys the session. */
  timeoutMs: number;
}

/** Pings `session` every interval until it closes; destroys it when a ping goes unanswered. */
export function watchSession(session: PingableSession, opts: WatchdogOptions): void {
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
      // Also while the session closes gracefully (shutdown): a live peer answers and keeps it.
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
