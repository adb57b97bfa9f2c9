// Opening our framed transport from the connecting side (agent → agent port, SDK → frontend port):
// TLS with ALPN, then the hello exchange. Shared by the agent and the SDK.
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { FramedPacketStream, MUX_ALPN, type Hello } from './framing.js';
import { splitHostPort } from '../wire/identifiers.js';
import { MAX_MESSAGE_BYTES } from '../wire/limits.js';

export interface MuxConnectOptions {
  /** HOST:PORT */
  address: string;
  caCert: Buffer;
  cert: Buffer;
  key: Buffer;
  /** TLS name to verify instead of the address host. */
  serverName?: string;
  hello: Hello;
  timeoutMs: number;
  signal?: AbortSignal;
  /** Run TLS over this already-connected socket (e.g. a CONNECT tunnel through an egress proxy). */
  socket?: Duplex;
}

/** The server completed TLS but picked another protocol (an ANP server picks h2): use gRPC. */
export class MuxUnsupportedError extends Error {
  override name = 'MuxUnsupportedError';
}

/** Why a server refused a mux hello: a gRPC status name, as the gRPC transport would report it. */
export type MuxRefusalCode = 'UNAVAILABLE' | 'UNAUTHENTICATED' | 'INVALID_ARGUMENT' | 'PERMISSION_DENIED' | 'ALREADY_EXISTS' | 'UNKNOWN';

const REFUSAL_CODES: ReadonlySet<string> = new Set<MuxRefusalCode>([
  'UNAVAILABLE',
  'UNAUTHENTICATED',
  'INVALID_ARGUMENT',
  'PERMISSION_DENIED',
  'ALREADY_EXISTS',
  'UNKNOWN',
]);

/** Hello keys of a refusal: `error` holds the text, `code` the MuxRefusalCode. */
export const HELLO_ERROR = 'error';
export const HELLO_ERROR_CODE = 'code';

/** The hello a server sends instead of its metadata when it refuses the peer. */
export function refusalHello(code: MuxRefusalCode, message: string): Hello {
  return { [HELLO_ERROR]: [message], [HELLO_ERROR_CODE]: [code] };
}

/** The server answered the hello with a refusal. The message reads `CODE: text`. */
export class MuxRefusedError extends Error {
  override name = 'MuxRefusedError';
  constructor(
    readonly code: MuxRefusalCode,
    readonly details: string,
  ) {
    super(`${code}: ${details}`);
  }
}

/** The refusal a hello carries, or null when it is the server's metadata. */
export function refusalOf(hello: Hello): MuxRefusedError | null {
  const details = hello[HELLO_ERROR]?.[0];
  if (details === undefined) return null;
  const code = hello[HELLO_ERROR_CODE]?.[0];
  return new MuxRefusedError(code !== undefined && REFUSAL_CODES.has(code) ? (code as MuxRefusalCode) : 'UNKNOWN', details);
}

/** Resolves with the open stream and the server's hello; a hello carrying a refusal rejects with MuxRefusedError. */
export function connectMux(opts: MuxConnectOptions): Promise<{ stream: FramedPacketStream; hello: Hello }> {
  const hp = splitHostPort(opts.address);
  if (!hp) return Promise.reject(new Error(`address "${opts.address}" is not HOST:PORT`));
  return new Promise((resolve, reject) => {
    const socket = tls.connect({
      ...(opts.socket ? { socket: opts.socket } : { host: hp.host, port: hp.port }),
      ca: opts.caCert,
      cert: opts.cert,
      key: opts.key,
      servername: opts.serverName ?? (/^[\d.]+$|:/.test(hp.host) ? undefined : hp.host),
      // Offer h2 too: a Go server refuses a handshake whose ALPN list it cannot match.
      ALPNProtocols: [MUX_ALPN, 'h2'],
    });
    if (!opts.socket) socket.setNoDelay(true);
    let settled = false;
    const fail = (err: Error): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', onAbort);
      socket.destroy();
      reject(err);
    };
    const onAbort = (): void => fail(new Error('cancelled'));
    const onError = (err: NodeJS.ErrnoException): void =>
      fail(new Error(err.code && !err.message.includes(err.code) ? `${err.message} (${err.code})` : err.message));
    const onClose = (): void =>
      fail(new Error(`${opts.address} closed the connection during the handshake (is our client certificate accepted?)`));
    const timer = setTimeout(() => fail(new Error(`no hello from ${opts.address} within ${opts.timeoutMs} ms`)), opts.timeoutMs);
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    socket.once('error', onError);
    socket.once('close', onClose);
    socket.once('secureConnect', () => {
      if (socket.alpnProtocol !== MUX_ALPN) {
        fail(new MuxUnsupportedError(`${opts.address} does not speak ${MUX_ALPN}`));
        return;
      }
      const stream = new FramedPacketStream(socket, MAX_MESSAGE_BYTES);
      stream.once('error', (err: Error) => fail(err));
      stream.once('hello', (hello: Hello) => {
        const refused = refusalOf(hello);
        if (refused) {
          fail(refused);
          return;
        }
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        opts.signal?.removeEventListener('abort', onAbort);
        socket.removeListener('close', onClose);
        socket.removeListener('error', onError);
        socket.on('error', () => {}); // reported through the stream from now on
        resolve({ stream, hello });
      });
      stream.sendHello(opts.hello);
    });
  });
}
