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

type Phase = 'connecting' | 'tls' | 'waiting';

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

  return new Promise((resolve, reject) => {
    let phase: Phase = 'connecting';
    let settled = false;
    let received: Buffer = Buffer.alloc(0);

    const allowHalfOpen = opts.allowHalfOpen ?? false;
    const socket: net.Socket | tls.TLSSocket = secure
      ? tls.connect({
          host: proxyHost,
          port: proxyPort,
          ...(opts.ca !== undefined ? { ca: opts.ca } : {}),
          // SNI only for names (RFC 6066); Node verifies the certificate against the host either way.
          ...(net.isIP(proxyHost) ? {} : { servername: proxyHost }),
        })
      : net.connect({ host: proxyHost, port: proxyPort, allowHalfOpen });

    const timer = setTimeout(() => {
      const message =
        phase === 'connecting'
          ? `cannot reach proxy ${shown}: no connection within ${opts.timeoutMs} ms`
          : phase === 'tls'
            ? `TLS handshake with proxy ${shown} did not finish within ${opts.timeoutMs} ms`
            : `proxy ${shown} did not answer CONNECT within ${opts.timeoutMs} ms`;
      finish(fail('timeout', message));
    }, opts.timeoutMs);

    const onAbort = (): void => finish(fail('aborted', `CONNECT to ${target} through ${shown} aborted`));
    opts.signal?.addEventListener('abort', onAbort, { once: true });

    const cleanup = (): void => {
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      socket.off('connect', onConnect);
      socket.off('secureConnect', onSecureConnect);
      socket.off('readable', onReadable);
      socket.off('error', onError);
      socket.off('end', onEnd);
      socket.off('close', onClose);
    };

    function finish(err: EgressProxyError | null, rest?: Buffer): void {
      if (settled) return;
      settled = true;
      cleanup();
      if (err !== null) {
        // Nothing may surface as an uncaught 'error' after we gave up on the socket.
        socket.on('error', () => {});
        socket.destroy();
        reject(err);
        return;
      }
      if (rest !== undefined && rest.length > 0) socket.unshift(rest);
      resolve(socket);
    }

    function onConnect(): void {
      if (secure) {
        phase = 'tls';
        return;
      }
      sendConnect();
    }

    function onSecureConnect(): void {
      sendConnect();
    }

    function sendConnect(): void {
      phase = 'waiting';
      const lines = [`CONNECT ${target} HTTP/1.1`, `Host: ${target}`];
      const auth = proxyAuthorization(opts.proxy);
      if (auth !== null) lines.push(`Proxy-Authorization: ${auth}`);
      for (const [k, v] of Object.entries(opts.headers ?? {})) {
        if (/[\r\n]/.test(k) || /[\r\n]/.test(v)) continue;
        lines.push(`${k}: ${v}`);
      }
      socket.write(`${lines.join('\r\n')}\r\n\r\n`);
    }

    function onReadable(): void {
      if (settled) return;
      let chunk: Buffer | null;
      while ((chunk = socket.read() as Buffer | null) !== null) {
        received = received.length === 0 ? chunk : Buffer.concat([received, chunk]);
        const end = received.indexOf('\r\n\r\n');
        if (end >= 0 && end + 4 <= maxHead) {
          handleHead(received.subarray(0, end).toString('latin1'), received.subarray(end + 4));
          return;
        }
        if (received.length > maxHead) {
          finish(fail('protocol', `proxy ${shown} sent a CONNECT answer head larger than ${Math.round(maxHead / 1024)} KiB`));
          return;
        }
        if (received[0] === 0x15 || received[0] === 0x16) {
          finish(fail('protocol', notHttp()));
          return;
        }
      }
    }

    function notHttp(): string {
      // A TLS record (alert 0x15, handshake 0x16) where HTTP was expected: an https:// proxy addressed as http://.
      if (received[0] === 0x15 || received[0] === 0x16)
        return `proxy ${shown} answered CONNECT with TLS, not HTTP: is it an https:// proxy?`;
      return `proxy ${shown} answered CONNECT with something that is not HTTP: ${printable(received.toString('latin1').split('\r\n')[0]!)}`;
    }

    function handleHead(head: string, rest: Buffer): void {
      const [statusLine = '', ...headerLines] = head.split('\r\n');
      const m = /^HTTP\/1\.[01] (\d{3})(?: (.*))?$/.exec(statusLine);
      if (!m) {
        finish(fail('protocol', notHttp()));
        return;
      }
      const status = Number(m[1]);
      const reason = (m[2] ?? '').trim();
      const statusText = reason !== '' ? `${status} ${printable(reason)}` : String(status);
      if (status >= 200 && status < 300) {
        finish(null, rest);
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
          proxyAuthorization(opts.proxy) !== null
            ? `proxy authentication failed (${shown} answered 407${noBasic})`
            : `proxy authentication required (${shown} answered 407 and the proxy URL has no user name and password${noBasic})`;
        finish(fail('auth', message, { statusCode: status }));
        return;
      }
      const squid = header('x-squid-error')[0];
      const detail = squid !== undefined ? `, ${printable(squid)}` : '';
      if (status === 403) {
        finish(fail('refused', `proxy refused CONNECT to ${target} (${statusText} from ${shown}${detail})`, { statusCode: status }));
        return;
      }
      finish(fail('status', `proxy ${shown} answered CONNECT to ${target} with ${statusText}${detail}`, { statusCode: status }));
    }

    function onError(err: NodeJS.ErrnoException): void {
      const code = err.code;
      if (phase === 'connecting') {
        const dns = code === 'ENOTFOUND' || code === 'EAI_AGAIN' ? ` (no DNS answer for ${proxyHost})` : '';
        finish(fail('unreachable', `cannot reach proxy ${shown}: ${code ?? err.message}${dns}`, { code, cause: err }));
      } else if (phase === 'tls') {
        const hint = /wrong version number|packet length too long|unknown protocol|record layer failure/i.test(err.message)
          ? '; is it an http:// proxy?'
          : isCertError(code)
            ? '; check the proxy CA bundle'
            : '';
        // OpenSSL's messages span lines and name source files; its `reason` is the readable part.
        const reason = (err as { reason?: unknown }).reason;
        const text = typeof reason === 'string' && reason !== '' ? reason : err.message.split('\n')[0]!;
        finish(
          fail('tls', `TLS to proxy ${shown} failed: ${text}${code && !text.includes(code) ? ` (${code})` : ''}${hint}`, {
            code,
            cause: err,
          }),
        );
      } else {
        finish(
          fail('closed', `connection to proxy ${shown} failed while waiting for the answer to CONNECT ${target}: ${code ?? err.message}`, {
            code,
            cause: err,
          }),
        );
      }
    }

    function onEnd(): void {
      onClose();
    }

    function onClose(): void {
      if (settled) return;
      if (phase === 'connecting') finish(fail('unreachable', `cannot reach proxy ${shown}: connection closed`));
      else if (phase === 'tls')
        finish(fail('tls', `TLS to proxy ${shown} failed: the proxy closed the connection during the handshake; is it an http:// proxy?`));
      else if (received.length > 0 && !'HTTP/'.startsWith(received.subarray(0, 5).toString('latin1'))) finish(fail('protocol', notHttp()));
      else finish(fail('closed', `proxy ${shown} closed the connection without answering CONNECT ${target}`));
    }

    socket.on('connect', onConnect);
    if (secure) socket.on('secureConnect', onSecureConnect);
    socket.on('readable', onReadable);
    socket.on('error', onError);
    socket.on('end', onEnd);
    socket.on('close', onClose);
  });
}

function printable(s: string): string {
  const clean = s.replace(/[\x00-\x1f\x7f-\xff]/g, '?');
  return clean.length > 80 ? `${clean.slice(0, 80)}...` : clean;
}

function isCertError(code: string | undefined): boolean {
  return code !== undefined && /CERT|SELF_SIGNED|UNABLE_TO|VERIFY|ERR_TLS_CERT_ALTNAME_INVALID/.test(code);
}
