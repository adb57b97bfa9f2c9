// One tunneled gateway connection from the hub, relayed to the apiserver on one TLS connection of its own
// (dialed at the first request, kept while both stay open, dialed again when the apiserver closed it).
// Request heads are parsed with node's own parser (proto message-parser.ts), checked and rewritten by the
// proxy (impersonating-proxy.ts: prepare()); request bodies are passed on as parsed (re-chunked when
// chunked); the apiserver's answer goes back to the hub byte for byte, parsed only to find where it ends.
// node:http's request and response objects at this hop cost about half the gateway's agent CPU.
//
// One request at a time, as node's HTTP client (the hub's) sends them: a head that arrives before the
// answer to the one before it ended is a protocol error and closes the connection.
//
//   idle ──head──▶ preparing (checks; the input paused, body bytes held) ──ready──▶ relaying
//   relaying ──request and answer both ended──▶ idle (or closed, when either said Connection: close)
//   preparing ──refused──▶ closing (one-line answer, then closed)
//   idle ──upgrade head──▶ upgraded (handed to upgrade.ts with the bytes after the head)
//   any ──the hub closed, a parse error, the apiserver failed──▶ closed
import net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import {
  LAST_CHUNK,
  MessageParser,
  distinctHeaders,
  textAnswer,
  writeChunk,
  type MessageHead,
  type MessageParseError,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { kubeTls, type KubeRestConfig } from '../kube-rest.js';
import { apiserverAddress, apiserverPath, apiserverUnreachable, type Prepared } from './apiserver-request.js';

/** A request head as the checks read it. */
export interface RequestHead {
  method: string;
  url: string;
  /** Lower-case names, every value in order (node's headersDistinct); no prototype. */
  headersDistinct: Record<string, string[]>;
  /** The tunneled connection it came on (the key of its link's identity MAC). */
  socket: Duplex;
}

export interface RelayHooks {
  /** The identity checked and the outgoing headers made, or the refusal (status and one line). */
  prepare(head: RequestHead): Promise<Prepared | { status: number; message: string }>;
  /** An upgrade request: the connection is the upgrade's from here, with the bytes after the head. */
  upgrade(head: RequestHead, socket: Duplex, rest: Buffer): void;
  log: Logger;
  maxHeadBytes: number;
}

export type RelayState = 'idle' | 'preparing' | 'relaying' | 'closing' | 'upgraded' | 'closed';

interface Exchange {
  request: RequestHead;
  /** Where it goes (known once the checks passed; a request sent again goes there too). */
  kube: KubeRestConfig | null;
  /** The head as written to the apiserver (kept to send again once, see upstreamGone). */
  head: string;
  chunked: boolean;
  /** No body and a method that may be sent twice: sent again once if a reused connection closes unanswered. */
  retryable: boolean;
  keepAlive: boolean;
  noResponseBody: boolean;
  requestEnded: boolean;
  answered: boolean;
  /** Bytes of the answer passed back. */
  started: boolean;
  /** The answer's head said the apiserver closes after it. */
  upstreamCloses: boolean;
  informational: boolean;
  /** Body bytes parsed while the checks ran. */
  held: Buffer[];
}

const IDEMPOTENT = new Set(['GET', 'HEAD', 'OPTIONS']);
const TOKEN = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const BAD_VALUE = /[^\t\x20-\x7e\x80-\xff]/;

export class ApiserverRelay {
  private stateNow: RelayState = 'idle';
  private readonly parser: MessageParser;
  private exchange: Exchange | null = null;
  private up: tls.TLSSocket | null = null;
  /** `up` carried a request before the one in flight (the apiserver may have closed it meanwhile). */
  private upReused = false;
  private upgradeHead: RequestHead | null = null;
  /** The hub ended its side: the connection closes once the request in flight is answered. */
  private downEnded = false;
  /** Waiting for 'drain' on the apiserver's connection (the hub's input paused) / on the hub's (the apiserver's paused). */
  private upFull = false;
  private downFull = false;

  constructor(
    private readonly down: Duplex,
    private readonly hooks: RelayHooks,
    private readonly sessions: { last: Buffer | undefined },
  ) {
    this.parser = new MessageParser(
      'request',
      { head: (h) => this.onRequestHead(h), body: (b) => this.onRequestBody(b), end: () => this.onRequestEnd() },
      hooks.maxHeadBytes,
    );
    down.on('data', this.onDownData);
    down.on('end', this.onDownEnd);
    down.on('close', this.onDownClose);
    down.on('error', () => {}); // reported through 'close'
  }

  get state(): RelayState {
    return this.stateNow;
  }

  /** The one place the state changes. */
  private setState(next: RelayState): void {
    this.stateNow = next;
  }

  /** Closes both connections now. */
  destroy(): void {
    if (this.stateNow === 'upgraded') return;
    this.setState('closed');
    this.exchange = null;
    this.down.destroy();
    this.dropUpstream();
  }

  private readonly onDownData = (d: Buffer): void => {
    if (this.stateNow === 'closing' || this.stateNow === 'closed' || this.stateNow === 'upgraded') return;
    const r = this.parser.execute(d);
    if (typeof r !== 'number') return this.malformed(r);
    const upgrade = this.upgradeHead;
    if (upgrade && (this.stateNow as RelayState) !== 'closing' && (this.stateNow as RelayState) !== 'closed') {
      this.setState('upgraded');
      this.down.off('data', this.onDownData);
      this.down.off('end', this.onDownEnd);
      this.down.off('close', this.onDownClose);
      this.dropUpstream();
      this.hooks.upgrade(upgrade, this.down, d.subarray(r));
    }
  };

  private malformed(err: MessageParseError): void {
    const tooLarge = err.code === 'HPE_HEADER_OVERFLOW';
    this.hooks.log.warn({ err: `${err.code}: ${err.message}` }, 'malformed gateway request from the hub');
    if (this.exchange?.started) return this.destroy();
    this.answerAndClose(
      tooLarge ? 431 : 400,
      tooLarge
        ? `the request head is larger than the ${this.hooks.maxHeadBytes} bytes the agent takes`
        : 'the agent could not parse the request',
    );
  }

  private onRequestHead(h: MessageHead): boolean {
    if (this.stateNow !== 'idle') {
      this.hooks.log.warn('gateway request from the hub before the answer to the one before it: closing the connection');
      this.destroy();
      return true;
    }
    const head: RequestHead = { method: h.method, url: h.url, headersDistinct: distinctHeaders(h.rawHeaders), socket: this.down };
    if (h.method === 'CONNECT') {
      this.answerAndClose(405, 'the gateway does not take CONNECT');
      return true;
    }
    if (h.upgrade) {
      this.upgradeHead = head;
      return true;
    }
    const chunked = head.headersDistinct['transfer-encoding'] !== undefined;
    const hasBody = chunked || (head.headersDistinct['content-length']?.[0] ?? '0') !== '0';
    this.exchange = {
      request: head,
      kube: null,
      head: '',
      chunked,
      retryable: !hasBody && IDEMPOTENT.has(h.method),
      keepAlive: h.keepAlive,
      noResponseBody: h.method === 'HEAD',
      requestEnded: false,
      answered: false,
      started: false,
      upstreamCloses: false,
      informational: false,
      held: [],
    };
    this.setState('preparing');
    this.down.pause();
    this.hooks.prepare(head).then(
      (p) => this.prepared(p),
      (err: unknown) => {
        this.hooks.log.error({ err: err instanceof Error ? err.message : String(err) }, 'gateway request failed unexpectedly');
        this.answerAndClose(500, 'the agent failed to serve the request');
      },
    );
    return false;
  }

  private prepared(p: Prepared | { status: number; message: string }): void {
    const ex = this.exchange;
    if (this.stateNow !== 'preparing' || !ex) return; // closed meanwhile
    if ('status' in p) return this.answerAndClose(p.status, p.message);
    const head = requestHead(ex.request, p, ex.chunked);
    if (typeof head !== 'string') return this.answerAndClose(400, head.error);
    ex.head = head;
    ex.kube = p.kube;
    this.setState('relaying');
    const up = this.upstream(p.kube);
    up.write(head, 'latin1');
    for (const b of ex.held) this.writeBody(up, ex, b);
    ex.held = [];
    if (ex.requestEnded && ex.chunked) up.write(LAST_CHUNK);
    if (ex.requestEnded) this.maybeDone();
    this.down.resume();
  }

  private onRequestBody(b: Buffer): void {
    const ex = this.exchange;
    if (!ex) return;
    if (this.stateNow === 'preparing') {
      // The input is paused: at most what one read held.
      ex.held.push(b);
      return;
    }
    const up = this.up;
    if (!up || up.destroyed) return; // the apiserver answered and closed: the rest of the body is dropped
    if (!this.writeBody(up, ex, b) && !this.upFull) {
      this.upFull = true;
      this.down.pause();
      up.once('drain', this.resumeDown);
    }
  }

  private writeBody(up: tls.TLSSocket, ex: Exchange, b: Buffer): boolean {
    return ex.chunked ? writeChunk(up, b) : up.write(b);
  }

  private readonly resumeUp = (): void => {
    this.downFull = false;
    this.up?.resume();
  };

  private readonly resumeDown = (): void => {
    this.upFull = false;
    if (this.stateNow === 'relaying' || this.stateNow === 'idle') this.down.resume();
  };

  private onRequestEnd(): void {
    const ex = this.exchange;
    if (!ex) return; // an upgrade's or a refused request's
    ex.requestEnded = true;
    // While the checks run, prepared() writes the last chunk after the held ones.
    if (ex.chunked && this.stateNow !== 'preparing' && this.up && !this.up.destroyed) this.up.write(LAST_CHUNK);
    if (this.stateNow === 'relaying') this.maybeDone();
  }

  /** The connection to the apiserver: the open one, or a new one. */
  private upstream(kube: KubeRestConfig): tls.TLSSocket {
    if (this.up && !this.up.destroyed && this.up.writable) {
      this.upReused = true;
      return this.up;
    }
    const { host, port } = apiserverAddress(kube);
    const up = tls.connect({
      host,
      port,
      ...(net.isIP(host) === 0 ? { servername: host } : {}),
      ...kubeTls(kube),
      ALPNProtocols: ['http/1.1'],
      ...(this.sessions.last ? { session: this.sessions.last } : {}),
    });
    up.setNoDelay(true);
    up.on('session', (s: Buffer) => (this.sessions.last = s));
    const parser = new MessageParser(
      'response',
      { head: (h) => this.onResponseHead(h), body: () => {}, end: () => this.onResponseEnd() },
      this.hooks.maxHeadBytes,
    );
    up.on('data', (d: Buffer) => this.onUpData(up, parser, d));
    up.on('error', (err) => this.upstreamGone(up, parser, err));
    up.on('close', () => this.upstreamGone(up, parser, null));
    this.up = up;
    this.upReused = false;
    return up;
  }

  private onResponseHead(h: MessageHead): boolean {
    const ex = this.exchange;
    if (!ex || ex.answered) {
      this.hooks.log.warn('the apiserver sent an answer nobody asked for: closing its connection');
      this.dropUpstream();
      return true;
    }
    ex.informational = h.status < 200;
    if (!h.keepAlive) ex.upstreamCloses = true;
    return ex.noResponseBody;
  }

  private onResponseEnd(): void {
    const ex = this.exchange;
    if (!ex) return;
    if (ex.informational) {
      ex.informational = false;
      return;
    }
    ex.answered = true;
  }

  private onUpData(up: tls.TLSSocket, parser: MessageParser, d: Buffer): void {
    if (up !== this.up) return;
    const ex = this.exchange;
    const r = parser.execute(d);
    if (typeof r !== 'number') {
      this.hooks.log.warn({ err: `${r.code}: ${r.message}` }, 'gateway request: the apiserver sent something other than HTTP');
      if (ex && !ex.started) return this.answerAndClose(502, 'the agent could not read the apiserver’s answer');
      return this.destroy();
    }
    if (!ex || this.stateNow !== 'relaying') return;
    ex.started = true;
    if (!this.down.write(d) && !this.downFull) {
      this.downFull = true;
      up.pause();
      this.down.once('drain', this.resumeUp);
    }
    if (ex.answered) this.maybeDone();
  }

  private upstreamGone(up: tls.TLSSocket, parser: MessageParser, err: Error | null): void {
    if (up !== this.up) return;
    this.dropUpstream();
    const ex = this.exchange;
    if (!ex || this.stateNow !== 'relaying' || ex.answered) return;
    if (ex.started) {
      // An answer that runs until the connection ends (no length) ends here; one cut short fails the connection.
      if (parser.finish() === null && ex.answered) return this.maybeDone(true);
      return this.destroy();
    }
    if (ex.retryable && this.upReused && ex.requestEnded && ex.kube) {
      // A kept connection the apiserver closed as this request went out: once more, on a new one.
      this.hooks.log.debug('gateway request: the apiserver closed a kept connection unanswered; sending it again');
      ex.retryable = false; // once
      this.upstream(ex.kube).write(ex.head, 'latin1');
      return;
    }
    if (err) this.hooks.log.warn({ err: err.message }, 'gateway request: the apiserver could not be reached');
    this.answerAndClose(502, err ? apiserverUnreachable(err) : 'the apiserver closed the connection without an answer');
  }

  /** Both the request and its answer ended: the next request may come, or the connection closes. */
  private maybeDone(upstreamEnded = false): void {
    const ex = this.exchange;
    if (!ex || !ex.requestEnded || !ex.answered || this.stateNow !== 'relaying') return;
    this.exchange = null;
    if (ex.upstreamCloses || upstreamEnded) this.dropUpstream();
    if (!ex.keepAlive || ex.upstreamCloses || upstreamEnded || this.downEnded) {
      this.setState('closing');
      this.down.end();
      return;
    }
    this.setState('idle');
  }

  /**
   * Closes the apiserver's connection; the hub's input, if it waited for that connection's 'drain', no longer
   * does, and a wait for the hub's 'drain' on its behalf ends (the next connection starts unpaused).
   */
  private dropUpstream(): void {
    const up = this.up;
    this.up = null;
    if (!up) return;
    up.off('drain', this.resumeDown);
    this.down.off('drain', this.resumeUp);
    this.downFull = false;
    up.destroy();
    if (this.upFull) this.resumeDown();
  }

  /** A one-line answer (nothing of an answer was sent yet); the connection closes after it. */
  private answerAndClose(status: number, message: string): void {
    if (this.stateNow === 'closed') return;
    this.setState('closing');
    this.exchange = null;
    this.dropUpstream();
    if (!this.down.writable) return void this.down.destroy();
    this.down.end(textAnswer(status, message));
  }

  private readonly onDownEnd = (): void => {
    // The hub ends its side only after its last request; an answer still coming is passed back first.
    this.downEnded = true;
    if (this.stateNow === 'idle') {
      this.setState('closing');
      this.dropUpstream();
      this.down.end();
    } else if (this.stateNow === 'preparing' && this.exchange && !this.exchange.requestEnded) this.destroy();
  };

  private readonly onDownClose = (): void => {
    if (this.stateNow === 'upgraded') return;
    this.setState('closed');
    this.exchange = null;
    this.dropUpstream();
  };
}

/** The head sent to the apiserver, or why it cannot be written (a name or value HTTP cannot carry). */
function requestHead(req: RequestHead, p: Prepared, chunked: boolean): string | { error: string } {
  let head = `${req.method} ${apiserverPath(p.kube, req.url)} HTTP/1.1\r\n`;
  for (const [name, value] of Object.entries(p.headers)) {
    if (!TOKEN.test(name)) return { error: 'a header name the agent cannot send on' };
    for (const v of typeof value === 'string' ? [value] : value) {
      if (BAD_VALUE.test(v)) return { error: `a value of header ${name} the agent cannot send on` };
      head += `${name}: ${v}\r\n`;
    }
  }
  if (chunked) head += 'transfer-encoding: chunked\r\n';
  return `${head}\r\n`;
}
