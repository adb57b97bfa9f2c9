// Comparing what the hub read from a store with what it would write. A real kube-apiserver gives custom
// resources back with their keys sorted (Go encodes a map so), not in the order we sent them, so two
// objects that say the same can differ as raw JSON: comparing JSON.stringify output there rewrites the
// object on every pass. These compare as JSON does (undefined members dropped, undefined in an array is
// null) but with every object's keys sorted; array order still counts.

/** JSON with every object's keys sorted (code-unit order, as Go sorts map keys). */
export function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map((x) => (x === undefined || typeof x === 'function' ? 'null' : canonicalJson(x))).join(',')}]`;
  if (v !== null && typeof v === 'object' && typeof (v as { toJSON?: unknown }).toJSON !== 'function') {
    const o = v as Record<string, unknown>;
    const keys = Object.keys(o)
      .filter((k) => o[k] !== undefined && typeof o[k] !== 'function')
      .sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalJson(o[k])}`).join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

/** Whether `a` and `b` are the same JSON, whatever the order of their objects' keys. */
export function sameJson(a: unknown, b: unknown): boolean {
  return a === b || canonicalJson(a) === canonicalJson(b);
}
