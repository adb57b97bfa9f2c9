// How the hub hands a caller's identity to agents of either kind, with real processes (a hub with
// --gateway-port, the agent in front of a recording HTTPS "apiserver"): an agent that announces the
// gateway-hmac capability gets identities authenticated by its link's TLS session key (no signature per
// request), over our transport and over gRPC; one that does not (--gateway-identity-mac off: as agents
// before the capability) still gets signed ones and is served the same. The hub's log says which a link uses.
import https from 'node:https';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RecordingApiserver } from '../src/fixtures/index.js';
import { startAgent, type AgentProcess, type HubProcess, type TestPki, type UserCert } from '../src/harness.js';
import { GATEWAY_SA_TOKEN, startGatewayHub, type GatewayHub } from '../src/e2e-setup.js';

let setup: GatewayHub;
let pki: TestPki;
let hub: HubProcess;
let api: RecordingApiserver;
let userCert: UserCert;
let oldAgent: AgentProcess | undefined;
let grpcAgent: AgentProcess | undefined;

/** GET `target` through the gateway as alice (client certificate): status and body. */
function get(target: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = https.request(
      {
        host: '127.0.0.1',
        port: hub.ports.gateway!,
        path: target,
        servername: 'localhost',
        agent: false,
        ca: pki.ca.certPem,
        cert: userCert.cert,
        key: userCert.key,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** Three GETs (a fresh connection and kept-alive ones) of `path`: each 200, alice impersonated with the agent's token. */
async function servedAsAlice(): Promise<void> {
  for (const target of ['/cluster1/version', '/cluster1/api/v1/namespaces/default/pods?limit=1', '/cluster1/version']) {
    const r = await get(target);
    expect(r.status, r.body).toBe(200);
    const seen = api.requests.at(-1)!;
    expect(seen.url).toBe(target.slice('/cluster1'.length));
    expect(seen.headers['authorization']).toEqual([`Bearer ${GATEWAY_SA_TOKEN}`]);
    expect(seen.headers['impersonate-user']).toEqual(['alice']);
    expect(Object.keys(seen.headers).filter((h) => h.startsWith('x-cluster-proxy'))).toEqual([]);
  }
}

beforeAll(async () => {
  setup = await startGatewayHub('cp-gateway-mac-');
  ({ pki, api, hub } = setup);
  userCert = await pki.user('alice', ['team-a']);
}, 60_000);

afterAll(async () => {
  await grpcAgent?.stop();
  await oldAgent?.stop();
  await setup?.stop();
});

describe('the identity hand-off by agent capability', () => {
  it("an agent with the capability: its link's key authenticates each identity", async () => {
    const connected = await hub.proc.waitForJsonLine((o) => o['msg'] === 'agent connected' && o['cluster'] === 'cluster1', 10_000);
    expect(connected['gatewayIdentityMac']).toBe(true);
    await servedAsAlice();
  });

  it('an agent without it (--gateway-identity-mac off) is served with signed identities', async () => {
    await setup.agent.stop();
    const mark = hub.proc.lineCount();
    oldAgent = await startAgent(pki, hub, {
      cluster: 'cluster1',
      apiserver: api.address,
      args: ['--gateway-kubeconfig', setup.agentKubeconfig, '--gateway-identity-mac', 'off'],
    });
    const connected = await hub.proc.waitForJsonLine((o) => o['msg'] === 'agent connected' && o['cluster'] === 'cluster1', 10_000, {
      after: mark,
    });
    expect(connected['gatewayIdentityMac']).toBe(false);
    await servedAsAlice();
  });

  it('an agent on gRPC (--transport grpc) takes the capability too: the key of its HTTP/2 connection', async () => {
    await oldAgent?.stop();
    oldAgent = undefined;
    const mark = hub.proc.lineCount();
    grpcAgent = await startAgent(pki, hub, {
      cluster: 'cluster1',
      apiserver: api.address,
      args: ['--gateway-kubeconfig', setup.agentKubeconfig, '--transport', 'grpc'],
    });
    const connected = await hub.proc.waitForJsonLine((o) => o['msg'] === 'agent connected' && o['cluster'] === 'cluster1', 10_000, {
      after: mark,
    });
    expect(connected['transport']).toBe('grpc');
    expect(connected['gatewayIdentityMac']).toBe(true);
    await servedAsAlice();
  });
});
