// What the CONNECT frontend answers: dial failures as HTTP statuses, status lines, the auth challenge.
import type { DialFailureReason } from '@cluster-proxy/proto';

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
