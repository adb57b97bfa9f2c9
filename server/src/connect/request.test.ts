// The CONNECT request-head parsing; the frontend itself is tested end to end in test/e2e/connect-frontend.test.ts.
import { describe, expect, it } from 'vitest';
import { DIAL_FAILURE_STATUS } from './frontend.js';
import { findHeadEnd, parseAuthority, parseHead } from './request.js';
import { tokenFromHeader } from '../http/bearer-token.js';

describe('findHeadEnd', () => {
  it('finds CRLF CRLF, bare LF LF and mixed endings, from an offset', () => {
    expect(findHeadEnd(Buffer.from('CONNECT a:1 HTTP/1.1\r\n\r\nrest'), 0)).toBe(24);
    expect(findHeadEnd(Buffer.from('CONNECT a:1 HTTP/1.1\n\nrest'), 0)).toBe(22);
    expect(findHeadEnd(Buffer.from('CONNECT a:1 HTTP/1.1\r\nA: b\n\r\n'), 0)).toBe(29);
    expect(findHeadEnd(Buffer.from('CONNECT a:1 HTTP/1.1\r\n'), 0)).toBe(-1);
    expect(findHeadEnd(Buffer.from('xx\r\n\r\n'), 2)).toBe(6);
  });
});

describe('parseHead', () => {
  it('parses a CONNECT request', () => {
    const h = parseHead('CONNECT cluster1:443 HTTP/1.1\r\nHost: cluster1:443\r\nProxy-Authorization: Bearer x\r\n\r\n');
    expect(h).toMatchObject({ method: 'CONNECT', target: 'cluster1:443' });
    expect(typeof h !== 'string' && h.headers.get('proxy-authorization')).toEqual(['Bearer x']);
  });

  it.each([
    ['', /malformed request line/],
    ['CONNECT cluster1:443\r\n\r\n', /malformed request line/],
    ['CONNECT  cluster1:443 HTTP/1.1\r\n\r\n', /malformed request line/],
    ['CONNECT cluster1:443 HTTP/2.0\r\n\r\n', /unsupported HTTP version/],
    ['CONNECT a:1 HTTP/1.1\r\nbad header\r\n\r\n', /malformed header line/],
    ['CONNECT a:1 HTTP/1.1\r\nA: b\r\n folded\r\n\r\n', /line folding/],
    ['CONNECT a:1 HTTP/1.1\r\nBad Name: b\r\n\r\n', /header name/],
    ['CONNECT a:1 HTTP/1.1\r\nA: b\rc\r\n\r\n', /control characters/],
    ['CONNECT a:1 HTTP/1.1\r\nContent-Length: 5\r\n\r\n', /no body/],
    ['CONNECT a:1 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n', /no body/],
  ])('refuses %j', (text, msg) => {
    expect(parseHead(text)).toMatch(msg);
  });
});

describe('parseAuthority', () => {
  it.each([
    ['cluster1:443', 'cluster1:443'],
    ['Cluster1.NS:443', 'cluster1.ns:443'],
    ['cluster1.:443', 'cluster1:443'],
    ['10.0.0.1:6443', '10.0.0.1:6443'],
    ['[fd00::1]:443', '[fd00::1]:443'],
  ])('accepts %s', (target, want) => expect(parseAuthority(target)).toBe(want));

  it.each([
    'cluster1',
    'cluster1:',
    'cluster1:0',
    'cluster1:65536',
    'cluster1:+1',
    'http://cluster1:443',
    'user@cluster1:443',
    'fd00::1:443',
    '[nothex]:443',
    'a..b:1',
    '-a:1',
    '/x',
    '*:443',
  ])('refuses %s', (target) => expect(parseAuthority(target)).toBeNull());
});

describe('tokenFromHeader', () => {
  it('takes Bearer, and Basic with any user name and the token as password', () => {
    expect(tokenFromHeader('Bearer abc-_1')).toBe('abc-_1');
    expect(tokenFromHeader('bearer abc')).toBe('abc');
    expect(tokenFromHeader(`Basic ${Buffer.from('anyone:tok:en').toString('base64')}`)).toBe('tok:en');
    expect(tokenFromHeader(`Basic ${Buffer.from(':tok').toString('base64')}`)).toBe('tok');
    expect(tokenFromHeader(`Basic ${Buffer.from('nocolon').toString('base64')}`)).toBeNull();
    expect(tokenFromHeader('Digest x')).toBeNull();
    expect(tokenFromHeader('Bearer')).toBeNull();
  });
});

describe('DIAL_FAILURE_STATUS', () => {
  it('maps every dial failure class', () => {
    expect(Object.fromEntries(Object.entries(DIAL_FAILURE_STATUS).map(([k, v]) => [k, v.status]))).toEqual({
      no_agent: 503,
      draining: 503,
      endpoint: 502,
      forbidden: 403,
      timeout: 504,
      dialclosed: 502,
      limit: 503,
      unknown: 502,
    });
  });
});
