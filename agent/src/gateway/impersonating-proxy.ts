// The agent's half of the hub's HTTP gateway (docs/gateway.md): an in-process HTTP/1.1 handler behind
// the reserved destination GATEWAY_DESTINATION. It never listens on a port: the tunnel hands it one
// end of an in-memory duplex pair per dial (connect()). For each request it
//   - believes the caller's identity only from an assertion the hub authenticated (proto gateway-identity.ts):
//     an HMAC under the key of the link the request's dial came in on (its TLS session's exported keying
//     material), or a signature by a serving certificate of the hub CA this agent trusts; for this
//     cluster and this very request (method and target), not expired;
//   - refuses (403) an identity a header would not carry exactly (proto identity-names.ts) and, unless
//     the admin allows the name (--gateway-allow-reserved), every `system:` user and group but
//     `system:authenticated`: whatever the hub signs, this agent never makes anyone system:masters,
//     a node or one of the cluster's service accounts;
//   - drops the caller's Authorization, any Impersonate-* (the hub refuses them already), front-proxy
//     X-Remote-* headers, a WebSocket bearer subprotocol, and the hop-by-hop headers;
//   - calls the apiserver over TLS (the cluster CA) with its own credentials, found where the agent's
//     other Kubernetes calls find them (kube-rest.ts: in a pod the service account; the token file is
//     read again once a minute, as client-go does: kubelet rotates it), and Impersonate-User / -Group / -Uid / -Extra-*, as
//     UTF-8 (what client-go sends);
//   - relays each tunneled connection to the apiserver on a TLS connection of its own (apiserver-relay.ts:
//     request heads parsed by node's own parser and rewritten, bodies passed on, the answer passed back byte
//     for byte, backpressure both ways, nothing buffered whole);
//   - upgrades (exec, attach, port-forward: WebSocket, SPDY/3.1) the same way up to the apiserver's 101,
//     then splices the two byte streams (upgrade.ts).
// So the cluster's own RBAC decides what the hub user may do; the agent's service account needs
// `impersonate` on users, groups and uids (agent/README.md). Every request gets an answer: a failure
// inside is a 500 with one line, never an unhandled rejection. When the hub closes the tunneled
// connection (its caller left), the request to the apiserver ends with it (a watch included).
import type { KeyObject, X509Certificate } from 'node:crypto';
import { type Duplex, duplexPair } from 'node:stream';
import {
  GATEWAY_AGENT_MAX_HEAD_BYTES,
  IDENTITY_HEADER,
  IDENTITY_MAC_HEADER,
  IDENTITY_SIGNER_HEADER,
  certificatesOf,
  gatewayForwardedHeaders,
  identityProblem,
  impersonateExtraHeaders,
  isReservedInCluster,
  quoteName,
  requestLine,
  utf8HeaderValue,
  verifyIdentity,
  verifyLinkIdentity,
  type GatewayIdentity,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { bearerToken, type KubeRestConfig } from '../kube-rest.js';
import type { Prepared } from './apiserver-request.js';
import { ApiserverRelay, type RelayHooks, type RequestHead } from './apiserver-relay.js';
import { rawAnswer, upgradeToApiserver } from './upgrade.js';

export interface ImpersonatingProxyOptions {
  cluster: string;
  /** The hub CA bundle this agent trusts now (it changes during a CA rollover). */
  trust: () => Buffer;
  /** Where the apiserver is and the agent's own credentials for it. */
  kube: () => Promise<KubeRestConfig>;
  log: Logger;
  /** Reserved (`system:`) users and groups this agent impersonates all the same, by exact name (--gateway-allow-reserved). */
  allowReserved?: ReadonlySet<string>;
}

/** What the endpoint connection calls on a socket, beyond Duplex: no-ops in memory. */
function socketLike(d: Duplex): Duplex {
  return Object.assign(d, {
    setNoDelay: () => d,
    setKeepAlive: () => d,
    setTimeout: () => d,
  });
}

export class ImpersonatingProxy {
  /** Tunneled connections being relayed (destroyed by close()). */
  private readonly relays = new Set<ApiserverRelay>();
  /** The apiserver's last TLS session, offered by each new connection to it (a shorter handshake). */
  private readonly tlsSessions: { last: Buffer | undefined } = { last: undefined };
  private readonly hooks: RelayHooks;
  private trusted: { bundle: Buffer; certs: X509Certificate[] } | null = null;
  private kubeConfig: Promise<KubeRestConfig> | null = null;
  private readonly log: Logger;
  /** Upgrade requests and their sessions. */
  private readonly upgraded = new Set<Duplex>();
  /** The identity MAC key of the link each tunneled connection came in on (none: signed identities only). */
  private readonly linkKeys = new WeakMap<object, KeyObject>();

  constructor(private readonly opts: ImpersonatingProxyOptions) {
    this.log = opts.log.child({ component: 'gateway' });
    // No request timeout: a watch or `logs -f` runs as long as the caller wants (the hub times out a
    // missing answer). Heads up to what the hub may send: a caller's head within the hub's limit plus the identity.
    this.hooks = {
      prepare: (head) => this.prepare(head),
      upgrade: (head, socket, rest) => {
        this.upgrade(head, socket, rest).catch((err: unknown) =>
          this.failed(err, () => rawAnswer(socket, 500, 'the agent failed to serve the request')),
        );
      },
      log: this.log,
      maxHeadBytes: GATEWAY_AGENT_MAX_HEAD_BYTES,
    };
  }

  /**
   * One tunneled connection to the reserved destination: returns the end the tunnel writes into.
   * `linkKey`: the identity MAC key of the link it came in on (null: that link's requests need signed identities).
   */
  connect(linkKey: KeyObject | null = null): Duplex {
    const [tunnelEnd, serverEnd] = duplexPair({ allowHalfOpen: true });
    if (linkKey) this.linkKeys.set(serverEnd, linkKey);
    // The tunnel's end destroyed (the hub closed the connection: its caller left) ends the relay's side
    // too, and with it any request to the apiserver still open. The other way needs nothing: the relay's
    // end reaches the tunnel as EOF after every byte it wrote.
    tunnelEnd.once('close', () => serverEnd.destroy());
    const relay = new ApiserverRelay(serverEnd, this.hooks, this.tlsSessions);
    this.relays.add(relay);
    serverEnd.once('close', () => this.relays.delete(relay));
    return socketLike(tunnelEnd);
  }

  private failed(err: unknown, answer: () => void): void {
    this.log.error({ err: err instanceof Error ? err.message : String(err) }, 'gateway request failed unexpectedly');
    try {
      answer();
    } catch {
      // the connection is gone: nothing left to answer
    }
  }

  close(): void {
    for (const r of this.relays) r.destroy();
    for (const s of this.upgraded) s.destroy();
  }

  private trustedCas(): X509Certificate[] {
    const bundle = this.opts.trust();
    if (this.trusted?.bundle !== bundle) this.trusted = { bundle, certs: certificatesOf(bundle) };
    return this.trusted.certs;
  }

  /** Loaded on first use and kept; a failure is not kept, so a fixed configuration is picked up. */
  private kube(): Promise<KubeRestConfig> {
    this.kubeConfig ??= this.opts.kube().catch((err: unknown) => {
      this.kubeConfig = null;
      throw err;
    });
    return this.kubeConfig;
  }

  /** The identity checked and the outgoing headers made, or the refusal (status and one line). */
  private async prepare(req: RequestHead): Promise<Prepared | { status: number; message: string }> {
    const identity = this.identityOf(req);
    if ('error' in identity) {
      this.log.warn({ reason: identity.error }, 'gateway request refused: the identity was not authenticated by the hub');
      return { status: 403, message: `the agent refused the request: ${identity.error}` };
    }
    const refused = this.refusedIdentity(identity);
    if (refused) {
      this.log.warn({ reason: refused }, 'gateway request refused: the agent does not impersonate this identity');
      return { status: 403, message: `the agent refused the request: ${refused}` };
    }
    let kube: KubeRestConfig;
    let token: string | undefined;
    try {
      kube = await this.kube();
      token = await bearerToken(kube);
    } catch (err) {
      return { status: 502, message: `the agent has no Kubernetes API credentials: ${(err as Error).message}` };
    }
    // Dropped again here, whatever the hub sent: this hop's own check (proto http-headers.ts).
    const headers = gatewayForwardedHeaders(req.headersDistinct);
    if (token) headers['authorization'] = `Bearer ${token}`;
    headers['impersonate-user'] = utf8HeaderValue(identity.user);
    if (identity.groups.length > 0) headers['impersonate-group'] = identity.groups.map(utf8HeaderValue);
    if (identity.uid) headers['impersonate-uid'] = utf8HeaderValue(identity.uid);
    for (const [name, values] of Object.entries(impersonateExtraHeaders(identity.extra))) headers[name] = values.map(utf8HeaderValue);
    headers['host'] = kube.server.host;
    return { kube, headers, identity };
  }

  /** The identity the hub authenticated for this request, or why there is none it believes. */
  private identityOf(req: RequestHead): GatewayIdentity | { error: string } {
    const mac = req.headersDistinct[IDENTITY_MAC_HEADER];
    const assertion = req.headersDistinct[IDENTITY_HEADER];
    const signer = req.headersDistinct[IDENTITY_SIGNER_HEADER];
    const request = requestLine(req.method, req.url);
    if (mac !== undefined) {
      // One identity per request: a second one alongside is not something the hub sends.
      if (assertion !== undefined || signer !== undefined || mac.length !== 1) return { error: 'more than one identity assertion' };
      return verifyLinkIdentity(mac[0]!, this.linkKeys.get(req.socket) ?? null, this.opts.cluster, request);
    }
    if (assertion === undefined || signer === undefined) return { error: 'no identity assertion' };
    if (assertion.length !== 1 || signer.length !== 1) return { error: 'more than one identity assertion' };
    return verifyIdentity(assertion[0]!, signer[0]!, this.trustedCas(), this.opts.cluster, request);
  }

  /** Why this agent does not impersonate `identity` (null: it does). */
  private refusedIdentity(identity: GatewayIdentity): string | null {
    const problem = identityProblem(identity);
    if (problem) return problem;
    const allowed = this.opts.allowReserved;
    const reserved = [identity.user, ...identity.groups].find((n) => isReservedInCluster(n) && !allowed?.has(n));
    return reserved === undefined
      ? null
      : `${quoteName(reserved)} is a reserved Kubernetes name this agent does not impersonate (--gateway-allow-reserved allows one by name)`;
  }

  private async upgrade(req: RequestHead, socket: Duplex, head: Buffer): Promise<void> {
    socket.on('error', () => {}); // the tunnel's end: reported through 'close' / the splice
    this.upgraded.add(socket);
    socket.once('close', () => this.upgraded.delete(socket));
    const p = await this.prepare(req);
    if ('status' in p) {
      rawAnswer(socket, p.status, p.message);
      return;
    }
    upgradeToApiserver(p, req, socket, head, this.log);
  }
}
