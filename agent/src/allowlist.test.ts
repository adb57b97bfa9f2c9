import { describe, expect, it } from 'vitest';
import { Allowlist, AllowlistError } from './allowlist.js';

function parseError(entry: string): AllowlistError {
  try {
    new Allowlist([entry]);
  } catch (err) {
    expect(err).toBeInstanceOf(AllowlistError);
    return err as AllowlistError;
  }
  throw new Error(`expected allowlist entry ${JSON.stringify(entry)} to be refused`);
}

describe('Allowlist', () => {
  it('host:port allows exactly that host and port, case-insensitively', () => {
    const a = new Allowlist(['Example.com:443']);
    expect(a.allows('example.com', 443)).toBe(true);
    expect(a.allows('EXAMPLE.COM', 443)).toBe(true);
    expect(a.allows('example.com', 80)).toBe(false);
    expect(a.allows('www.example.com', 443)).toBe(false);
    expect(a.allows('example.com.evil', 443)).toBe(false);
  });

  it('host:* allows every port of that host', () => {
    const a = new Allowlist(['db.internal:*']);
    expect(a.allows('db.internal', 1)).toBe(true);
    expect(a.allows('db.internal', 65535)).toBe(true);
    expect(a.allows('db2.internal', 5432)).toBe(false);
  });

  it('*.domain allows subdomains only, not the domain itself or look-alikes', () => {
    const a = new Allowlist(['*.example.com:443']);
    expect(a.allows('a.example.com', 443)).toBe(true);
    expect(a.allows('a.b.example.com', 443)).toBe(true);
    expect(a.allows('example.com', 443)).toBe(false);
    expect(a.allows('badexample.com', 443)).toBe(false);
    expect(a.allows('a.example.com', 80)).toBe(false);
    expect(new Allowlist(['*.svc:*']).allows('kubernetes.default.svc', 6443)).toBe(true);
  });

  it('IPv4 CIDR:port matches addresses in the range, never names', () => {
    const a = new Allowlist(['10.0.0.0/8:443']);
    expect(a.allows('10.1.2.3', 443)).toBe(true);
    expect(a.allows('11.0.0.1', 443)).toBe(false);
    expect(a.allows('10.1.2.3', 80)).toBe(false);
    expect(a.allows('10.example.com', 443)).toBe(false);
  });

  it('IPv6 CIDR in brackets, with or without the prefix inside', () => {
    for (const entry of ['[fd00::]/8:*', '[fd00::/8]:*']) {
      const a = new Allowlist([entry]);
      expect(a.allows('fd12::1', 22), entry).toBe(true);
      expect(a.allows('fe80::1', 22), entry).toBe(false);
      expect(a.allows('10.0.0.1', 22), entry).toBe(false);
    }
    const one = new Allowlist(['[::1]:8443']);
    expect(one.allows('::1', 8443)).toBe(true);
    expect(one.allows('::1', 443)).toBe(false);
  });

  it('*:port allows any host on that port; * allows everything', () => {
    const a = new Allowlist(['*:6443']);
    expect(a.allows('anything.example', 6443)).toBe(true);
    expect(a.allows('10.0.0.1', 6443)).toBe(true);
    expect(a.allows('anything.example', 443)).toBe(false);
    const all = new Allowlist(['*']);
    expect(all.allows('x', 1)).toBe(true);
    expect(all.allows('::1', 65535)).toBe(true);
  });

  it('an empty allowlist allows nothing; blank entries are ignored', () => {
    expect(new Allowlist([]).allows('localhost', 80)).toBe(false);
    const a = new Allowlist(['', '  ', ' db:5432 ']);
    expect(a.describe()).toEqual(['db:5432']);
    expect(a.allows('db', 5432)).toBe(true);
  });

  it('any entry that matches is enough', () => {
    const a = new Allowlist(['a:1', 'b:2', '10.0.0.0/24:3']);
    expect(a.allows('a', 1)).toBe(true);
    expect(a.allows('b', 2)).toBe(true);
    expect(a.allows('10.0.0.9', 3)).toBe(true);
    expect(a.allows('a', 2)).toBe(false);
  });

  it('refuses malformed entries with a one-line AllowlistError naming the entry', () => {
    for (const bad of [
      'example.com',
      'example.com:',
      ':443',
      'example.com:0',
      'example.com:65536',
      'example.com:http',
      '10.0.0.0/33:443',
      '10.0.0.0/x:443',
      'fd00::/129:*',
      'example.com/8:443',
      '[::1]',
    ]) {
      const e = parseError(bad);
      expect(e.message, bad).toContain(bad);
      expect(e.message).not.toContain('\n');
    }
  });

  it('refuses a bare IPv6 address without brackets and port instead of misreading it', () => {
    // "fd00::1" has no port; it must not become host "fd00:" with port 1.
    const e = parseError('fd00::1');
    expect(e.message).toContain('fd00::1');
  });
});
