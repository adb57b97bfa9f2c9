// What a kube-apiserver does with a CRD's structural schema, for the keywords CRDs here use: the
// structural rules a v1 CRD must meet, and validation plus pruning of an object (a field the schema does
// not have is silently dropped by a real apiserver, so it is reported here).

export interface Schema {
  type?: string;
  properties?: Record<string, Schema>;
  additionalProperties?: Schema | boolean;
  items?: Schema;
  required?: string[];
  enum?: unknown[];
  format?: string;
  pattern?: string;
  maxLength?: number;
  minLength?: number;
  minimum?: number;
  maximum?: number;
  maxItems?: number;
  default?: unknown;
  'x-kubernetes-preserve-unknown-fields'?: boolean;
  'x-kubernetes-int-or-string'?: boolean;
}

/** The apiserver's structural-schema rules that matter here; returns the violations. */
export function structuralProblems(s: Schema, path: string, out: string[] = []): string[] {
  const free = s['x-kubernetes-preserve-unknown-fields'] === true || s['x-kubernetes-int-or-string'] === true;
  if (s.type === undefined && !free) out.push(`${path}: no type`);
  if (s.properties && s.type !== 'object') out.push(`${path}: properties on a ${s.type ?? 'untyped'} node`);
  if (s.type === 'array' && !s.items) out.push(`${path}: array without items`);
  if (s.properties && s.additionalProperties !== undefined) out.push(`${path}: properties and additionalProperties together`);
  for (const [k, v] of Object.entries(s.properties ?? {})) structuralProblems(v, `${path}.${k}`, out);
  if (s.items) structuralProblems(s.items, `${path}[]`, out);
  if (typeof s.additionalProperties === 'object') structuralProblems(s.additionalProperties, `${path}{}`, out);
  return out;
}

/** Validates like the apiserver does for the keywords our CRDs use, and reports what would be pruned. */
export function objectProblems(s: Schema, v: unknown, path: string, out: string[] = []): string[] {
  const free = s['x-kubernetes-preserve-unknown-fields'] === true;
  switch (s.type) {
    case undefined:
      if (!free && s['x-kubernetes-int-or-string'] !== true) out.push(`${path}: untyped`);
      return out;
    case 'object': {
      if (v === null || typeof v !== 'object' || Array.isArray(v)) return (out.push(`${path}: not an object`), out);
      const o = v as Record<string, unknown>;
      for (const r of s.required ?? []) if (!(r in o)) out.push(`${path}.${r}: required`);
      for (const [k, child] of Object.entries(o)) {
        const sub = s.properties?.[k] ?? (typeof s.additionalProperties === 'object' ? s.additionalProperties : undefined);
        if (sub) objectProblems(sub, child, `${path}.${k}`, out);
        else if (!free && s.additionalProperties !== true && path !== '.metadata') out.push(`${path}.${k}: would be pruned`);
      }
      return out;
    }
    case 'array':
      if (!Array.isArray(v)) return (out.push(`${path}: not an array`), out);
      if (s.maxItems !== undefined && v.length > s.maxItems) out.push(`${path}: more than ${s.maxItems} items`);
      v.forEach((x, i) => objectProblems(s.items!, x, `${path}[${i}]`, out));
      return out;
    case 'string':
      if (typeof v !== 'string') return (out.push(`${path}: not a string`), out);
      if (s.format === 'date-time' && Number.isNaN(Date.parse(v))) out.push(`${path}: not a date-time`);
      if (s.format === 'byte' && !/^[A-Za-z0-9+/]*={0,2}$/.test(v)) out.push(`${path}: not base64`);
      if (s.pattern && !new RegExp(s.pattern).test(v)) out.push(`${path}: does not match ${s.pattern}`);
      if (s.maxLength !== undefined && v.length > s.maxLength) out.push(`${path}: longer than ${s.maxLength}`);
      if (s.minLength !== undefined && v.length < s.minLength) out.push(`${path}: shorter than ${s.minLength}`);
      break;
    case 'integer':
      if (!Number.isInteger(v)) out.push(`${path}: not an integer`);
      else if ((s.minimum !== undefined && (v as number) < s.minimum) || (s.maximum !== undefined && (v as number) > s.maximum))
        out.push(`${path}: out of range`);
      break;
    case 'number':
      if (typeof v !== 'number') out.push(`${path}: not a number`);
      break;
    case 'boolean':
      if (typeof v !== 'boolean') out.push(`${path}: not a boolean`);
      break;
  }
  if (s.enum && !s.enum.includes(v)) out.push(`${path}: ${JSON.stringify(v)} not in ${JSON.stringify(s.enum)}`);
  return out;
}

/** Applies the schema's defaults in place, as the apiserver does on every write (only inside objects that are present). */
export function applyDefaults(s: Schema, v: unknown): void {
  if (s.type === 'object' && v !== null && typeof v === 'object' && !Array.isArray(v)) {
    const o = v as Record<string, unknown>;
    for (const [k, child] of Object.entries(s.properties ?? {})) {
      if (!(k in o) && child.default !== undefined) o[k] = structuredClone(child.default);
      if (k in o) applyDefaults(child, o[k]);
    }
    if (typeof s.additionalProperties === 'object') for (const x of Object.values(o)) applyDefaults(s.additionalProperties, x);
  } else if (s.type === 'array' && Array.isArray(v) && s.items) {
    for (const x of v) applyDefaults(s.items, x);
  }
}

/** Removes, in place, what a structural schema does not have (the apiserver's pruning); returns the paths removed. */
export function prune(s: Schema, v: unknown, path: string, out: string[] = []): string[] {
  if (s['x-kubernetes-preserve-unknown-fields'] === true) return out;
  if (s.type === 'object' && v !== null && typeof v === 'object' && !Array.isArray(v)) {
    const o = v as Record<string, unknown>;
    for (const k of Object.keys(o)) {
      const sub = s.properties?.[k] ?? (typeof s.additionalProperties === 'object' ? s.additionalProperties : undefined);
      if (sub) prune(sub, o[k], `${path}.${k}`, out);
      else if (s.additionalProperties !== true && path !== '.metadata') {
        out.push(`${path}.${k}`);
        delete o[k];
      }
    }
  } else if (s.type === 'array' && Array.isArray(v) && s.items) {
    v.forEach((x, i) => prune(s.items!, x, `${path}[${i}]`, out));
  }
  return out;
}
