// MessageParser drives node's own HTTP parser binding directly: these pin the shape it relies on, so a Node
// that changes the binding fails here.
import { describe, expect, it } from 'vitest';
import { MessageParseError, MessageParser, type MessageHead } from './message-parser.js';

function collect(kind: 'request' | 'response', noBody = false, maxHeaderBytes = 16 * 1024) {
  const events: (string | MessageHead)[] = [];
  const parser = new MessageParser(
    kind,
    {
      head: (h) => (events.push(h), noBody),
      body: (b) => events.push(`body:${b.toString('latin1')}`),
      end: () => events.push('end'),
    },
    maxHeaderBytes,
  );
  return { parser, events, heads: () => events.filter((e): e is MessageHead => typeof e !== 'string') };
}

describe('MessageParser (node’s llhttp, driven directly)', () => {
  it('reads requests one after another: heads as sent, chunked bodies de-chunked, a length-framed body', () => {
    const { parser, events, heads } = collect('request');
    const wire =
      'POST /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Case: KeEp\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n' +
      'PUT /c HTTP/1.1\r\nContent-Length: 4\r\nConnection: close\r\n\r\nwxyz';
    expect(parser.execute(Buffer.from(wire, 'latin1'))).toBe(wire.length);
    const [a, b] = heads();
    expect([a!.method, a!.url, a!.rawHeaders, a!.keepAlive, a!.upgrade]).toEqual([
      'POST',
      '/a?b=1',
      ['Host', 'x', 'X-Case', 'KeEp', 'Transfer-Encoding', 'chunked'],
      true,
      false,
    ]);
    expect([b!.method, b!.keepAlive]).toEqual(['PUT', false]);
    expect(events.filter((e) => typeof e === 'string')).toEqual(['body:abc', 'body:de', 'end', 'body:wxyz', 'end']);
  });

  it('a head split anywhere, and more than 32 header lines (handed over in parts), reads the same', () => {
    const { parser, heads } = collect('request');
    const lines = Array.from({ length: 40 }, (_, i) => `H${i}: v${i}\r\n`).join('');
    const wire = Buffer.from(`GET /long HTTP/1.1\r\n${lines}\r\n`, 'latin1');
    for (let i = 0; i < wire.length; i += 7) expect(parser.execute(wire.subarray(i, i + 7))).toBe(Math.min(7, wire.length - i));
    expect(heads()[0]!.url).toBe('/long');
    expect(heads()[0]!.rawHeaders).toHaveLength(80);
    expect(heads()[0]!.rawHeaders.slice(78)).toEqual(['H39', 'v39']);
  });

  it('stops after an upgrade head: what follows is the new protocol’s', () => {
    const { parser, heads } = collect('request', true);
    const head = 'GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n';
    expect(parser.execute(Buffer.from(`${head}\x81\x05hello`, 'latin1'))).toBe(head.length);
    expect(heads()[0]!.upgrade).toBe(true);
  });

  it('refuses what node:http refuses, with llhttp’s code: both lengths, a bare LF in a value, a head too large', () => {
    const bad = (wire: string, max = 16 * 1024): MessageParseError => {
      const r = collect('request', false, max).parser.execute(Buffer.from(wire, 'latin1'));
      if (!(r instanceof MessageParseError)) throw new Error(`accepted: ${JSON.stringify(wire)}`);
      return r;
    };
    expect(bad('POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n').code).toMatch(/^HPE_/);
    expect(bad('GET / HTTP/1.1\r\nX: a\rb\r\n\r\n').code).toMatch(/^HPE_/);
    expect(bad('POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n').code).toMatch(/^HPE_/);
    expect(bad(`GET / HTTP/1.1\r\nX: ${'a'.repeat(2000)}\r\n\r\n`, 1024).code).toBe('HPE_HEADER_OVERFLOW');
  });

  it('responses: a HEAD’s answer has no body when told; 1xx before the answer; a body to the end of the connection ends at finish()', () => {
    const head = collect('response', true);
    const wire = 'HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n';
    expect(head.parser.execute(Buffer.from(wire))).toBe(wire.length);
    expect(head.heads().map((h) => h.status)).toEqual([200, 204]);

    const r = collect('response');
    r.parser.execute(Buffer.from('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: close\r\n\r\npart'));
    expect(r.heads().map((h) => [h.status, h.statusMessage, h.keepAlive])).toEqual([
      [100, 'Continue', true],
      [200, 'OK', false],
    ]);
    expect(r.events.filter((e) => typeof e === 'string')).toEqual(['end', 'body:part']);
    expect(r.parser.finish()).toBeNull();
    expect(r.events.at(-1)).toBe('end');

    const cut = collect('response');
    cut.parser.execute(Buffer.from('HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc'));
    expect(cut.parser.finish()).toBeInstanceOf(MessageParseError);
  });
});
