// Who writes into the stuck connections: stuck-client.js for our SDK's and CONNECT's clients, and for
// konnectivity-style ones ANP's own konnectivity-client, unmodified (test/anp-go's konnectivity-probe,
// its `stuck` scenario), as kube-apiserver dials: one TLS connection and HTTP/2 session per connection.
// Both speak the same JSON lines and signals (stuck-client.ts says which).
import { ANP_VERSIONS, anpBinary } from '../fixtures/anp-real.js';
import { spawnProcess, type ManagedProcess } from '../fixtures/index.js';
import { reapOnDeath } from './reaper.js';
import { spawnHelper } from './scenarios.js';
import type { StuckJob } from './stuck-client.js';

/** The konnectivity-client the bench's konnectivity-style clients are (ANP's current release). */
const KONNECTIVITY_CLIENT = ANP_VERSIONS[0]!;
/** Bytes per konnectivity-client Write(), one DATA packet each: io.Copy's buffer, as a proxied stream writes. */
const KONNECTIVITY_WRITE_BYTES = 32 * 1024;

export async function spawnStuckClients(name: string, job: StuckJob): Promise<ManagedProcess> {
  const spec = job.spec;
  if (spec.kind !== 'anp') return spawnHelper(name, 'stuck-client.js', job);
  const stall = spec.targets.stall;
  if (stall === undefined) throw new Error('no stall target for the konnectivity-style clients');
  const bin = await anpBinary('konnectivity-probe', KONNECTIVITY_CLIENT.version);
  // Go raises its open-files limit to the hard limit by itself.
  return reapOnDeath(
    spawnProcess({
      name,
      command: bin,
      args: [
        '--address',
        spec.address,
        '--ca',
        spec.tls.caPath,
        '--cert',
        spec.tls.certPath,
        '--key',
        spec.tls.keyPath,
        'stuck',
        '--dest',
        `127.0.0.1:${stall}`,
        '--count',
        String(job.count),
        '--concurrency',
        String(job.concurrency),
        '--seconds',
        String(job.seconds),
        '--chunk',
        String(Math.min(job.chunkBytes, KONNECTIVITY_WRITE_BYTES)),
        '--limit',
        String(job.perConnectionLimit),
      ],
    }),
  );
}
