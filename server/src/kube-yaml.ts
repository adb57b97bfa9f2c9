// YAML documents people read and Go tools parse (kubeconfigs, `-o yaml`, `proxy-config render`), written by
// the `yaml` library in kubectl's style: lists at their key's indentation, long values (base64 certificates)
// never folded.
import { lazyRequire } from '@cluster-proxy/proto';
import type * as Yaml from 'yaml';

/** The `yaml` library, loaded at first use: a hub that renders and reads no YAML starts without it (~2 MiB of RSS). */
export const yamlLib = lazyRequire<typeof Yaml>('yaml', import.meta.url);

export type YamlValue = string | number | boolean | null | YamlValue[] | { [key: string]: YamlValue };

export function toYaml(value: YamlValue): string {
  // YAML 1.1 rules for quoting: kubectl and Go tools read with a YAML 1.1 parser, where a plain no, on or y is a boolean.
  return yamlLib().stringify(value, { indentSeq: false, lineWidth: 0, version: '1.1' });
}
