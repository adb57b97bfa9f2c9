// How a command that carries tunnel bytes for a long time (hub, agent, forward) sets up its memory, in one call:
// kernel send queues capped and free pages given back (native-calls.ts, proto's runtime/socket-options.ts,
// allocator-trim.ts), small stream buffers (stream-buffers.ts), a quiet heap made small (idle-heap.ts), and V8's
// collector tuned (gc-tuning.ts) with the governors that bound the dead Buffers the tuning leaves (dead-buffers.ts,
// young-buffers.ts). Each module is loaded only here, so other commands start without them.
import { useNativeCalls } from '@cluster-proxy/proto';

export interface DataPlaneMemoryOptions {
  /** Keep young garbage short while its budget is held (young-buffers.ts); the agent asks for it. */
  shortYoungGarbage: boolean;
}

export async function tuneForDataPlane(opts: DataPlaneMemoryOptions): Promise<void> {
  useNativeCalls((await import('./native-calls.js')).loadNativeCalls());
  // A paused socket reads into Node's buffer up to its high-water mark: keep that small.
  (await import('./stream-buffers.js')).limitStreamBuffers();
  const { AllocatorTrimmer } = await import('./allocator-trim.js');
  if (AllocatorTrimmer.available()) new AllocatorTrimmer().start();
  // A quiet process's heap shrinks right after a full collection rather than V8's 8 s later.
  new (await import('./idle-heap.js')).IdleHeapReducer().start();
  if ((await import('./gc-tuning.js')).tuneGarbageCollector()) {
    // The tuning stops V8 collecting for every 64 MiB of Buffers; the governor bounds what that leaves dead.
    new (await import('./dead-buffers.js')).DeadBufferGovernor().start();
    if (opts.shortYoungGarbage) new (await import('./young-buffers.js')).YoungBufferLimit().start();
  }
}
