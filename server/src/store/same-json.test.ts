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
});
