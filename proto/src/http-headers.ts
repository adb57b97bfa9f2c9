// Header hygiene for the HTTP gateway's two proxies (the hub's gateway and the agent's impersonating
// proxy): what one HTTP hop must not pass on (RFC 9110 §7.6.1), and who may send Impersonate-*.

/** Connection-specific headers, never forwarded (plus whatever Connection itself names). */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

/** Headers whose name says they ask the apiserver to act as someone else. */
export function isImpersonationHeader(name: string): boolean {
  return name.toLowerCase().startsWith('impersonate-');
}

/**
 * The end-to-end headers of `headers` (node's headersDistinct: lower-case names, every value), with
 * hop-by-hop ones removed, and those `drop` says no to.
 */
export function endToEndHeaders(headers: Readonly<Record<string, string[] | undefined>>, drop: (name: string) => boolean = () => false): Record<string, string[]> {
  const named = new Set<string>();
  for (const v of headers['connection'] ?? []) for (const t of v.split(',')) if (t.trim() !== '') named.add(t.trim().toLowerCase());
  const out: Record<string, string[]> = {};
  for (const [name, values] of Object.entries(headers)) {
    if (!values || HOP_BY_HOP.has(name) || named.has(name) || drop(name)) continue;
    out[name] = [...values];
  }
  return out;
}

/** `X-Forwarded-For` with `peer` appended to what earlier proxies said. */
export function appendForwardedFor(existing: readonly string[] | undefined, peer: string): string {
  const before = (existing ?? []).join(', ').trim();
  return before === '' ? peer : `${before}, ${peer}`;
}
