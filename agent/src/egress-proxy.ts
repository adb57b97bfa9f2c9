// A TCP tunnel through an HTTP CONNECT proxy: `http://` (plain TCP to the proxy) or `https://` (TLS to
// the proxy, verified against a CA bundle), Basic auth from the URL's user-info, one timeout for the
// whole setup, and errors that name the proxy without its password.
//
// The socket handed back is positioned right after the proxy's response head. Bytes the proxy sent
// after the head (a server-speaks-first protocol, or a coalesced read) are unshifted back into the
// socket's readable buffer, where pipe(), 'data' listeners, tls.connect({ socket }) and
// http2.connect({ createConnection }) all find them (Node's TLS and HTTP/2 wrappers drain a socket's
// JS-level buffer before reading from its handle).
import net from 'node:net';
import tls from 'node:tls';
import { redactProxyUrl } from './no-proxy.js';

export type EgressProxyErrorKind =
  /** The proxy URL or target cannot be used (unsupported scheme, bad port, CR/LF in the host). */
  | 'config'
  /** TCP connection to the proxy failed: refused, unreachable, DNS. */
  | 'unreachable'
  /** TLS to an https:// proxy failed (certificate not trusted, wrong host name, not TLS at all). */
  | 'tls'
  /** No connection, handshake or CONNECT answer within timeoutMs. */
  | 'timeout'
  /** 407: credentials missing or refused. */
  | 'auth'
  /** 403: the proxy's policy refuses this destination. */
  | 'refused'
  /** Any other non-2xx answer. */
  | 'status'
  /** The answer is not HTTP, or its head is too large. */
  | 'protocol'
  /** The proxy closed or reset the connection before answering. */
  | 'closed'
  /** The caller's AbortSignal fired. */
  | 'aborted';

export class EgressProxyError extends Error {
  override name = 'EgressProxyError';
  readonly kind: EgressProxyErrorKind;
  /** The proxy URL without its password (scheme://[user@]host:port). */
  readonly proxy: string;
  /** HOST:PORT the CONNECT was for. */
  readonly target: string;
  /** The proxy's status code, for kinds auth, refused and status. */
  readonly statusCode: number | undefined;
  /** The system or OpenSSL error code (ECONNREFUSED, ENOTFOUND, UNABLE_TO_VERIFY_LEAF_SIGNATURE, ...). */
  readonly code: string | undefined;

  constructor(
    kind: EgressProxyErrorKind,
    message: string,
    info: { proxy: string; target: string; statusCode?: number; code?: string; cause?: unknown },
  ) {
    super(message, info.cause !== undefined ? { cause: info.cause } : undefined);
    this.kind = kind;
    this.proxy = info.proxy;
    this.target = info.target;
    this.statusCode = info.statusCode;
    this.code = info.code;
  }
}

export interface ConnectThroughProxyOptions {
  /** `http://[user:password@]host[:port]` or `https://...`; the port defaults to 80 / 443 (as Go does). */
  proxy: URL;
  target: { host: string; port: number };
  /** Bounds everything: TCP connect, TLS handshake with the proxy, and the CONNECT answer. */
  timeoutMs: number;
  /** CA bundle (PEM) for an https:// proxy; default: Node's bundled root CAs. */
  ca?: Buffer | string;
  signal?: AbortSignal;
  /** Largest response head accepted from the proxy (default 16 KiB). */
  maxHeadBytes?: number;
  /** Extra request headers (e.g. User-Agent). */
  headers?: Record<string, string>;
  /**
   * For http:// proxies: keep the write side open after the peer's FIN (default false, Node's
   * default). TLS to an https:// proxy always closes both ways together.
   */
  allowHalfOpen?: boolean;
}

export const DEFAULT_MAX_HEAD_BYTES = 16 * 1024;

/** HOST:PORT with IPv6 literals in brackets. */
export function formatHostPort(host: string, port: number): string {
  const h = host.startsWith('[') ? host : host.includes(':') ? `[${host}]` : host;
  return `${h}:${port}`;
}

/** The Proxy-Authorization value for the URL's user-info, or null when it has none. */
export function proxyAuthorization(proxy: URL): string | null {
  if (proxy.username === '' && proxy.password === '') return null;
  const decode = (s: string): string => {
    try {
      return decodeURIComponent(s);
    } catch {
      return s;
    }
  };
  return `Basic ${Buffer.from(`${decode(proxy.username)}:${decode(proxy.password)}`).toString('base64')}`;
}

/**
 * Opens a tunnel to `target` through the proxy. Resolves with the proxy connection (a net.Socket for
 * http://, a tls.TLSSocket for https://) once the proxy answered 2xx; rejects with an
 * EgressProxyError otherwise. The caller owns the socket: attach an 'error' listener right away.
 */
export function connectThroughProxy(opts: ConnectThroughProxyOptions): Promise<net.Socket | tls.TLSSocket> {
  const shown = redactProxyUrl(opts.proxy);
  const target = formatHostPort(opts.target.host.replace(/^\[(.*)\]$/, '$1'), opts.target.port);
  const info = { proxy: shown, target };
  const fail = (
    kind: EgressProxyErrorKind,
    message: string,
    extra: { statusCode?: number; code?: string; cause?: unknown } = {},
  ): EgressProxyError => new EgressProxyError(kind, message, { ...info, ...extra });

  const secure = opts.proxy.protocol === 'https:';
  if (!secure && opts.proxy.protocol !== 'http:') {
    return Promise.reject(
      fail('config', `proxy ${shown}: scheme ${opts.proxy.protocol.replace(/:$/, '')} is not supported (use http:// or https://)`),
    );
  }
  const proxyHost = opts.proxy.hostname.replace(/^\[(.*)\]$/, '$1');
  if (proxyHost === '') return Promise.reject(fail('config', `proxy ${shown} has no host`));
  const proxyPort = opts.proxy.port !== '' ? Number(opts.proxy.port) : secure ? 443 : 80;
  const { host: targetHostRaw, port: targetPort } = opts.target;
  if (!Number.isInteger(targetPort) || targetPort < 1 || targetPort > 65535) {
    return Promise.reject(fail('config', `CONNECT target ${target}: port must be 1-65535`));
  }
  // The target goes into the request line: refuse anything that could inject a header.
  if (targetHostRaw === '' || /[\s\x00-\x1f\x7f/?#@]/.test(targetHostRaw)) {
    return Promise.reject(fail('config', `CONNECT target ${JSON.stringify(targetHostRaw)} is not a host name or IP address`));
  }
  if (!(opts.timeoutMs > 0)) return Promise.reject(fail('config', `CONNECT timeout must be positive, got ${opts.timeoutMs}`));
  const maxHead = opts.maxHeadBytes ?? DEFAULT_MAX_HEAD_BYTES;
  if (opts.signal?.aborted) return Promise.reject(fail('aborted', `CONNECT to ${target} through ${shown} aborted`));
  return new ProxyConnect(opts, { shown, target, secure, proxyHost, proxyPort, maxHead }).start();
}

/** Where one CONNECT through a proxy is (see ProxyConnect). */
type ProxyConnectState = 'idle' | 'connecting' | 'tls' | 'waiting' | 'tunneled' | 'failed';

/** What connectThroughProxy checked and worked out from its options. */
interface ProxyConnectPlan {
  /** The proxy URL without its password, for messages. */
  shown: string;
  /** HOST:PORT of the target, as the request line names it. */
  target: string;
  secure: boolean;
  proxyHost: string;
  proxyPort: number;
  maxHead: number;
}

/**
 * One CONNECT through a proxy. States:
 *   idle       made, start() not called yet
 *   connecting TCP to the proxy
 *   tls        TCP connected, TLS handshake with an https:// proxy
 *   waiting    CONNECT sent, reading the proxy's answer head
 *   tunneled   the proxy answered 2xx: the socket is the caller's (resolved)
 *   failed     an error, the timeout, an abort or stop(): the socket destroyed (rejected with an EgressProxyError)
 *
 *   idle ──start()──▶ connecting ──connect (http://)──▶ waiting ──2xx──▶ tunneled
 *   connecting ──connect (https://)──▶ tls ──secureConnect──▶ waiting
 *   connecting, tls, waiting ──error, close, timeout, abort, stop(), an answer not 2xx──▶ failed
 * Entering tunneled or failed (finish(), the only way there) settles the promise; the timer, the abort
 * listener and every listener on the socket go then.
 */
class ProxyConnect {
  private state: ProxyConnectState = 'idle';
  private received: Buffer = Buffer.alloc(0);
  private socket: net.Socket | tls.TLSSocket | null = null;
  private timer: NodeJS.Timeout | null = null;
  private resolve: (s: net.Socket | tls.TLSSocket) => void = () => {};
  private reject: (err: EgressProxyError) => void = () => {};

  constructor(
    private readonly opts: ConnectThroughProxyOptions,
    private readonly plan: ProxyConnectPlan,
  ) {}

  /** Dials the proxy and sends CONNECT; resolves with the socket once the proxy answered 2xx. */
  start(): Promise<net.Socket | tls.TLSSocket> {
    if (this.state !== 'idle') return Promise.reject(new Error('ProxyConnect.start() runs once'));
    const { opts, plan } = this;
    return new Promise((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
      this.setState('connecting');
      const allowHalfOpen = opts.allowHalfOpen ?? false;
      const socket: net.Socket | tls.TLSSocket = plan.secure
        ? tls.connect({
            host: plan.proxyHost,
            port: plan.proxyPort,
            ...(opts.ca !== undefined ? { ca: opts.ca } : {}),
            // SNI only for names (RFC 6066); Node verifies the certificate against the host either way.
            ...(net.isIP(plan.proxyHost) ? {} : { servername: plan.proxyHost }),
          })
        : net.connect({ host: plan.proxyHost, port: plan.proxyPort, allowHalfOpen });
      this.socket = socket;
      this.timer = setTimeout(this.onTimeout, opts.timeoutMs);
      opts.signal?.addEventListener('abort', this.onAbort, { once: true });
      socket.on('connect', this.onConnect);
      if (plan.secure) socket.on('secureConnect', this.onSecureConnect);
      socket.on('readable', this.onReadable);
      socket.on('error', this.onError);
      socket.on('end', this.onEnd);
      socket.on('close', this.onClose);
    });
  }

  /** Gives up (as an abort does): the socket is destroyed and the promise rejected. */
  stop(): void {
    this.onAbort();
  }

  private get settled(): boolean {
    return this.state === 'tunneled' || this.state === 'failed';
  }

  /** The one place the state changes; settling stops the timer and removes every listener. */
  private setState(next: ProxyConnectState): void {
    this.state = next;
    if (next !== 'tunneled' && next !== 'failed') return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.opts.signal?.removeEventListener('abort', this.onAbort);
    const socket = this.socket;
    if (!socket) return;
    socket.off('connect', this.onConnect);
    socket.off('secureConnect', this.onSecureConnect);
    socket.off('readable', this.onReadable);
    socket.off('error', this.onError);
    socket.off('end', this.onEnd);
    socket.off('close', this.onClose);
  }

  private fail(
    kind: EgressProxyErrorKind,
    message: string,
    extra: { statusCode?: number; code?: string; cause?: unknown } = {},
  ): EgressProxyError {
    return new EgressProxyError(kind, message, { proxy: this.plan.shown, target: this.plan.target, ...extra });
  }

  private finish(err: EgressProxyError | null, rest?: Buffer): void {
    if (this.settled || this.state === 'idle') return;
    const socket = this.socket!;
    this.setState(err === null ? 'tunneled' : 'failed');
    if (err !== null) {
      // Nothing may surface as an uncaught 'error' after we gave up on the socket.
      socket.on('error', () => {});
      socket.destroy();
      this.reject(err);
      return;
    }
    if (rest !== undefined && rest.length > 0) socket.unshift(rest);
    this.resolve(socket);
  }

  private readonly onTimeout = (): void => {
    const { shown } = this.plan;
    const ms = this.opts.timeoutMs;
    const message =
      this.state === 'connecting'
        ? `cannot reach proxy ${shown}: no connection within ${ms} ms`
        : this.state === 'tls'
          ? `TLS handshake with proxy ${shown} did not finish within ${ms} ms`
          : `proxy ${shown} did not answer CONNECT within ${ms} ms`;
    this.finish(this.fail('timeout', message));
  };

  private readonly onAbort = (): void => {
    this.finish(this.fail('aborted', `CONNECT to ${this.plan.target} through ${this.plan.shown} aborted`));
  };

  private readonly onConnect = (): void => {
    if (this.plan.secure) {
      this.setState('tls');
      return;
    }
    this.sendConnect();
  };

  private readonly onSecureConnect = (): void => {
    this.sendConnect();
  };

  private sendConnect(): void {
    this.setState('waiting');
    const { target } = this.plan;
    const lines = [`CONNECT ${target} HTTP/1.1`, `Host: ${target}`];
    const auth = proxyAuthorization(this.opts.proxy);
    if (auth !== null) lines.push(`Proxy-Authorization: ${auth}`);
    for (const [k, v] of Object.entries(this.opts.headers ?? {})) {
      if (/[\r\n]/.test(k) || /[\r\n]/.test(v)) continue;
      lines.push(`${k}: ${v}`);
    }
    this.socket!.write(`${lines.join('\r\n')}\r\n\r\n`);
  }

  private readonly onReadable = (): void => {
    if (this.settled) return;
    const { maxHead, shown } = this.plan;
    const socket = this.socket!;
    let chunk: Buffer | null;
    while ((chunk = socket.read() as Buffer | null) !== null) {
      this.received = this.received.length === 0 ? chunk : Buffer.concat([this.received, chunk]);
      const received = this.received;
      const end = received.indexOf('\r\n\r\n');
      if (end >= 0 && end + 4 <= maxHead) {
        this.handleHead(received.subarray(0, end).toString('latin1'), received.subarray(end + 4));
        return;
      }
      if (received.length > maxHead) {
        this.finish(this.fail('protocol', `proxy ${shown} sent a CONNECT answer head larger than ${Math.round(maxHead / 1024)} KiB`));
        return;
      }
      if (received[0] === 0x15 || received[0] === 0x16) {
        this.finish(this.fail('protocol', this.notHttp()));
        return;
      }
    }
  };

  private notHttp(): string {
    const { received } = this;
    const { shown } = this.plan;
    // A TLS record (alert 0x15, handshake 0x16) where HTTP was expected: an https:// proxy addressed as http://.
    if (received[0] === 0x15 || received[0] === 0x16) return `proxy ${shown} answered CONNECT with TLS, not HTTP: is it an https:// proxy?`;
    return `proxy ${shown} answered CONNECT with something that is not HTTP: ${printable(received.toString('latin1').split('\r\n')[0]!)}`;
  }

  private handleHead(head: string, rest: Buffer): void {
    const { shown, target } = this.plan;
    const [statusLine = '', ...headerLines] = head.split('\r\n');
    const m = /^HTTP\/1\.[01] (\d{3})(?: (.*))?$/.exec(statusLine);
    if (!m) {
      this.finish(this.fail('protocol', this.notHttp()));
      return;
    }
    const status = Number(m[1]);
    const reason = (m[2] ?? '').trim();
    const statusText = reason !== '' ? `${status} ${printable(reason)}` : String(status);
    if (status >= 200 && status < 300) {
      this.finish(null, rest);
      return;
    }
    const headers = headerLines.map((l) => {
      const i = l.indexOf(':');
      return i < 0 ? ['', ''] : [l.slice(0, i).trim().toLowerCase(), l.slice(i + 1).trim()];
    });
    const header = (name: string): string[] => headers.filter(([k]) => k === name).map(([, v]) => v!);
    if (status === 407) {
      const schemes = header('proxy-authenticate')
        .map((v) => v.split(/\s/)[0]!)
        .filter((s) => s !== '');
      const noBasic =
        schemes.length > 0 && !schemes.some((s) => s.toLowerCase() === 'basic')
          ? `; it asks for ${schemes.join(', ')}, only Basic is supported`
          : '';
      const message =
        proxyAuthorization(this.opts.proxy) !== null
          ? `proxy authentication failed (${shown} answered 407${noBasic})`
          : `proxy authentication required (${shown} answered 407 and the proxy URL has no user name and password${noBasic})`;
      this.finish(this.fail('auth', message, { statusCode: status }));
      return;
    }
    const squid = header('x-squid-error')[0];
    const detail = squid !== undefined ? `, ${printable(squid)}` : '';
    if (status === 403) {
      this.finish(
        this.fail('refused', `proxy refused CONNECT to ${target} (${statusText} from ${shown}${detail})`, { statusCode: status }),
      );
      return;
    }
    this.finish(this.fail('status', `proxy ${shown} answered CONNECT to ${target} with ${statusText}${detail}`, { statusCode: status }));
  }

  private readonly onError = (err: NodeJS.ErrnoException): void => {
    const { shown, target, proxyHost } = this.plan;
    const code = err.code;
    if (this.state === 'connecting') {
      const dns = code === 'ENOTFOUND' || code === 'EAI_AGAIN' ? ` (no DNS answer for ${proxyHost})` : '';
      this.finish(this.fail('unreachable', `cannot reach proxy ${shown}: ${code ?? err.message}${dns}`, { code, cause: err }));
    } else if (this.state === 'tls') {
      const hint = /wrong version number|packet length too long|unknown protocol|record layer failure/i.test(err.message)
        ? '; is it an http:// proxy?'
        : isCertError(code)
          ? '; check the proxy CA bundle'
          : '';
      // OpenSSL's messages span lines and name source files; its `reason` is the readable part.
      const reason = (err as { reason?: unknown }).reason;
      const text = typeof reason === 'string' && reason !== '' ? reason : err.message.split('\n')[0]!;
      this.finish(
        this.fail('tls', `TLS to proxy ${shown} failed: ${text}${code && !text.includes(code) ? ` (${code})` : ''}${hint}`, {
          code,
          cause: err,
        }),
      );
    } else {
      this.finish(
        this.fail(
          'closed',
          `connection to proxy ${shown} failed while waiting for the answer to CONNECT ${target}: ${code ?? err.message}`,
          {
            code,
            cause: err,
          },
        ),
      );
    }
  };

  private readonly onEnd = (): void => {
    this.onClose();
  };

  private readonly onClose = (): void => {
    if (this.settled) return;
    const { shown, target } = this.plan;
    const { received } = this;
    if (this.state === 'connecting') this.finish(this.fail('unreachable', `cannot reach proxy ${shown}: connection closed`));
    else if (this.state === 'tls')
      this.finish(
        this.fail('tls', `TLS to proxy ${shown} failed: the proxy closed the connection during the handshake; is it an http:// proxy?`),
      );
    else if (received.length > 0 && !'HTTP/'.startsWith(received.subarray(0, 5).toString('latin1')))
      this.finish(this.fail('protocol', this.notHttp()));
    else this.finish(this.fail('closed', `proxy ${shown} closed the connection without answering CONNECT ${target}`));
  };
}

function printable(s: string): string {
  const clean = s.replace(/[\x00-\x1f\x7f-\xff]/g, '?');
  return clean.length > 80 ? `${clean.slice(0, 80)}...` : clean;
}

function isCertError(code: string | undefined): boolean {
  return code !== undefined && /CERT|SELF_SIGNED|UNABLE_TO|VERIFY|ERR_TLS_CERT_ALTNAME_INVALID/.test(code);
}
