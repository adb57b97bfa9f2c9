// Garbage-collector settings for the processes that carry tunnel bytes (hub, agent, forward).
//
// Every TLS record and socket read becomes a fresh Buffer whose memory lives outside V8's heap, and
// nearly all of them die young. V8's defaults make that expensive: it starts a full mark-compact
// collection each time 64 MiB more external memory has been allocated since the last one, whether or
// not a young-generation collection would free it (~70 full collections per GB through the hub, a
// quarter to a third of its CPU), and on a large machine, container or not, it lets each young
// semi-space grow to 32 MiB, so tens of MiB of dead Buffers wait for the next young collection and,
// once the C allocator has handed them out, stay as RSS. Three settings, measured with `ab.js`
// (tunnel path, one connection, 3 rounds, ssh -R alongside; hub + agent CPU seconds per GiB up/down,
// peak RSS of a bulk transfer hub/agent):
//   V8's defaults                                  3.5 / 3.1 s     188 / 163 MiB
//   external memory in the global heap limit       2.6 / 2.6 s     260 / 230 MiB
//   + 2 MiB semi-spaces                            2.5 / 2.3 s     177 / 171 MiB
//   + old generation starts at 64 MiB               1.6 / 1.8 s     179 / 165 MiB  (ssh -R: 2.2 / 2.3 s)
// The first is set at run time (tuneGarbageCollector; V8 reads it whenever it sizes its limits), with
// a fixed growing factor (RUNTIME_FLAGS). V8 sizes the generations once, at start, so the other two
// are `node` flags (LAUNCH_FLAGS), given where
// the product is launched: the image's entrypoint, the packed `cluster-proxy` command's first line,
// and this checkout's cli/dist/main.js. See docs/goals.md, "Where the time goes".
import { setFlagsFromString } from 'node:v8';

/**
 * Set at run time. The second fixes the heap's growing factor at 2: with external memory in the global
 * limit, V8's own factor (1.1–4, from its GC-speed estimates) stayed so low while ~100 MiB of Buffers
 * were held for stuck connections that a healthy bulk beside them made it collect the full heap 10–20
 * times a second (`pnpm bench -- --only stuck-destination`, 1,024 on `tunnel`: the hub's peak 277–285 →
 * 233 MiB, the bulk 66–78 → 96 %, no full collection during it).
 */
const RUNTIME_FLAGS = ['--external-memory-accounted-in-global-limit', '--heap-growing-percent=100'];
/** Flags for `node` itself when it runs the hub or the agent (a test keeps the launchers in step). */
export const LAUNCH_FLAGS: readonly string[] = ['--max-semi-space-size=2', '--initial-old-space-size=64'];
/** The Node.js lines whose V8 has the flag and on which it was measured; elsewhere V8 would print
 * "unrecognized flag", so it is left alone there. */
const MEASURED_MAJORS = new Set([24]);

/**
 * Sets the run-time flag when node was launched with LAUNCH_FLAGS (argv or NODE_OPTIONS) on a Node.js
 * line where it was measured. Alone, with V8's large young generation, it lets dead Buffers pile up
 * (the bulk peak above, 260/230 MiB): better the defaults than that.
 */
export function tuneGarbageCollector(version: string = process.versions.node, launchArgs: readonly string[] = launchArguments()): boolean {
  const major = Number(version.split('.')[0]);
  if (!MEASURED_MAJORS.has(major)) return false;
  if (!LAUNCH_FLAGS.every((f) => launchArgs.includes(f))) return false;
  for (const flag of RUNTIME_FLAGS) setFlagsFromString(flag);
  return true;
}

/**
 * V8 starts a young collection before it allocates a Buffer once the young generation's Buffers hold
 * twice its default young-generation capacity: this flag's MiB, doubled again in a build without
 * pointer compression (Node's), so 128 MiB at V8's default of 32, whatever the semi-space size
 * (`Heap::AllocateExternalBackingStore` in V8's heap.cc). V8 reads it each time, so it may move at run
 * time (young-buffers.ts moves it); V8 uses it otherwise only when it sizes the heap, at start.
 */
const YOUNG_CAPACITY_FLAG = '--scavenger-max-new-space-capacity-mb';
export const V8_DEFAULT_YOUNG_CAPACITY_MB = 32;

/** The flag's value that makes young Buffers of `bytes` start a young collection (at least 1 MiB). */
export function youngCapacityFlagFor(bytes: number, pointerCompression: boolean = nodeHasPointerCompression()): number {
  return Math.max(1, Math.round(bytes / (2 * 1024 * 1024 * (pointerCompression ? 1 : 2))));
}

/** Young Buffers of `bytes` start a young collection from now on; null gives V8's default back. */
export function collectYoungBuffersAt(bytes: number | null): void {
  setFlagsFromString(`${YOUNG_CAPACITY_FLAG}=${bytes === null ? V8_DEFAULT_YOUNG_CAPACITY_MB : youngCapacityFlagFor(bytes)}`);
}

function nodeHasPointerCompression(): boolean {
  return Number((process.config.variables as Record<string, unknown>)['v8_enable_pointer_compression'] ?? 0) === 1;
}

function launchArguments(): string[] {
  return [...process.execArgv, ...(process.env['NODE_OPTIONS'] ?? '').split(/\s+/)];
}
