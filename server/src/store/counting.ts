// Counts the requests a hub makes of its store (per verb and kind), for `/metrics`: how much a fleet
// costs the store (the Kubernetes API server, in that mode) is a figure worth watching at scale.
import type { Kind } from './objects.js';
import type { Store } from './store.js';

export type StoreVerb = 'get' | 'list' | 'create' | 'update' | 'updateStatus' | 'delete' | 'watch';

/** The same store, calling `count` once per request (a watch counts once, when it starts). */
export function countingStore(store: Store, count: (verb: StoreVerb, kind: Kind) => void): Store {
  return {
    get kind() {
      return store.kind;
    },
    get: (kind, key) => {
      count('get', kind);
      return store.get(kind, key);
    },
    list: (kind, opts) => {
      count('list', kind);
      return store.list(kind, opts);
    },
    create: (kind, obj) => {
      count('create', kind);
      return store.create(kind, obj);
    },
    update: (kind, obj) => {
      count('update', kind);
      return store.update(kind, obj);
    },
    updateStatus: (kind, obj, opts) => {
      count('updateStatus', kind);
      return store.updateStatus(kind, obj, opts);
    },
    delete: (kind, key, opts) => {
      count('delete', kind);
      return store.delete(kind, key, opts);
    },
    watch: (kind, opts, handlers) => {
      count('watch', kind);
      return store.watch(kind, opts, handlers);
    },
    ensureNamespace: (name) => store.ensureNamespace(name),
    ping: () => store.ping(),
    close: () => store.close(),
  };
}
