// The agent's half of the hub's HTTP gateway (docs/gateway.md): an in-process HTTP/1.1 handler behind
// the reserved destination GATEWAY_DESTINATION. It never listens on a port: the tunnel hands it one
// end of an in-memory duplex pair per dial (connect()). For each request it
//   - believes the caller's identity only from a hub-signed assertion (proto gateway-identity.ts):
//     signed by a serving certificate of the hub CA this agent trusts, for this cluster, not expired;
//   - drops the caller's Authorization and any Impersonate-* (the hub refuses them already), and the
//     hop-by-hop headers;
//   - calls the apiserver over TLS (the cluster CA) with its own credentials, found where the agent's
//     other Kubernetes calls find them (kube-rest.ts: in a pod the service account; the token file is
//     read on every request, kubelet rotates it), and Impersonate-User / -Group / -Uid;
//   - streams both bodies with pipeline() (backpressure, nothing buffered whole);
//   - upgrades (exec, attach, port-forward: WebSocket, SPDY/3.1) the same way up to the apiserver's 101,
//     then splices the two byte streams (upgrade.ts).
// So the cluster's own RBAC decides what the hub user may do; the agent's service account needs
// `impersonate` on users, groups and uids (agent/README.md).
import { X509Certificate } from 'node:crypto';
import { readFile } from 'node:fs/promises';
import https from 'node:https';
import { Duplex, duplexPair, pipeline } from 'node:stream';
import { IDENTITY_HEADER, IDENTITY_SIGNER_HEADER, certificatesOf, impersonateExtraHeaders, endToEndHeaders, isImpersonationHeader, requestLine, verifyIdentity, type GatewayIdentity, http } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import type { KubeRestConfig } from '../kube-rest.js';
import { rawAnswer, upgradeToApiserver } from './upgrade.js';
import type * as HttpTypes from 'node:http';

/** A request the agent will send on: where, and with which headers (the impersonation ones included). */
export interface Prepared {
  kube: KubeRestConfig;
  headers: Record<string, string | string[]>;
  identity: GatewayIdentity;
}

export interface ImpersonatingProxyOptions {
  cluster: string;
  /** The hub CA bundle this agent trusts now (it changes during a CA rollover). */
  trust: () => Buffer;
  /** Where the apiserver is and the agent's own credentials for it. */
  kube: () => Promise<KubeRestConfig>;
  log: Logger;
}

/** What node:http and the endpoint connection call on a socket, beyond Duplex: no-ops in memory. */
function socketLike(d: Duplex): Duplex {
  return Object.assign(d, {
    setNoDelay: () => d,
    setKeepAlive: () => d,
    setTimeout: () => d,
  });
}

export class ImpersonatingProxy {
  private readonly server: HttpTypes.Server;
  /** Keep-alive connections to the apiserver, shared by every request; destroyed by close(). */
  private readonly apiAgent = new https.Agent({ keepAlive: true, maxFreeSockets: 64, scheduling: "lifo" });
  private trusted: { bundle: Buffer; certs: X509Certificate[] } | null = null;
  private kubeConfig: Promise<KubeRestConfig> | null = null;
  private readonly log: Logger;
  /** Upgrade requests and their sessions (node's closeAllConnections() no longer sees them). */
  private readonly upgraded = new Set<Duplex>();

  constructor(private readonly opts: ImpersonatingProxyOptions) {
    this.log = opts.log.child({ component: 'gateway' });
    // No request timeout: a watch or `logs -f` runs as long as the caller wants.
    this.server = http.createServer({ requestTimeout: 0, headersTimeout: 15_000, keepAliveTimeout: 0 }, (req, res) => void this.handle(req, res));
    this.server.on('upgrade', (req: HttpTypes.IncomingMessage, socket: Duplex, head: Buffer) => void this.upgrade(req, socket, head));
  }

  /** One tunneled connection to the reserved destination: returns the end the tunnel writes into. */
  connect(): Duplex {
    const [tunnelEnd, serverEnd] = duplexPair({ allowHalfOpen: true });
    this.server.emit('connection', socketLike(serverEnd));
    return socketLike(tunnelEnd);
  }

  close(): void {
    this.server.closeAllConnections();
    for (const s of this.upgraded) s.destroy();
    this.apiAgent.destroy();
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
  private async prepare(req: HttpTypes.IncomingMessage): Promise<Prepared | { status: number; message: string }> {
    const assertion = req.headers[IDENTITY_HEADER];
    const signer = req.headers[IDENTITY_SIGNER_HEADER];
    const identity: GatewayIdentity | { error: string } = typeof assertion === 'string' && typeof signer === 'string'
      ? verifyIdentity(assertion, signer, this.trustedCas(), this.opts.cluster, requestLine(req.method, req.url))
      : { error: 'no identity assertion' };
    if ('error' in identity) {
      this.log.warn({ reason: identity.error }, 'gateway request refused: the identity was not signed by the hub');
      return { status: 403, message: `the agent refused the request: ${identity.error}` };
    }
    let kube: KubeRestConfig;
    let token: string | undefined;
    try {
      kube = await this.kube();
      token = kube.tokenFile ? (await readFile(kube.tokenFile, 'utf8')).trim() : kube.token;
    } catch (err) {
      return { status: 502, message: `the agent has no Kubernetes API credentials: ${(err as Error).message}` };
    }
    const headers: Record<string, string | string[]> = endToEndHeaders(req.headersDistinct, (name) =>
      name === 'authorization' || name === 'host' || name === IDENTITY_HEADER || name === IDENTITY_SIGNER_HEADER || isImpersonationHeader(name));
    if (token) headers['authorization'] = `Bearer ${token}`;
    headers['impersonate-user'] = identity.user;
    if (identity.groups.length > 0) headers['impersonate-group'] = identity.groups;
    if (identity.uid) headers['impersonate-uid'] = identity.uid;
    Object.assign(headers, impersonateExtraHeaders(identity.extra));
    headers['host'] = kube.server.host;
    return { kube, headers, identity };
  }

  private async upgrade(req: HttpTypes.IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
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

  private async handle(req: HttpTypes.IncomingMessage, res: HttpTypes.ServerResponse): Promise<void> {
    const p = await this.prepare(req);
    if ('status' in p) return this.refuse(req, res, p.status, p.message);
    const { kube, headers } = p;
    if (req.headers['transfer-encoding']) headers['transfer-encoding'] = 'chunked';

    const upstream = https.request(apiserverRequest(kube, req.method, req.url ?? '/', headers, this.apiAgent));
    upstream.on('response', (up) => {
      res.writeHead(up.statusCode ?? 502, endToEndHeaders(up.headersDistinct));
      res.flushHeaders();
      pipeline(up, res, (err) => {
        if (err) res.destroy();
      });
    });
    upstream.on('error', (err) => {
      if (res.headersSent) {
        res.destroy();
        return;
      }
      this.refuse(req, res, 502, `the agent could not reach the apiserver ${kube.server.host}: ${err.message}`);
    });
    pipeline(req, upstream, (err) => {
      if (err) upstream.destroy();
    });
    res.on('close', () => {
      if (!res.writableFinished) upstream.destroy();
    });
  }

  private refuse(req: HttpTypes.IncomingMessage, res: HttpTypes.ServerResponse, status: number, message: string): void {
    req.resume();
    const body = `${message.replace(/\s+/g, ' ').trim()}\n`;
    res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'content-length': Buffer.byteLength(body), connection: 'close' });
    res.end(body);
  }
}

/** A request to the apiserver of `kube` (its server URL's path prefixed), verified with its CA, with its client certificate if any. */
export function apiserverRequest(kube: KubeRestConfig, method: string | undefined, path: string, headers: Record<string, string | string[]>, agent: https.Agent | false): https.RequestOptions {
  return {
    protocol: 'https:',
    hostname: kube.server.hostname.replace(/^\[(.*)\]$/, '$1'),
    port: kube.server.port || 443,
    method,
    path: `${kube.server.pathname.replace(/\/$/, '')}${path}`,
    headers,
    ca: kube.ca,
    cert: kube.cert,
    key: kube.key,
    rejectUnauthorized: !kube.insecureSkipTlsVerify,
    agent,
  };
}
