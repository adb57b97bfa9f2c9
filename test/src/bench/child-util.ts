// Helpers shared by the benchmark's helper processes (targets, relays).

/**
 * Exits when the parent process goes away (it was SIGKILLed and could not stop us): spawned with
 * stdin ignored, a helper would otherwise keep its ports forever. Checked once a second, unref'd.
 */
export function exitWithParent(): void {
  const parent = process.ppid;
  setInterval(() => {
    if (process.ppid !== parent) process.exit(0);
  }, 1000).unref();
}
