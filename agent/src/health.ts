// The agent's health listener (default :8093): /healthz (liveness), /readyz (a tunnel to at least
// one server replica), both as named checks (`?verbose` lists them), /metrics (Prometheus) and
// /debug/connections (the connection table, for operators and end-to-end tests).
import { HealthChecks, type HealthCheck, http } from '@cluster-proxy/proto';
import type { Agent } from './agent.js';
import type * as HttpTypes from 'node:http';

export interface AgentHealthOptions {
  /** Extra /readyz checks besides `tunnel`. */
  readinessChecks?: HealthCheck[];
  /** Extra /healthz checks besides `ping`. */
  livenessChecks?: HealthCheck[];
}

/** The agent's /readyz checks: `tunnel` = a stream to at least one replica. */
export function agentReadiness(agent: Agent, extra: HealthCheck[] = []): HealthChecks {
  return new HealthChecks('readyz', [
    {
      name: 'tunnel',
      check: () => {
        if (agent.connectedServers > 0) return;
        throw new Error(`no tunnel to any proxy server${agent.lastConnectError ? ` (${agent.lastConnectError})` : ''}`);
      },
    },
    ...extra,
  ]);
}

export function startAgentHealthServer(agent: Agent, host: string, port: number, opts: AgentHealthOptions = {}): Promise<HttpTypes.Server> {
  const readiness = agentReadiness(agent, opts.readinessChecks);
  const liveness = new HealthChecks('healthz', [{ name: 'ping', check: () => undefined }, ...(opts.livenessChecks ?? [])]);
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://agent');
    const send = (code: number, body: string, type = 'text/plain; charset=utf-8'): void => {
      res.writeHead(code, { 'content-type': type });
      res.end(body);
    };
    const answer = (p: Promise<{ status: number; body: string; type?: string }>): void => {
      p.then(
        (r) => send(r.status, r.body, r.type),
        (err: Error) => send(500, `${err.message}\n`),
      );
    };
    switch (url.pathname) {
      case '/healthz':
      case '/livez':
        return answer(liveness.respond(url));
      case '/readyz':
        return answer(readiness.respond(url));
      case '/metrics':
        return answer(agent.metrics.expose().then((m) => ({ status: 200, body: m.body, type: m.contentType })));
      case '/debug/connections':
        return send(200, JSON.stringify({ ...agent.status(), handles: process.getActiveResourcesInfo() }), 'application/json');
      default:
        return send(404, 'not found\n');
    }
  });
  server.keepAliveTimeout = 1000;
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.removeListener('error', reject);
      resolve(server);
    });
  });
}
