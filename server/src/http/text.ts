// Text from outside (client-supplied names, error messages) made safe to echo in a response or a log line.

/** Printable ASCII only, bounded: client-supplied text that ends up in a response or a log. */
export function printable(s: string, max = 300): string {
  // eslint-disable-next-line no-control-regex
  const t = s.replace(/[^\x20-\x7e]/g, '?');
  return t.length > max ? `${t.slice(0, max)}...` : t;
}

export function oneLine(s: string): string {
  return printable(s.replace(/\s+/g, ' ').trim(), 500);
}
