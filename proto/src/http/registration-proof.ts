// What an agent signs with its own private key when it asks the hub for a certificate (bootstrap
// and renewal): proof that it holds the key, without the key ever leaving the agent. Shared by the
// hub (server/src/registration.ts) and the agent (agent/src/credentials.ts). Also the health report
// the agent sends with each lease renewal (POST /v1/lease).

/** The agent's health report, the body of `POST /v1/lease` (agent/src/lease.ts → server/src/addon/manager.ts). */
export interface AgentHealthReport {
  agentID: string;
  leaseDurationSeconds: number;
  connectedServers: number;
  serverCount: number;
  apiserverReachable: boolean;
  apiserverError?: string;
  version: string;
  phase: 'Running' | 'Bootstrapping' | 'RenewingCredentials';
}

export function bootstrapProofMessage(cluster: string, tokenId: string): Buffer {
  return Buffer.from(`cluster-proxy-bootstrap\n${cluster}\n${tokenId}\n`);
}

export function renewProofMessage(cluster: string): Buffer {
  return Buffer.from(`cluster-proxy-renew\n${cluster}\n`);
}
