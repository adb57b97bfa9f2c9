// Every Prometheus metric of the proxy server, names and help texts in one place (contract §9).
// ANP's names (`konnectivity_network_proxy_server_*`) where ANP has the metric, with ANP's labels and
// label values; ours under `cluster_proxy_server_*`. One Registry per ProxyServer (never prom-client's
// global one), so two servers in one process (tests) do not collide. Labels only ever hold values
// from small fixed sets: never addresses, agent IDs or connection IDs.
import { PacketType, type DialFailureReason, type DirectionUsage } from '@cluster-proxy/proto';
import { Registry as ProcessRegistry, processMetrics } from '@cluster-proxy/proto/prometheus';
import { Counter, Gauge, Histogram, Registry } from './prom.js';
import { TallyHistogram, registerTally } from './tally-histogram.js';

const ANP = 'konnectivity_network_proxy_server_';
const OWN = 'cluster_proxy_server_';

/** ANP's stream segments: which leg a packet travelled on, seen from the whole system. */
export type Segment = 'from_client' | 'to_client' | 'from_agent' | 'to_agent';

/**
 * `dial_failure_count{reason}`: ANP's values where the situation is ANP's, plus ours:
 *   no_agent               no agent for the destination (ANP)
 *   draining               only draining agents for it (ours)
 *   error_response         the agent answered DIAL_RSP with an error (ANP)
 *   unrecognized_response  DIAL_RSP for a dial we no longer know (ANP)
 *   backend_close          the agent went away (or sent DIAL_CLS) during the dial (ANP)
 *   backend_dial_timeout   no DIAL_RSP within the dial deadline (ANP)
 *   frontend_close         the client gave up on the pending dial (ANP)
 *   bad_request            the request could not be dialled at all, e.g. protocol not tcp (ours)
 */
export type ServerDialFailure =
  | 'no_agent'
  | 'draining'
  | 'error_response'
  | 'unrecognized_response'
  | 'backend_close'
  | 'backend_dial_timeout'
  | 'frontend_close'
  | 'bad_request';

/** What the scrape-time gauges read from the live server (tables, not counters that could drift). */
export interface ServerGaugeSource {
  /** Agent streams registered with the core. */
  agentStreams(): { total: number; grpc: number; mux: number };
  /** Distinct identifiers per routing strategy (ANP's ready_backends). */
  readyBackends(): { destHost: number; cidr: number; defaultRoute: number };
  pendingDials(): number;
  /** Dials waiting for an agent of their cluster to connect to this replica (agent-wait.ts). */
  waitingDials(): number;
  established(): number;
  /** gRPC ProxyService.Proxy streams of clients. */
  grpcFrontends(): number;
  /** Client sessions over our multiplexed transport. */
  muxFrontends(): number;
  /** HTTP CONNECT client connections, in any state. */
  httpConnections(): number;
  /**
   * Streams whose reading is stopped now because what they carry cannot move on (ANP's
   * full_receive_channels): Proxy, client streams (gRPC) paused until the agent side has room;
   * Connect, agent streams held until a client that cannot take more does.
   */
  blockedReceivers(): { proxy: number; connect: number };
  serverCount(): number;
  /** The memory budget: its limit, and per direction what the windows add up to and what is held now. */
  memory(): { limit: number; directions: DirectionUsage[] };
}

export { grpcCodeName } from '@cluster-proxy/proto';

/** Packet type names for labels: the enum's names, anything else "Unknown" (bounded). */
export function packetTypeLabel(type: number): string {
  const name = PacketType[type];
  return typeof name === 'string' ? name : 'Unknown';
}

export interface ServerMetricsOptions {
  /** Also export prom-client's process/Node.js metrics (one per process: the CLI turns it on). */
  processMetrics?: boolean;
}

const SEGMENT_INDEX: Record<Segment, number> = { from_client: 0, to_client: 1, from_agent: 2, to_agent: 3 };

/** ANP's server latency buckets (dial and frontend write). */
const ANP_LATENCY_BUCKETS = [0.000001, 0.00001, 0.0001, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5];

export class ServerMetrics {
  readonly registry = new Registry();
  /** Process metrics (CPU, RSS, heap, descriptors), when asked for. */
  private readonly processRegistry: ProcessRegistry | null;
  private source: ServerGaugeSource | null = null;

  // ---- ANP's
  readonly dialDuration = new Histogram({
    name: `${ANP}dial_duration_seconds`,
    help: 'Latency of successful dials: DIAL_REQ sent to the agent until its successful DIAL_RSP',
    buckets: ANP_LATENCY_BUCKETS,
    registers: [this.registry],
  });
  /**
   * ANP times each packet its server sends a client; ours, each DATA payload handed on towards a client
   * (every frontend: gRPC, mux, CONNECT). Node's writes do not block, so this is the time the hub spends
   * passing it on; a client that does not read shows in the stall and held-bytes metrics instead.
   */
  readonly frontendWriteDuration = registerTally(
    this.registry,
    new TallyHistogram(
      `${ANP}frontend_write_duration_seconds`,
      'Latency of write to the frontend in seconds (each DATA payload handed on towards a client)',
      ANP_LATENCY_BUCKETS,
    ),
  );
  readonly dialFailures = new Counter({
    name: `${ANP}dial_failure_count`,
    help: 'Dials that failed, by reason (no_agent, draining, error_response, unrecognized_response, backend_close, backend_dial_timeout, frontend_close, bad_request)',
    labelNames: ['reason'] as const,
    registers: [this.registry],
  });
  readonly connectionDuration = new Histogram({
    name: `${ANP}connection_duration_seconds`,
    help: 'Lifetime of established tunneled connections, from the successful dial to the close',
    // ANP's buckets for this histogram (it came after v0.36.0).
    buckets: [1, 5, 15, 30, 60, 300, 900, 1800, 3600, 14400, 43200, 86400],
    registers: [this.registry],
  });
  /**
   * Packets counted since the last scrape, per segment and packet type: plain numbers on the hot path (a
   * prom-client inc() hashes its labels, per packet), added to streamPackets when it is collected.
   */
  private readonly packetTally = new Map<number, { segment: Segment; packetType: string; n: number }>();
  readonly streamPackets: Counter<'segment' | 'packet_type'> = new Counter({
    name: `${ANP}stream_packets_total`,
    help: 'Packets on client and agent streams, by segment (from_client, to_client, from_agent, to_agent) and packet type',
    labelNames: ['segment', 'packet_type'] as const,
    registers: [this.registry],
    collect: () => {
      for (const t of this.packetTally.values()) {
        if (t.n === 0) continue;
        this.streamPackets.inc({ segment: t.segment, packet_type: t.packetType }, t.n);
        t.n = 0;
      }
    },
  });
  readonly streamErrors = new Counter({
    name: `${ANP}stream_errors_total`,
    help: 'Client and agent streams that ended with an error, by segment, gRPC code and packet type (Unknown for receive errors)',
    labelNames: ['segment', 'code', 'packet_type'] as const,
    registers: [this.registry],
  });

  // ANP's lease metrics are its lease garbage collector's (--enable-lease-controller): it lists the
  // servers' Leases and deletes expired ones. The hub lists the replica Leases (fleet/replicas.ts) to count
  // its replicas: those lists are counted here. It deletes no other replica's Lease (an expired one is
  // ignored and stays), so culled_leases_count stays 0 and the delete metrics have no series, as on an
  // ANP server whose collector found nothing to cull.
  readonly culledLeases = new Counter({
    name: `${ANP}culled_leases_count`,
    help: 'Count of expired leases that the lease garbage collection controller has culled (the hub culls none: 0)',
    registers: [this.registry],
  });
  readonly leaseDeleteLatency = new Histogram({
    name: `${ANP}lease_delete_latency_seconds`,
    help: 'Latency of lease deletion calls by the garbage collection controller in seconds (the hub makes none)',
    labelNames: ['http_status_code'] as const,
    registers: [this.registry],
  });
  readonly leaseDeletes = new Counter({
    name: `${ANP}lease_delete_total`,
    help: 'Count of lease deletion calls by the garbage collection controller, by HTTP status code and reason (the hub makes none)',
    labelNames: ['http_status_code', 'reason'] as const,
    registers: [this.registry],
  });
  readonly leaseListLatency = new Histogram({
    name: `${ANP}lease_list_latency_seconds`,
    help: 'Latency of the replica lease list calls in seconds, by HTTP status code',
    labelNames: ['http_status_code'] as const,
    registers: [this.registry],
  });
  readonly leaseLists = new Counter({
    name: `${ANP}lease_list_total`,
    help: 'Count of replica lease list calls, by HTTP status code and reason',
    labelNames: ['http_status_code', 'reason'] as const,
    registers: [this.registry],
  });

  // ---- ours
  /** Payload bytes per direction since the last scrape: plain numbers on the hot path, added to `bytes` when it is collected. */
  private readonly bytesTally = { to_agent: 0, to_client: 0 };
  readonly bytes: Counter<'direction'> = new Counter({
    name: `${OWN}bytes_total`,
    help: 'Payload bytes moved through tunneled connections, by direction (to_agent: from clients towards destinations; to_client: back)',
    labelNames: ['direction'] as const,
    registers: [this.registry],
    collect: () => {
      for (const direction of ['to_agent', 'to_client'] as const) {
        const n = this.bytesTally[direction];
        if (n === 0) continue;
        this.bytes.inc({ direction }, n);
        this.bytesTally[direction] = 0;
      }
    },
  });
  readonly flowControlStalls = new Counter({
    name: `${OWN}flow_control_stalls_total`,
    help: 'Times a connection ran out of flow-control credit and had to wait for its receiver, by direction (to_agent, to_client)',
    labelNames: ['direction'] as const,
    registers: [this.registry],
  });
  readonly tunnelConnects = new Counter({
    name: `${OWN}tunnel_connects_total`,
    help: 'Agent streams (tunnels) accepted, by transport (grpc, mux)',
    labelNames: ['transport'] as const,
    registers: [this.registry],
  });
  readonly tunnelDisconnects = new Counter({
    name: `${OWN}tunnel_disconnects_total`,
    help: 'Agent streams (tunnels) that ended, by transport (grpc, mux)',
    labelNames: ['transport'] as const,
    registers: [this.registry],
  });
  readonly agentRefusals = new Counter({
    name: `${OWN}agent_refusals_total`,
    help: 'Agent streams refused at admission, by gRPC code (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT, UNAVAILABLE)',
    labelNames: ['code'] as const,
    registers: [this.registry],
  });
  readonly memoryThrottled = new Counter({
    name: `${OWN}memory_budget_throttled_total`,
    help: 'Times a connection window was kept from growing because the memory budget was short, by direction (to_agent, to_client)',
    labelNames: ['direction'] as const,
    registers: [this.registry],
  });
  readonly stalledCloses = new Counter({
    name: `${OWN}stalled_connections_closed_total`,
    help: 'Connections the hub closed because bytes could not move one way for --stall-timeout, by direction (to_agent: the destination took nothing; to_client: the client took nothing)',
    labelNames: ['direction'] as const,
    registers: [this.registry],
  });
  readonly admissionRefusals = new Counter({
    name: `${OWN}admission_refusals_total`,
    help: 'Dials refused because a connection limit was reached, by limit (hub: --max-connections, client: --max-connections-per-client)',
    labelNames: ['limit'] as const,
    registers: [this.registry],
  });
  readonly agentWaits = new Counter({
    name: `${OWN}agent_waits_total`,
    help: 'Dials with no agent here whose cluster has one on another replica, by how the wait for it to connect here ended (connected, timeout, cancelled, shutdown; full: not held, too many waiting)',
    labelNames: ['result'] as const,
    registers: [this.registry],
  });
  readonly connectRequests = new Counter({
    name: `${OWN}http_connect_requests_total`,
    help: 'HTTP CONNECT requests answered, by status code (200 = tunnel open)',
    labelNames: ['status'] as const,
    registers: [this.registry],
  });

  readonly gatewayRequests = new Counter({
    name: `${OWN}gateway_requests_total`,
    help: 'HTTP gateway requests answered, by cluster (empty until the cluster is known to exist) and status code',
    labelNames: ['cluster', 'code'] as const,
    registers: [this.registry],
  });
  readonly gatewayDuration = new Histogram({
    name: `${OWN}gateway_request_duration_seconds`,
    help: 'HTTP gateway requests, from the request head to the end of the response (watches included)',
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800],
    registers: [this.registry],
  });

  constructor(opts: ServerMetricsOptions = {}) {
    const r = [this.registry];
    const src = (): ServerGaugeSource | null => this.source;
    // Scrape-time gauges: read from the live tables, so they cannot drift from the truth.
    new Gauge({
      name: `${ANP}ready_backend_connections`,
      help: 'Agent streams (backend connections) registered with this server (deprecated in ANP; see ready_backends)',
      registers: r,
      collect() {
        this.set(src()?.agentStreams().total ?? 0);
      },
    });
    new Gauge({
      name: `${ANP}ready_backends`,
      help: 'Distinct agent identifiers this server can route by, per routing strategy (destHost, cidr, defaultRoute)',
      labelNames: ['proxy_strategy'] as const,
      registers: r,
      collect() {
        const b = src()?.readyBackends() ?? { destHost: 0, cidr: 0, defaultRoute: 0 };
        this.set({ proxy_strategy: 'destHost' }, b.destHost);
        this.set({ proxy_strategy: 'cidr' }, b.cidr);
        this.set({ proxy_strategy: 'defaultRoute' }, b.defaultRoute);
      },
    });
    new Gauge({
      name: `${ANP}pending_backend_dials`,
      help: 'Dials sent to agents and not yet answered',
      registers: r,
      collect() {
        this.set(src()?.pendingDials() ?? 0);
      },
    });
    new Gauge({
      name: `${OWN}agent_waiting_dials`,
      help: 'Dials waiting now for an agent of their cluster to connect to this replica (--agent-wait)',
      registers: r,
      collect() {
        this.set(src()?.waitingDials() ?? 0);
      },
    });
    new Gauge({
      name: `${ANP}established_connections`,
      help: 'Tunneled connections established through agents (open or closing)',
      registers: r,
      collect() {
        this.set(src()?.established() ?? 0);
      },
    });
    new Gauge({
      name: `${ANP}grpc_connections`,
      help: 'Open gRPC streams, by service method (Proxy: clients, Connect: agents)',
      labelNames: ['service_method'] as const,
      registers: r,
      collect() {
        const s = src();
        this.set({ service_method: 'Proxy' }, s?.grpcFrontends() ?? 0);
        this.set({ service_method: 'Connect' }, s?.agentStreams().grpc ?? 0);
      },
    });
    new Gauge({
      name: `${ANP}full_receive_channels`,
      help: 'Number of current connections blocked by a full receive channel, partitioned by service method (Proxy: client streams paused for room towards the agent; Connect: agent streams held for a client)',
      labelNames: ['service_method'] as const,
      registers: r,
      collect() {
        const b = src()?.blockedReceivers() ?? { proxy: 0, connect: 0 };
        this.set({ service_method: 'Proxy' }, b.proxy);
        this.set({ service_method: 'Connect' }, b.connect);
      },
    });
    new Gauge({
      name: `${ANP}http_connections`,
      help: 'Open HTTP CONNECT client connections',
      registers: r,
      collect() {
        this.set(src()?.httpConnections() ?? 0);
      },
    });
    new Gauge({
      name: `${OWN}mux_connections`,
      help: 'Open connections over our multiplexed transport, by role (client, agent)',
      labelNames: ['role'] as const,
      registers: r,
      collect() {
        const s = src();
        this.set({ role: 'client' }, s?.muxFrontends() ?? 0);
        this.set({ role: 'agent' }, s?.agentStreams().mux ?? 0);
      },
    });
    new Gauge({
      name: `${OWN}server_count`,
      help: 'Number of server replicas this server tells agents to connect to',
      registers: r,
      collect() {
        this.set(src()?.serverCount() ?? 0);
      },
    });
    new Gauge({
      name: `${OWN}memory_budget_bytes`,
      help: 'Bytes this hub may hold on behalf of its peers (--memory-budget)',
      registers: r,
      collect() {
        this.set(src()?.memory().limit ?? 0);
      },
    });
    new Gauge({
      name: `${OWN}memory_committed_bytes`,
      help: "Sum of the per-connection windows granted to peers, by direction (to_agent: client bytes towards agents, gRPC clients' stream windows included; to_client: agent bytes towards clients)",
      labelNames: ['direction'] as const,
      registers: r,
      collect() {
        for (const u of src()?.memory().directions ?? []) this.set({ direction: u.direction }, u.committed);
      },
    });
    new Gauge({
      name: `${OWN}memory_held_bytes`,
      help: 'Bytes held now on behalf of peers, not yet passed on, by direction (to_agent, to_client; to_agent includes client bytes in the buffers of paused sockets and HTTP/2 streams)',
      labelNames: ['direction'] as const,
      registers: r,
      collect() {
        for (const u of src()?.memory().directions ?? []) this.set({ direction: u.direction }, u.buffered);
      },
    });
    // The CLI's process metrics, the agent's set (proto's prometheus.ts): prom-client's default collectors
    // and the OpenTelemetry API they load cost the hub ~3 MiB of RSS at start.
    this.processRegistry = opts.processMetrics ? new ProcessRegistry() : null;
    if (this.processRegistry) for (const m of processMetrics()) this.processRegistry.register(m);
  }

  /** Connects the scrape-time gauges to the live server. */
  bind(source: ServerGaugeSource): void {
    this.source = source;
  }

  dialFailure(reason: ServerDialFailure): void {
    this.dialFailures.inc({ reason });
  }

  /** The routing table had no usable agent (or the destination was malformed). */
  routeFailure(reason: DialFailureReason): void {
    this.dialFailure(reason === 'no_agent' || reason === 'draining' ? reason : 'bad_request');
  }

  packet(segment: Segment, type: number): void {
    // Keyed by a number, not a string built per packet: the segment's index times 1024 plus the type, or
    // 1023 for every type without a name (a peer's made-up types all count as Unknown, one entry).
    const slot = typeof PacketType[type] === 'string' && type >= 0 && type < 1023 ? type : 1023;
    const key = SEGMENT_INDEX[segment] * 1024 + slot;
    const t = this.packetTally.get(key);
    if (t) t.n++;
    else this.packetTally.set(key, { segment, packetType: packetTypeLabel(type), n: 1 });
  }

  /** Payload bytes moved one way (per DATA packet: a plain add, flushed into bytes_total at scrape). */
  bytesMoved(direction: 'to_agent' | 'to_client', n: number): void {
    this.bytesTally[direction] += n;
  }

  /** One replica lease list: its HTTP status (200 when it worked) and reason (Kubernetes' Status reason, or ''). */
  leaseList(seconds: number, httpStatusCode: number, reason = ''): void {
    const code = String(httpStatusCode);
    this.leaseLists.inc({ http_status_code: code, reason });
    this.leaseListLatency.observe({ http_status_code: code }, seconds);
  }

  streamError(segment: Segment, code: string, packetType = 'Unknown'): void {
    this.streamErrors.inc({ segment, code, packet_type: packetType });
  }

  /** The exposition text and its content type, for a /metrics handler. */
  async expose(): Promise<{ contentType: string; body: string }> {
    // prom-client's text ends with a newline; the process metrics follow it.
    return {
      contentType: this.registry.contentType,
      body: `${await this.registry.metrics()}${(await this.processRegistry?.collect()) ?? ''}`,
    };
  }
}

/** For objects built without a server (unit tests of single classes): counts go nowhere visible. */
let detached: ServerMetrics | null = null;
export function detachedServerMetrics(): ServerMetrics {
  detached ??= new ServerMetrics();
  return detached;
}
