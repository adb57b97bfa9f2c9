// Just enough YAML for the CLI, without a dependency: reading flat config files (`flag: value`,
// lists for repeatable flags) and writing the CLI's own documents (kubeconfigs, `-o yaml`), whose
// shape we control. Anything a flat file does not need (nested maps, anchors, multi-line scalars,
// tags) is refused with the line number rather than guessed at.

export type YamlValue = string | number | boolean | null | YamlValue[] | { [key: string]: YamlValue };

/**
 * Parses a flat YAML mapping:
 *
 *   # comment
 *   data-dir: /var/lib/hub        # plain scalar (trailing " #" comment dropped)
 *   bind-address: "127.0.0.1"     # double-quoted (JSON escapes) or 'single-quoted'
 *   grant: [c1=default-route, 'c2=cidr:10.0.0.0/8']
 *   allow:
 *     - 10.0.0.1:443
 *     - "*.svc:443"
 *
 * Scalars: true/false → boolean, null/~/empty → null, integers → number, everything else a string.
 * Returns null for a document with no keys.
 */
export function parseFlatYaml(text: string): Record<string, YamlValue> | null {
  const out: Record<string, YamlValue> = {};
  let seenStart = false;
  let listKey: string | null = null; // a "key:" line with no value, whose "- item" lines may follow
  const lines = text.replace(/^\uFEFF/, '').split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    const n = i + 1;
    const raw = lines[i]!;
    if (/^\s*(#.*)?$/.test(raw)) continue;
    const marker = /^(---|\.\.\.)\s*(#.*)?$/.test(raw);
    if (marker && raw.startsWith('---') && Object.keys(out).length === 0 && !seenStart) {
      seenStart = true; // a document start before any key (comments may come first)
      continue;
    }
    if (marker) throw new Error(`line ${n}: only one YAML document is supported`);
    if (raw.includes('\t')) throw new Error(`line ${n}: tabs are not allowed in YAML indentation`);
    const item = /^\s*-(?:\s+(.*))?$/.exec(raw);
    if (item) {
      if (listKey === null) throw new Error(`line ${n}: a "- item" line must follow a "key:" line`);
      const text = stripComment(item[1] ?? '', n);
      if (text.startsWith('[') || text.startsWith('{') || /^[^'"]*:(\s|$)/.test(text)) throw new Error(`line ${n}: nested values are not supported (only flat "flag: value" lines)`);
      const v = scalar(text, n);
      const cur = out[listKey];
      out[listKey] = Array.isArray(cur) ? [...cur, v] : [v];
      continue;
    }
    if (/^\s/.test(raw)) throw new Error(`line ${n}: nested values are not supported (only flat "flag: value" lines)`);
    const m = /^("(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^:#'"\s][^:]*?)\s*:(?:\s+(.*))?$/.exec(raw);
    if (!m) throw new Error(`line ${n}: expected "flag: value"`);
    const key = unquoteKey(m[1]!, n);
    if (Object.hasOwn(out, key)) throw new Error(`line ${n}: "${key}" appears twice`);
    const rest = stripComment(m[2] ?? '', n);
    if (rest === '') {
      out[key] = null;
      listKey = key;
      continue;
    }
    listKey = null;
    if (rest.startsWith('[')) out[key] = flowList(rest, n);
    else if (rest.startsWith('{')) throw new Error(`line ${n}: nested values are not supported (only flat "flag: value" lines)`);
    else if (/^[|>]/.test(rest)) throw new Error(`line ${n}: multi-line strings are not supported`);
    else out[key] = scalar(rest, n);
  }
  return Object.keys(out).length === 0 ? null : out;
}

function unquoteKey(k: string, n: number): string {
  if (k.startsWith('"') || k.startsWith("'")) {
    const v = scalar(k, n);
    return String(v);
  }
  return k.trim();
}

/** Drops a trailing comment: "#" at the start or after whitespace, outside quotes. */
function stripComment(s: string, n: number): string {
  let quote: string | null = null;
  for (let i = 0; i < s.length; i++) {
    const c = s[i]!;
    if (quote === '"' && c === '\\') {
      i++;
      continue;
    }
    if (quote) {
      if (c === quote) quote = null;
      continue;
    }
    if ((c === '"' || c === "'") && (i === 0 || /[\s[,]/.test(s[i - 1]!))) quote = c;
    else if (c === '#' && (i === 0 || /\s/.test(s[i - 1]!))) return s.slice(0, i).trim();
  }
  if (quote) throw new Error(`line ${n}: unterminated ${quote === '"' ? 'double' : 'single'}-quoted string`);
  return s.trim();
}

function scalar(s: string, n: number): string | number | boolean | null {
  s = s.trim();
  if (s.startsWith('"')) {
    if (!/^"(?:[^"\\]|\\.)*"$/.test(s)) throw new Error(`line ${n}: bad double-quoted string ${s}`);
    try {
      return JSON.parse(s) as string;
    } catch {
      throw new Error(`line ${n}: bad escape in ${s}`);
    }
  }
  if (s.startsWith("'")) {
    if (!/^'(?:[^']|'')*'$/.test(s)) throw new Error(`line ${n}: bad single-quoted string ${s}`);
    return s.slice(1, -1).replace(/''/g, "'");
  }
  if (/^[&*!]/.test(s)) throw new Error(`line ${n}: anchors, aliases and tags are not supported`);
  if (s === '' || s === '~' || s === 'null' || s === 'Null' || s === 'NULL') return null;
  if (/^(true|True|TRUE)$/.test(s)) return true;
  if (/^(false|False|FALSE)$/.test(s)) return false;
  if (/^[-+]?\d+$/.test(s) && Number.isSafeInteger(Number(s))) return Number(s);
  return s;
}

function flowList(s: string, n: number): YamlValue[] {
  if (!s.endsWith(']')) throw new Error(`line ${n}: a [list] must close on the same line`);
  const body = s.slice(1, -1).trim();
  if (body === '') return [];
  const items: string[] = [];
  let cur = '';
  let quote: string | null = null;
  for (let i = 0; i < body.length; i++) {
    const c = body[i]!;
    if (quote === '"' && c === '\\') {
      cur += c + (body[++i] ?? '');
      continue;
    }
    if (quote) {
      if (c === quote) quote = null;
      cur += c;
      continue;
    }
    if (c === '"' || c === "'") quote = c;
    else if (c === '[' || c === ']' || c === '{' || c === '}') throw new Error(`line ${n}: nested lists are not supported`);
    if (c === ',') {
      items.push(cur);
      cur = '';
    } else cur += c;
  }
  items.push(cur);
  return items.map((it) => {
    if (it.trim() === '') throw new Error(`line ${n}: empty item in [list]`);
    return scalar(it, n);
  });
}

// ------------------------------------------------------------ writing

const PLAIN = /^[A-Za-z0-9_/.][A-Za-z0-9_./@-]*$/;
const AMBIGUOUS = /^(true|false|yes|no|on|off|y|n|null|~|[-+]?(\d[\d_]*(\.\d*)?|\.\d+)([eE][-+]?\d+)?|0x[0-9a-fA-F]+|0o[0-7]+|\.(inf|nan))$/i;

function str(s: string): string {
  return PLAIN.test(s) && !AMBIGUOUS.test(s) ? s : JSON.stringify(s); // a JSON string is a valid YAML double-quoted scalar
}

function isScalar(v: YamlValue): v is string | number | boolean | null {
  return v === null || typeof v !== 'object';
}

function scalarText(v: string | number | boolean | null): string {
  if (v === null) return 'null';
  if (typeof v === 'string') return str(v);
  return String(v);
}

/** Block-style YAML for plain data (objects, arrays, strings, numbers, booleans, null). */
export function toYaml(value: YamlValue, indent = ''): string {
  if (isScalar(value)) return `${indent}${scalarText(value)}\n`;
  if (Array.isArray(value)) {
    if (value.length === 0) return `${indent}[]\n`;
    return value.map((v) => {
      if (isScalar(v)) return `${indent}- ${scalarText(v)}\n`;
      if (Array.isArray(v) ? v.length === 0 : Object.keys(v).length === 0) return `${indent}- ${Array.isArray(v) ? '[]' : '{}'}\n`;
      // "- " then the first line of the nested block, the rest indented under it.
      const inner = toYaml(v, `${indent}  `);
      return `${indent}- ${inner.slice(indent.length + 2)}`;
    }).join('');
  }
  const entries = Object.entries(value).filter(([, v]) => v !== undefined);
  if (entries.length === 0) return `${indent}{}\n`;
  return entries.map(([k, v]) => {
    if (isScalar(v)) return `${indent}${str(k)}: ${scalarText(v)}\n`;
    if (Array.isArray(v) ? v.length === 0 : Object.keys(v).length === 0) return `${indent}${str(k)}: ${Array.isArray(v) ? '[]' : '{}'}\n`;
    // Lists under a key at the key's indentation (kubectl's style); maps one level deeper.
    return `${indent}${str(k)}:\n${toYaml(v, Array.isArray(v) ? indent : `${indent}  `)}`;
  }).join('');
}
