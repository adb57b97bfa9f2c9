// Two things Node.js cannot do from JavaScript, done through koffi (a maintained FFI with prebuilt
// binaries; no compiler at install time) on Linux with glibc, and skipped quietly elsewhere:
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
// - malloc_trim(0): glibc keeps freed pages of its arenas; after a burst the process's RSS stays at
//   its peak until something asks for them back.
import { createRequire } from 'node:module';
import type { Duplex } from 'node:stream';

const IPPROTO_TCP = 6;
const TCP_NOTSENT_LOWAT = 25;

/** What a socket may keep unsent in the kernel by default: 128 KiB (fills a 1 Gbit/s × 1 ms path). */
export const DEFAULT_UNSENT_LIMIT = 128 * 1024;

interface Native {
  setsockopt: (fd: number, level: number, name: number, value: number[], len: number) => number;
  getsockopt: (fd: number, level: number, name: number, value: number[], len: number[]) => number;
  mallocTrim: ((pad: number) => number) | null;
}

let native: Native | null | undefined;

function load(): Native | null {
  if (native !== undefined) return native;
  native = null;
  if (process.platform !== 'linux') return native;
  try {
    const koffi = createRequire(import.meta.url)('koffi') as typeof import('koffi');
    const libc = koffi.load('libc.so.6');
    let mallocTrim: Native['mallocTrim'] = null;
    try {
      mallocTrim = libc.func('int malloc_trim(size_t pad)') as Native['mallocTrim'];
    } catch {
      // Not glibc (musl has no malloc_trim): nothing to trim.
    }
    native = {
      setsockopt: libc.func('int setsockopt(int fd, int level, int name, const int *value, uint32_t len)') as Native['setsockopt'],
      getsockopt: libc.func('int getsockopt(int fd, int level, int name, _Out_ int *value, _Inout_ uint32_t *len)') as Native['getsockopt'],
      mallocTrim,
    };
  } catch {
    // No prebuilt binary for this platform, or no libc.so.6: the kernel's defaults apply.
  }
  return native;
}

/** The file descriptor under a connected socket (a TLS socket's too); -1 if none. */
function fdOf(socket: Duplex): number {
  const handle = (socket as unknown as { _handle?: { fd?: unknown } | null })._handle;
  const fd = handle?.fd;
  return typeof fd === 'number' && fd >= 0 ? fd : -1;
}

/**
 * Caps the bytes `socket` may keep unsent in the kernel (TCP_NOTSENT_LOWAT). Call it once connected.
 * Returns false where the option cannot be set (not Linux, no FFI, not a TCP socket); nothing else changes then.
 */
export function limitUnsentBytes(socket: Duplex, bytes = DEFAULT_UNSENT_LIMIT): boolean {
  const n = load();
  const fd = fdOf(socket);
  if (!n || fd < 0 || bytes <= 0) return false;
  return n.setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, [bytes], 4) === 0;
}

/** The socket's TCP_NOTSENT_LOWAT, or null where it cannot be read (for tests and diagnostics). */
export function unsentLimitOf(socket: Duplex): number | null {
  const n = load();
  const fd = fdOf(socket);
  if (!n || fd < 0) return null;
  const value = [0];
  return n.getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, value, [4]) === 0 ? (value[0] ?? null) : null;
}

/** Whether trimAllocator() can do anything here (glibc through FFI). */
export function canTrimAllocator(): boolean {
  return Boolean(load()?.mallocTrim);
}

/** Gives glibc's free pages back to the kernel (malloc_trim(0)). Returns false where there is no such call. */
export function trimAllocator(): boolean {
  const trim = load()?.mallocTrim;
  if (!trim) return false;
  trim(0);
  return true;
}
