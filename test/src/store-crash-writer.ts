// Child process for test/e2e/store-crash.test.ts: opens the embedded store in argv[2] and writes,
// updates and deletes ManagedClusters until killed. Before each write it prints `B <json>` and waits until
// the line is in the pipe, after the write is acknowledged `A <json>`. (libuv makes a stdout pipe
// non-blocking: while the reading test is slow and the pipe full, a line waits in this process, and a
// SIGKILL then lost a `B` whose write had landed.) Each worker owns its names and has one write in flight.
import { openEmbeddedStore, type ManagedCluster } from '@cluster-proxy/server';

const [dir, roundText, compactText] = process.argv.slice(2);
if (!dir || !roundText) {
  process.stderr.write('usage: store-crash-writer DIR ROUND [COMPACT_BYTES]\n');
  process.exit(2);
}
const round = Number(roundText);
const store = await openEmbeddedStore(dir, {
  compactBytes: Number(compactText ?? 32768),
  warn: (m) => process.stderr.write(`warning: ${m}\n`),
});
process.stdout.write(`ready ${process.pid}\n`);

const WORKERS = 8;
const NAMES = 6;
let seq = 0;

async function worker(w: number): Promise<never> {
  const present = new Map<string, ManagedCluster>();
  for (let i = 0; ; i++) {
    const name = `r${round}-w${w}-${i % NAMES}`;
    const v = round * 1_000_000 + ++seq;
    const cur = present.get(name);
    const op = !cur ? 'create' : i % 5 === 4 ? 'delete' : 'update';
    await new Promise((resolve) => process.stdout.write(`B ${JSON.stringify({ op, name, v })}\n`, resolve));
    if (op === 'create') {
      const o = await store.create('ManagedCluster', {
        apiVersion: 'cluster.open-cluster-management.io/v1',
        kind: 'ManagedCluster',
        metadata: { name },
        spec: { hubAcceptsClient: true, leaseDurationSeconds: v },
      });
      present.set(name, o);
      process.stdout.write(`A ${JSON.stringify({ op, name, v, rv: o.metadata.resourceVersion })}\n`);
    } else if (op === 'update' && cur) {
      const o = await store.update('ManagedCluster', { ...cur, spec: { ...cur.spec, leaseDurationSeconds: v } });
      present.set(name, o);
      process.stdout.write(`A ${JSON.stringify({ op, name, v, rv: o.metadata.resourceVersion })}\n`);
    } else {
      await store.delete('ManagedCluster', { name });
      present.delete(name);
      process.stdout.write(`A ${JSON.stringify({ op, name, v })}\n`);
    }
  }
}

await Promise.all(Array.from({ length: WORKERS }, (_, w) => worker(w)));
