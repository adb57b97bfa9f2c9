// What `pnpm fuzz` (vite-node) loads: the plugin that instruments our packages for the fuzz targets.
import { defineConfig } from 'vitest/config';
import { fuzzCoverage } from './instrument.js';

export default defineConfig({ plugins: [fuzzCoverage()] });
