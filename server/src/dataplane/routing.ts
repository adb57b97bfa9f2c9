// Which agent stream a dial goes to (contract §4): the destination host as an exact host/ipv4/ipv6
// identifier ("destHost"), then agents whose cidr= identifiers contain an IP destination, then
// default-route agents. Among candidates: skip draining agents, then pick the fewest open
// connections (ANP picks at random).
import { BlockList, isIP } from 'node:net';
import { isGatewayHost, splitHostPort, type DialFailureReason } from '@cluster-proxy/proto';

export interface Routable {
  readonly key: string;
  readonly hosts: readonly string[];
  readonly cidrs: readonly string[];
  readonly defaultRoute: boolean;
  readonly draining: boolean;
  readonly openConnections: number;
}

export type RouteResult<B> = { backend: B } | { reason: DialFailureReason; message: string };

interface CidrEntry<B> {
  list: BlockList;
  backend: B;
}

export class RoutingTable<B extends Routable> {
  private readonly byHost = new Map<string, Set<B>>();
  private readonly cidrs: CidrEntry<B>[] = [];
  private readonly defaultRoutes = new Set<B>();
  private readonly all = new Set<B>();

  add(b: B): void {
    this.all.add(b);
    for (const h of b.hosts) {
      const key = h.toLowerCase();
      let set = this.byHost.get(key);
      if (!set) this.byHost.set(key, (set = new Set()));
      set.add(b);
    }
    for (const c of b.cidrs) {
      const list = cidrList(c);
      if (list) this.cidrs.push({ list, backend: b });
    }
    if (b.defaultRoute) this.defaultRoutes.add(b);
  }

  remove(b: B): void {
    this.all.delete(b);
    for (const h of b.hosts) {
      const set = this.byHost.get(h.toLowerCase());
      set?.delete(b);
      if (set && set.size === 0) this.byHost.delete(h.toLowerCase());
    }
    for (let i = this.cidrs.length - 1; i >= 0; i--) if (this.cidrs[i]!.backend === b) this.cidrs.splice(i, 1);
    this.defaultRoutes.delete(b);
  }

  backends(): B[] {
    return [...this.all];
  }

  get size(): number {
    return this.all.size;
  }

  route(address: string): RouteResult<B> {
    const hp = splitHostPort(address);
    if (!hp) return { reason: 'endpoint', message: `invalid destination "${address}": expected HOST:PORT` };
    // Never a route to the agents' gateway handler: the gateway picks its agent by cluster (ProxyCore.dialGateway).
    if (isGatewayHost(hp.host)) return { reason: 'forbidden', message: `${address} is reserved for the hub's HTTP gateway` };
    const candidates: B[] = [];
    const exact = this.byHost.get(hp.host);
    if (exact) candidates.push(...exact);
    if (candidates.length === 0) {
      const family = isIP(hp.host);
      if (family) {
        const type = family === 4 ? 'ipv4' : 'ipv6';
        for (const c of this.cidrs) if (c.list.check(hp.host, type)) candidates.push(c.backend);
      }
    }
    if (candidates.length === 0) candidates.push(...this.defaultRoutes);
    if (candidates.length === 0) return { reason: 'no_agent', message: `No agent available for ${address}` };
    const live = candidates.filter((b) => !b.draining);
    if (live.length === 0) return { reason: 'draining', message: `No agent available for ${address}: its agents are draining` };
    let best = live[0]!;
    for (const b of live) if (b.openConnections < best.openConnections) best = b;
    return { backend: best };
  }
}

function cidrList(cidr: string): BlockList | null {
  const [addr, bitsText] = cidr.split('/');
  if (!addr || !bitsText || !/^\d+$/.test(bitsText)) return null;
  const family = isIP(addr);
  const bits = Number(bitsText);
  if (!family || bits > (family === 4 ? 32 : 128)) return null;
  const list = new BlockList();
  list.addSubnet(addr, bits, family === 4 ? 'ipv4' : 'ipv6');
  return list;
}

export function isValidCidr(cidr: string): boolean {
  return cidrList(cidr) !== null;
}

/** True if every address of `inner` is inside `outer` (both CIDRs of the same family). */
export function cidrContains(outer: string, inner: string): boolean {
  const o = cidrList(outer);
  const [innerAddr, innerBits] = inner.split('/');
  const [, outerBits] = outer.split('/');
  if (!o || !innerAddr || !isValidCidr(inner)) return false;
  const family = isIP(innerAddr);
  if (family !== isIP(outer.split('/')[0]!)) return false;
  if (Number(innerBits) < Number(outerBits)) return false;
  // inner is at least as narrow, so it lies inside outer iff its first address does.
  return o.check(innerAddr, family === 4 ? 'ipv4' : 'ipv6');
}
