export * from './objects.js';
export * from './store.js';
export * from './memory.js';
export * from './journal.js';
export * from './embedded.js';
// The Kubernetes store is not re-exported here (it would load @kubernetes/client-node into every hub):
// openStore({ type: 'kubernetes' }) loads it on demand, and `@cluster-proxy/server/kubernetes-store` exports it.
export * from './open.js';
export * from './counting.js';
