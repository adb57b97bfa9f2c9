import { defineConfig } from 'vitest/config';
import { fuzzCoverage } from './test/fuzz/instrument.js';

// Unit tests live next to the code (`*/src/**/*.test.ts`); end-to-end tests that spawn real
// server/agent processes live in test/e2e and import the built packages (run `pnpm build` first).
export default defineConfig({
  // Instruments our packages for the fuzz targets only (test/fuzz/README.md); every other test gets them plain.
  plugins: [fuzzCoverage()],
  test: {
    include: ['proto/src/**/*.test.ts', 'server/src/**/*.test.ts', 'agent/src/**/*.test.ts', 'client/src/**/*.test.ts', 'cli/src/**/*.test.ts', 'test/src/**/*.test.ts', 'test/fuzz/**/*.test.ts', 'test/e2e/**/*.test.ts'],
    exclude: ['**/node_modules/**', '**/dist/**'],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // 2-core machines: end-to-end files spawn several processes each; run files one or two at a time.
    fileParallelism: true,
    maxWorkers: 2,
    minWorkers: 1,
    pool: 'forks',
  },
});
