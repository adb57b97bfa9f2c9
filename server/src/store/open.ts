// One entry point for the hub: the store named by its configuration (contract §6).
import { join } from 'node:path';
import { openEmbeddedStore, type EmbeddedStoreOptions } from './embedded.js';
import type { Store } from './store.js';

export type StoreConfig =
  /** Files live in `<dataDir>/store` (0700). */
  | ({ type: 'embedded'; dataDir: string } & EmbeddedStoreOptions)
  | { type: 'kubernetes'; kubeconfig?: string; context?: string; watchBackoffMs?: { initial: number; max: number } };

/** The embedded store's directory inside the hub's data directory. */
export function embeddedStoreDir(dataDir: string): string {
  return join(dataDir, 'store');
}

export async function openStore(config: StoreConfig): Promise<Store> {
  if (config.type === 'embedded') {
    const { type: _t, dataDir, ...opts } = config;
    return openEmbeddedStore(embeddedStoreDir(dataDir), opts);
  }
  const { type: _t, ...opts } = config;
  // Loaded only here: @kubernetes/client-node costs a hub on the embedded store ~65 MiB it never uses.
  const { openKubernetesStore } = await import('./kubernetes.js');
  return openKubernetesStore(opts);
}
