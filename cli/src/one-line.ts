// Messages the command line prints are one line, whatever they quote.

/**
 * `message` as one line: line breaks and the other control characters (C0 but tab, DEL, C1, U+2028 and
 * U+2029) as \uXXXX. Messages quote values from config files, the environment and libraries' own errors,
 * which may hold any of them. Cut at `max` characters (each escape takes six).
 */
export function oneLineMessage(message: string, max = Number.POSITIVE_INFINITY): string {
  // eslint-disable-next-line no-control-regex
  const line = message.replace(/[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
  return line.length > max ? `${line.slice(0, max)}…` : line;
}
