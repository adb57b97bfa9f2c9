// What the CONNECT frontend answers: dial failures as HTTP statuses, status lines, the auth challenge,
// and client-supplied text made safe to echo in a response or a log line.
import type { DialFailureReason } from '@cluster-proxy/proto';
import type { Principal } from './types.js';

export const REALM = 'cluster-proxy';
export const PROXY_AUTHENTICATE = `Bearer realm="${REALM}", Basic realm="${REALM}"`;

/**
 * How each dial failure class of the core becomes an HTTP status. The one place this is decided.
 *   - `forbidden` is the agent's allowlist refusing the destination: a policy decision, so 403
 *     (as a proxy's ACL denial is), not 502 — the destination was never tried.
 *   - `dialclosed` (the agent vanished mid-dial) and anything unclassified are a bad gateway.
 */
export const DIAL_FAILURE_STATUS: Readonly<Record<DialFailureReason, { status: number; why: string }>> = {
  no_agent: { status: 503, why: 'no agent is connected for this destination' },
  draining: { status: 503, why: 'the agents for this destination are shutting down' },
  endpoint: { status: 502, why: 'the agent could not connect to the destination (refused or unresolvable)' },
  forbidden: { status: 403, why: "the destination is not in the agent's allowlist" },
  timeout: { status: 504, why: 'the dial timed out' },
  dialclosed: { status: 502, why: 'the agent disconnected during the dial' },
  limit: { status: 503, why: 'a connection limit of the hub or the agent was reached' },
  unknown: { status: 502, why: 'the dial failed' },
};

export const STATUS_TEXT: Readonly<Record<number, string>> = {
  400: 'Bad Request',
  403: 'Forbidden',
  405: 'Method Not Allowed',
  407: 'Proxy Authentication Required',
  408: 'Request Timeout',
  431: 'Request Header Fields Too Large',
  502: 'Bad Gateway',
  503: 'Service Unavailable',
  504: 'Gateway Timeout',
};

/** A certificate subject field (node:tls gives an array when a name repeats): its first value. */
function firstValue(v: string | string[] | undefined): string {
  return Array.isArray(v) ? (v[0] ?? '') : (v ?? '');
}

/** Who a client certificate names, as every frontend shows it (messages, the per-client limit). */
export function certificatePrincipal(cn: string | string[] | undefined): Principal {
  return { kind: 'certificate', name: firstValue(cn) || 'unnamed-certificate' };
}

export function principalName(p: Principal): string {
  switch (p.kind) {
    case 'certificate':
      return `certificate "${p.name}"`;
    case 'token':
      return `token "${p.name}" (${p.id})`;
    default:
      return p.name;
  }
}

/** Printable ASCII only, bounded: client-supplied text that ends up in a response or a log. */
export function printable(s: string, max = 300): string {
  // eslint-disable-next-line no-control-regex
  const t = s.replace(/[^\x20-\x7e]/g, '?');
  return t.length > max ? `${t.slice(0, max)}...` : t;
}

export function oneLine(s: string): string {
  return printable(s.replace(/\s+/g, ' ').trim(), 500);
}
