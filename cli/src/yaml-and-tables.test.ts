import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { toKubectlYaml as toYaml } from '@cluster-proxy/server';
import { shq, table } from './ui.js';

describe('toYaml', () => {
  it("writes kubectl-style block YAML: lists of maps at the key's indentation, maps one level deeper", () => {
    const doc = {
      apiVersion: 'v1',
      clusters: [{ name: 'c1', cluster: { server: 'https://c1', 'insecure-skip-tls-verify': true } }],
      users: [{ name: 'c1', user: {} }],
      empty: [],
      count: 3,
      none: null,
    };
    expect(toYaml(doc)).toBe(
      [
        'apiVersion: v1',
        'clusters:',
        '- name: c1',
        '  cluster:',
        '    server: https://c1',
        '    insecure-skip-tls-verify: true',
        'users:',
        '- name: c1',
        '  user: {}',
        'empty: []',
        'count: 3',
        'none: null',
        '',
      ].join('\n'),
    );
  });

  it('quotes strings that a YAML 1.1 (kubectl, Go) or 1.2 reader would take for something else', () => {
    for (const s of [
      'true',
      'no',
      'on',
      'y',
      'yes',
      'null',
      '~',
      '123',
      '1.5',
      '1.20',
      '1e3',
      '0x1f',
      '012',
      '*',
      'a: b',
      '#x',
      '-x',
      ' lead',
      'trail ',
      '',
      'a\nb',
      '"q"',
      "it's",
      '[x]',
      '{x}',
      '@x',
      '!x',
      '&x',
      '%x',
      '`x`',
      'x #y',
      '2001-12-14',
    ]) {
      const out = toYaml({ k: s });
      expect(parse(out, { version: '1.1' }), JSON.stringify(s)).toEqual({ k: s });
      expect(parse(out), JSON.stringify(s)).toEqual({ k: s });
    }
    expect(toYaml({ k: 'plain-word_1.2/x' })).toBe('k: plain-word_1.2/x\n');
  });

  it('never folds long values (base64 certificate data stays on one line)', () => {
    const long = 'QUJD'.repeat(500);
    expect(toYaml({ 'certificate-authority-data': long })).toBe(`certificate-authority-data: ${long}\n`);
  });
});

describe('shq and table', () => {
  it('quotes for a POSIX shell only when needed', () => {
    expect(shq('/tmp/a.crt')).toBe('/tmp/a.crt');
    expect(shq('https://127.0.0.1:8089')).toBe('https://127.0.0.1:8089');
    expect(shq('Proxy-Authorization: Bearer x')).toBe("'Proxy-Authorization: Bearer x'");
    expect(shq("it's")).toBe("'it'\\''s'");
    expect(shq('')).toBe("''");
  });

  it('lays out columns like kubectl', () => {
    expect(
      table(
        ['NAME', 'AGENTS'],
        [
          ['cluster1', '1'],
          ['c2', '10'],
        ],
      ),
    ).toBe('NAME       AGENTS\ncluster1   1\nc2         10\n');
  });
});
