// One caller's TLS connection to the gateway: its requests read by node's own HTTP parser (proto
// message-parser.ts: the strictness of node:http's server), one at a time, each an exchange (CallerExchange)
// the gateway answers: a refusal, or the agent's answer passed on as it arrives. node:http's request and
// response objects are not made: at this hop they cost more CPU than the rest of a request together.
//
//   idle ──head──▶ busy (one exchange: checks, then forwarded) ──request and answer ended──▶ idle
//   busy ──a refusal, Connection: close, an answer that ends with the connection──▶ closing ──▶ closed
//   idle ──upgrade head──▶ upgraded (the socket is the upgrade's: server.ts, upgrade.ts)
//   any ──malformed bytes (400 / 431), a head not complete in time (408), the caller left──▶ closed
//
// A request pipelined behind another waits, parsed, with the socket paused until the one before it is
// answered; one behind a refusal or a `Connection: close` is never handled. An idle connection closes
// after the keep-alive timeout; a head must be complete within the header timeout of its first byte.
import type tls from 'node:tls';
import {
  LAST_CHUNK,
  MessageParser,
  distinctHeaders,
  headerLines,
  textAnswer,
  writeChunk,
  type MessageHead,
  type MessageParseError,
} from '@cluster-proxy/proto';

/** A request head as the gateway's checks read it. */
export interface GatewayRequest {
  method: string;
  url: string;
  /** Lower-case names, every value in order (node's headersDistinct); no prototype. */
  headersDistinct: Record<string, string[]>;
  socket: tls.TLSSocket;
  /** HTTP/1.0 (no chunked answers) or 1.1. */
  http10: boolean;
  /** The body is chunked (re-chunked on its way); else it has a length, or there is none. */
  chunked: boolean;
}

export interface CallerHost {
  maxHeaderBytes: number;
  headerTimeoutMs: number;
  keepAliveTimeoutMs: number;
  /** A request to answer (ex.refuse(), or ex.bodyTo() and ex.head() … ex.end()). */
  request(req: GatewayRequest, ex: CallerExchange): void;
  /** An upgrade request: the socket is the upgrade's from here, with the bytes after the head. */
  upgrade(req: GatewayRequest, rest: Buffer): void;
  /** Bytes that are not an HTTP request, or a head too large or too slow: answered here, reported there. */
  malformed(socket: tls.TLSSocket, status: 400 | 408 | 431, detail: string): void;
}

export type CallerConnectionState = 'idle' | 'busy' | 'closing' | 'upgraded' | 'closed';

type Deferred = { kind: 'head'; head: MessageHead } | { kind: 'body'; chunk: Buffer } | { kind: 'end' };

export class CallerConnection {
  private stateNow: CallerConnectionState = 'idle';
  private readonly parser: MessageParser;
  private current: CallerExchange | null = null;
  /** Parser events of requests pipelined behind the current one (the socket is paused meanwhile). */
  private deferred: Deferred[] = [];
  /** The bytes after an upgrade head (the parser stops there). */
  private upgradeRest: Buffer | null = null;
  private timer: NodeJS.Timeout | null = null;
  private timerKind: 'head' | 'keepalive' = 'head';
  /** The request in flight is the last one (a refusal, Connection: close): a head after it is not handled. */
  private lastRequest = false;
  /** The parser takes nothing more (bytes after a request with Connection: close). */
  private parserDone = false;

  constructor(
    readonly socket: tls.TLSSocket,
    private readonly host: CallerHost,
  ) {
    this.parser = new MessageParser(
      'request',
      {
        begin: () => this.arm('head'),
        head: (h) => {
          // The head is complete in time, whenever it is handled (one pipelined behind a watch waits long).
          if (this.timerKind === 'head') this.disarm();
          return this.event({ kind: 'head', head: h });
        },
        body: (chunk) => void this.event({ kind: 'body', chunk }),
        end: () => void this.event({ kind: 'end' }),
      },
      host.maxHeaderBytes,
    );
    socket.on('data', this.onData);
    socket.on('close', this.onClose);
    socket.on('error', () => {}); // reported through 'close'
    this.arm('head');
  }

  get state(): CallerConnectionState {
    return this.stateNow;
  }

  /** The one place the state changes. */
  private setState(next: CallerConnectionState): void {
    this.stateNow = next;
    if (next === 'closed' || next === 'upgraded' || next === 'closing') this.disarm();
  }

  /** Closes it now (a stopping gateway); an exchange in flight hears that its caller left. */
  destroy(): void {
    if (this.stateNow === 'upgraded') return;
    this.socket.destroy();
  }

  private arm(kind: 'head' | 'keepalive'): void {
    if (kind === 'head' && this.timer && this.timerKind === 'head') return;
    this.disarm();
    this.timerKind = kind;
    this.timer = setTimeout(
      () => {
        this.timer = null;
        if (kind === 'keepalive') this.destroy();
        else this.failParse(408, 'the request head did not arrive in time');
      },
      kind === 'head' ? this.host.headerTimeoutMs : this.host.keepAliveTimeoutMs,
    );
  }

  private disarm(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private readonly onData = (d: Buffer): void => {
    if (this.stateNow === 'closing' || this.stateNow === 'closed' || this.stateNow === 'upgraded' || this.parserDone) return;
    const r = this.parser.execute(d);
    if (typeof r !== 'number') return this.malformed(r);
    if (r < d.length && this.upgradeRest === null) {
      // An upgrade head: the rest is the new protocol's. Nothing more is read as HTTP.
      this.upgradeRest = d.subarray(r);
      this.socket.pause();
      this.socket.off('data', this.onData);
    }
  };

  private malformed(err: MessageParseError): void {
    if (err.code === 'HPE_CLOSED_CONNECTION') {
      // Bytes after a request with `Connection: close` (in flight or held): not read; its answer ends the connection.
      this.parserDone = true;
      return;
    }
    if (err.code === 'HPE_HEADER_OVERFLOW') return this.failParse(431, `the request head is larger than ${this.host.maxHeaderBytes} bytes`);
    const ex = this.current;
    if (ex && this.deferred.length === 0 && !ex.requestEnded) {
      // The body of the request in flight: it fails (400 if nothing was answered yet), the connection closes.
      this.setState('closing');
      ex.bodyFailed(`the request body is malformed (${err.code})`);
      return;
    }
    this.failParse(400, `${err.code}: ${err.message}`);
  }

  /** A refusal of bytes that are no request (nothing in flight answers them). */
  private failParse(status: 400 | 408 | 431, detail: string): void {
    if (this.current || this.stateNow === 'closed') {
      this.destroy(); // an answer is being written: no second one
      return;
    }
    this.setState('closing');
    this.host.malformed(this.socket, status, detail);
  }

  /** A parser event: handled now, or after the exchange in flight (a pipelined request). */
  private event(e: Deferred): boolean {
    if (this.stateNow === 'closing' || this.stateNow === 'closed') return true;
    if (e.kind === 'head' && this.lastRequest) {
      // Behind the last request: never handled, nor anything after it.
      this.setState('closing');
      return true;
    }
    // Body and end belong to the request in flight, unless a head is waiting already (then to that one).
    if (this.deferred.length > 0 || (e.kind === 'head' && this.current)) {
      this.deferred.push(e);
      this.socket.pause();
      return e.kind === 'head' && e.head.upgrade;
    }
    return this.dispatch(e);
  }

  private dispatch(e: Deferred): boolean {
    if (e.kind === 'body') {
      this.current?.pushBody(e.chunk);
      return false;
    }
    if (e.kind === 'end') {
      this.current?.requestEnd();
      return false;
    }
    this.disarm();
    const h = e.head;
    const headersDistinct = distinctHeaders(h.rawHeaders);
    const chunked = headersDistinct['transfer-encoding'] !== undefined;
    const req: GatewayRequest = {
      method: h.method,
      url: h.url,
      headersDistinct,
      socket: this.socket,
      http10: h.versionMajor === 1 && h.versionMinor === 0,
      chunked,
    };
    if (h.upgrade && h.method !== 'CONNECT') {
      this.setState('upgraded');
      const socket = this.socket;
      socket.pause();
      socket.off('data', this.onData);
      socket.off('close', this.onClose);
      // The rest is known once execute() returns: handed over after it, the socket as node:http hands an
      // upgrade's over (neither flowing nor paused: the first reader starts it).
      queueMicrotask(() => {
        (socket as unknown as { readableFlowing: boolean | null }).readableFlowing = null;
        this.host.upgrade(req, this.upgradeRest ?? Buffer.alloc(0));
      });
      return true;
    }
    const ex = new CallerExchange(this, req, h.keepAlive);
    this.current = ex;
    this.setState('busy');
    if (h.method === 'CONNECT') ex.refuse(405, 'the gateway does not take CONNECT: use the CONNECT frontend');
    else if (!req.http10 && headersDistinct['host']?.length !== 1) ex.refuse(400, 'an HTTP/1.1 request needs exactly one Host header');
    else {
      const expect = headersDistinct['expect'];
      if (expect && (expect.length > 1 || expect[0]!.toLowerCase() !== '100-continue'))
        ex.refuse(417, 'the gateway takes no Expect but 100-continue');
      else this.host.request(req, ex);
    }
    return h.upgrade; // CONNECT: what follows is not HTTP
  }

  /** Called by the exchange once its request and its answer both ended. */
  exchangeDone(ex: CallerExchange): void {
    if (ex !== this.current) return;
    this.current = null;
    // As node:http does: what the caller still sends is read and dropped; closed once the answer is out.
    if (ex.closesConnection || this.stateNow !== 'busy' || this.lastRequest) return this.exchangeDoneWithout();
    this.setState('idle');
    this.arm('keepalive');
    // The held events in order: a head starts the next exchange, its body and end go to it; the head after that waits.
    while (this.deferred.length > 0) {
      const state = this.stateNow as CallerConnectionState;
      if (state === 'closing' || state === 'closed' || state === 'upgraded') break;
      if (this.deferred[0]!.kind === 'head' && this.current) break;
      this.dispatch(this.deferred.shift()!);
    }
    if (this.deferred.length === 0 && (this.stateNow as CallerConnectionState) === 'idle') this.socket.resume();
  }

  /** No exchange in flight and none to come: closed once what was written is out. */
  private exchangeDoneWithout(): void {
    this.setState('closing');
    this.deferred = [];
    const socket = this.socket;
    socket.resume();
    socket.end(() => socket.destroy());
  }

  /** The exchange in flight is the last: no request after it is handled; the connection closes once it ended. */
  closing(): void {
    this.lastRequest = true;
  }

  private readonly onClose = (): void => {
    const ex = this.current;
    this.current = null;
    this.deferred = [];
    this.setState('closed');
    ex?.callerGone();
  };
}

/** How an answer's body is framed for the caller. */
type Framing = 'none' | 'length' | 'chunked' | 'close';

export type ExchangeState = 'checking' | 'forwarding' | 'answered' | 'gone';

/**
 * One request and its answer on a caller connection. The request's body is held (the socket paused) until
 * bodyTo() takes it; the answer is written by refuse(), or head() / write() / end().
 */
export class CallerExchange {
  requestEnded = false;
  /** The answer's head was written. */
  headersSent = false;
  status = 0;
  closesConnection: boolean;
  private responseEnded = false;
  private framing: Framing = 'none';
  private held: Buffer[] = [];
  private sink: BodySink | null = null;
  private gone: (() => void) | null = null;
  private stateNow: ExchangeState = 'checking';

  constructor(
    private readonly conn: CallerConnection,
    readonly req: GatewayRequest,
    keepAlive: boolean,
  ) {
    this.closesConnection = !keepAlive;
    conn.socket.pause(); // until bodyTo(): the checks may take a while (a TokenReview)
  }

  get state(): ExchangeState {
    return this.stateNow;
  }

  /** Whether it still waits for its answer, with the caller there to hear it. */
  get open(): boolean {
    return (this.stateNow === 'checking' || this.stateNow === 'forwarding') && !this.conn.socket.destroyed;
  }

  /** `f` is called once if the caller leaves before the answer ended (the forwarder's; one at a time). */
  onGone(f: () => void): void {
    this.gone = f;
  }

  /** The request's body from here on goes to `sink` (held chunks first); `sink.chunk` false: the caller is paused until 'drain' there. */
  bodyTo(sink: BodySink): void {
    this.stateNow = 'forwarding';
    this.sink = sink;
    if (this.req.headersDistinct['expect'] && !this.headersSent && !this.req.http10)
      this.conn.socket.write('HTTP/1.1 100 Continue\r\n\r\n');
    for (const c of this.held) this.pushBody(c);
    this.held = [];
    if (this.requestEnded) sink.end();
    else this.conn.socket.resume();
  }

  /** The request's body bytes are dropped (a refusal, or no body expected by the next hop). */
  dropBody(): void {
    this.bodyTo({ chunk: () => true, end: () => {}, failed: () => {}, drained: () => {} });
  }

  pushBody(chunk: Buffer): void {
    const sink = this.sink;
    if (!sink) {
      this.held.push(chunk);
      return;
    }
    if (!sink.chunk(chunk)) {
      const socket = this.conn.socket;
      socket.pause();
      sink.drained(() => {
        if (this.stateNow !== 'gone') socket.resume();
      });
    }
  }

  requestEnd(): void {
    this.requestEnded = true;
    if (this.sink) this.sink.end();
    this.maybeDone();
  }

  /** The body did not parse: the answer fails (400 while nothing was sent). */
  bodyFailed(why: string): void {
    this.closesConnection = true;
    const sink = this.sink;
    if (sink) sink.failed(why);
    else this.refuse(400, why);
  }

  /** A one-line answer (nothing was sent yet); the connection closes after it. */
  refuse(status: number, message: string, extra: Record<string, string> = {}): void {
    if (this.stateNow === 'answered') return; // refused already (a body that did not parse): that answer stands
    this.closesConnection = true;
    this.conn.closing();
    if (this.headersSent || !this.open) {
      this.destroy();
      return;
    }
    this.status = status;
    this.headersSent = true;
    this.conn.socket.write(textAnswer(status, message, extra));
    this.requestEnded = true; // what is left of its body is not read
    this.responseEnded = true;
    this.stateNow = 'answered';
    this.conn.exchangeDone(this);
  }

  /**
   * The answer's head: `headers` end-to-end (no Connection, Transfer-Encoding, Keep-Alive); framing is
   * ours: its length if given, else chunked (HTTP/1.1) or to the end of the connection (HTTP/1.0).
   */
  head(status: number, statusMessage: string, headers: Readonly<Record<string, readonly string[]>>): void {
    const noBody = this.req.method === 'HEAD' || status === 204 || status === 304;
    this.framing = noBody ? 'none' : headers['content-length'] ? 'length' : this.req.http10 ? 'close' : 'chunked';
    if (this.framing === 'close') this.closesConnection = true;
    let head = `HTTP/1.1 ${status} ${statusMessage.replace(/[\r\n]/g, ' ')}\r\n${headerLines(headers)}`;
    if (this.framing === 'chunked') head += 'Transfer-Encoding: chunked\r\n';
    if (this.closesConnection) head += 'Connection: close\r\n';
    else if (this.req.http10) head += 'Connection: keep-alive\r\n';
    this.status = status;
    this.headersSent = true;
    if (this.closesConnection) this.conn.closing();
    // The head, and what of the body and its end comes in this tick (most answers: all of it), in one
    // TLS record and one system call, as node:http does.
    const socket = this.conn.socket;
    socket.cork();
    process.nextTick(uncork, socket);
    socket.write(`${head}\r\n`, 'latin1');
  }

  /** Answer body bytes; false: wait for drained(). */
  write(chunk: Buffer): boolean {
    const s = this.conn.socket;
    return this.framing === 'chunked' ? writeChunk(s, chunk) : s.write(chunk);
  }

  /** `f` once the caller took what was written. */
  drained(f: () => void): void {
    this.conn.socket.once('drain', f);
  }

  end(): void {
    if (this.responseEnded) return;
    this.responseEnded = true;
    this.stateNow = 'answered';
    if (this.framing === 'chunked') this.conn.socket.write(LAST_CHUNK);
    this.maybeDone();
  }

  /** The answer cannot be completed: the caller must see a broken one, not a clean end. */
  destroy(): void {
    this.stateNow = 'gone';
    this.conn.socket.destroy();
  }

  callerGone(): void {
    if (this.responseEnded && this.requestEnded) return;
    this.stateNow = 'gone';
    const f = this.gone;
    this.gone = null;
    f?.();
  }

  private maybeDone(): void {
    if (this.requestEnded && this.responseEnded) this.conn.exchangeDone(this);
  }
}

function uncork(socket: tls.TLSSocket): void {
  socket.uncork();
}

/** Where a request's body goes. */
export interface BodySink {
  /** false: stop until drained() calls back. */
  chunk(b: Buffer): boolean;
  end(): void;
  /** The caller's body did not parse. */
  failed(why: string): void;
  /** `f` once chunk() may be called again after it said false. */
  drained(f: () => void): void;
}
