// The config spec hashes of addon-framework's addonconfig and cmaconfig controllers
// (pkg/addonmanager/controllers/addonconfig/controller.go, cmaconfig/controller.go), which run in an
// addon's own manager, so here in the hub. OCM's addon-manager resolves which configs an addon gets, but
// copies their hashes from where these controllers wrote them (ocm pkg/addon/controllers/addonconfiguration/
// graph.go): the ClusterManagementAddOn's status.defaultconfigReferences and installProgressions for the
// defaults, the addon's own status.configReferences for its spec.configs. Its rollout is Completed only when
// every desired hash is non-empty and equal to the work's config-spec-hash annotation (addonprogressing), so
// without them an addon never leaves Progressing. The hash is addon-framework's GetSpecHash (pkg/utils/
// helpers.go): sha256 of Go's JSON encoding of the object without apiVersion, kind, metadata and status.
import { createHash } from 'node:crypto';
import type { ClusterManagementAddOn, ConfigReference, ManagedClusterAddOn } from '../store/objects.js';
import { sameJson } from '../store/same-json.js';

/** A config as the hash sees it: any object; its generation for lastObservedGeneration. */
export type ConfigObject = { metadata?: { generation?: number } } & Record<string, unknown>;
/** Finds a config by group/resource and name: null when it does not exist, undefined when its kind is not one the addon reads. */
export type ConfigLookup = (ref: {
  group: string;
  resource: string;
  name: string;
  namespace?: string;
}) => Promise<ConfigObject | null | undefined>;

/** addon-framework GetSpecHash: sha256 (hex) of Go's json.Marshal of the object minus apiVersion/kind/metadata/status. */
export function configSpecHash(obj: Record<string, unknown>): string {
  const { apiVersion: _a, kind: _k, metadata: _m, status: _s, ...rest } = obj;
  return createHash('sha256').update(goJson(rest), 'utf8').digest('hex');
}

/**
 * encoding/json's Marshal of a decoded JSON value: map keys sorted by their UTF-8 bytes; `<`, `>`, `&`, U+2028 and
 * U+2029 escaped, as Go escapes them for HTML; lone surrogates as U+FFFD.
 */
export function goJson(v: unknown): string {
  if (v === null || v === undefined) return 'null';
  if (typeof v === 'boolean') return v ? 'true' : 'false';
  if (typeof v === 'number') return goNumber(v);
  if (typeof v === 'string') return goString(v);
  if (Array.isArray(v)) return `[${v.map(goJson).join(',')}]`;
  if (typeof v === 'object') {
    const o = v as Record<string, unknown>;
    const keys = Object.keys(o)
      .filter((k) => o[k] !== undefined)
      .sort((a, b) => Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8')));
    return `{${keys.map((k) => `${goString(k)}:${goJson(o[k])}`).join(',')}}`;
  }
  return 'null';
}

function goNumber(n: number): string {
  if (!Number.isFinite(n)) throw new Error(`json: unsupported value: ${n}`);
  // Go's float encoding agrees with JavaScript's: shortest digits, exponent form below 1e-6 and from 1e21, no
  // padded exponent (Go cleans e-07 to e-7).
  return String(n);
}

const GO_ESCAPES: Record<string, string> = { '"': '\\"', '\\': '\\\\', '\b': '\\b', '\f': '\\f', '\n': '\\n', '\r': '\\r', '\t': '\\t' };

function goString(s: string): string {
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const ch = s[i]!;
    if (GO_ESCAPES[ch]) out += GO_ESCAPES[ch];
    else if (c < 0x20 || ch === '<' || ch === '>' || ch === '&' || c === 0x2028 || c === 0x2029)
      out += `\\u${c.toString(16).padStart(4, '0')}`;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && s.charCodeAt(i + 1) >= 0xdc00 && s.charCodeAt(i + 1) <= 0xdfff) {
      out += s.slice(i, i + 2);
      i++;
    } else if (c >= 0xd800 && c <= 0xdfff) out += '\\ufffd';
    else out += ch;
  }
  return `${out}"`;
}

/** Per pass: each config read once, however many addons name it. */
export function memoLookup(get: ConfigLookup): ConfigLookup {
  const seen = new Map<string, Promise<ConfigObject | null | undefined>>();
  return (ref) => {
    const k = `${ref.group}/${ref.resource}/${ref.namespace ?? ''}/${ref.name}`;
    let p = seen.get(k);
    if (!p) {
      p = get(ref);
      seen.set(k, p);
    }
    return p;
  };
}

/**
 * The addon's status.configReferences as addonconfig writes them: every found config's lastObservedGeneration,
 * and the desired spec hash of those named in the addon's spec.configs (the defaults' hashes come from the
 * ClusterManagementAddOn, through OCM's addon-manager). Null when nothing changes.
 */
export async function addonConfigReferences(addon: ManagedClusterAddOn, lookup: ConfigLookup): Promise<ConfigReference[] | null> {
  const refs = addon.status?.configReferences;
  if (!refs?.length) return null;
  const next: ConfigReference[] = [];
  for (const ref of refs) {
    // addonconfig looks the config up by the reference's own (flat) name, as OCM's addon-manager fills it.
    const config = ref.name ? await lookup({ group: ref.group, resource: ref.resource, name: ref.name, namespace: ref.namespace }) : null;
    if (!config) {
      next.push(ref);
      continue;
    }
    const inSpec =
      ref.desiredConfig &&
      (addon.spec.configs ?? []).some(
        (c) =>
          c.group === ref.group &&
          c.resource === ref.resource &&
          c.name === ref.desiredConfig!.name &&
          (c.namespace ?? '') === (ref.desiredConfig!.namespace ?? ''),
      );
    next.push({
      ...ref,
      ...(config.metadata?.generation !== undefined ? { lastObservedGeneration: config.metadata.generation } : {}),
      ...(inSpec ? { desiredConfig: { ...ref.desiredConfig!, specHash: configSpecHash(config) } } : {}),
    });
  }
  return sameJson(next, refs) ? null : next;
}

const DEFAULTS = 'defaultconfigReferences';
type DesiredConfig = { name?: string; namespace?: string; specHash?: string };
type RefWithDesired = { group?: string; resource?: string; desiredConfig?: DesiredConfig };

/**
 * The ClusterManagementAddOn's status with cmaconfig's hashes in status.defaultconfigReferences and every
 * installProgression's configReferences (a config that does not exist hashes to ""). Null when nothing changes.
 */
export async function clusterManagementAddOnStatus(
  cma: ClusterManagementAddOn,
  lookup: ConfigLookup,
): Promise<Record<string, unknown> | null> {
  const status = cma.status;
  if (!status) return null;
  const hashed = async (ref: RefWithDesired): Promise<RefWithDesired> => {
    const d = ref.desiredConfig;
    if (!d?.name || ref.group === undefined || !ref.resource) return ref;
    const config = await lookup({ group: ref.group, resource: ref.resource, name: d.name, namespace: d.namespace });
    if (config === undefined) return ref;
    return { ...ref, desiredConfig: { ...d, specHash: config ? configSpecHash(config) : '' } };
  };
  // The field is spelled `defaultconfigReferences` in OCM's API (api addon/v1alpha1 types_clustermanagementaddon.go).
  const defaults = Array.isArray(status[DEFAULTS]) ? (status[DEFAULTS] as RefWithDesired[]) : [];
  const progressions = Array.isArray(status['installProgressions'])
    ? (status['installProgressions'] as ({ configReferences?: RefWithDesired[] } & Record<string, unknown>)[])
    : [];
  const next: Record<string, unknown> = { ...status };
  if (defaults.length) next[DEFAULTS] = await Promise.all(defaults.map(hashed));
  if (progressions.length)
    next['installProgressions'] = await Promise.all(
      progressions.map(async (p) =>
        p.configReferences ? { ...p, configReferences: await Promise.all(p.configReferences.map(hashed)) } : p,
      ),
    );
  return sameJson(next, status) ? null : next;
}
