// What an agent signs with its own private key when it asks the hub for a certificate (bootstrap
// and renewal): proof that it holds the key, without the key ever leaving the agent. Shared by the
// hub (server/src/registration.ts) and the agent (agent/src/credentials.ts).

export function bootstrapProofMessage(cluster: string, tokenId: string): Buffer {
  return Buffer.from(`cluster-proxy-bootstrap\n${cluster}\n${tokenId}\n`);
}

export function renewProofMessage(cluster: string): Buffer {
  return Buffer.from(`cluster-proxy-renew\n${cluster}\n`);
}
