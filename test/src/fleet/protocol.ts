// What the fleet simulator (fleet.ts) and its agent processes (agents-child.ts) say to each other over IPC.

export interface FleetChildJob {
  index: number;
  hubAddress: string;
  caCertPath: string;
  /** The hub CA's key: the child signs its agents' certificates itself (in parallel with the other children). */
  caKeyPath: string;
  clusters: string[];
  /** Indexes (into `clusters`) of the agents that speak gRPC; the others speak mux. */
  grpc: number[];
  /** Every cluster's "apiserver": where a dial to CLUSTER:443 lands. */
  apiserver: string;
  leaseDurationMs: number;
  replicaSyncMs: number;
  /** Agents started per second (the first connects of a fleet spread out, as a real rollout would). */
  startPerSecond: number;
  certValidityDays: number;
  logLevel: string;
}

export type ChildRequest =
  | { type: 'status'; id: number }
  | { type: 'up-times'; id: number; since: number }
  | { type: 'kill'; id: number; cluster: string }
  | { type: 'stop'; id: number };

export type ChildReply =
  | { type: 'ready'; issuedSeconds: number }
  | { type: 'status'; id: number; connected: number; total: number; started: number; issuedSeconds: number; rssKiB: number }
  | { type: 'up-times'; id: number; times: (number | null)[] }
  | { type: 'killed'; id: number; found: boolean }
  | { type: 'stopped'; id: number };
