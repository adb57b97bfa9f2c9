// Turns a DialRequest address into a TCP connection: maps the cluster's own names to its
// apiserver, enforces the allowlist, and dials with a timeout.
import type { KeyObject } from 'node:crypto';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import {
  STARTING_UNSENT_LIMIT,
  isGatewayHost,
  joinHostPort,
  limitUnsentBytes,
  splitHostPort,
  type DialFailureReason,
} from '@cluster-proxy/proto';
import { Allowlist } from './allowlist.js';

export interface TargetDialerOptions {
  /** Names that mean "this cluster's apiserver" (C, C.N, OCM's service-proxy host). */
  clusterNames: readonly string[];
  /** host:port of the apiserver; in a pod, kubernetes.default.svc:443. */
  apiserver: string;
  /** Extra destinations the hub configured (see allowlist.ts for the syntax). */
  allow: readonly string[];
  dialTimeoutMs: number;
  /**
   * Serves the hub gateway's reserved destination in process (gateway/impersonating-proxy.ts); unset:
   * refused. `linkKey`: the identity MAC key of the link the dial came in on (null: none).
   */
  gateway?: (linkKey: KeyObject | null) => Duplex;
}

export class DialFailure extends Error {
  override name = 'DialFailure';
  constructor(
    readonly reason: DialFailureReason,
    message: string,
  ) {
    super(message);
  }
}

export interface ResolvedTarget {
  host: string;
  port: number;
  /** The hub gateway's reserved destination: an in-process handler, no TCP dial. */
  virtual?: 'gateway';
}

export class TargetDialer {
  private readonly names: Set<string>;
  private readonly apiserver: ResolvedTarget;
  private readonly allowlist: Allowlist;

  constructor(readonly opts: TargetDialerOptions) {
    this.names = new Set(opts.clusterNames.map((n) => n.toLowerCase()));
    const api = splitHostPort(opts.apiserver);
    if (!api) throw new Error(`apiserver address "${opts.apiserver}" is not HOST:PORT`);
    this.apiserver = api;
    // The apiserver itself is always allowed: the cluster names resolve to it.
    this.allowlist = new Allowlist([joinHostPort(api.host, api.port), ...opts.allow]);
  }

  resolve(address: string, protocol: string): ResolvedTarget {
    if (protocol !== 'tcp') throw new DialFailure('forbidden', `protocol "${protocol}" is not supported, only tcp`);
    const hp = splitHostPort(address);
    if (!hp) throw new DialFailure('endpoint', `address "${address}" is not HOST:PORT`);
    // Before the allowlist: `*` must not make the reserved name a TCP destination.
    if (isGatewayHost(hp.host)) {
      if (!this.opts.gateway) throw new DialFailure('forbidden', 'this agent does not serve the HTTP gateway');
      return { host: hp.host, port: hp.port, virtual: 'gateway' };
    }
    // Dialing C:443 reaches the apiserver, as OCM's ExternalName Service C does inside the cluster.
    // Another port of C means that port on the apiserver's host, and the allowlist must say so.
    const target = this.names.has(hp.host) ? (hp.port === 443 ? { ...this.apiserver } : { host: this.apiserver.host, port: hp.port }) : hp;
    if (!this.allowlist.allows(target.host, target.port)) {
      throw new DialFailure('forbidden', `destination ${address} is not in this agent's allowlist`);
    }
    return target;
  }

  /** Whether the reserved gateway destination is served here. */
  get servesGateway(): boolean {
    return this.opts.gateway !== undefined;
  }

  /**
   * Connects; rejects with DialFailure('endpoint' | 'timeout') on failure or `signal` abort. `linkKey`: the
   * identity MAC key of the link the dial came in on, for the gateway's destination.
   */
  dial(target: ResolvedTarget, signal: AbortSignal, linkKey: KeyObject | null = null): Promise<net.Socket> {
    if (target.virtual === 'gateway' && this.opts.gateway) {
      // An in-memory pair with the socket calls the endpoint connection makes (gateway/impersonating-proxy.ts).
      return Promise.resolve(this.opts.gateway(linkKey) as net.Socket);
    }
    return new Promise((resolve, reject) => {
      const where = joinHostPort(target.host, target.port);
      const socket = net.connect({ host: target.host, port: target.port, allowHalfOpen: true });
      const cleanup = (): void => {
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        socket.removeListener('connect', onConnect);
        socket.removeListener('error', onError);
      };
      const fail = (err: DialFailure): void => {
        cleanup();
        socket.destroy();
        reject(err);
      };
      const onConnect = (): void => {
        cleanup();
        limitUnsentBytes(socket, STARTING_UNSENT_LIMIT);
        resolve(socket);
      };
      const onError = (err: NodeJS.ErrnoException): void => {
        const what = err.code === 'ECONNREFUSED' ? 'connection refused' : err.code === 'ENOTFOUND' ? 'no such host' : err.message;
        fail(new DialFailure('endpoint', `dial tcp ${where}: connect: ${what}`));
      };
      const onAbort = (): void => fail(new DialFailure('dialclosed', `dial tcp ${where}: cancelled`));
      const timer = setTimeout(
        () => fail(new DialFailure('timeout', `dial tcp ${where}: i/o timeout after ${this.opts.dialTimeoutMs} ms`)),
        this.opts.dialTimeoutMs,
      );
      socket.once('connect', onConnect);
      socket.once('error', onError);
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
    });
  }
}
