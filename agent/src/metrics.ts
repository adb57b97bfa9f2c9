// Every Prometheus metric of the agent, names and help texts in one place (contract §9). ANP's names
// (`konnectivity_network_proxy_agent_*`) where ANP has the metric, ours under `cluster_proxy_agent_*`.
// One Registry per Agent (proto's prometheus.ts: our own small exposition writer, not prom-client, for
// its memory). Labels hold values from small fixed sets only: never addresses, server IDs or connection IDs.
import { PacketType } from '@cluster-proxy/proto';
import { CONTENT_TYPE, Counter, Gauge, Histogram, Registry, processMetrics } from '@cluster-proxy/proto/prometheus';

const ANP = 'konnectivity_network_proxy_agent_';
/** ANP's agent latency buckets (dials, lease lists): 5 ms to 30 s. */
const ANP_LATENCY_BUCKETS = [0.005, 0.025, 0.1, 0.5, 2.5, 10, 30];
const OWN = 'cluster_proxy_agent_';

/** As ANP's agent reports them: from_agent = sent to a server, to_agent = received from one. */
export type AgentSegment = 'from_agent' | 'to_agent';

/** What the scrape-time gauges read from the live agent. */
export interface AgentGaugeSource {
  openServerConnections(): number;
  knownServerCount(): number;
  openEndpointConnections(): number;
  /** The memory budget: its limit, what the windows granted to the hub add up to, what is held now. */
  memory(): { limit: number; committed: number; held: number };
}

export interface AgentMetricsOptions {
  /** Also export the process metrics (CPU, memory, fds; the CLI turns it on). */
  processMetrics?: boolean;
}

/** The slot of the packet types without a name (all counted as Unknown). */
const UNKNOWN_SLOT = -1;

function packetTypeLabel(type: number): string {
  const name = PacketType[type];
  return typeof name === 'string' ? name : 'Unknown';
}

export class AgentMetrics {
  readonly registry = new Registry();
  private source: AgentGaugeSource | null = null;

  // ---- ANP's
  readonly dialDuration = this.registry.register(
    new Histogram(`${ANP}dial_duration_seconds`, 'Latency of successful dials to destinations (endpoints)', ANP_LATENCY_BUCKETS),
  );
  readonly endpointDialFailures = this.registry.register(
    new Counter(
      `${ANP}endpoint_dial_failure_total`,
      'Dials to destinations that failed, by reason (timeout, endpoint, forbidden, draining, unknown)',
      ['reason'] as const,
    ),
  );
  readonly streamPackets = this.registry.register(
    new Counter(
      `${ANP}stream_packets_total`,
      'Packets on server streams, by segment (from_agent: sent, to_agent: received) and packet type',
      ['segment', 'packet_type'] as const,
    ),
  );
  readonly streamErrors = this.registry.register(
    new Counter(
      `${ANP}stream_errors_total`,
      'Server streams that ended with an error, by segment, code and packet type (Unknown for receive errors)',
      ['segment', 'code', 'packet_type'] as const,
    ),
  );
  /** ANP's deprecated twin of streamErrors: counted with it, to_server for from_agent and from_server for to_agent. */
  readonly serverFailures = this.registry.register(
    new Counter(
      `${ANP}server_connection_failure_count`,
      'Count of failures to send to or receive from the proxy server, labeled by the direction (from_server or to_server). DEPRECATED, please use stream_errors_total',
      ['direction'] as const,
    ),
  );
  // ANP's lease metrics count the agent's lists of the servers' Leases (--count-server-leases). Ours asks
  // the hub for its live replicas instead (GET /v1/replicas, which the hub answers from those Leases):
  // each answer counts as a list, with its HTTP status. The agent watches nothing, so lease_watches_total
  // has no series (as in ANP, whose watches are counted into lease_lists_total).
  readonly leaseLists = this.registry.register(
    new Counter(
      `${ANP}lease_lists_total`,
      'Count of server lease lists made by the agent (GET /v1/replicas of the hub), labeled by HTTP response code and reason',
      ['http_response_code', 'reason'] as const,
    ),
  );
  readonly leaseWatches = this.registry.register(
    new Counter(
      `${ANP}lease_watches_total`,
      'Count of server lease watch calls made by the agent, labeled by HTTP response code and reason (the agent watches none)',
      ['http_response_code', 'reason'] as const,
    ),
  );
  readonly leaseListLatency = this.registry.register(
    new Histogram(
      `${ANP}lease_list_latency_seconds`,
      'Latency of server lease listing in seconds (GET /v1/replicas of the hub)',
      ANP_LATENCY_BUCKETS,
      ['http_response_code'] as const,
    ),
  );

  // ---- ours
  readonly bytes = this.registry.register(
    new Counter(
      `${OWN}bytes_total`,
      'Payload bytes moved through tunneled connections, by direction (to_endpoint: written to destinations; to_server: read from them)',
      ['direction'] as const,
    ),
  );
  /** bytes' two series, resolved once: counted per packet. */
  readonly bytesToEndpoint = this.bytes.child({ direction: 'to_endpoint' });
  readonly bytesToServer = this.bytes.child({ direction: 'to_server' });
  readonly flowControlStalls = this.registry.register(
    new Counter(
      `${OWN}flow_control_stalls_total`,
      'Times a connection ran out of flow-control credit towards the server and stopped reading its destination',
    ),
  );
  readonly tunnelConnects = this.registry.register(
    new Counter(
      `${OWN}tunnel_connects_total`,
      'Attempts to open a tunnel (server stream), by result (ok, error, duplicate: a replica we already hold)',
      ['result'] as const,
    ),
  );
  readonly tunnelReconnects = this.registry.register(
    new Counter(
      `${OWN}tunnel_reconnects_total`,
      'Tunnels lost while running (not by our own stop or drain), after which the agent reconnects',
    ),
  );
  readonly memoryThrottled = this.registry.register(
    new Counter(
      `${OWN}memory_budget_throttled_total`,
      "Times a connection's window was kept from growing because the memory budget was short",
    ),
  );

  constructor(opts: AgentMetricsOptions = {}) {
    const src = (): AgentGaugeSource | null => this.source;
    this.registry.register(
      new Gauge(`${ANP}open_server_connections`, 'Tunnels (server streams) this agent holds', () => src()?.openServerConnections() ?? 0),
    );
    this.registry.register(
      new Gauge(
        `${ANP}known_server_count`,
        'Number of server replicas the agent believes exist (from the serverCount header)',
        () => src()?.knownServerCount() ?? 0,
      ),
    );
    this.registry.register(
      new Gauge(
        `${ANP}open_endpoint_connections`,
        'Connections to destinations (endpoints) open or being dialled',
        () => src()?.openEndpointConnections() ?? 0,
      ),
    );
    this.registry.register(
      new Gauge(
        `${OWN}memory_budget_bytes`,
        'Bytes this agent may hold on behalf of the hub (--memory-budget)',
        () => src()?.memory().limit ?? 0,
      ),
    );
    this.registry.register(
      new Gauge(
        `${OWN}memory_committed_bytes`,
        'Sum of the per-connection windows granted to the hub (what it may make us hold towards destinations)',
        () => src()?.memory().committed ?? 0,
      ),
    );
    this.registry.register(
      new Gauge(
        `${OWN}memory_held_bytes`,
        'Bytes from the hub held now, not yet written to their destinations',
        () => src()?.memory().held ?? 0,
      ),
    );
    if (opts.processMetrics) for (const m of processMetrics()) this.registry.register(m);
  }

  bind(source: AgentGaugeSource): void {
    this.source = source;
  }

  /**
   * Per segment, the series of streamPackets by packet type number (UNKNOWN_SLOT: every type without a
   * name): counted per packet, so resolved once and looked up without building a key.
   */
  private readonly packetSeries: Record<AgentSegment, Map<number, { inc(by?: number): void }>> = {
    from_agent: new Map(),
    to_agent: new Map(),
  };

  packet(segment: AgentSegment, packetType: number): void {
    const slot = typeof PacketType[packetType] === 'string' ? packetType : UNKNOWN_SLOT;
    const bySlot = this.packetSeries[segment];
    let series = bySlot.get(slot);
    if (!series) bySlot.set(slot, (series = this.streamPackets.child({ segment, packet_type: packetTypeLabel(packetType) })));
    series.inc();
  }

  /** A server stream ended with an error (ANP counts it twice: stream_errors_total and the deprecated failure count). */
  streamError(segment: AgentSegment, code: string, packetType = 'Unknown'): void {
    this.streamErrors.inc({ segment, code, packet_type: packetType });
    this.serverFailures.inc({ direction: segment === 'from_agent' ? 'to_server' : 'from_server' });
  }

  /** One replica list asked of the hub (ANP's lease list): seconds, HTTP status, reason ('' when it worked). */
  leaseList(seconds: number, httpResponseCode: number, reason = ''): void {
    const code = String(httpResponseCode);
    this.leaseLists.inc({ http_response_code: code, reason });
    this.leaseListLatency.observeWith({ http_response_code: code }, seconds);
  }

  async expose(): Promise<{ contentType: string; body: string }> {
    return { contentType: CONTENT_TYPE, body: await this.registry.collect() };
  }
}
