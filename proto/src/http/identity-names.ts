// The names the HTTP gateway impersonates in a managed cluster (user, groups, uid, extra), judged as the
// cluster's apiserver will read them. They travel hub → agent inside the signed assertion (JSON, exact),
// then agent → apiserver as Impersonate-* header values, where every HTTP parser (Go's net/textproto
// too) trims spaces and tabs around a value and refuses control characters. So a name survives the trip
// unchanged only if it has no whitespace at either end, no control character (C0, DEL, C1) and is valid
// Unicode; anything else is refused, never "cleaned": `" system:masters"` would arrive as
// `system:masters`. Values go on the wire as UTF-8, as client-go sends them (node:http would write a
// string's code units as Latin-1 bytes: `josé` arrived as `jos\xe9`).

/** What the cluster will see of a gateway caller: the impersonated user, groups, uid and extra. */
export interface ImpersonatedNames {
  user: string;
  groups: readonly string[];
  uid?: string;
  extra?: Readonly<Record<string, readonly string[]>>;
}

// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
const EDGE_SPACE = /^\s|\s$/;

/** Why `name` would not reach the cluster exactly as it is (null: it would). */
export function nameProblem(name: string): string | null {
  if (name === '') return 'is empty';
  if (EDGE_SPACE.test(name)) return 'begins or ends with whitespace';
  if (CONTROL.test(name)) return 'holds a control character';
  if (LONE_SURROGATE.test(name)) return 'is not valid Unicode';
  return null;
}

/** Why this identity cannot be impersonated faithfully, naming the part ("the group \"…\" begins with …"); null: it can. */
export function identityProblem(id: ImpersonatedNames): string | null {
  const check = (what: string, name: string): string | null => {
    const p = nameProblem(name);
    return p ? `${what} ${quoteName(name)} ${p}` : null;
  };
  const found =
    check('the user', id.user) ??
    firstOf(id.groups, (g) => check('the group', g)) ??
    (id.uid !== undefined ? check('the uid', id.uid) : null) ??
    firstOf(
      Object.entries(id.extra ?? {}),
      ([k, vs]) => check('the extra key', k) ?? firstOf(vs, (v) => check(`the extra ${quoteName(k)} value`, v)),
    );
  return found;
}

function firstOf<T>(items: Iterable<T>, f: (x: T) => string | null): string | null {
  for (const x of items) {
    const r = f(x);
    if (r) return r;
  }
  return null;
}

/** A name for a one-line message: JSON-quoted, every character outside printable ASCII as \uXXXX, at most 80 characters. */
export function quoteName(name: string): string {
  const cut = name.length > 80 ? `${name.slice(0, 80)}\u2026` : name;
  return `"${[...cut].map((c) => (c === '"' || c === '\\' ? `\\${c}` : /^[\x20-\x7e]$/.test(c) ? c : [...c].map((u) => `\\u${u.charCodeAt(0).toString(16).padStart(4, '0')}`).join(''))).join('')}"`;
}

/**
 * A header value node:http will write as `value`'s UTF-8 bytes (it writes each code unit of a string as
 * one Latin-1 byte, so the value handed to it is the UTF-8 encoding spelled as Latin-1). Only for
 * values that passed nameProblem().
 */
export function utf8HeaderValue(value: string): string {
  // eslint-disable-next-line no-control-regex
  return /^[\x00-\x7f]*$/.test(value) ? value : Buffer.from(value, 'utf8').toString('latin1');
}

/**
 * Kubernetes' reserved names, which a gateway caller never becomes in a cluster unless the agent's
 * admin allows them by name: every `system:` user and group (`system:masters` is cluster-admin, a
 * `system:serviceaccount:` user is that cluster's own service account, `system:node:` a kubelet), but
 * `system:authenticated`, which the apiserver adds to every authenticated user anyway.
 */
export function isReservedInCluster(name: string): boolean {
  return name.startsWith('system:') && name !== 'system:authenticated';
}
