// How a client reaches a target on each path, as a JSON-serialisable spec, so that the bench
// process and its client child processes (scale-client.ts) dial the same way:
//   tcp      a plain TCP connect to a per-target port (the target, an sshd -R port, a relay)
//   tunnel   SDK Tunnel.dial() to the hub's frontend (transport 'mux' or 'grpc')
//   connect  TLS (client certificate) to the hub's HTTP CONNECT port, CONNECT 127.0.0.1:PORT, then raw bytes
//   anp      ANP's own konnectivity-client, as kube-apiserver dials: a TLS connection, an HTTP/2 session and
//            one Proxy stream per connection (a Go program: stuck-clients.ts starts it, not openClient)
import { readFileSync } from 'node:fs';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { Tunnel } from '@cluster-proxy/client';
import type { TargetName } from './helpers.js';
import { connectTcp } from './io.js';

export interface TlsFiles {
  caPath: string;
  certPath: string;
  keyPath: string;
}

export type ClientSpec =
  | { kind: 'tcp'; ports: Partial<Record<TargetName, number>> }
  | { kind: 'tunnel'; address: string; transport: 'mux' | 'grpc'; tls: TlsFiles; targets: Partial<Record<TargetName, number>> }
  | { kind: 'anp'; address: string; tls: TlsFiles; targets: Partial<Record<TargetName, number>> }
  /** `resume`: reuse a TLS session (ticket) across connections; the scale scenario's dials only. */
  | { kind: 'connect'; port: number; tls: TlsFiles; targets: Partial<Record<TargetName, number>>; resume?: boolean };

export interface Client {
  /** Opens a connection to a target; resolves once the client can send to it. */
  dial(target: TargetName, timeoutMs: number): Promise<Duplex>;
  /** What the client ended up using (e.g. the SDK's active transport), for the progress log. */
  describe(): string;
  close(): void;
}

function portOf(map: Partial<Record<TargetName, number>>, target: TargetName, what: string): number {
  const port = map[target];
  if (port === undefined) throw new Error(`${what}: no port for target ${target}`);
  return port;
}

export function openClient(spec: ClientSpec): Client {
  switch (spec.kind) {
    case 'tcp':
      return {
        dial: async (target, timeoutMs) => connectTcp(portOf(spec.ports, target, 'tcp'), timeoutMs),
        describe: () => 'tcp',
        close: () => {},
      };
    case 'tunnel': {
      const tunnel = new Tunnel({
        address: spec.address,
        serverName: 'localhost',
        caCert: readFileSync(spec.tls.caPath),
        cert: readFileSync(spec.tls.certPath),
        key: readFileSync(spec.tls.keyPath),
        transport: spec.transport,
      });
      return {
        dial: async (target, timeoutMs) => tunnel.dial(`127.0.0.1:${portOf(spec.targets, target, 'tunnel')}`, { timeoutMs }),
        describe: () => `SDK transport ${tunnel.activeTransport}`,
        close: () => tunnel.close(),
      };
    }
    case 'anp':
      // ANP's own konnectivity-client dials these, from Go (stuck-clients.ts).
      throw new Error('konnectivity-style clients are konnectivity-probe, not dialed from Node');
    case 'connect': {
      // One TLS context for every connection, as any client that loads its certificate once does.
      const secureContext = tls.createSecureContext({
        ca: readFileSync(spec.tls.caPath),
        cert: readFileSync(spec.tls.certPath),
        key: readFileSync(spec.tls.keyPath),
      });
      let session: Buffer | undefined;
      let resumed = 0;
      const onSession = spec.resume ? (s: Buffer): void => void (session = s) : undefined;
      return {
        dial: async (target, timeoutMs) => {
          const socket = await dialConnect(
            spec.port,
            { secureContext, session: spec.resume ? session : undefined, onSession },
            `127.0.0.1:${portOf(spec.targets, target, 'connect')}`,
            timeoutMs,
          );
          if (socket.isSessionReused()) resumed++;
          return socket;
        },
        describe: () => `HTTP CONNECT over TLS, client certificate${spec.resume ? `, TLS sessions resumed (${resumed} so far)` : ''}`,
        close: () => {},
      };
    }
  }
}

const MAX_RESPONSE_HEAD = 16 * 1024;

/**
 * TLS to 127.0.0.1:`port` with a client certificate, `CONNECT destination`, and the socket back
 * once the proxy answered 200 (bytes after the response head are put back; the socket is left in
 * the default, not yet flowing, read mode so callers can attach 'data' listeners as on net.connect).
 */
export function dialConnect(
  port: number,
  creds: { secureContext: tls.SecureContext; session?: Buffer; onSession?: (session: Buffer) => void },
  destination: string,
  timeoutMs: number,
): Promise<tls.TLSSocket> {
  return new Promise<tls.TLSSocket>((resolve, reject) => {
    const { onSession, ...options } = creds;
    const socket = tls.connect({ host: '127.0.0.1', port, servername: 'localhost', ...options });
    if (onSession) socket.on('session', onSession);
    socket.setNoDelay(true);
    let head: Buffer = Buffer.alloc(0);
    let settled = false;
    const timer = setTimeout(
      () => fail(new Error(`CONNECT ${destination} via 127.0.0.1:${port}: no answer within ${timeoutMs} ms`)),
      timeoutMs,
    );
    const cleanup = (): void => {
      clearTimeout(timer);
      socket.off('readable', onReadable);
      socket.off('error', fail);
      socket.off('end', onEnd);
    };
    function fail(err: Error): void {
      if (settled) return;
      settled = true;
      cleanup();
      socket.destroy();
      reject(err);
    }
    const onEnd = (): void =>
      fail(
        new Error(`CONNECT ${destination}: the proxy closed the connection (got ${JSON.stringify(head.toString('latin1').slice(0, 200))})`),
      );
    function onReadable(): void {
      for (let chunk: Buffer | null = socket.read() as Buffer | null; chunk !== null; chunk = socket.read() as Buffer | null) {
        head = head.length === 0 ? chunk : Buffer.concat([head, chunk]);
        const end = head.indexOf('\r\n\r\n');
        if (end < 0) {
          if (head.length > MAX_RESPONSE_HEAD)
            fail(new Error(`CONNECT ${destination}: response head larger than ${MAX_RESPONSE_HEAD} bytes`));
          continue;
        }
        const text = head.subarray(0, end).toString('latin1');
        const status = /^HTTP\/1\.[01] (\d{3})/.exec(text)?.[1];
        if (status !== '200') {
          fail(
            new Error(
              `CONNECT ${destination}: ${text.split('\r\n')[0] ?? text} ${head
                .subarray(end + 4, end + 204)
                .toString('utf8')
                .trim()}`,
            ),
          );
          return;
        }
        settled = true;
        cleanup();
        const rest = head.subarray(end + 4);
        if (rest.length > 0) socket.unshift(rest);
        socket.on('error', () => {}); // later errors surface through whoever reads or writes
        // Without a 'readable' listener the stream goes back to its initial mode on the next tick;
        // only then does attaching a 'data' listener start the flow, as it does on a fresh socket.
        setImmediate(() => resolve(socket));
        return;
      }
    }
    socket.once('secureConnect', () => socket.write(`CONNECT ${destination} HTTP/1.1\r\nHost: ${destination}\r\n\r\n`));
    socket.on('readable', onReadable);
    socket.once('error', fail);
    socket.once('end', onEnd);
  });
}
