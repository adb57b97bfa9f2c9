// Reading `--config FILE` (flat YAML, `flag: value`, lists for repeatable flags) with the `yaml`
// library. A flags file needs no nesting, anchors, tags or multi-line strings: those are refused with
// the line number rather than guessed at. Numbers keep the text they were written as (`1.20` stays
// "1.20", `0x1f` stays "0x1f"): every flag is a string in the end.
import { lazyRequire, quoteName } from '@cluster-proxy/proto';
import type * as Yaml from 'yaml';
import type { Node } from 'yaml';
import { oneLineMessage } from './one-line.js';

/** The YAML library's own message, as we pass it on, at most this long: it may quote a long run of the file. */
const LIBRARY_MESSAGE_MAX = 300;

/** `yaml` is loaded only when a config file is read: the agent has no other use for it (~2 MiB of RSS). */
const loadYaml = lazyRequire<typeof Yaml>('yaml', import.meta.url);

export type ConfigScalar = string | boolean | null;
export type ConfigValue = ConfigScalar | ConfigScalar[];

/** Parses a flat YAML mapping; null for a document with no keys. Throws `line N: problem`. */
export function parseConfigYaml(text: string): Record<string, ConfigValue> | null {
  const { LineCounter, isMap, isScalar, isSeq, parseAllDocuments } = loadYaml();
  const lines = new LineCounter();
  const parsed = parseAllDocuments(text, { lineCounter: lines, uniqueKeys: false, prettyErrors: false });
  if (!Array.isArray(parsed)) return null; // an empty stream (comments only)
  const lineOf = (offset: number | undefined): number => lines.linePos(offset ?? 0).line;
  if (parsed.length > 1) throw new Error(`line ${lineOf(parsed[1]!.range[0])}: only one YAML document is supported`);
  const doc = parsed[0];
  if (!doc) return null;
  const error = doc.errors[0];
  if (error) throw new Error(`line ${lineOf(error.pos[0])}: ${oneLineMessage(error.message.split('\n')[0]!, LIBRARY_MESSAGE_MAX)}`);
  const root = doc.contents;
  if (root === null) return null;
  const nodeLine = (node: Node | null | undefined): number => lineOf(node?.range?.[0]);
  if (!isMap(root)) throw new Error(`line ${nodeLine(root)}: expected "flag: value" lines`);
  const out: Record<string, ConfigValue> = {};
  for (const pair of root.items) {
    const keyNode = pair.key as Node | null;
    if (!isScalar(keyNode)) throw new Error(`line ${nodeLine(keyNode)}: expected "flag: value"`);
    const key = String(keyNode.value);
    if (Object.hasOwn(out, key)) throw new Error(`line ${nodeLine(keyNode)}: ${quoteName(key)} appears twice`);
    const value = pair.value as Node | null;
    if (isSeq(value)) out[key] = value.items.map((item) => scalar(item as Node | null, nodeLine));
    else out[key] = scalar(value, nodeLine);
  }
  return Object.keys(out).length === 0 ? null : out;
}

function scalar(node: Node | null, nodeLine: (n: Node | null) => number): ConfigScalar {
  if (node === null) return null; // "key:" with nothing after it
  const { isAlias, isMap, isScalar, isSeq } = loadYaml();
  const n = nodeLine(node);
  if (isAlias(node) || node.anchor || node.tag) throw new Error(`line ${n}: anchors, aliases and tags are not supported`);
  if (isMap(node) || isSeq(node)) throw new Error(`line ${n}: nested values are not supported (only flat "flag: value" lines)`);
  if (!isScalar(node)) throw new Error(`line ${n}: expected a value`);
  if (node.type === 'BLOCK_LITERAL' || node.type === 'BLOCK_FOLDED') throw new Error(`line ${n}: multi-line strings are not supported`);
  const v = node.value;
  if (v === null || typeof v === 'boolean') return v;
  if (typeof v === 'number' || typeof v === 'bigint') return node.source ?? String(v);
  return String(v);
}
