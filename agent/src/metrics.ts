// Every Prometheus metric of the agent, names and help texts in one place (SPEC §9). ANP's names
// (`konnectivity_network_proxy_agent_*`) where ANP has the metric, ours under `cluster_proxy_agent_*`.
// One Registry per Agent (never prom-client's global one). Labels hold values from small fixed sets
// only: never addresses, server IDs or connection IDs.
import { PacketType, type Packet } from '@cluster-proxy/proto';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

const ANP = 'konnectivity_network_proxy_agent_';
const OWN = 'cluster_proxy_agent_';

/** As ANP's agent reports them: from_agent = sent to a server, to_agent = received from one. */
export type AgentSegment = 'from_agent' | 'to_agent';

/** What the scrape-time gauges read from the live agent. */
export interface AgentGaugeSource {
  openServerConnections(): number;
  knownServerCount(): number;
  openEndpointConnections(): number;
}

export interface AgentMetricsOptions {
  /** Also export prom-client's process/Node.js metrics (once per process: the CLI turns it on). */
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
  readonly dialDuration = new Histogram({
    name: `${ANP}dial_duration_seconds`,
    help: 'Latency of successful dials to destinations (endpoints)',
    buckets: [0.005, 0.025, 0.1, 0.5, 2.5, 12.5, 30],
    registers: [this.registry],
  });
  readonly endpointDialFailures = new Counter({
    name: `${ANP}endpoint_dial_failure_total`,
    help: 'Dials to destinations that failed, by reason (timeout, endpoint, forbidden, draining, unknown)',
    labelNames: ['reason'] as const,
    registers: [this.registry],
  });
  readonly streamPackets = new Counter({
    name: `${ANP}stream_packets_total`,
    help: 'Packets on server streams, by segment (from_agent: sent, to_agent: received) and packet type',
    labelNames: ['segment', 'packet_type'] as const,
    registers: [this.registry],
  });
  readonly streamErrors = new Counter({
    name: `${ANP}stream_errors_total`,
    help: 'Server streams that ended with an error, by segment, code and packet type (Unknown for receive errors)',
    labelNames: ['segment', 'code', 'packet_type'] as const,
    registers: [this.registry],
  });

  // ---- ours
  readonly bytes = new Counter({
    name: `${OWN}bytes_total`,
    help: 'Payload bytes moved through tunneled connections, by direction (to_endpoint: written to destinations; to_server: read from them)',
    labelNames: ['direction'] as const,
    registers: [this.registry],
  });
  readonly flowControlStalls = new Counter({
    name: `${OWN}flow_control_stalls_total`,
    help: 'Times a connection ran out of flow-control credit towards the server and stopped reading its destination',
    registers: [this.registry],
  });
  readonly tunnelConnects = new Counter({
    name: `${OWN}tunnel_connects_total`,
    help: 'Attempts to open a tunnel (server stream), by result (ok, error, duplicate: a replica we already hold)',
    labelNames: ['result'] as const,
    registers: [this.registry],
  });
  readonly tunnelReconnects = new Counter({
    name: `${OWN}tunnel_reconnects_total`,
    help: 'Tunnels lost while running (not by our own stop or drain), after which the agent reconnects',
    registers: [this.registry],
  });

  constructor(opts: AgentMetricsOptions = {}) {
    const r = [this.registry];
    const src = (): AgentGaugeSource | null => this.source;
    new Gauge({
      name: `${ANP}open_server_connections`,
      help: 'Tunnels (server streams) this agent holds',
      registers: r,
      collect() { this.set(src()?.openServerConnections() ?? 0); },
    });
    new Gauge({
      name: `${ANP}known_server_count`,
      help: 'Number of server replicas the agent believes exist (from the serverCount header)',
      registers: r,
      collect() { this.set(src()?.knownServerCount() ?? 0); },
    });
    new Gauge({
      name: `${ANP}open_endpoint_connections`,
      help: 'Connections to destinations (endpoints) open or being dialled',
      registers: r,
      collect() { this.set(src()?.openEndpointConnections() ?? 0); },
    });
    if (opts.processMetrics) collectDefaultMetrics({ register: this.registry });
  }

  bind(source: AgentGaugeSource): void {
    this.source = source;
  }

  packet(segment: AgentSegment, p: Packet): void {
    this.streamPackets.inc({ segment, packet_type: packetTypeLabel(p.type) });
  }

  async expose(): Promise<{ contentType: string; body: string }> {
    return { contentType: this.registry.contentType, body: await this.registry.metrics() };
  }
}
