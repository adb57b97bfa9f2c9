// A CommonJS dependency loaded at its first use rather than at start: hub and agent carry libraries
// they need only for some flags or commands (text logs, config files, certificates, manifests), and
// their RSS at start is a goal. `from` is the caller's import.meta.url, so the package resolves as the
// caller's own dependency.
import { createRequire } from 'node:module';

/** A function that loads `specifier` the first time it is called and returns the same module after. */
export function lazyRequire<T>(specifier: string, from: string): () => T {
  let loaded: T | undefined;
  return () => (loaded ??= createRequire(from)(specifier) as T);
}
