// The agent's health listener (default :8093): /healthz, /readyz (a tunnel to at least one server),
// and /debug/connections (the connection table, for operators and end-to-end tests).
import http from 'node:http';
import type { Agent } from './agent.js';

export function startAgentHealthServer(agent: Agent, host: string, port: number): Promise<http.Server> {
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://agent');
    const send = (code: number, body: string, type = 'text/plain; charset=utf-8'): void => {
      res.writeHead(code, { 'content-type': type });
      res.end(body);
    };
    switch (url.pathname) {
      case '/healthz':
        return send(200, 'ok\n');
      case '/readyz': {
        const ok = agent.connectedServers > 0;
        const line = ok ? '[+]server-connected ok' : `[-]server-connected failed: no servers connected${agent.lastConnectError ? ` (${agent.lastConnectError})` : ''}`;
        return send(ok ? 200 : 503, url.searchParams.has('verbose') ? `${line}\n${ok ? 'ok' : 'not ready'}\n` : ok ? 'ok\n' : `${line}\n`);
      }
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
