// A Buffer that is a view of a larger one keeps all of the larger one alive. Bytes that only pass
// through may stay views (a copy per byte would cost more than it saves), but bytes held for as long
// as a peer is stalled should not pin the rest of the frame, message or TLS record they were cut
// from: a hub holding the unsent half of a 64 KiB gRPC message for each of 1,024 stuck connections
// kept 64 MiB alive for 32 MiB of data.

/** Views pinning less than this are left alone (a TLS record's 16 KiB is the common case). */
export const PIN_COPY_MIN = 16 * 1024;

/** `data`, or a copy of it in a Buffer of its own when it pins more than twice its size (and at least PIN_COPY_MIN). */
export function unpinned(data: Buffer): Buffer {
  const pinned = data.buffer.byteLength;
  if (pinned < PIN_COPY_MIN || pinned <= 2 * data.length) return data;
  // Not Buffer.from: under 4 KiB that would be a slice of Node's shared 8 KiB pool, pinned again.
  const copy = Buffer.allocUnsafeSlow(data.length);
  data.copy(copy);
  return copy;
}
