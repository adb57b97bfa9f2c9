// Header hygiene for the HTTP gateway's two proxies (the hub's gateway and the agent's impersonating
// proxy): what one HTTP hop must not pass on (RFC 9110 §7.6.1), and who may send Impersonate-*.
import { IDENTITY_HEADER, IDENTITY_MAC_HEADER, IDENTITY_SIGNER_HEADER } from './gateway-identity.js';

/** Connection-specific headers, never forwarded (plus whatever Connection itself names). */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

/** Node's headersDistinct from raw header lines (name, value, …): lower-case names, every value in order, no prototype. */
export function distinctHeaders(raw: readonly string[]): Record<string, string[]> {
  const out = Object.create(null) as Record<string, string[]>;
  for (let i = 0; i + 1 < raw.length; i += 2) (out[raw[i]!.toLowerCase()] ??= []).push(raw[i + 1]!);
  return out;
}

/** Header lines (`name: value` CRLF, one per value, in order) for a head being written; values as given. */
export function headerLines(headers: Readonly<Record<string, string | readonly string[]>>): string {
  let out = '';
  for (const [name, v] of Object.entries(headers)) for (const value of typeof v === 'string' ? [v] : v) out += `${name}: ${value}\r\n`;
  return out;
}

/** Headers whose name says they ask the apiserver to act as someone else. */
export function isImpersonationHeader(name: string): boolean {
  return name.toLowerCase().startsWith('impersonate-');
}

/**
 * The end-to-end headers of `headers` (node's headersDistinct: lower-case names, every value), with
 * hop-by-hop ones removed, and those `drop` says no to.
 */
export function endToEndHeaders(
  headers: Readonly<Record<string, string[] | undefined>>,
  drop?: (name: string) => boolean,
): Record<string, string[]> {
  // Most messages name no header in Connection but itself (keep-alive, close): no set to build then.
  let named: Set<string> | null = null;
  for (const v of headers['connection'] ?? []) {
    for (const t of v.split(',')) {
      const n = t.trim().toLowerCase();
      if (n !== '' && !HOP_BY_HOP.has(n)) (named ??= new Set()).add(n);
    }
  }
  // No prototype, like node's headersDistinct: a header named `__proto__` is a header, not the object's prototype.
  const out: Record<string, string[]> = Object.create(null) as Record<string, string[]>;
  for (const [name, values] of Object.entries(headers)) {
    if (!values || HOP_BY_HOP.has(name) || named?.has(name) || drop?.(name)) continue;
    out[name] = values.slice();
  }
  return out;
}

/** `X-Forwarded-For` with `peer` appended to what earlier proxies said. */
export function appendForwardedFor(existing: readonly string[] | undefined, peer: string): string {
  const before = (existing ?? []).join(', ').trim();
  return before === '' ? peer : `${before}, ${peer}`;
}

/**
 * Headers that authenticate a caller to an apiserver other than through `Authorization`, which the hub
 * judged already and a cluster must never see: Kubernetes' front-proxy headers (`X-Remote-User`,
 * `-Group`, `-Uid`, `-Extra-*`, the defaults of kube-apiserver's --requestheader-* flags).
 */
export function isCredentialHeader(name: string): boolean {
  const n = name.toLowerCase();
  return n === 'x-remote-user' || n === 'x-remote-group' || n === 'x-remote-uid' || n.startsWith('x-remote-extra-');
}

/** The WebSocket subprotocol that carries a bearer token (kubectl's and browsers' WebSocket clients send it). */
const BEARER_PROTOCOL = /^base64url\.bearer\.authorization\.k8s\.io\./i;

/** `Sec-WebSocket-Protocol` values less any bearer-token entry; null when nothing else is left. */
export function withoutBearerProtocols(values: readonly string[]): string[] | null {
  const kept = values.flatMap((v) =>
    v
      .split(',')
      .map((p) => p.trim())
      .filter((p) => p !== '' && !BEARER_PROTOCOL.test(p)),
  );
  return kept.length > 0 ? [kept.join(', ')] : null;
}

/** The largest request head the gateway takes from a caller by default (node's own default, 16 KiB). */
export const GATEWAY_MAX_HEAD_BYTES = 16 * 1024;
/**
 * The largest head the agent's gateway handler takes from the hub: a caller's head of up to the hub's
 * limit plus the identity assertion and its signer. The hub refuses (431) a request whose head would
 * pass this once the identity is added, so no request is refused further down.
 */
export const GATEWAY_AGENT_MAX_HEAD_BYTES = 64 * 1024;

/**
 * What either gateway hop passes on of the headers it received: the end-to-end ones, less every credential
 * (Authorization, Impersonate-*, X-Remote-*, a bearer WebSocket subprotocol), Host and the hub's identity
 * hand-off headers. The hub sends the result on with its own identity; the agent, with its own credentials.
 */
export function gatewayForwardedHeaders(headers: Readonly<Record<string, string[] | undefined>>): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = endToEndHeaders(
    headers,
    (name) =>
      name === 'authorization' ||
      name === 'host' ||
      name === IDENTITY_HEADER ||
      name === IDENTITY_SIGNER_HEADER ||
      name === IDENTITY_MAC_HEADER ||
      isImpersonationHeader(name) ||
      isCredentialHeader(name),
  );
  const protocols = headers['sec-websocket-protocol'];
  if (protocols) {
    const kept = withoutBearerProtocols(protocols);
    if (kept) out['sec-websocket-protocol'] = kept;
    else delete out['sec-websocket-protocol'];
  }
  return out;
}
