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

/**
 * Whether `a` and `b` are the same JSON, whatever the order of their objects' keys: canonicalJson(a) ===
 * canonicalJson(b), walked in place without building either string (a status pass compares every addon).
 */
export function sameJson(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (!isPlainJsonObject(a) || !isPlainJsonObject(b)) {
    if (isPlainJsonObject(a) || isPlainJsonObject(b)) return false;
    return canonicalJson(a) === canonicalJson(b);
  }
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (!sameJson(inArray(a[i]), inArray(b[i]))) return false;
    return true;
  }
  if (Array.isArray(b)) return false;
  const x = a as Record<string, unknown>;
  const y = b as Record<string, unknown>;
  let keys = 0;
  for (const k of Object.keys(x)) {
    if (!isJsonValue(x[k])) continue;
    keys++;
    if (!Object.hasOwn(y, k) || !isJsonValue(y[k]) || !sameJson(x[k], y[k])) return false;
  }
  for (const k of Object.keys(y)) if (isJsonValue(y[k])) keys--;
  return keys === 0;
}

/** An object or array JSON walks member by member (not null, not one that says its own JSON, like a Date). */
function isPlainJsonObject(v: unknown): v is object {
  return v !== null && typeof v === 'object' && typeof (v as { toJSON?: unknown }).toJSON !== 'function';
}

/** A member JSON writes (undefined and functions are dropped from objects). */
const isJsonValue = (v: unknown): boolean => v !== undefined && typeof v !== 'function';

/** An array element as JSON writes it (undefined and functions become null). */
const inArray = (v: unknown): unknown => (isJsonValue(v) ? v : null);
