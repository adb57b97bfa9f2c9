import { describe, expect, it } from 'vitest';
import { BudgetPressure, RELAX_HOLDERS, RELAX_SHARE, TIGHT_HOLDERS, TIGHT_SHARE } from './budget-pressure.js';

const MiB = 1024 * 1024;

describe('BudgetPressure', () => {
  it('is tight from an eighth of the budget held until less than a sixteenth is', () => {
    let held = 0;
    const pressure = new BudgetPressure({ held: () => held, limit: () => 64 * MiB, holders: () => 1, active: () => 1 });
    expect(pressure.update()).toBe(false);
    held = TIGHT_SHARE * 64 * MiB - 1;
    expect(pressure.update()).toBe(false);
    held = TIGHT_SHARE * 64 * MiB;
    expect(pressure.update()).toBe(true);
    held = RELAX_SHARE * 64 * MiB; // between the two: it stays tight
    expect(pressure.update()).toBe(true);
    expect(pressure.tight).toBe(true);
    held = RELAX_SHARE * 64 * MiB - 1;
    expect(pressure.update()).toBe(false);
  });

  it('is tight while many connections hold bytes, however little, and relaxes once few do and little is held', () => {
    let holders = 0;
    let held = 0;
    const pressure = new BudgetPressure({ held: () => held, limit: () => 256 * MiB, holders: () => holders, active: () => 1 });
    holders = TIGHT_HOLDERS - 1;
    held = 2 * MiB;
    expect(pressure.update()).toBe(false);
    holders = TIGHT_HOLDERS; // a thousand stuck connections are filling
    expect(pressure.update()).toBe(true);
    holders = RELAX_HOLDERS;
    expect(pressure.update()).toBe(true);
    holders = RELAX_HOLDERS - 1;
    held = 31 * MiB; // one bulk transfer holding much, alone: still more than RELAX_SHARE
    expect(pressure.update()).toBe(true);
    held = RELAX_SHARE * 256 * MiB - 1;
    expect(pressure.update()).toBe(false);
    holders = 1;
    held = 31 * MiB; // a bulk transfer alone does not tighten it (under TIGHT_SHARE, one holder)
    expect(pressure.update()).toBe(false);
  });

  it('is tight while many connections pass bytes on at once, though none holds any (stuck ones filling)', () => {
    let active = 0;
    const pressure = new BudgetPressure({ held: () => 0, limit: () => 256 * MiB, holders: () => 0, active: () => active });
    active = TIGHT_HOLDERS - 1;
    expect(pressure.update()).toBe(false);
    active = TIGHT_HOLDERS; // a thousand connections, each a few KiB a second
    expect(pressure.update()).toBe(true);
    active = RELAX_HOLDERS;
    expect(pressure.update()).toBe(true);
    active = RELAX_HOLDERS - 1;
    expect(pressure.update()).toBe(false);
    active = 8; // eight bulk transfers at once
    expect(pressure.update()).toBe(false);
  });

  it('changes nothing where there is no budget', () => {
    const pressure = new BudgetPressure({ held: () => 10 * MiB, limit: () => 0, holders: () => 1000 });
    expect(pressure.update()).toBe(false);
  });
});
