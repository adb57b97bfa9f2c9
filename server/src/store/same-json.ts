// Comparing what the hub read from a store with what it would write. A real kube-apiserver gives custom
// resources back with their keys sorted (Go encodes a map so), not in the order we sent them, so two
// objects that say the same can differ as raw JSON: comparing JSON.stringify output there rewrites the
// object on every pass. These compare as JSON does (undefined members dropped, undefined in an array is
// null) but with every object's keys sorted; array order still counts.

/**
 * JSON with every object's keys sorted (code-unit order, as Go sorts map keys). What the hub reads is mostly in
 * that order already (a real apiserver, and our stand-in, give custom resources back with sorted keys): then
 * JSON.stringify, native, writes the same string (~5× faster than the walk on a rendered ManifestWork's spec;
 * the OCM installer takes one of every ManifestWork it lists, 5,000 at once after a restart).
 */
export function canonicalJson(v: unknown): string {
  return keysInOrder(v) ? (JSON.stringify(v) ?? 'null') : sortingWalk(v);
}

/** Whether every object in `v` lists its keys (Object.keys, JSON.stringify's order) in code-unit order. */
function keysInOrder(v: unknown): boolean {
  if (!isPlainJsonObject(v)) return true;
  if (Array.isArray(v)) {
    for (const x of v) if (!keysInOrder(x)) return false;
    return true;
  }
  const o = v as Record<string, unknown>;
  let last: string | undefined;
  for (const k of Object.keys(o)) {
    if (last !== undefined && !(last < k)) return false;
    if (!keysInOrder(o[k])) return false;
    last = k;
  }
  return true;
}

/** canonicalJson by sorting each object's keys: one string built as it walks. */
function sortingWalk(v: unknown): string {
  if (!isPlainJsonObject(v)) return JSON.stringify(v) ?? 'null';
  if (Array.isArray(v)) {
    let s = '[';
    for (let i = 0; i < v.length; i++) {
      const x: unknown = v[i];
      if (i > 0) s += ',';
      s += isJsonValue(x) ? sortingWalk(x) : 'null';
    }
    return `${s}]`;
  }
  const o = v as Record<string, unknown>;
  let s = '{';
  for (const k of Object.keys(o).sort()) {
    const x = o[k];
    if (!isJsonValue(x)) continue;
    if (s.length > 1) s += ',';
    s += `${JSON.stringify(k)}:${sortingWalk(x)}`;
  }
  return `${s}}`;
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
