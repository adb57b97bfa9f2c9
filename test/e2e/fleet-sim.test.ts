// The fleet simulator end to end at a small N, so it does not rot: every agent connects (each with its
// own identity, mux and gRPC mixed), the hub lists an addon per cluster and reports them Available, a dial
// through one cluster's agent reaches its apiserver, a killed agent is reported unavailable, and stop()
// leaves no process behind. Not timed: the bench's `fleet` scenario measures.
import { afterAll, describe, expect, it } from 'vitest';
import { setTimeout as sleep } from 'node:timers/promises';
import { Fleet, clusterName } from '../src/fleet/fleet.js';

const N = 50;

describe('fleet simulator', () => {
  let fleet: Fleet | undefined;
  afterAll(async () => {
    await fleet?.stop();
  });

  it(`connects ${N} agents, dials through one, sees one killed, and cleans up`, async () => {
    // A short tunnel-loss window, so the killed agent shows within the test's time.
    fleet = await Fleet.create({ clusters: N, startPerSecond: 200, hubArgs: ['--tunnel-loss-window', '4s'] });
    await fleet.loadClient();
    await fleet.startAgents();
    await fleet.waitConnected(N, 60_000);
    expect(await fleet.hubAgents()).toBe(N);

    const ms = await fleet.dial(clusterName(7));
    expect(ms).toBeGreaterThan(0);

    // Every cluster's addon turns Available once its agent holds a tunnel.
    for (let i = 0; i < 100; i++) {
      const addons = await fleet.addons();
      if (addons.length === N && addons.every((a) => a.available === 'True')) break;
      await sleep(200);
    }
    const addons = await fleet.addons();
    expect(addons.filter((a) => a.available === 'True')).toHaveLength(N);

    await fleet.killAgent(clusterName(3));
    let down: string | undefined;
    for (let i = 0; i < 100 && down !== 'False'; i++) {
      await sleep(200);
      down = (await fleet.addons()).find((a) => a.cluster === clusterName(3))?.available;
    }
    expect(down).toBe('False');

    const hub = fleet.hub.proc;
    await fleet.stop();
    expect(hub.isRunning()).toBe(false);
    fleet = undefined;
  }, 180_000);
});
