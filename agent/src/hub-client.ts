// The agent's client for the hub API (server/src/hub-api.ts): HTTPS on the hub's agent port with
// ALPN "http/1.1", through the same egress proxy as the tunnel, so bootstrap, certificate renewal
// and lease renewal need no other route to the hub than the tunnel itself.
import { isIP } from 'node:net';
import tls from 'node:tls';
import { splitHostPort, http } from '@cluster-proxy/proto';
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

const MAX_ANSWER_BYTES = 1 << 20;

/** The hub answered with an error status; `message` is the hub's one-line reason. */
export class HubRequestError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
    this.name = 'HubRequestError';
  }
}

/** POSTs (or GETs, without body) JSON to the hub API; resolves with the parsed JSON answer. */
export async function hubRequest(opts: HubClientOptions, method: 'GET' | 'POST', path: string, body?: unknown): Promise<unknown> {
  const hp = splitHostPort(opts.address);
  if (!hp) throw new Error(`hub address "${opts.address}" is not HOST:PORT`);
  const timeoutMs = opts.timeoutMs ?? 15_000;
  const signal = AbortSignal.timeout(timeoutMs);
  const tunnel = opts.egress
    ? await connectThroughProxy({
        proxy: opts.egress.proxy,
        target: hp,
        timeoutMs: opts.egress.connectTimeoutMs,
        ca: opts.egress.ca,
        signal,
      })
    : undefined;
  const serverName = opts.serverName ?? (isIP(hp.host) ? undefined : hp.host);
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        method,
        path,
        host: hp.host,
        port: hp.port,
        headers: { 'content-type': 'application/json', ...(payload ? { 'content-length': payload.length } : {}) },
        signal,
        createConnection: () => {
          const session = opts.sessions?.get(opts.cert, opts.caCert);
          const socket = tls.connect({
            ...(tunnel ? { socket: tunnel } : { host: hp.host, port: hp.port }),
            ca: opts.caCert,
            ...(opts.cert && opts.key ? { cert: opts.cert, key: opts.key } : {}),
            servername: serverName,
            ALPNProtocols: ['http/1.1'],
            ...(session ? { session } : {}),
          });
          const sessions = opts.sessions;
          if (sessions) socket.on('session', (s: Buffer) => sessions.set(opts.cert, opts.caCert, s));
          return socket;
        },
      },
      (res) => {
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
          const why =
            typeof parsed === 'object' && parsed !== null && typeof (parsed as { error?: unknown }).error === 'string'
              ? (parsed as { error: string }).error
              : `HTTP ${status}`;
          reject(new HubRequestError(status, `hub refused ${method} ${path} (${status}): ${why}`));
        });
      },
    );
    req.once('error', (err: Error) => {
      tunnel?.destroy();
      reject(
        err.name === 'AbortError' || err.name === 'TimeoutError'
          ? new Error(`hub ${opts.address} did not answer ${method} ${path} within ${timeoutMs} ms`)
          : err,
      );
    });
    req.end(payload);
  });
}
