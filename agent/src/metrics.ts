// Every Prometheus metric of the agent, names and help texts in one place (contract §9). ANP's names
// (`konnectivity_network_proxy_agent_*`) where ANP has the metric, ours under `cluster_proxy_agent_*`.
// One Registry per Agent (proto's prometheus.ts: our own small exposition writer, not prom-client, for
// its memory). Labels hold values from small fixed sets only: never addresses, server IDs or connection IDs.
import { PacketType } from '@cluster-proxy/proto';
import { CONTENT_TYPE, Counter, Gauge, Histogram, Registry, processMetrics } from '@cluster-proxy/proto/prometheus';

const ANP = 'konnectivity_network_proxy_agent_';
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

function packetTypeLabel(type: number): string {
  const name = PacketType[type];
  return typeof name === 'string' ? name : 'Unknown';
}

export class AgentMetrics {
  readonly registry = new Registry();
  private source: AgentGaugeSource | null = null;

  // ---- ANP's
  readonly dialDuration = this.registry.register(new Histogram(`${ANP}dial_duration_seconds`, 'Latency of successful dials to destinations (endpoints)',
    [0.005, 0.025, 0.1, 0.5, 2.5, 12.5, 30]));
  readonly endpointDialFailures = this.registry.register(new Counter(`${ANP}endpoint_dial_failure_total`,
    'Dials to destinations that failed, by reason (timeout, endpoint, forbidden, draining, unknown)', ['reason'] as const));
  readonly streamPackets = this.registry.register(new Counter(`${ANP}stream_packets_total`,
    'Packets on server streams, by segment (from_agent: sent, to_agent: received) and packet type', ['segment', 'packet_type'] as const));
  readonly streamErrors = this.registry.register(new Counter(`${ANP}stream_errors_total`,
    'Server streams that ended with an error, by segment, code and packet type (Unknown for receive errors)', ['segment', 'code', 'packet_type'] as const));

  // ---- ours
  readonly bytes = this.registry.register(new Counter(`${OWN}bytes_total`,
    'Payload bytes moved through tunneled connections, by direction (to_endpoint: written to destinations; to_server: read from them)', ['direction'] as const));
  readonly flowControlStalls = this.registry.register(new Counter(`${OWN}flow_control_stalls_total`,
    'Times a connection ran out of flow-control credit towards the server and stopped reading its destination'));
  readonly tunnelConnects = this.registry.register(new Counter(`${OWN}tunnel_connects_total`,
    'Attempts to open a tunnel (server stream), by result (ok, error, duplicate: a replica we already hold)', ['result'] as const));
  readonly tunnelReconnects = this.registry.register(new Counter(`${OWN}tunnel_reconnects_total`,
    'Tunnels lost while running (not by our own stop or drain), after which the agent reconnects'));
  readonly memoryThrottled = this.registry.register(new Counter(`${OWN}memory_budget_throttled_total`,
    'Times a connection\'s window was kept from growing because the memory budget was short'));

  constructor(opts: AgentMetricsOptions = {}) {
    const src = (): AgentGaugeSource | null => this.source;
    this.registry.register(new Gauge(`${ANP}open_server_connections`, 'Tunnels (server streams) this agent holds', () => src()?.openServerConnections() ?? 0));
    this.registry.register(new Gauge(`${ANP}known_server_count`, 'Number of server replicas the agent believes exist (from the serverCount header)', () => src()?.knownServerCount() ?? 0));
    this.registry.register(new Gauge(`${ANP}open_endpoint_connections`, 'Connections to destinations (endpoints) open or being dialled', () => src()?.openEndpointConnections() ?? 0));
    this.registry.register(new Gauge(`${OWN}memory_budget_bytes`, 'Bytes this agent may hold on behalf of the hub (--memory-budget)', () => src()?.memory().limit ?? 0));
    this.registry.register(new Gauge(`${OWN}memory_committed_bytes`, 'Sum of the per-connection windows granted to the hub (what it may make us hold towards destinations)', () => src()?.memory().committed ?? 0));
    this.registry.register(new Gauge(`${OWN}memory_held_bytes`, 'Bytes from the hub held now, not yet written to their destinations', () => src()?.memory().held ?? 0));
    if (opts.processMetrics) for (const m of processMetrics()) this.registry.register(m);
  }

  bind(source: AgentGaugeSource): void {
    this.source = source;
  }

  /** Per segment and packet type, the series of streamPackets: counted per packet, so resolved once. */
  private readonly packetSeries = new Map<string, { inc(by?: number): void }>();

  packet(segment: AgentSegment, packetType: number): void {
    // Keyed by the label, not the type number: a peer's made-up types all count as Unknown, one entry.
    const type = packetTypeLabel(packetType);
    const k = `${segment} ${type}`;
    let series = this.packetSeries.get(k);
    if (!series) this.packetSeries.set(k, (series = this.streamPackets.child({ segment, packet_type: type })));
    series.inc();
  }

  async expose(): Promise<{ contentType: string; body: string }> {
    return { contentType: CONTENT_TYPE, body: this.registry.text() };
  }
}
