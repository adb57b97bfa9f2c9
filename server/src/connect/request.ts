// Reading an HTTP CONNECT request head: bounded, strict about what matters (method, authority,
// credentials) and forgiving about the rest, like other HTTP proxies.
import net from 'node:net';
import { joinHostPort, splitHostPort } from '@cluster-proxy/proto';

export interface ParsedHead {
  method: string;
  target: string;
  headers: Map<string, string[]>;
}

/** Index just past the empty line that ends the head (CRLF CRLF, or bare LFs), or -1. */
export function findHeadEnd(buf: Buffer, from: number): number {
  const a = buf.indexOf('\n\r\n', from, 'latin1');
  const b = buf.indexOf('\n\n', from, 'latin1');
  if (a < 0 && b < 0) return -1;
  if (b < 0 || (a >= 0 && a < b)) return a + 3;
  return b + 2;
}

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const REQUEST_LINE = /^([!#$%&'*+\-.^_`|~0-9A-Za-z]+) ([^\s]+) HTTP\/(\d)\.(\d)$/;

/** The request head (without the final empty line), or a one-line reason it is malformed. */
export function parseHead(text: string): ParsedHead | string {
  const lines = text.split('\n').map((l) => (l.endsWith('\r') ? l.slice(0, -1) : l));
  while (lines.length > 0 && lines[lines.length - 1] === '') lines.pop();
  const requestLine = lines.shift() ?? '';
  const m = REQUEST_LINE.exec(requestLine);
  if (!m) return 'malformed request line (expected "CONNECT host:port HTTP/1.1")';
  if (m[3] !== '1') return `unsupported HTTP version ${m[3]}.${m[4]}`;
  const headers = new Map<string, string[]>();
  for (const line of lines) {
    if (line.startsWith(' ') || line.startsWith('\t')) return 'obsolete line folding in the request head';
    const colon = line.indexOf(':');
    if (colon <= 0) return 'malformed header line';
    const name = line.slice(0, colon);
    if (!TOKEN.test(name)) return 'malformed header name';
    const value = line.slice(colon + 1).trim();
    // eslint-disable-next-line no-control-regex
    if (/[\x00-\x08\x0a-\x1f\x7f]/.test(value)) return 'control characters in a header value';
    const key = name.toLowerCase();
    const list = headers.get(key);
    if (list) list.push(value);
    else headers.set(key, [value]);
  }
  if (headers.has('transfer-encoding')) return 'a CONNECT request has no body (Transfer-Encoding)';
  const cl = headers.get('content-length');
  if (cl && cl.some((v) => v !== '0')) return 'a CONNECT request has no body (Content-Length)';
  return { method: m[1]!, target: m[2]!, headers };
}

const REG_NAME =
  /^(?=.{1,253}$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$/;

/** authority-form `host:port` → normalized address for the core, or null. */
export function parseAuthority(target: string): string | null {
  const hp = splitHostPort(target);
  if (!hp) return null;
  const bracketed = target.startsWith('[');
  if (bracketed) {
    if (net.isIPv6(hp.host)) return joinHostPort(hp.host, hp.port);
    return null;
  }
  if (net.isIPv4(hp.host) || REG_NAME.test(hp.host)) return joinHostPort(hp.host.replace(/\.$/, ''), hp.port);
  return null;
}
