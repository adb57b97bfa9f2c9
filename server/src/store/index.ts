export * from './objects.js';
export * from './store.js';
export * from './memory.js';
export * from './journal.js';
export * from './embedded.js';
export * from './kubernetes.js';
export * from './open.js';
