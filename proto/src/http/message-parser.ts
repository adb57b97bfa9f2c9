// Node's own HTTP/1.1 parser (llhttp, the one node:http runs on every request and response), driven
// directly: for a relay that reads message heads and must know where each body ends, but has no use for
// node:http's request and response objects (IncomingMessage, ServerResponse, ClientRequest), which cost
// most of a proxy hop's CPU. The same parser, so the same strictness as node:http's server and client
// (no lenient flags): what node:http would refuse, this refuses.
//
// Its binding is `_http_common`'s HTTPParser, not documented; the shape used here has held since Node 12
// (llhttp). message-parser.test.ts pins it, so a Node that changes it fails the suite, not a gateway.
import { createRequire } from 'node:module';

interface NativeParser {
  initialize(kind: number, resource: object, maxHeaderSize: number, lenient: number): void;
  execute(data: Buffer): number | NativeError;
  finish(): NativeError | undefined;
  [callback: number]: unknown;
}
interface NativeError extends Error {
  code?: string;
  reason?: string;
  bytesParsed?: number;
}
interface NativeParserClass {
  new (): NativeParser;
  REQUEST: number;
  RESPONSE: number;
  kOnMessageBegin: number;
  kOnHeaders: number;
  kOnHeadersComplete: number;
  kOnBody: number;
  kOnMessageComplete: number;
  kOnExecute: number;
  kOnTimeout: number;
  kLenientNone: number;
}

function binding(): { Native: NativeParserClass; METHODS: string[] } {
  const common = createRequire(import.meta.url)('_http_common') as { HTTPParser?: NativeParserClass; methods?: string[] };
  const { HTTPParser, methods } = common;
  if (typeof HTTPParser !== 'function' || !Array.isArray(methods) || typeof HTTPParser.kOnHeadersComplete !== 'number')
    throw new Error(`this Node.js (${process.version}) has no HTTP parser binding of the shape cluster-proxy uses`);
  return { Native: HTTPParser, METHODS: methods };
}
const { Native, METHODS } = binding();

/** One message's head as the parser read it: header names and values as sent (latin1), in order. */
export interface MessageHead {
  /** Requests: the method and the request target. */
  method: string;
  url: string;
  /** Responses: the status code and reason. */
  status: number;
  statusMessage: string;
  versionMajor: number;
  versionMinor: number;
  rawHeaders: string[];
  /** An upgrade (Connection: upgrade with Upgrade, or CONNECT): what follows the head is not HTTP. */
  upgrade: boolean;
  /** Whether the connection stays open after this message (HTTP/1.1 without Connection: close). */
  keepAlive: boolean;
}

export interface MessageEvents {
  /** The first byte of a message arrived (a head is being read). */
  begin?(): void;
  /** A head. Return true when no body follows whatever the head says (the response to a HEAD request). */
  head(head: MessageHead): boolean;
  /** Body bytes, de-chunked: a view of the buffer given to execute(). */
  body(chunk: Buffer): void;
  /** The message ended (its last body byte, or its head when it has none). */
  end(): void;
}

/** A message the parser refused: llhttp's code (HPE_…) and its reason. */
export class MessageParseError extends Error {
  constructor(
    readonly code: string,
    reason: string,
  ) {
    super(reason);
  }
}

/**
 * Parses one direction of one connection, message after message. execute() returns how many bytes it
 * took: all of them, but for an upgrade, where it stops after the head (the rest is the new protocol's).
 */
export class MessageParser {
  private readonly native: NativeParser;
  /** Header lines node's binding hands over before the head is complete (more than 32). */
  private pendingHeaders: string[] = [];
  private pendingUrl = '';

  constructor(kind: 'request' | 'response', events: MessageEvents, maxHeaderBytes: number) {
    const n = new Native();
    n.initialize(kind === 'request' ? Native.REQUEST : Native.RESPONSE, {}, maxHeaderBytes, Native.kLenientNone);
    n[Native.kOnMessageBegin] = (): void => events.begin?.();
    n[Native.kOnExecute] = () => {};
    n[Native.kOnTimeout] = () => {};
    n[Native.kOnHeaders] = (headers: string[], url: string): void => {
      this.pendingHeaders.push(...headers);
      this.pendingUrl += url;
    };
    n[Native.kOnHeadersComplete] = (
      versionMajor: number,
      versionMinor: number,
      headers: string[] | undefined,
      method: number | undefined,
      url: string | undefined,
      status: number | undefined,
      statusMessage: string | undefined,
      upgrade: boolean,
      keepAlive: boolean,
    ): number => {
      const rawHeaders = headers ?? this.pendingHeaders;
      const target = url ?? this.pendingUrl;
      this.pendingHeaders = [];
      this.pendingUrl = '';
      const noBody = events.head({
        method: typeof method === 'number' ? (METHODS[method] ?? '') : '',
        url: target,
        status: status ?? 0,
        statusMessage: statusMessage ?? '',
        versionMajor,
        versionMinor,
        rawHeaders,
        upgrade,
        keepAlive,
      });
      // node's binding: 1 = no body follows, 0 = as the head says
      return noBody ? 1 : 0;
    };
    n[Native.kOnBody] = (chunk: Buffer): void => events.body(chunk);
    n[Native.kOnMessageComplete] = (): void => events.end();
    this.native = n;
  }

  /** Bytes taken from `data`, or why they are not HTTP. */
  execute(data: Buffer): number | MessageParseError {
    const r = this.native.execute(data);
    return typeof r === 'number' ? r : refused(r);
  }

  /** The connection ended: a body that runs to the end of the connection ends here; a message cut short is an error. */
  finish(): MessageParseError | null {
    const r = this.native.finish();
    return r === undefined ? null : refused(r);
  }
}

function refused(e: NativeError): MessageParseError {
  return new MessageParseError(e.code ?? 'HPE_UNKNOWN', e.reason ?? e.message);
}
