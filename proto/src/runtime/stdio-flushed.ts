// Exiting a process right after writing to stdout or stderr loses what a pipe has not taken yet:
// writes to a pipe are asynchronous in Node, and `cluster-proxy get -o json | jq` with a few thousand
// clusters was cut off at the pipe's 64 KiB. Entry points (the CLI, the bench) exit after this.

/** Resolves once everything written to `stream` so far has reached the OS (or its reader went away). */
function flushed(stream: NodeJS.WriteStream): Promise<void> {
  if (stream.writableLength === 0 || stream.destroyed || stream.writableEnded) return Promise.resolve();
  return new Promise((resolve) => {
    // A reader that left (`| head`: EPIPE) ends the wait too, quietly, as SIGPIPE ends Go and C tools.
    stream.once('error', () => resolve());
    // A zero-length write queues behind the pending ones: its callback means all of them are done.
    stream.write('', () => resolve());
  });
}

/** Resolves once stdout and stderr have handed everything written so far to the OS. */
export function stdioFlushed(): Promise<void> {
  return Promise.all([flushed(process.stdout), flushed(process.stderr)]).then(() => undefined);
}
