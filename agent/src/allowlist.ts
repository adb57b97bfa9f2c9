// Which destinations an agent dials. Entries: `host:port`, `host:*`, `*.domain:port`, `10.0.0.0/8:443`,
// `[fd00::]/8:*`, `*:port`, or `*` for everything. Names are matched as written: nothing is resolved.
import { BlockList, isIP } from 'node:net';
import { splitHostPort } from '@cluster-proxy/proto';

interface Entry {
  text: string;
  port: number | '*';
  matchHost: (host: string) => boolean;
}

export class AllowlistError extends Error {
  override name = 'AllowlistError';
}

function parseEntry(raw: string): Entry {
  const text = raw.trim();
  if (text === '*') return { text, port: '*', matchHost: () => true };
  const m = /^(.*):(\d{1,5}|\*)$/.exec(text);
  if (!m) throw new AllowlistError(`allowlist entry "${text}" must be HOST:PORT, HOST:*, CIDR:PORT or *`);
  let hostPart = m[1]!.toLowerCase();
  const port = m[2] === '*' ? '*' : Number(m[2]);
  if (port !== '*' && (port < 1 || port > 65535)) throw new AllowlistError(`allowlist entry "${text}": port out of range`);
  if (hostPart.startsWith('[')) hostPart = hostPart.replace(/^\[(.*)\](\/\d+)?$/, '$1$2');
  else if (hostPart.includes(':'))
    throw new AllowlistError(`allowlist entry "${text}": write IPv6 addresses in brackets, e.g. [fd00::1]:443`);
  if (hostPart === '*') return { text, port, matchHost: () => true };
  if (hostPart.includes('/')) {
    const [addr, bitsText] = hostPart.split('/') as [string, string];
    const family = isIP(addr);
    const bits = Number(bitsText);
    if (!family || !/^\d+$/.test(bitsText) || bits > (family === 4 ? 32 : 128))
      throw new AllowlistError(`allowlist entry "${text}": bad CIDR`);
    const list = new BlockList();
    list.addSubnet(addr, bits, family === 4 ? 'ipv4' : 'ipv6');
    return {
      text,
      port,
      matchHost: (h) => {
        const f = isIP(h);
        return f !== 0 && list.check(h, f === 4 ? 'ipv4' : 'ipv6');
      },
    };
  }
  if (hostPart.startsWith('*.')) {
    const suffix = hostPart.slice(1);
    return { text, port, matchHost: (h) => h.endsWith(suffix) && h.length > suffix.length };
  }
  if (hostPart === '') throw new AllowlistError(`allowlist entry "${text}": empty host`);
  return { text, port, matchHost: (h) => h === hostPart };
}

export class Allowlist {
  private readonly entries: Entry[];
  constructor(entries: readonly string[]) {
    this.entries = entries.filter((e) => e.trim() !== '').map(parseEntry);
  }

  allows(host: string, port: number): boolean {
    const h = host.toLowerCase();
    return this.entries.some((e) => (e.port === '*' || e.port === port) && e.matchHost(h));
  }

  describe(): string[] {
    return this.entries.map((e) => e.text);
  }

  static parseAddress(address: string): { host: string; port: number } | null {
    return splitHostPort(address);
  }
}
