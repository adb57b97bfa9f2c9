import { describe, expect, it } from 'vitest';
import { canonicalJson, sameJson } from './same-json.js';

describe('sameJson', () => {
  it('ignores the order of object keys, at every depth (a real apiserver sorts them)', () => {
    const sent = {
      signerName: 'open-cluster-management.io/proxy-agent-signer',
      subject: { user: 'u', groups: ['g'], organizationUnit: ['ou'] },
    };
    const read = JSON.parse(
      '{"signerName":"open-cluster-management.io/proxy-agent-signer","subject":{"groups":["g"],"organizationUnit":["ou"],"user":"u"}}',
    ) as unknown;
    expect(JSON.stringify(read)).not.toBe(JSON.stringify(sent));
    expect(sameJson([sent], [read])).toBe(true);
  });

  it('still tells values, array order, types and missing members apart', () => {
    expect(sameJson({ a: 1 }, { a: 2 })).toBe(false);
    expect(sameJson([1, 2], [2, 1])).toBe(false);
    expect(sameJson({ a: '1' }, { a: 1 })).toBe(false);
    expect(sameJson({ a: 1, b: 2 }, { a: 1 })).toBe(false);
    expect(sameJson({ a: null }, {})).toBe(false);
    expect(sameJson([], {})).toBe(false);
  });

  it('compares as JSON would: undefined members dropped, undefined in an array is null', () => {
    expect(sameJson({ a: 1, b: undefined }, { a: 1 })).toBe(true);
    expect(sameJson([undefined], [null])).toBe(true);
    expect(canonicalJson({ b: { d: 1, c: [true, 'x'] }, a: null })).toBe('{"a":null,"b":{"c":[true,"x"],"d":1}}');
    expect(canonicalJson(undefined)).toBe('null');
  });

  it('writes keys in code-unit order whether or not they came so, integer-like keys too (Go sorts them as strings)', () => {
    const sorted = { apiVersion: 'v1', kind: 'K', metadata: { labels: { a: '1', b: '2' }, name: 'n' }, spec: [{ x: 1, y: [null] }] };
    expect(canonicalJson(sorted)).toBe(JSON.stringify(sorted));
    const shuffled = { spec: [{ y: [undefined], x: 1 }], metadata: { name: 'n', labels: { b: '2', a: '1' } }, kind: 'K', apiVersion: 'v1' };
    expect(canonicalJson(shuffled)).toBe(JSON.stringify(sorted));
    // Object.keys (and JSON.stringify) put integer-like keys first, in numeric order: "2" before "10".
    expect(canonicalJson({ a: 3, 10: 2, 2: 1 })).toBe('{"10":2,"2":1,"a":3}');
    expect(canonicalJson({ x: { 2: 1, 10: 2 } })).toBe('{"x":{"10":2,"2":1}}');
  });

  it('agrees with comparing canonicalJson strings on random values, equal and nearly equal (seeded)', () => {
    let seed = 42;
    const rnd = (n: number): number => {
      seed = (seed * 1103515245 + 12345) % 2147483648;
      return seed % n;
    };
    const leaf = (): unknown =>
      [null, undefined, 0, -0, 1, 1.5, Number.NaN, '', 'a', 'b', true, false, new Date(0), new Date(1), () => 1][rnd(15)];
    const value = (depth: number): unknown => {
      if (depth === 0 || rnd(3) === 0) return leaf();
      if (rnd(2) === 0) return Array.from({ length: rnd(4) }, () => value(depth - 1));
      return Object.fromEntries(Array.from({ length: rnd(4) }, () => [['a', 'b', 'c', 'd'][rnd(4)]!, value(depth - 1)]));
    };
    // A copy with its keys in another order, and sometimes one change somewhere.
    const variant = (v: unknown): unknown => {
      if (Array.isArray(v)) return v.map((x) => (rnd(8) === 0 ? value(1) : variant(x)));
      if (v !== null && typeof v === 'object' && !(v instanceof Date)) {
        const entries = Object.entries(v).reverse();
        if (rnd(8) === 0) entries.push([['a', 'e'][rnd(2)]!, value(1)]);
        return Object.fromEntries(entries.map(([k, x]) => [k, variant(x)]));
      }
      return rnd(10) === 0 ? leaf() : v;
    };
    let equal = 0;
    for (let i = 0; i < 5000; i++) {
      const a = value(4);
      const b = rnd(4) === 0 ? value(4) : variant(a);
      const want = canonicalJson(a) === canonicalJson(b);
      if (want) equal++;
      // The canonical form is the same JSON as JSON.stringify's, keys sorted.
      expect(JSON.parse(canonicalJson(a))).toEqual(JSON.parse(JSON.stringify(a) ?? 'null'));
      expect(canonicalJson(a)).toBe(JSON.stringify(sortedKeys(JSON.parse(JSON.stringify(a) ?? 'null'))));
      expect(sameJson(a, b), `${canonicalJson(a)} / ${canonicalJson(b)}`).toBe(want);
    }
    // Both outcomes were exercised.
    expect(equal).toBeGreaterThan(500);
    expect(equal).toBeLessThan(4500);
  });
});

/** A JSON value with every object's keys in sorted order (for the expected canonical form). */
function sortedKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortedKeys);
  if (v === null || typeof v !== 'object') return v;
  const o = v as Record<string, unknown>;
  return Object.fromEntries(
    Object.keys(o)
      .sort()
      .map((k) => [k, sortedKeys(o[k])]),
  );
}
