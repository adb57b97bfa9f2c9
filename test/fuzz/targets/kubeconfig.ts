// Kubeconfigs the CLI writes (buildKubeconfig, proxyUrl) from names, tokens and addresses a user or a hub
// hands in: read back as kubectl would (YAML 1.1), every value is exactly what went in (no value can add a
// key, a document or a line), and a proxy URL parses back to the same user, token, host and port.
import { isIPv4 } from 'node:net';
import { parse } from 'yaml';
import { buildKubeconfig, proxyUrl } from '@cluster-proxy/cli/parsers';
import { isDns1123Subdomain } from '@cluster-proxy/server/pki';
import { check, fc, type FuzzTarget } from '../engine.js';

const field = fc.oneof(
  fc.constantFrom(
    'c1',
    'prod.eu-1',
    'no',
    'on',
    '~',
    'null',
    '0x1f',
    '1e3',
    "'",
    '"',
    '#x',
    '- a',
    'a: b',
    'a\nb: c',
    '---',
    '|',
    '&a',
    '*a',
    '!!str',
    ' lead',
    'trail ',
    '%',
    '@',
    'é',
    '\u2028',
  ),
  fc.string({ maxLength: 12 }),
);

export const kubeconfigTarget: FuzzTarget = {
  name: 'kubeconfig',
  about:
    'kubeconfigs the CLI writes (buildKubeconfig, proxyUrl): read back as YAML 1.1, every value is exactly what went in; a proxy URL parses back to the same user, token, host and port',
  generate: fc.array(field, { minLength: 8, maxLength: 8 }).map((fs) => Buffer.from(fs.join('\u0000'))),
  run(input) {
    const [cluster = 'c1', server = '', token = '', user = '', host = '', ca = '', command = '', arg = ''] = input
      .toString('utf8')
      .split('\u0000');
    const name = isDns1123Subdomain(cluster) ? cluster : 'c1'; // the CLI refuses other cluster names first
    const port = 1 + (((input[0] ?? 0) * 256 + (input[1] ?? 0)) % 65535);
    const withExec = (input[2] ?? 0) % 2 === 1;
    // The hub's host as a user names it: a DNS name or an IPv4 address. A name whose last label is a number
    // (`a.0`) is neither, and WHATWG's URL, which reads the proxy URL back here, refuses it as a bad IPv4
    // address (Go's, in kubectl, takes it as a name).
    const isHost = /^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$/i.test(host) && (!/(^|\.)(\d+|0x[0-9a-f]*)$/i.test(host) || isIPv4(host));
    const url = isHost ? proxyUrl(user, token, host, port) : null;
    const text = buildKubeconfig({
      cluster: name,
      server,
      caPems: ca === '' ? [] : [ca],
      ...(url ? { proxyUrl: url } : {}),
      ...(withExec ? { exec: { command, args: [arg] } } : token !== '' ? { userToken: token } : {}),
      tlsServerName: user,
    });
    const doc = parse(text, { version: '1.1' }) as Record<string, unknown>;
    const c = (doc['clusters'] as { name: string; cluster: Record<string, unknown> }[])[0]!;
    check(c.name === name && doc['current-context'] === name, 'kubeconfig: the entry names changed');
    check(
      c.cluster['server'] === server,
      `kubeconfig: server ${JSON.stringify(server)} read back as ${JSON.stringify(c.cluster['server'])}`,
    );
    if (user !== '') check(c.cluster['tls-server-name'] === user, 'kubeconfig: tls-server-name changed');
    if (url) check(c.cluster['proxy-url'] === url, 'kubeconfig: proxy-url changed');
    const u = (doc['users'] as { user: Record<string, unknown> }[])[0]!.user;
    if (withExec) {
      const exec = u['exec'] as { command: string; args: string[] };
      check(exec.command === command && exec.args.length === 1 && exec.args[0] === arg, 'kubeconfig: the exec plugin changed');
    } else if (token !== '') check(u['token'] === token, 'kubeconfig: the token changed');
    check(
      Object.keys(doc).sort().join() === 'apiVersion,clusters,contexts,current-context,kind,preferences,users',
      `kubeconfig: top-level keys ${Object.keys(doc).join()}`,
    );
    if (url) {
      const p = new URL(url);
      check(
        decodeURIComponent(p.username) === user && decodeURIComponent(p.password) === token,
        `proxyUrl: user or token changed in ${url}`,
      );
      check(p.port === (port === 443 ? '' : String(port)) && p.protocol === 'https:', `proxyUrl: port or scheme changed in ${url}`);
    }
  },
};
