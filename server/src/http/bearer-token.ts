// The credential in an `Authorization` or `Proxy-Authorization` header value.

/** The token from `Bearer <token>` or `Basic base64(user:token)`, or null. */
export function tokenFromHeader(value: string): string | null {
  const bearer = /^Bearer +([^\s]+) *$/i.exec(value);
  if (bearer) return bearer[1]!;
  const basic = /^Basic +([A-Za-z0-9+/]+=*) *$/i.exec(value);
  if (basic) {
    const decoded = Buffer.from(basic[1]!, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    if (colon < 0) return null;
    return decoded.slice(colon + 1);
  }
  return null;
}
