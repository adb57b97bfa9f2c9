// V8's gc() without `--expose-gc` on the command line, for the watchers that ask for collections
// (dead-buffers.ts, idle-heap.ts). The flag set at run time applies to contexts created after it, so
// the function comes from a new context; it keeps that context alive, hence one for the process.
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/** The options of V8's gc() that we use. */
export type GcOptions =
  | { type: 'major'; execution: 'async' }
  /** `last-resort`: full collections until nothing more is freed, each one memory-reducing. */
  | { type: 'major'; execution: 'sync'; flavor: 'last-resort' };

export type GcFunction = (options: GcOptions) => void;

let gc: GcFunction | null = null;

export function exposedGc(): GcFunction {
  if (!gc) {
    setFlagsFromString('--expose-gc');
    gc = runInNewContext('gc') as GcFunction;
  }
  return gc;
}
