// The agent's client for the hub API (server/src/hub-api.ts): HTTPS on the hub's agent port with
// ALPN "http/1.1", through the same egress proxy as the tunnel, so bootstrap, certificate renewal
// and lease renewal need no other route to the hub than the tunnel itself.
import { createHash } from 'node:crypto';
import http from 'node:http';
import { isIP } from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { splitHostPort } from '@cluster-proxy/proto';
import { connectThroughProxy } from './egress-proxy.js';
import type { EgressOptions } from './links.js';

export interface HubClientOptions {
  /** HOST:PORT of the hub's agent listener. */
  address: string;
  caCert: Buffer;
  /** Absent for bootstrap (no certificate yet). */
  cert?: Buffer;
  key?: Buffer;
  serverName?: string;
  egress?: EgressOptions;
  timeoutMs?: number;
  /** Resume the TLS session of an earlier request (no certificate signing or checking on either side). */
  sessions?: HubSessionCache;
  /** Keep the connection open for the next request (lease renewals, replica syncs: no handshake at all). */
  connections?: HubConnections;
}

/**
 * The last TLS session an agent had with the hub API, for the identity it was made with. A lease renewal
 * and a replica sync every few seconds from each of thousands of agents each cost the hub a full handshake
 * (an RSA signature, a certificate chain check) otherwise; resumed, they cost it a key exchange.
 */
export class HubSessionCache {
  private entry: { cert: Buffer; caCert: Buffer; session: Buffer } | null = null;

  /** The session made with this certificate and trust, if any (a renewed certificate starts afresh). */
  get(cert: Buffer | undefined, caCert: Buffer): Buffer | undefined {
    const e = this.entry;
    return e && cert && e.cert.equals(cert) && e.caCert.equals(caCert) ? e.session : undefined;
  }

  set(cert: Buffer | undefined, caCert: Buffer, session: Buffer): void {
    this.entry = cert ? { cert, caCert, session } : null;
  }
}

/**
 * An idle hub API connection is closed after this long at most (the hub's own bound, announced in its
 * Keep-Alive header, is usually shorter and wins): long enough to outlive the default 60 s lease period.
 */
export const HUB_KEEPALIVE_MAX_IDLE_MS = 120_000;

/**
 * One kept-alive HTTPS connection to the hub API per agent (two while a lease renewal and a replica sync
 * overlap), for the identity it was opened with. At 5,000 agents each renewing every minute, a connection
 * per request was ~80 TLS handshakes a second on the hub. The hub closes idle ones after its keep-alive
 * timeout and all of them when it drains, so a kept connection never holds a replica up.
 */
export class HubConnections {
  private current: { key: string; agent: http.Agent } | null = null;
  private closed = false;
  /** How the pool opens a connection, from the latest request (same identity; its own timeout). */
  private connect: ConnectFn | null = null;

  /** The pool for these options; a new identity, trust or address closes the old pool's connections. */
  agentFor(opts: HubClientOptions, connect: ConnectFn): http.Agent | undefined {
    if (this.closed) return undefined;
    this.connect = connect;
    const key = [opts.address, opts.serverName ?? '', opts.egress?.proxy.href ?? '', fingerprint(opts.caCert), fingerprint(opts.cert)].join('|');
    if (this.current?.key === key) return this.current.agent;
    this.current?.agent.destroy();
    const agent = new http.Agent({ keepAlive: true, maxSockets: 2, maxFreeSockets: 1, timeout: HUB_KEEPALIVE_MAX_IDLE_MS });
    // The socket (TLS, maybe through the egress proxy) comes from the caller; the pool only keeps it.
    agent.createConnection = (_options: unknown, cb: (err: Error | null, socket?: Duplex) => void): undefined => {
      if (this.connect) this.connect(cb);
      else cb(new Error('hub API connections are closed'));
      return undefined;
    };
    this.current = { key, agent };
    return agent;
  }

  /** Closes every kept connection (agent stop). */
  close(): void {
    this.closed = true;
    this.current?.agent.destroy();
    this.current = null;
    this.connect = null;
  }
}

type ConnectFn = (cb: (err: Error | null, socket?: Duplex) => void) => void;

function fingerprint(b: Buffer | undefined): string {
  return b ? createHash('sha256').update(b).digest('base64') : '';
}

const MAX_ANSWER_BYTES = 1 << 20;

/** The hub answered with an error status; `message` is the hub's one-line reason. */
export class HubRequestError extends Error {
  constructor(readonly status: number, message: string) {
    super(message);
    this.name = 'HubRequestError';
  }
}

/** POSTs (or GETs, without body) JSON to the hub API; resolves with the parsed JSON answer. */
export async function hubRequest(opts: HubClientOptions, method: 'GET' | 'POST', path: string, body?: unknown): Promise<unknown> {
  try {
    return await requestOnce(opts, method, path, body);
  } catch (err) {
    // A kept connection the hub closed just as we reused it (idle timeout, drain): once more on a new one.
    if (err instanceof StaleConnectionError) return requestOnce(opts, method, path, body);
    throw err;
  }
}

/** A reused connection turned out closed. Sent again: the hub API requests that keep connections (lease renewal, replica list) are idempotent. */
class StaleConnectionError extends Error {}

async function requestOnce(opts: HubClientOptions, method: 'GET' | 'POST', path: string, body?: unknown): Promise<unknown> {
  const hp = splitHostPort(opts.address);
  if (!hp) throw new Error(`hub address "${opts.address}" is not HOST:PORT`);
  const timeoutMs = opts.timeoutMs ?? 15_000;
  const signal = AbortSignal.timeout(timeoutMs);
  const serverName = opts.serverName ?? (isIP(hp.host) ? undefined : hp.host);
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  let tunnel: Duplex | undefined; // the one-shot request's egress tunnel, destroyed on error
  const openTls = (underlying: Duplex | undefined): tls.TLSSocket => {
    const session = opts.sessions?.get(opts.cert, opts.caCert);
    const socket = tls.connect({
      ...(underlying ? { socket: underlying } : { host: hp.host, port: hp.port }),
      ca: opts.caCert,
      ...(opts.cert && opts.key ? { cert: opts.cert, key: opts.key } : {}),
      servername: serverName,
      ALPNProtocols: ['http/1.1'],
      ...(session ? { session } : {}),
    });
    const sessions = opts.sessions;
    if (sessions) socket.on('session', (s: Buffer) => sessions.set(opts.cert, opts.caCert, s));
    return socket;
  };
  // Through the egress proxy, the CONNECT tunnel comes first (asynchronously), then TLS inside it.
  const connect: ConnectFn = (cb) => {
    if (!opts.egress) return cb(null, openTls(undefined));
    connectThroughProxy({ proxy: opts.egress.proxy, target: hp, timeoutMs: opts.egress.connectTimeoutMs, ca: opts.egress.ca, signal: AbortSignal.timeout(timeoutMs) }).then(
      (t) => cb(null, openTls(t)),
      (err: Error) => cb(err),
    );
  };
  const pool = opts.connections?.agentFor(opts, connect);
  const oneShotTunnel = !pool && opts.egress ? await connectThroughProxy({ proxy: opts.egress.proxy, target: hp, timeoutMs: opts.egress.connectTimeoutMs, ca: opts.egress.ca, signal }) : undefined;
  return new Promise((resolve, reject) => {
    const req = http.request({
      method,
      path,
      host: hp.host,
      port: hp.port,
      headers: { 'content-type': 'application/json', ...(payload ? { 'content-length': payload.length } : {}) },
      signal,
      ...(pool ? { agent: pool } : { createConnection: () => { tunnel = oneShotTunnel; return openTls(oneShotTunnel); } }),
    }, (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (c: Buffer) => {
        size += c.length;
        // Answers are small JSON documents; a hub that sends more is cut off rather than buffered.
        if (size > MAX_ANSWER_BYTES) {
          reject(new Error(`hub answer to ${method} ${path} exceeds ${MAX_ANSWER_BYTES} bytes`));
          req.destroy();
          return;
        }
        chunks.push(c);
      });
      res.once('error', reject);
      res.once('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let parsed: unknown = null;
        try {
          parsed = text ? JSON.parse(text) : null;
        } catch {
          return reject(new HubRequestError(res.statusCode ?? 0, `hub answered ${res.statusCode} with a body that is not JSON`));
        }
        const status = res.statusCode ?? 0;
        if (status >= 200 && status < 300) return resolve(parsed);
        const why = typeof parsed === 'object' && parsed !== null && typeof (parsed as { error?: unknown }).error === 'string' ? (parsed as { error: string }).error : `HTTP ${status}`;
        reject(new HubRequestError(status, `hub refused ${method} ${path} (${status}): ${why}`));
      });
    });
    req.once('error', (err: NodeJS.ErrnoException) => {
      if (!pool) tunnel?.destroy();
      if (req.reusedSocket && !signal.aborted && (err.code === 'ECONNRESET' || err.code === 'EPIPE')) return reject(new StaleConnectionError(err.message));
      reject(err.name === 'AbortError' || err.name === 'TimeoutError' ? new Error(`hub ${opts.address} did not answer ${method} ${path} within ${timeoutMs} ms`) : err);
    });
    req.end(payload);
  });
}
