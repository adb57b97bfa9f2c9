// Where listeners bind when no address is given: every address of both families, as Go's ANP server does.
// Node's listen on '::' is dual-stack (IPv4 clients arrive as ::ffff:a.b.c.d), so one socket serves an IPv4,
// a dual-stack and an IPv6-only cluster network; a host without IPv6 (disabled in its kernel) gets 0.0.0.0.
import os from 'node:os';

export function allAddresses(interfaces: ReturnType<typeof os.networkInterfaces> = os.networkInterfaces()): string {
  const ipv6 = Object.values(interfaces).some((list) => list?.some((a) => a.family === 'IPv6'));
  return ipv6 ? '::' : '0.0.0.0';
}
