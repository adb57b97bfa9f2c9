// Three things Node.js cannot do from JavaScript, used by hub and agent where the platform allows:
//
// - TCP_NOTSENT_LOWAT on a socket we write to. Without it a destination that stops reading lets the
//   kernel take up to tcp_wmem's maximum (4 MiB by default) of our writes into its send queue, per
//   connection. That memory is the node's, shared with every other socket: at a thousand stuck
//   connections the kernel goes into TCP memory pressure and throttles the healthy ones beside them.
//   With the option, write() returns EAGAIN once this many bytes wait unsent, so the rest stays in
//   our budgeted queues (and then in the peer's window) instead. Bytes in flight are not limited, so
//   a fast, far destination still fills its path. Set where we write to an endpoint (the agent's
//   destinations, the hub's CONNECT clients); not on tunnel links, where it cost 12–22 % of a bulk
//   transfer's speed on loopback (more wake-ups for the same bytes), and one connection per agent
//   holds no more than tcp_wmem's maximum anyway.
//   A connection starts at STARTING_UNSENT_LIMIT and gets DEFAULT_UNSENT_LIMIT once its reader has
//   taken a whole window within a second (flow-control.ts, onBulk). On Kubernetes nodes with cgroup v2
//   the kernel charges socket buffers to the pod: at 128 KiB each, 1,024 destinations that never read
//   had the agent's sockets hold 140–168 MiB (measured here with cgroup v1's memory.kmem.tcp
//   accounting), beside its RSS and within the same 256 Mi limit.
// - The bytes a socket's kernel holds unsent (ioctl SIOCOUTQNSD). The option above is checked only
//   when the kernel starts a new packet buffer, so a write still fills the last one; the agent asks
//   this before it returns credit for a destination's bytes (flow/sent-gate.ts).
// - malloc_trim(0): glibc keeps freed pages of its arenas; after a burst the process's RSS stays at
//   its peak until something asks for them back.
//
// The calls themselves come from the CLI (cli/src/memory/native-calls.ts, through an FFI library), which
// installs them when it starts a hub or an agent: the SDK, built on this package, stays free of
// dependencies. Until they are installed, or where they cannot be, every function here does nothing.
import type { Duplex } from 'node:stream';

/** What a socket may keep unsent in the kernel by default: 128 KiB (fills a 1 Gbit/s × 1 ms path). */
export const DEFAULT_UNSENT_LIMIT = 128 * 1024;
/**
 * What an endpoint's socket may keep unsent until its reader has shown it keeps up (a bulk transfer).
 * The agent writes such a socket one chunk at a time meanwhile (endpoint-connection.ts): with Node's
 * vectored writes, a writev the kernel took only part of kept chunks already sent alive, and a 16 KiB
 * allowance cuts writevs often (8 MiB more RSS on the gRPC transport at 1,024 stuck destinations).
 */
export const STARTING_UNSENT_LIMIT = 16 * 1024;

/** The system calls, on a file descriptor; each says whether it worked. */
export interface NativeCalls {
  setUnsentLimit(fd: number, bytes: number): boolean;
  /** The option's value, or null if it cannot be read. */
  unsentLimit(fd: number): number | null;
  /** Bytes written to the socket that its kernel has not sent yet (SIOCOUTQNSD), or null if it cannot say. */
  unsentBytes(fd: number): number | null;
  /** malloc_trim(0); null where there is no such call (not glibc). */
  trim: (() => void) | null;
}

let native: NativeCalls | null = null;

/** Installs the system calls (or removes them, with null); the CLI does this at start. */
export function useNativeCalls(calls: NativeCalls | null): void {
  native = calls;
}

/** The file descriptor under a connected socket (a TLS socket's too); -1 if none. */
function fdOf(socket: Duplex): number {
  const handle = (socket as unknown as { _handle?: { fd?: unknown } | null })._handle;
  const fd = handle?.fd;
  return typeof fd === 'number' && fd >= 0 ? fd : -1;
}

/**
 * Caps the bytes `socket` may keep unsent in the kernel (TCP_NOTSENT_LOWAT). Call it once connected.
 * Returns false where the option cannot be set (no system calls installed, not a TCP socket); nothing
 * else changes then.
 */
export function limitUnsentBytes(socket: Duplex, bytes = DEFAULT_UNSENT_LIMIT): boolean {
  const fd = fdOf(socket);
  if (!native || fd < 0 || bytes <= 0) return false;
  return native.setUnsentLimit(fd, bytes);
}

/** The socket's TCP_NOTSENT_LOWAT, or null where it cannot be read (for tests and diagnostics). */
export function unsentLimitOf(socket: Duplex): number | null {
  const fd = fdOf(socket);
  return native && fd >= 0 ? native.unsentLimit(fd) : null;
}

/** Bytes `socket`'s kernel holds that it has not sent yet, or null where that cannot be read. */
export function unsentBytesOf(socket: Duplex): number | null {
  const fd = fdOf(socket);
  return native && fd >= 0 ? native.unsentBytes(fd) : null;
}

/** Whether trimAllocator() can do anything here. */
export function canTrimAllocator(): boolean {
  return Boolean(native?.trim);
}

/** Gives the C allocator's free pages back to the kernel (malloc_trim(0)). Returns false where it cannot. */
export function trimAllocator(): boolean {
  const trim = native?.trim;
  if (!trim) return false;
  trim();
  return true;
}
