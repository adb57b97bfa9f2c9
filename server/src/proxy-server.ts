// The proxy server process: agent listener (mTLS gRPC, :8091), gRPC frontend (mTLS :8090 and/or a
// plain Unix socket), health (:8092) and loopback admin (:8095) listeners, all wired to one core.
import { randomUUID } from 'node:crypto';
import { mkdir, rm, writeFile, rename } from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import {
  DEFAULT_CONNECTION_WINDOW, FRONTEND_STREAM_WINDOW, HTTP2_CONNECTION_WINDOW, HTTP2_STREAM_WINDOW, MAX_MESSAGE_BYTES, agentServiceDefinition, proxyServiceDefinition,
  type FramedPacketStream, type Hello, type Packet,
} from '@cluster-proxy/proto';
import type { Logger } from 'pino';
import { makeAgentConnectHandler, onMuxAgentHello, type AgentListenerOptions, type Grant } from './agent-listener.js';
import { TlsPort } from './tls-port.js';
import { MuxFrontendSession } from './frontend-mux.js';
import { startConnectFrontend, type ConnectFrontend } from './frontend-connect.js';
import { TokenStore } from './tokens.js';
import type { TLSSocket } from 'node:tls';
import { GrpcFrontend } from './frontend-grpc.js';
import { raiseServerReceiveWindows } from './grpc-windows.js';
import { clusterFromSubject } from './pki/agent-identity.js';
import { ProxyCore } from './proxy-core.js';

export interface TlsFiles {
  /** PEM contents. */
  caCert: Buffer;
  cert: Buffer;
  key: Buffer;
}

export interface ProxyServerOptions {
  serverID?: string;
  serverCount?: number;
  bindAddress: string;
  /** Agent listener port (8091); 0 = pick a free one. */
  agentPort: number;
  /** gRPC frontend port (8090); null = no TCP frontend. */
  frontendPort: number | null;
  /** Plain gRPC frontend on a Unix socket. */
  frontendUds?: string;
  healthPort: number | null;
  adminPort: number | null;
  tls: TlsFiles;
  dialTimeoutMs?: number;
  window?: number;
  grants?: ReadonlyMap<string, Grant>;
  /** Where ports.json goes (chosen ports, for scripts and tests). */
  dataDir?: string;
  /** HTTP CONNECT frontend over TLS (8089); null = off. */
  connectPort?: number | null;
  connectUds?: string;
  /** Plain-TCP CONNECT frontend, loopback only. */
  connectPlain?: { host: string; port: number; allowTokens?: boolean };
  /** CONNECT bearer tokens (default <dataDir>/tokens.json). */
  tokensFile?: string;
  log: Logger;
}

export interface BoundPorts {
  serverID: string;
  agent: number;
  frontend: number | null;
  frontendUds: string | null;
  health: number | null;
  admin: number | null;
  connect: number | null;
  connectUds: string | null;
  connectPlain: number | null;
}

export class ProxyServer {
  readonly serverID: string;
  readonly core: ProxyCore;
  private readonly agentServer: grpc.Server;
  private readonly frontendServer: grpc.Server;
  private readonly frontends = new Set<GrpcFrontend>();
  private httpServers: http.Server[] = [];
  private readonly listenerOptions: AgentListenerOptions;
  private agentPort: TlsPort | null = null;
  private frontendPort: TlsPort | null = null;
  private readonly muxClients = new Set<MuxFrontendSession>();
  private connect: ConnectFrontend | null = null;
  tokens: TokenStore | null = null;
  private accepting = true;
  private ready = false;
  ports: BoundPorts | null = null;

  constructor(private readonly opts: ProxyServerOptions) {
    this.serverID = opts.serverID ?? randomUUID();
    this.core = new ProxyCore({ dialTimeoutMs: opts.dialTimeoutMs ?? 10_000, log: opts.log });
    const grpcOptions: grpc.ServerOptions = {
      'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
      'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
      // Ping idle agents so a vanished one (no FIN) is noticed and its routes dropped.
      'grpc.keepalive_time_ms': 30_000,
      'grpc.keepalive_timeout_ms': 10_000,
    };
    this.agentServer = new grpc.Server(grpcOptions);
    this.frontendServer = new grpc.Server(grpcOptions);
    raiseServerReceiveWindows(this.agentServer, HTTP2_STREAM_WINDOW, HTTP2_CONNECTION_WINDOW);
    raiseServerReceiveWindows(this.frontendServer, FRONTEND_STREAM_WINDOW, HTTP2_CONNECTION_WINDOW);
    this.listenerOptions = {
      serverID: this.serverID,
      serverCount: () => opts.serverCount ?? 1,
      window: opts.window ?? DEFAULT_CONNECTION_WINDOW,
      grants: opts.grants ?? new Map(),
      core: this.core,
      log: opts.log,
      accepting: () => this.accepting,
    };
    this.agentServer.addService(agentServiceDefinition, { Connect: makeAgentConnectHandler(this.listenerOptions) });
    this.frontendServer.addService(proxyServiceDefinition, { Proxy: this.handleProxy });
  }

  private readonly handleProxy = (call: grpc.ServerDuplexStream<Packet, Packet>): void => {
    const refuse = (code: grpc.status, details: string): void => {
      this.opts.log.warn({ peer: call.getPeer() }, `client refused: ${details}`);
      call.on('error', () => {});
      call.emit('error', { code, details });
    };
    if (!this.accepting) return refuse(grpc.status.UNAVAILABLE, 'server is shutting down');
    // Agents share the CA with hub users; an agent certificate must not open connections into other clusters.
    const cert = call.getAuthContext().sslPeerCertificate;
    if (cert && clusterFromSubject(cert.subject)) return refuse(grpc.status.PERMISSION_DENIED, 'agent certificates may not use the client frontend');
    const f = new GrpcFrontend(call, this.core, this.opts.log, (done) => this.frontends.delete(done));
    this.frontends.add(f);
  };

  /** A client of our SDK over the multiplexed transport. */
  private readonly onMuxClient = (stream: FramedPacketStream, _hello: Hello, socket: TLSSocket, peer: string): void => {
    if (!this.accepting || clusterFromSubject(socket.getPeerCertificate().subject)) {
      const why = this.accepting ? 'PERMISSION_DENIED: agent certificates may not use the client frontend' : 'UNAVAILABLE: server is shutting down';
      this.opts.log.warn({ peer }, `client refused: ${why}`);
      stream.sendHello({ error: [why] });
      stream.end();
      return;
    }
    const session = new MuxFrontendSession(stream, _hello, this.core, this.opts.window ?? DEFAULT_CONNECTION_WINDOW, this.opts.log.child({ peer }), (done) => this.muxClients.delete(done));
    stream.startKeepalive(30_000, 10_000);
    this.muxClients.add(session);
  };

  async start(): Promise<BoundPorts> {
    const { tls, bindAddress } = this.opts;
    // TLS is terminated by AgentPort (ALPN picks the transport); grpc-js gets verified plaintext.
    this.agentPort = new TlsPort({ name: 'agent', host: bindAddress, port: this.opts.agentPort, tls, grpcServer: this.agentServer, onHello: onMuxAgentHello(this.listenerOptions, { intervalMs: 30_000, timeoutMs: 10_000 }), log: this.opts.log });
    const agent = await this.agentPort.listen();
    let frontend: number | null = null;
    if (this.opts.frontendPort !== null) {
      this.frontendPort = new TlsPort({ name: 'frontend', host: bindAddress, port: this.opts.frontendPort, tls, grpcServer: this.frontendServer, onHello: this.onMuxClient, log: this.opts.log });
      frontend = await this.frontendPort.listen();
    }
    let uds: string | null = null;
    if (this.opts.frontendUds) {
      await rm(this.opts.frontendUds, { force: true });
      await bind(this.frontendServer, `unix://${path.resolve(this.opts.frontendUds)}`, grpc.ServerCredentials.createInsecure());
      uds = path.resolve(this.opts.frontendUds);
    }
    if (this.opts.connectPort != null || this.opts.connectUds || this.opts.connectPlain) {
      this.tokens = await TokenStore.open(this.opts.tokensFile ?? path.join(this.opts.dataDir ?? '.', 'tokens.json'), { log: this.opts.log });
      this.connect = await startConnectFrontend({
        core: this.core,
        log: this.opts.log,
        tokens: this.tokens,
        tls: this.opts.connectPort != null ? { host: bindAddress, port: this.opts.connectPort, ...tls } : undefined,
        uds: this.opts.connectUds,
        plain: this.opts.connectPlain,
      });
    }
    const health = this.opts.healthPort === null ? null : await this.listenHttp(bindAddress, this.opts.healthPort, this.healthHandler);
    const admin = this.opts.adminPort === null ? null : await this.listenHttp('127.0.0.1', this.opts.adminPort, this.adminHandler);
    this.ports = {
      serverID: this.serverID, agent, frontend, frontendUds: uds, health, admin,
      connect: this.connect?.ports.tls ?? null, connectUds: this.connect?.ports.uds ?? null, connectPlain: this.connect?.ports.plain ?? null,
    };
    if (this.opts.dataDir) await writeJsonAtomic(path.join(this.opts.dataDir, 'ports.json'), this.ports);
    this.ready = true;
    this.opts.log.info(this.ports, 'proxy server listening');
    return this.ports;
  }

  snapshot(): ReturnType<ProxyCore['snapshot']> & { frontends: { state: string; connectID: number; address: string }[] } {
    return {
      ...this.core.snapshot(),
      frontends: [...[...this.frontends].map((f) => f.description), ...[...this.muxClients].flatMap((m) => m.describe()), ...(this.connect?.describe() ?? []).map((c) => ({ state: c.state, connectID: c.connectID, address: c.destination }))],
    };
  }

  /** Stop: readiness false, refuse new work, give open streams `graceMs`, then force everything closed. */
  async stop(graceMs = 5000): Promise<void> {
    this.ready = false;
    this.accepting = false;
    const connectStopped = this.connect?.stop(graceMs) ?? Promise.resolve();
    const frontendsDone = tryShutdown(this.frontendServer);
    const agentsDone = tryShutdown(this.agentServer);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<void>((r) => { timer = setTimeout(r, graceMs); });
    // Agent streams never end by themselves; after the frontends had their chance, close them.
    await Promise.race([Promise.all([frontendsDone, connectStopped]), timeout]);
    for (const b of this.core.routes.backends()) b.close('server shutting down');
    const agentPortClosed = this.agentPort?.close();
    const frontendPortClosed = this.frontendPort?.close();
    await Promise.race([agentsDone, timeout]);
    clearTimeout(timer);
    this.frontendServer.forceShutdown();
    this.agentServer.forceShutdown();
    await Promise.all([agentPortClosed, frontendPortClosed, connectStopped]);
    await Promise.all(this.httpServers.map((s) => new Promise<void>((r) => { s.close(() => r()); s.closeAllConnections(); })));
    this.httpServers = [];
    if (this.opts.frontendUds) await rm(this.opts.frontendUds, { force: true });
  }

  // ------------------------------------------------------------ HTTP listeners

  private readonly healthHandler = (req: http.IncomingMessage, res: http.ServerResponse): void => {
    const url = new URL(req.url ?? '/', 'http://hub');
    if (url.pathname === '/healthz') return text(res, 200, 'ok\n');
    if (url.pathname === '/readyz') {
      const checks = [
        { name: 'listeners', ok: this.ready, why: 'listeners not bound or shutting down' },
      ];
      const ok = checks.every((c) => c.ok);
      const lines = checks.map((c) => (c.ok ? `[+]${c.name} ok` : `[-]${c.name} failed: ${c.why}`));
      lines.push(`[i]agents connected: ${this.core.routes.size}`);
      return text(res, ok ? 200 : 503, url.searchParams.has('verbose') || !ok ? `${lines.join('\n')}\n` : 'ok\n');
    }
    return text(res, 404, 'not found\n');
  };

  private readonly adminHandler = (req: http.IncomingMessage, res: http.ServerResponse): void => {
    const url = new URL(req.url ?? '/', 'http://hub');
    if (url.pathname === '/debug/connections') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ serverID: this.serverID, ...this.snapshot(), handles: process.getActiveResourcesInfo() }));
      return;
    }
    return this.healthHandler(req, res);
  };

  private listenHttp(host: string, port: number, handler: http.RequestListener): Promise<number> {
    const server = http.createServer(handler);
    server.keepAliveTimeout = 1000;
    server.headersTimeout = 10_000;
    server.requestTimeout = 10_000;
    this.httpServers.push(server);
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, host, () => {
        server.removeListener('error', reject);
        resolve((server.address() as { port: number }).port);
      });
    });
  }
}

function text(res: http.ServerResponse, code: number, body: string): void {
  res.writeHead(code, { 'content-type': 'text/plain; charset=utf-8' });
  res.end(body);
}


function bind(server: grpc.Server, address: string, creds: grpc.ServerCredentials): Promise<number> {
  return new Promise((resolve, reject) => {
    server.bindAsync(address, creds, (err, port) => {
      if (err) reject(new Error(`cannot listen on ${address}: ${err.message}`));
      else resolve(port);
    });
  });
}

function tryShutdown(server: grpc.Server): Promise<void> {
  return new Promise((resolve) => server.tryShutdown(() => resolve()));
}

async function writeJsonAtomic(file: string, value: unknown): Promise<void> {
  await mkdir(path.dirname(file), { recursive: true });
  const tmp = `${file}.${process.pid}.tmp`;
  await writeFile(tmp, `${JSON.stringify(value, null, 2)}\n`);
  await rename(tmp, file);
}
