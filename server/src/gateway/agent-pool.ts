// The gateway's connections to the agents' reserved destination (AgentLeg: a tunneled connection and the
// parser of the answers on it), and the keep-alive pool of idle ones: a request reuses an idle connection
// of its cluster (and caller) instead of dialing the agent again, which saves a hub↔agent round trip per
// request (kubectl's discovery alone is dozens of GETs). Each request still carries its own identity
// assertion, bound to its method and target, so a reused connection grants nothing. An idle connection
// closes after IDLE_MS; the connection tables drain shortly after a burst.
//
// Keyed by (cluster, caller): the hub's per-client connection limit counts tunneled connections by caller.
import type { Duplex } from 'node:stream';
import { MessageParser, type MessageHead } from '@cluster-proxy/proto';
import type { ProxyCore } from '../dataplane/proxy-core.js';
import { TunnelSocket } from './tunnel-socket.js';

/** How long an idle pooled connection is kept. */
export const IDLE_MS = 4000;
/** Idle connections kept per (cluster, caller). */
const MAX_IDLE = 16;
/** The largest answer head taken from an agent (an apiserver's are a few hundred bytes). */
const MAX_ANSWER_HEAD_BYTES = 64 * 1024;

/** What one request wants to hear of the answer on a leg. */
export interface AnswerHandler {
  /** Its head; true: no body follows (the answer to HEAD). */
  head(h: MessageHead): boolean;
  body(chunk: Buffer): void;
  end(): void;
  /** The connection broke or sent what is not HTTP before the answer ended. */
  failed(err: Error): void;
}

export type AgentLegState = 'busy' | 'idle' | 'closed';

/** One connection to an agent's reserved destination (or a Service), and the parser of its answers. */
export class AgentLeg {
  private handler: AnswerHandler | null = null;
  private readonly parser: MessageParser;
  private stateNow: AgentLegState = 'busy';
  private timer: NodeJS.Timeout | null = null;
  /** Takes it out of the pool's idle list (while it is in there). */
  private unlist: (() => void) | null = null;

  constructor(
    readonly socket: Duplex,
    readonly key: string,
  ) {
    this.parser = new MessageParser(
      'response',
      {
        head: (h) => (this.handler ? this.handler.head(h) : (this.broken(new Error('an answer nobody asked for')), true)),
        body: (b) => this.handler?.body(b),
        end: () => this.handler?.end(),
      },
      MAX_ANSWER_HEAD_BYTES,
    );
    socket.on('data', (d: Buffer) => {
      const r = this.parser.execute(d);
      if (typeof r !== 'number') this.broken(new Error(`the agent's answer is not HTTP (${r.code})`));
    });
    socket.on('end', () => {
      // An answer that runs to the end of the connection ends here; one cut short is a failure.
      const r = this.parser.finish();
      this.broken(r ? new Error(`the agent's answer was cut off (${r.code})`) : new Error('the agent closed the connection'));
    });
    socket.on('error', (err: Error) => this.broken(err));
    socket.on('close', () => this.broken(new Error('the agent closed the connection')));
  }

  get state(): AgentLegState {
    return this.stateNow;
  }

  /** The one place the state changes. */
  private setState(next: AgentLegState): void {
    this.stateNow = next;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    if (next !== 'idle') {
      const unlist = this.unlist;
      this.unlist = null;
      unlist?.();
    }
  }

  /** Whether a request may go out on it. */
  get usable(): boolean {
    return this.stateNow !== 'closed' && !this.socket.destroyed && this.socket.writable;
  }

  /** The answers from here on go to `h` (null: taken from the pool, a handler follows). */
  use(h: AnswerHandler | null): void {
    this.handler = h;
    this.setState('busy');
  }

  /** Kept idle for `ms` (its answer ended), then closed; `unlist` once it is no longer idle. */
  idleFor(ms: number, unlist: () => void): void {
    this.handler = null;
    // Paused for a slow caller of the last answer, maybe: an idle connection reads (what comes is an error).
    this.socket.resume();
    this.setState('idle');
    this.unlist = unlist;
    this.timer = setTimeout(() => this.destroy(), ms);
    this.timer.unref();
  }

  destroy(): void {
    this.handler = null;
    this.setState('closed');
    this.socket.destroy();
  }

  private broken(err: Error): void {
    const h = this.handler;
    this.destroy();
    h?.failed(err);
  }
}

export class GatewayPool {
  private readonly idle = new Map<string, AgentLeg[]>();
  private closed = false;

  constructor(private readonly core: ProxyCore) {}

  /** An idle connection of (cluster, client), or a new one once the agent accepted the dial. */
  take(cluster: string, client: string, got: (err: Error | null, leg?: AgentLeg) => void): void {
    const key = `${cluster}\0${client}`;
    const list = this.idle.get(key);
    while (list && list.length > 0) {
      const leg = list.pop()!;
      if (list.length === 0) this.idle.delete(key);
      if (leg.usable) {
        leg.use(null);
        got(null, leg);
        return;
      }
    }
    new TunnelSocket(this.core, cluster, client, (err, s) => (err ? got(err) : got(null, new AgentLeg(s, key))));
  }

  /** After an answer ended with the connection kept: idle for the next request, unless its agent is shutting down. */
  release(leg: AgentLeg): void {
    const list = this.idle.get(leg.key) ?? [];
    if (this.closed || !leg.usable || (leg.socket as TunnelSocket).agentDraining || list.length >= MAX_IDLE) {
      leg.destroy();
      return;
    }
    list.push(leg);
    this.idle.set(leg.key, list);
    leg.idleFor(IDLE_MS, () => this.forget(leg));
  }

  private forget(leg: AgentLeg): void {
    const list = this.idle.get(leg.key);
    const i = list?.indexOf(leg) ?? -1;
    if (i < 0) return;
    list!.splice(i, 1);
    if (list!.length === 0) this.idle.delete(leg.key);
  }

  /** Idle connections close now (a hub that stops); busy ones finish. */
  closeIdle(): void {
    for (const list of [...this.idle.values()]) for (const leg of [...list]) leg.destroy();
  }

  /** No connection is kept from here on. */
  close(): void {
    this.closed = true;
    this.closeIdle();
  }

  /** (cluster, caller) pairs with idle connections now (for tests). */
  get size(): number {
    return this.idle.size;
  }
}
