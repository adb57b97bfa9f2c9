// The system calls proto's socket-options.ts uses, through koffi: a maintained FFI whose npm package
// brings prebuilt binaries (linux-x64: 2.3 MB; its install script is not run, nothing is compiled).
// A native addon of our own would need a compiler wherever we are installed. Linux only (the option
// numbers are Linux's); malloc_trim only with glibc. Anything missing: null, and the kernel's and the
// allocator's defaults apply.
import { createRequire } from 'node:module';
import type { NativeCalls } from '@cluster-proxy/proto';

const IPPROTO_TCP = 6;
const TCP_NOTSENT_LOWAT = 25;
/** ioctl: bytes written to a TCP socket that the kernel has not sent yet. */
const SIOCOUTQNSD = 0x894b;

type SetSockOpt = (fd: number, level: number, name: number, value: number[], len: number) => number;
type GetSockOpt = (fd: number, level: number, name: number, value: number[], len: number[]) => number;
type Ioctl = (fd: number, request: number, value: number[]) => number;

/** The calls, or null where koffi or libc cannot be loaded (not Linux, no prebuilt binary). */
export function loadNativeCalls(): NativeCalls | null {
  if (process.platform !== 'linux') return null;
  try {
    const koffi = createRequire(import.meta.url)('koffi') as typeof import('koffi');
    const libc = koffi.load('libc.so.6');
    const setsockopt = libc.func('int setsockopt(int fd, int level, int name, const int *value, uint32_t len)') as SetSockOpt;
    const getsockopt = libc.func('int getsockopt(int fd, int level, int name, _Out_ int *value, _Inout_ uint32_t *len)') as GetSockOpt;
    // ioctl is variadic in C; its third argument here is always a pointer, which every Linux ABI koffi
    // supports passes as a fixed one would be passed.
    const ioctl = libc.func('int ioctl(int fd, unsigned long request, _Out_ int *value)') as Ioctl;
    let trim: NativeCalls['trim'] = null;
    try {
      const mallocTrim = libc.func('int malloc_trim(size_t pad)') as (pad: number) => number;
      trim = () => void mallocTrim(0);
    } catch {
      // Not glibc (musl has no malloc_trim): nothing to trim.
    }
    return {
      setUnsentLimit: (fd, bytes) => setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, [bytes], 4) === 0,
      unsentLimit: (fd) => {
        const value = [0];
        return getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, value, [4]) === 0 ? (value[0] ?? null) : null;
      },
      unsentBytes: (fd) => {
        const value = [0];
        return ioctl(fd, SIOCOUTQNSD, value) === 0 ? (value[0] ?? null) : null;
      },
      trim,
    };
  } catch {
    return null;
  }
}
