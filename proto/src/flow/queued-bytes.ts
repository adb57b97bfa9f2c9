// Bytes that wait to be sent as DATA (for credit, or for a congested stream), as the chunks they came
// in: a payload received as views of TLS records stays views until it is written out.

export interface QueuedBytes {
  chunk: Buffer;
  /** Runs once the whole entry has been sent. */
  sent?: () => void;
}

export interface TakenBytes {
  chunks: Buffer[];
  length: number;
  /** The `sent` callbacks of the entries taken whole, in order: run them once the chunks are sent. */
  sent: (() => void)[];
}

/** Queues one payload of `chunks` (at least one), `sent` running once its last chunk has been sent. */
export function queueChunks(queue: QueuedBytes[], chunks: readonly Buffer[], sent?: () => void): void {
  const last = chunks.length - 1;
  for (let i = 0; i < last; i++) queue.push({ chunk: chunks[i]! });
  queue.push({ chunk: chunks[last]!, sent });
}

/** Takes up to `max` (> 0) bytes from the front of `queue`, splitting an entry if it must (no copy). */
export function takeQueued(queue: QueuedBytes[], max: number): TakenBytes {
  const taken: TakenBytes = { chunks: [], length: 0, sent: [] };
  while (taken.length < max && queue.length > 0) {
    const head = queue[0]!;
    const k = Math.min(head.chunk.length, max - taken.length);
    taken.length += k;
    if (k < head.chunk.length) {
      taken.chunks.push(head.chunk.subarray(0, k));
      head.chunk = head.chunk.subarray(k);
      break;
    }
    taken.chunks.push(head.chunk);
    queue.shift();
    if (head.sent) taken.sent.push(head.sent);
  }
  return taken;
}
