// Preloaded into the hub and agent processes of the scale scenarios only
// (`node --expose-gc --import gc-hook.js cli.js hub ...`): on SIGUSR2 it runs full garbage
// collections and prints one JSON line, so the bench reads VmRSS of a settled heap before and
// after opening 10,000 connections. Nothing else in those processes changes.
const gc = (globalThis as { gc?: () => void }).gc;
let collections = 0;

process.on('SIGUSR2', () => {
  gc?.();
  gc?.();
  const { heapUsed, external, arrayBuffers } = process.memoryUsage();
  process.stdout.write(`${JSON.stringify({ benchGc: ++collections, exposed: gc !== undefined, heapUsed, external, arrayBuffers })}\n`);
});

export {};
