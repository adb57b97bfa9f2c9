// HTTP heads from untrusted peers: the CONNECT frontend's request head, the gateway's request target and
// the headers it passes on towards the agent (and the agent towards the apiserver), the names it
// impersonates, and the heads the agent writes back for an answer to an upgrade.
import fc from 'fast-check';
import {
  IDENTITY_HEADER,
  IDENTITY_SIGNER_HEADER,
  gatewayForwardedHeaders,
  nameProblem,
  quoteName,
  responseHead,
  textAnswer,
} from '@cluster-proxy/proto';
import { parseGatewayTarget } from '@cluster-proxy/server';
import { findHeadEnd, parseAuthority, parseHead, tokenFromHeader } from '@cluster-proxy/server/parsers';
import { check, checkBounded, checkOneLine, chunksOf, heldBytes, type FuzzTarget } from '../engine.js';

const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/** findHeadEnd as the frontend calls it, chunk by chunk (searching from two bytes before the new ones). */
function headEndIncremental(input: Buffer, chunks: readonly Buffer[]): number {
  let len = 0;
  for (const c of chunks) {
    const old = len;
    len += c.length;
    const end = findHeadEnd(input.subarray(0, len), Math.max(0, old - 2));
    if (end >= 0) return end;
  }
  return -1;
}

const connectHeads = fc
  .tuple(
    fc.constantFrom('CONNECT', 'GET', 'connect', 'CONNECT ', ''),
    fc.oneof(
      fc.constantFrom(
        'cluster1.svc:443',
        '[::1]:6443',
        '10.0.0.1:1',
        'a_b.example.:65535',
        'x:0',
        'x:65536',
        '[fe80::1%eth0]:80',
        'host',
        ':443',
      ),
      fc.string({ maxLength: 30 }),
    ),
    fc.constantFrom('HTTP/1.1', 'HTTP/1.0', 'HTTP/2.0', 'http/1.1'),
    fc.array(
      fc.tuple(
        fc.constantFrom('Host', 'Proxy-Authorization', 'Content-Length', 'Transfer-Encoding', 'X', ' folded', 'bad name'),
        fc.oneof(
          fc.constantFrom('Bearer abc', 'Basic dXNlcjp0b2tlbg==', 'Basic Og==', 'bearer  a b', '0', '1', 'chunked'),
          fc.string({ maxLength: 20 }),
        ),
      ),
      { maxLength: 5 },
    ),
    fc.constantFrom('\r\n', '\n'),
    fc.uint8Array({ maxLength: 16 }),
  )
  .map(([method, target, version, headers, eol, rest]) =>
    Buffer.concat([
      Buffer.from(`${method} ${target} ${version}${eol}${headers.map(([n, v]) => `${n}: ${v}${eol}`).join('')}${eol}`, 'latin1'),
      rest,
    ]),
  );

export const connectHeadTarget: FuzzTarget = {
  name: 'connect-head',
  about:
    "the CONNECT frontend's request head (findHeadEnd chunked as the socket reads it, parseHead, parseAuthority, tokenFromHeader): a one-line refusal, or a head whose parts are well-formed and whose authority is normalized and re-parses to itself",
  generate: connectHeads,
  run(input) {
    const end = findHeadEnd(input, 0);
    check(end === headEndIncremental(input, chunksOf(input, 5)), 'connect: the head ends elsewhere when read in chunks');
    if (end < 0) return;
    check(end <= input.length, 'connect: head end past the input');
    const text = input.toString('latin1', 0, end);
    const parsed = parseHead(text);
    if (typeof parsed === 'string') {
      checkOneLine(parsed, 'connect refusal');
      return;
    }
    checkBounded(heldBytes(parsed), end, 'connect: parsed head');
    check(TOKEN.test(parsed.method), 'connect: method is not a token');
    check(!/\s/.test(parsed.target) && parsed.target !== '', 'connect: target holds whitespace or is empty');
    check(!parsed.headers.has('transfer-encoding'), 'connect: a Transfer-Encoding head was accepted');
    for (const [name, values] of parsed.headers) {
      check(TOKEN.test(name) && name === name.toLowerCase(), `connect: header name ${JSON.stringify(name)}`);
      for (const v of values) check(!/[\x00-\x08\x0a-\x1f\x7f]/.test(v) && v === v.trim(), `connect: header value ${JSON.stringify(v)}`);
    }
    const address = parseAuthority(parsed.target);
    if (address !== null) {
      // An IPv6 literal may carry a zone (node's isIPv6 takes `%` and [0-9A-Za-z.:_-]): no space, slash or line break.
      check(
        /^(\[[0-9a-f:.]+(%[0-9a-z._:-]+)?\]|[a-z0-9_.-]+):\d{1,5}$/.test(address),
        `connect: authority ${JSON.stringify(address)} is not normalized`,
      );
      const port = Number(address.slice(address.lastIndexOf(':') + 1));
      check(port >= 1 && port <= 65535, `connect: port ${port}`);
      check(parseAuthority(address) === address, `connect: authority ${JSON.stringify(address)} does not re-parse to itself`);
      check(!address.endsWith('.') && !address.includes('.:'), 'connect: trailing dot kept');
    }
    for (const v of parsed.headers.get('proxy-authorization') ?? []) {
      const token = tokenFromHeader(v);
      if (token !== null && /^bearer /i.test(v)) check(token !== '' && !/\s/.test(token), 'connect: a Bearer token with whitespace');
    }
  },
};

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

const gatewayTargets = fc
  .tuple(
    fc.constantFrom('/c1', '/prod-eu', '/C1', '/', '', '//c1', '/%63', '/c1.x'),
    fc.array(
      fc.oneof(
        fc.constantFrom(
          'api',
          'v1',
          'namespaces',
          'default',
          'kube-system',
          'services',
          'https:web:8443',
          'http:kubernetes',
          'web:x',
          'proxy-service',
          'proxy',
          'pods',
          '.',
          '..',
          '%2e',
          '%2E%2e',
          '%2f',
          '%5C',
          '%00',
          '',
          '%',
          '%zz',
          'a\\b',
          'é',
          '%C3%A9',
          ';',
          'a b',
          '#',
        ),
        fc.string({ maxLength: 6 }),
      ),
      { maxLength: 10 },
    ),
    fc.constantFrom('', '?watch=1', '?a=%2f..', '?#', '?x=/../'),
  )
  .map(([cluster, segs, query]) => Buffer.from(`${cluster}${segs.length ? '/' : ''}${segs.join('/')}${query}`, 'latin1'));

function checkGatewayTarget(target: string): void {
  const r = parseGatewayTarget(target);
  if ('error' in r) {
    checkOneLine(r.error, 'gateway refusal');
    return;
  }
  check(DNS_LABEL.test(r.cluster), `gateway: cluster ${JSON.stringify(r.cluster)} is not a DNS label`);
  check(r.path.startsWith('/'), `gateway: path ${JSON.stringify(r.path)} does not start with /`);
  check(!/[\x00-\x20\x7f#]/.test(r.path), 'gateway: control character, space or fragment in the forwarded path');
  const q = r.path.indexOf('?');
  const pathPart = q < 0 ? r.path : r.path.slice(0, q);
  check(!/%(2f|5c|00)/i.test(pathPart) && !pathPart.includes('\\'), 'gateway: encoded slash, backslash or NUL forwarded');
  const segments = pathPart.slice(1).split('/');
  segments.forEach((s, i) => {
    const d = decodeURIComponent(s);
    check(d !== '.' && d !== '..', `gateway: dot segment forwarded in ${JSON.stringify(r.path)}`);
    check(s !== '' || i === segments.length - 1 || pathPart === '/', `gateway: empty segment forwarded in ${JSON.stringify(r.path)}`);
  });
  // A URL parser (WHATWG here; Go's and the apiserver's clean likewise) sees the same segments: nothing it would normalize.
  const seen = new URL(pathPart, 'http://h').pathname.slice(1).split('/');
  check(
    seen.length === segments.length && seen.every((s, i) => safeDecode(s) === safeDecode(encodeOnly(segments[i]!))),
    `gateway: a URL parser reads ${JSON.stringify(pathPart)} as other segments: ${JSON.stringify(seen)}`,
  );
  if (r.service) {
    check(DNS_LABEL.test(r.service.name) && DNS_LABEL.test(r.service.namespace), 'gateway: service names');
    check(Number.isInteger(r.service.port) && r.service.port >= 1 && r.service.port <= 65535, 'gateway: service port');
  } else if (!target.includes('/proxy-service/') && !target.endsWith('/proxy-service')) {
    // The kube form re-parses to itself.
    const again = parseGatewayTarget(`/${r.cluster}${r.path === '/' && !/^\/[^/?]+\//.test(target) ? '' : r.path}`);
    check(
      !('error' in again) && again.cluster === r.cluster && again.path === r.path,
      `gateway: /${r.cluster}${r.path} does not re-parse to the same target`,
    );
  }
}

function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/** What a URL parser writes for a segment it only percent-encodes (it does not change its meaning). */
function encodeOnly(s: string): string {
  return new URL(`/${s}`, 'http://h').pathname.slice(1);
}

export const gatewayTargetTarget: FuzzTarget = {
  name: 'gateway-target',
  about:
    "the gateway's request target (parseGatewayTarget): a one-line refusal, or a cluster name and a path with no dot segment, empty segment, encoded slash, backslash or control character, that a URL parser reads as the same segments, and that re-parses to itself",
  generate: gatewayTargets,
  run(input) {
    checkGatewayTarget(input.toString('latin1'));
  },
};

/** Header lines `name: value` (node's headersDistinct: lower-case names, every value). */
function headersFrom(input: Buffer): Record<string, string[]> {
  const out = Object.create(null) as Record<string, string[]>; // as node's headersDistinct is
  for (const line of input.toString('latin1').split('\n')) {
    const colon = line.indexOf(':');
    if (colon <= 0) continue;
    const name = line.slice(0, colon).trim().toLowerCase();
    if (!TOKEN.test(name)) continue;
    (out[name] ??= []).push(line.slice(colon + 1).trim());
  }
  return out;
}

const CREDENTIAL_NAMES = ['authorization', 'host', 'proxy-authorization', IDENTITY_HEADER, IDENTITY_SIGNER_HEADER];
const HOP_BY_HOP = ['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'te', 'trailer', 'transfer-encoding', 'upgrade'];

const headerLines = fc
  .array(
    fc.tuple(
      fc.oneof(
        fc.constantFrom(
          'Authorization',
          'authorization',
          'Host',
          'Impersonate-User',
          'impersonate-group',
          'Impersonate-Extra-Scopes',
          'X-Remote-User',
          'x-remote-extra-a',
          'X-Remote-Group',
          'Connection',
          'Keep-Alive',
          'Upgrade',
          'Sec-WebSocket-Protocol',
          'Proxy-Authorization',
          'TE',
          'X-Custom',
          'Accept',
          IDENTITY_HEADER,
          IDENTITY_SIGNER_HEADER,
        ),
        fc.string({ maxLength: 10 }),
      ),
      fc.oneof(
        fc.constantFrom(
          'Bearer t',
          'x-custom, Keep-Alive',
          'close',
          'base64url.bearer.authorization.k8s.io.dG9r, v4.channel.k8s.io',
          'BASE64URL.BEARER.AUTHORIZATION.K8S.IO.x',
          ' , ',
          'system:masters',
        ),
        fc.string({ maxLength: 20 }),
      ),
    ),
    { maxLength: 8 },
  )
  .map((hs) => Buffer.from(hs.map(([n, v]) => `${n}: ${v}`).join('\n'), 'latin1'));

export const gatewayHeadersTarget: FuzzTarget = {
  name: 'gateway-headers',
  about:
    "what the gateway passes on of a caller's headers (gatewayForwardedHeaders) and the names it impersonates: no credential, identity, hop-by-hop or Connection-named header and no bearer subprotocol gets through; nothing is invented; a name passes only if it arrives unchanged",
  generate: headerLines,
  run(input) {
    const headers = headersFrom(input);
    const out = gatewayForwardedHeaders(headers);
    const named = new Set(
      (headers['connection'] ?? [])
        .flatMap((v) => v.split(','))
        .map((t) => t.trim().toLowerCase())
        .filter((t) => t !== ''),
    );
    for (const [name, value] of Object.entries(out)) {
      check(!CREDENTIAL_NAMES.includes(name) && !HOP_BY_HOP.includes(name) && !named.has(name), `gateway: forwarded ${name}`);
      // kube-apiserver's front-proxy headers (the defaults of its --requestheader-* flags).
      const frontProxy = ['x-remote-user', 'x-remote-group', 'x-remote-uid'].includes(name) || name.startsWith('x-remote-extra-');
      check(!name.startsWith('impersonate-') && !frontProxy, `gateway: forwarded credential header ${name}`);
      const values = Array.isArray(value) ? value : [value];
      if (name === 'sec-websocket-protocol') {
        for (const v of values)
          for (const p of v.split(','))
            check(!/^\s*base64url\.bearer\.authorization\.k8s\.io\./i.test(p), 'gateway: forwarded a bearer subprotocol');
      } else {
        check(JSON.stringify(values) === JSON.stringify(headers[name]), `gateway: ${name} changed on the way`);
      }
    }
    // Nothing else is dropped: every other header goes on (a `__proto__` header too).
    for (const name of Object.keys(headers)) {
      const credential =
        CREDENTIAL_NAMES.includes(name) ||
        HOP_BY_HOP.includes(name) ||
        named.has(name) ||
        name.startsWith('impersonate-') ||
        ['x-remote-user', 'x-remote-group', 'x-remote-uid'].includes(name) ||
        name.startsWith('x-remote-extra-') ||
        name === 'sec-websocket-protocol';
      if (!credential) check(Object.hasOwn(out, name), `gateway: dropped the end-to-end header ${JSON.stringify(name)}`);
    }
    // Impersonated names: one that passes reaches the apiserver exactly (no trimming, no control character).
    for (const values of Object.values(headers))
      for (const v of values) {
        const raw = v + String.fromCharCode(input[0] ?? 32);
        const p = nameProblem(raw);
        if (p === null)
          check(raw.trim() === raw && !/[\x00-\x1f\x7f-\x9f]/.test(raw), `identity: ${JSON.stringify(raw)} passed but would change`);
        const q = quoteName(raw);
        check(
          /^"[\x20-\x7e]*"$/.test(q) && q.length <= 2 + 81 * 12,
          `identity: quoteName(${JSON.stringify(raw)}) is not one printable line`,
        );
      }
  },
};

export const upgradeAnswerTarget: FuzzTarget = {
  name: 'upgrade-answer',
  about:
    "the heads the agent writes back on the tunnel for an apiserver's answer to an upgrade (responseHead, textAnswer): one status line, header lines that hold no line break, one empty line at the end, a body whose length is declared",
  run(input) {
    const status = 100 + (((input[0] ?? 0) * 256 + (input[1] ?? 0)) % 500);
    const text = input.subarray(2).toString('latin1');
    const [message = '', ...rest] = text.split('\u0000');
    // Header names and values as node's parser delivers them: no CR, LF or NUL.
    const raw = rest.flatMap((h) => {
      const i = h.indexOf(':');
      return i > 0 ? [h.slice(0, i).replace(/[\r\n]/g, ''), h.slice(i + 1).replace(/[\r\n]/g, '')] : [];
    });
    const head = responseHead(status, message, raw).toString('latin1');
    check(head.endsWith('\r\n\r\n') && head.indexOf('\r\n\r\n') === head.length - 4, 'upgrade: the head has an empty line before its end');
    const lines = head.slice(0, -4).split('\r\n');
    check(
      lines.every((l) => !/[\r\n]/.test(l)),
      'upgrade: a bare CR or LF in the head',
    );
    check(lines[0]!.startsWith(`HTTP/1.1 ${status} `), 'upgrade: status line');
    check(lines.length === 1 + raw.length / 2, 'upgrade: header count changed');
    const answer = textAnswer(status, message).toString('latin1');
    const split = answer.indexOf('\r\n\r\n');
    const body = answer.slice(split + 4);
    const length = /\r\nContent-Length: (\d+)\r\n/.exec(answer.slice(0, split));
    check(length !== null && Number(length[1]) === Buffer.byteLength(body, 'latin1'), 'upgrade: Content-Length does not match the body');
    check(body.endsWith('\n') && body.indexOf('\n') === body.length - 1, 'upgrade: the text answer is not one line');
  },
};
