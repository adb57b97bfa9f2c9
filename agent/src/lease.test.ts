import { describe, expect, it } from 'vitest';
import { renewIntervalMs } from './lease.js';

describe('renewIntervalMs', () => {
  it("takes the hub's renewIntervalSeconds, at most 10 minutes; anything else means every lease duration", () => {
    expect(renewIntervalMs({ renewIntervalSeconds: 250 })).toBe(250_000);
    expect(renewIntervalMs({ renewIntervalSeconds: 86_400 })).toBe(600_000);
    for (const bad of [null, {}, { renewIntervalSeconds: '250' }, { renewIntervalSeconds: -1 }, { renewIntervalSeconds: Number.NaN }])
      expect(renewIntervalMs(bad)).toBe(0);
  });
});
