// Garbage-collector settings for the commands that carry tunnel bytes (hub, agent, forward, quickstart).
//
// Every TLS record and socket read becomes a fresh Buffer whose memory lives outside V8's heap. V8 by
// default starts a full mark-compact collection each time 64 MiB more of such external memory has
// been allocated since the last one — even though nearly all of those Buffers die young and the
// cheap young-generation collection frees them. At a few hundred MB/s that was 70 full collections
// per GB through the hub, 25–30 % of its CPU. With external memory counted in V8's global heap limit
// instead, a full collection runs only when live memory (heap plus external) has grown; measured
// with `ab.js` (tunnel path, one connection, 3 rounds), hub + agent CPU per GiB 3.5/3.1 → 2.6/2.6 s
// up/down and throughput 400 → 500 MB/s, idle RSS unchanged. See docs/goals.md, "Where the time goes".
import { setFlagsFromString } from 'node:v8';

const FLAG = '--external-memory-accounted-in-global-limit';
/** The Node.js lines whose V8 has the flag and on which it was measured; elsewhere V8 would print
 * "unrecognized flag", so it is left alone there. */
const MEASURED_MAJORS = new Set([24]);

export function tuneGarbageCollector(version: string = process.versions.node): boolean {
  const major = Number(version.split('.')[0]);
  if (!MEASURED_MAJORS.has(major)) return false;
  setFlagsFromString(FLAG);
  return true;
}
