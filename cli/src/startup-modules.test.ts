import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

// The built modules (the suite builds before it runs).
const built = (file: string): string => fileURLToPath(new URL(`../../${file}`, import.meta.url));

/** Node's modules that importing `specifier` in a fresh process loaded, matching `pattern`. */
function loadedBy(specifier: string, pattern: RegExp): string[] {
  const script = `await import(${JSON.stringify(specifier)}); process.stdout.write(JSON.stringify(process.moduleLoadList));`;
  const out = execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 30_000 });
  return (JSON.parse(out) as string[]).filter((m) => pattern.test(m));
}

describe('what the long-running commands load at start', () => {
  it("not undici (Node's fetch and WebSocket client), which an ES-module import of node:http pulls in", (ctx) => {
    const undici = /undici/;
    // The cause: reading node:http's exports, as an ES-module import does, runs getters that load it.
    if (loadedBy('node:http', undici).length === 0) return ctx.skip('this Node.js does not load undici for an import of node:http');
    for (const file of ['cli/dist/agent.js', 'cli/dist/hub.js', 'cli/dist/forward.js', 'client/dist/index.js']) {
      expect(loadedBy(built(file), undici), file).toEqual([]);
    }
  });
});
