import { isIPv4, isIPv6 } from 'node:net';

/**
 * Converts an IP address to its network-order bytes (4 for IPv4, 16 for IPv6), as an
 * iPAddress subjectAltName holds it.
 *
 * We do this ourselves rather than pass `ip:` to node-forge because forge's parser does not
 * validate its input (e.g. "300.1.1.1" silently becomes a different address) and cannot read
 * IPv6 with an embedded IPv4 tail ("::ffff:10.0.0.1"). Node's `net` does the validation.
 */
export function ipToBytes(ip: string): Uint8Array {
  if (isIPv4(ip)) return Uint8Array.from(ip.split('.').map((part) => Number(part)));
  if (!isIPv6(ip)) throw new Error(`invalid IP address ${JSON.stringify(ip)}: not IPv4 or IPv6`);

  // Drop a zone id ("fe80::1%eth0"): it is local to one host and has no place in a certificate.
  let rest = ip.split('%')[0]!;
  const lastColon = rest.lastIndexOf(':');
  if (rest.includes('.', lastColon)) {
    // Embedded IPv4 in the last 32 bits ("::ffff:10.0.0.1"): rewrite it as two hex groups.
    const [a, b, c, d] = rest
      .slice(lastColon + 1)
      .split('.')
      .map((part) => Number(part)) as [number, number, number, number];
    rest = `${rest.slice(0, lastColon + 1)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }

  const [head, tailPart] = rest.split('::') as [string, string | undefined];
  const parse = (s: string): number[] => (s === '' ? [] : s.split(':').map((g) => parseInt(g, 16)));
  const headGroups = parse(head);
  const tailGroups = tailPart === undefined ? [] : parse(tailPart);
  const zeros = 8 - headGroups.length - tailGroups.length;
  const groups = [...headGroups, ...new Array<number>(tailPart === undefined ? 0 : zeros).fill(0), ...tailGroups];
  if (groups.length !== 8) throw new Error(`invalid IP address ${JSON.stringify(ip)}: cannot expand IPv6`);

  const bytes = new Uint8Array(16);
  groups.forEach((g, i) => {
    bytes[2 * i] = g >> 8;
    bytes[2 * i + 1] = g & 0xff;
  });
  return bytes;
}
