// `cluster-proxy forward CLUSTER HOST:PORT --listen ADDR`: a local port whose connections are
// tunneled to HOST:PORT in the cluster.
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { readFile } from 'node:fs/promises';
import { joinHostPort, splitHostPort } from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { Tunnel } from '@cluster-proxy/client';
import { createLogger } from './logging.js';
import { UsageError, helpText, parseFlags, required, str, type FlagSpecs } from './flags.js';

export const clientConnectionFlags: FlagSpecs = {
  frontend: { type: 'string', default: '127.0.0.1:8090', help: 'hub gRPC frontend HOST:PORT, or unix:///path.sock' },
  'ca-cert': { type: 'string', help: 'CA bundle to verify the hub (PEM)' },
  cert: { type: 'string', help: 'client certificate (PEM)' },
  key: { type: 'string', help: 'client key (PEM)' },
  'server-name': { type: 'string', help: 'TLS name to verify on the hub certificate' },
};

const forwardFlags: FlagSpecs = {
  listen: { type: 'string', default: '127.0.0.1:0', help: 'local HOST:PORT to listen on (port 0 picks one)' },
  ...clientConnectionFlags,
  'log-level': { type: 'string', default: 'info', help: 'fatal, error, warn, info, debug' },
};

export const forwardUsage = helpText(
  'cluster-proxy forward CLUSTER HOST:PORT [--listen ADDR] [flags]',
  "Serves a local port; each connection is tunneled to HOST:PORT (CLUSTER:443 is the cluster's apiserver).",
  forwardFlags,
);

export async function tunnelFromFlags(flags: Record<string, string | boolean | string[] | undefined>): Promise<Tunnel> {
  const address = str(flags, 'frontend')!;
  if (address.startsWith('unix:')) return new Tunnel({ address });
  const read = async (name: string): Promise<Buffer> => {
    const f = required(flags, name);
    try {
      return await readFile(f);
    } catch (err) {
      throw new UsageError(`cannot read --${name} ${f}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
  };
  return new Tunnel({
    address,
    caCert: await read('ca-cert'),
    cert: await read('cert'),
    key: await read('key'),
    serverName: str(flags, 'server-name'),
  });
}

/**
 * Accepts local connections and pipes each through its own tunneled connection. Both legs are
 * half-open, so a client that sends FIN (`nc -N`, HTTP/1.0, git) still reads the reply; an error on
 * the tunnel leg (a reset destination, a dead agent or hub) resets the local connection, so a client
 * never mistakes a cut transfer for a complete one.
 */
export function serveForward(
  tunnel: Tunnel,
  destination: string,
  listen: { host: string; port: number },
  log: Logger,
): Promise<net.Server> {
  const server = net.createServer({ allowHalfOpen: true, noDelay: true }, (local) =>
    pipeForward(local, tunnel.connect(destination, { allowHalfOpen: true }), destination, log),
  );
  return new Promise((resolve, reject) => {
    server.once('error', (err) =>
      reject(new UsageError(`cannot listen on ${listen.host}:${listen.port}: ${(err as NodeJS.ErrnoException).code}`)),
    );
    server.listen(listen.port, listen.host, () => resolve(server));
  });
}

/**
 * One forwarded connection: bytes and FINs both ways; a reset or failure on either leg becomes a
 * reset of the other; it is over when both legs are closed.
 */
export function pipeForward(local: net.Socket, remote: Duplex, destination: string, log: Logger): void {
  local.pipe(remote);
  relayToLocal(remote, local);
  remote.once('error', (err: Error) => {
    log.warn({ destination }, err.message);
    local.unpipe(remote);
    resetLocal(local);
  });
  // The local client reset, or went away before sending its FIN: abort the tunneled connection
  // (the destination sees it). After its FIN, the remote leg finishes sending and closes by itself.
  local.once('error', () => remote.destroy());
  local.once('close', () => {
    if (!local.readableEnded && !remote.destroyed) remote.destroy();
  });
  remote.once('close', () => {
    if (local.destroyed || remote.errored) return;
    if (!remote.readableEnded) {
      // Closed without an orderly end of its bytes: never let the client read that as complete.
      resetLocal(local);
      return;
    }
    // The destination closed: the client still gets what is queued and our FIN (through the pipe);
    // what it sends from now on has nowhere to go, so it gets a reset, as TCP answers a closed socket.
    local.unpipe(remote);
    local.once('data', () => resetLocal(local));
    local.resume(); // unpipe() paused it
  });
}

/**
 * The tunnel's bytes to the local client. A DATA frame comes as the TLS records it arrived in, a 'data' event
 * each: what arrives within one turn of the event loop goes to the client in one writev (pipe() would write
 * a record at a time, pausing at the socket's 16 KiB mark after each: a syscall per 16 KiB). The tunnel
 * pauses when the client's socket is still above its mark after that turn, and resumes on 'drain'; the
 * tunnel's FIN becomes ours.
 */
function relayToLocal(remote: Duplex, local: net.Socket): void {
  let corked = false;
  let full = false;
  const flush = (): void => {
    corked = false;
    local.uncork();
    if (full && local.writableNeedDrain) remote.pause();
    full = false;
  };
  remote.on('data', (chunk: Buffer) => {
    if (local.destroyed) return;
    if (!corked) {
      corked = true;
      local.cork();
      process.nextTick(flush);
    }
    if (!local.write(chunk)) full = true;
  });
  local.on('drain', () => remote.resume());
  remote.once('end', () => {
    if (!local.destroyed) local.end();
  });
}

/**
 * A TCP reset, whatever is still queued for the client; a close if our FIN is already under way
 * (end() called, every byte written, no 'finish' yet): libuv refuses a reset then, and Node would
 * drop the handle without closing it (no 'close', a leaked descriptor). The client's stream is
 * complete by then, and bytes it still sends get a reset from the kernel.
 */
function resetLocal(local: net.Socket): void {
  if (local.destroyed) return;
  if (local.writableEnded && local.writableLength === 0 && !local.writableFinished) local.destroy();
  else local.resetAndDestroy();
}

export async function runForward(args: string[]): Promise<void> {
  const { flags, positionals } = parseFlags(args, forwardFlags);
  if (flags['help']) {
    process.stdout.write(forwardUsage);
    return;
  }
  if (positionals.length !== 2)
    throw new UsageError('forward needs CLUSTER and HOST:PORT, e.g. "cluster-proxy forward cluster1 cluster1:443 --listen 127.0.0.1:6443"');
  const [cluster, destination] = positionals as [string, string];
  if (!splitHostPort(destination)) throw new UsageError(`"${destination}" is not HOST:PORT`);
  const listenText = str(flags, 'listen')!;
  const m = /^(.+):(\d{1,5})$/.exec(listenText);
  if (!m || Number(m[2]) > 65535) throw new UsageError(`--listen "${listenText}" is not HOST:PORT`);
  const listen = { host: m[1]!.replace(/^\[(.*)\]$/, '$1'), port: Number(m[2]) };
  const log = createLogger(str(flags, 'log-level')!, 'forward');
  const tunnel = await tunnelFromFlags(flags);
  const server = await serveForward(tunnel, destination, listen, log);
  const addr = server.address() as net.AddressInfo;
  log.info({ cluster, destination, listen: joinHostPort(addr.address, addr.port) }, 'forwarding');
  process.stderr.write(`Forwarding ${joinHostPort(addr.address, addr.port)} -> ${destination} (cluster ${cluster}). Ctrl+C to stop.\n`);
  await new Promise<void>((resolve) => {
    const stop = (): void => {
      server.close(() => resolve());
      tunnel.close();
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });
}
