// What the client commands (token, kubeconfig, get) know about a hub on this machine: its data
// directory (tokens.json, ports.json, pki/) and its loopback admin endpoint.
import { readFileSync } from 'node:fs';
import { http } from '@cluster-proxy/proto';
import path from 'node:path';
import { TokenStore } from '@cluster-proxy/server';
import { UsageError, hostPort, str, type FlagSpecs, type ParsedFlags } from './flags.js';

export const DEFAULT_HUB_DATA_DIR = '.cluster-proxy/hub';
export const DEFAULT_ADMIN = '127.0.0.1:8095';
export const DEFAULT_CONNECT_PORT = 8089;

export const hubDataDirFlags: FlagSpecs = {
  'data-dir': { type: 'string', default: DEFAULT_HUB_DATA_DIR, help: "the hub's --data-dir (tokens.json, ports.json, pki/)" },
  'tokens-file': { type: 'string', help: "the hub's token file (default DATA_DIR/tokens.json)" },
};

export const adminFlag: FlagSpecs = {
  admin: { type: 'string', help: `the hub's loopback admin HOST:PORT (default: from DATA_DIR/ports.json, else ${DEFAULT_ADMIN})` },
};

export function tokensFile(flags: ParsedFlags): string {
  return str(flags, 'tokens-file') || path.join(str(flags, 'data-dir')!, 'tokens.json');
}

export async function openTokenStore(flags: ParsedFlags): Promise<TokenStore> {
  try {
    return await TokenStore.open(tokensFile(flags));
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

/** The ports a hub (or quickstart) wrote to DATA_DIR/ports.json, if there is one. */
export interface HubPorts {
  serverID?: string;
  agent?: number;
  frontend?: number | null;
  admin?: number | null;
  connect?: number | null;
  gateway?: number | null;
}

export function readHubPorts(dataDir: string): HubPorts | null {
  try {
    const doc = JSON.parse(readFileSync(path.join(dataDir, 'ports.json'), 'utf8')) as unknown;
    return typeof doc === 'object' && doc !== null ? (doc as HubPorts) : null;
  } catch {
    return null;
  }
}

export function adminAddress(flags: ParsedFlags): { host: string; port: number; text: string } {
  if (str(flags, 'admin')) {
    const hp = hostPort(flags, 'admin');
    return { ...hp, text: str(flags, 'admin')! };
  }
  const ports = readHubPorts(str(flags, 'data-dir')!);
  const text = typeof ports?.admin === 'number' ? `127.0.0.1:${ports.admin}` : DEFAULT_ADMIN;
  return { ...hostPort({ admin: text }, 'admin'), text };
}

export interface EstablishedConnection {
  connectID: number;
  address: string;
  state: string;
}

export interface AgentRow {
  agentID: string;
  cluster: string;
  draining: boolean;
  hosts: string[];
  pending: number;
  established: EstablishedConnection[];
}

export interface HubConnections {
  serverID: string;
  agents: AgentRow[];
  frontends: { state: string; connectID: number; address: string }[];
}

/** Thrown when the admin endpoint cannot be reached (the caller decides whether that is fatal). */
export class AdminUnreachable extends Error {
  override name = 'AdminUnreachable';
}

/** GET /debug/connections on the hub's admin listener. */
export function fetchConnections(admin: { host: string; port: number; text: string }, timeoutMs = 5000): Promise<HubConnections> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: admin.host, port: admin.port, path: '/debug/connections', timeout: timeoutMs, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => {
        if (res.statusCode !== 200)
          return reject(new Error(`the hub's admin endpoint ${admin.text} answered HTTP ${res.statusCode} to /debug/connections`));
        try {
          const doc = JSON.parse(body) as HubConnections;
          if (!Array.isArray(doc.agents)) throw new Error('no "agents"');
          resolve({ serverID: doc.serverID, agents: doc.agents, frontends: doc.frontends ?? [] });
        } catch (err) {
          reject(new Error(`the hub's admin endpoint ${admin.text} sent an unexpected answer: ${(err as Error).message}`));
        }
      });
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(Object.assign(new Error('timed out'), { code: 'ETIMEDOUT' })));
    req.on('error', (err: NodeJS.ErrnoException) => {
      reject(
        new AdminUnreachable(
          `cannot reach the hub's admin endpoint at ${admin.text} (${err.code ?? err.message}); is the hub running? (set --admin HOST:PORT or --data-dir)`,
        ),
      );
    });
  });
}

/** The hub's admin API answered with an error status; the message is the hub's one-line reason. */
export class AdminRequestError extends Error {
  override name = 'AdminRequestError';
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/**
 * A JSON request to the hub's loopback admin API (`/v1/...`). Unreachable → AdminUnreachable; an
 * error status → AdminRequestError carrying the hub's `{error}` text.
 */
export function adminRequest(
  admin: { host: string; port: number; text: string },
  method: 'GET' | 'POST' | 'DELETE',
  urlPath: string,
  body?: unknown,
  timeoutMs = 15_000,
): Promise<unknown> {
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: admin.host,
        port: admin.port,
        method,
        path: urlPath,
        timeout: timeoutMs,
        agent: false,
        headers: payload ? { 'content-type': 'application/json', 'content-length': payload.length } : {},
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (text += d));
        res.on('error', reject);
        res.on('end', () => {
          let doc: unknown = null;
          try {
            doc = text ? JSON.parse(text) : null;
          } catch {
            return reject(
              new Error(
                `the hub's admin endpoint ${admin.text} sent an answer to ${method} ${urlPath} that is not JSON (HTTP ${res.statusCode})`,
              ),
            );
          }
          const status = res.statusCode ?? 0;
          if (status >= 200 && status < 300) return resolve(doc);
          const why = typeof (doc as { error?: unknown } | null)?.error === 'string' ? (doc as { error: string }).error : `HTTP ${status}`;
          reject(new AdminRequestError(status, why));
        });
      },
    );
    req.on('timeout', () => req.destroy(Object.assign(new Error('timed out'), { code: 'ETIMEDOUT' })));
    req.on('error', (err: NodeJS.ErrnoException) => {
      reject(
        new AdminUnreachable(
          `cannot reach the hub's admin endpoint at ${admin.text} (${err.code ?? err.message}); is the hub running? (set --admin HOST:PORT or --data-dir)`,
        ),
      );
    });
    req.end(payload);
  });
}
