// The few Kubernetes API calls the agent makes (its credentials Secret), over node:http(s) with the
// service-account token. Not @kubernetes/client-node: importing it alone added ~65 MiB to an agent that
// otherwise idles under 60 MiB (measured: `import('@cluster-proxy/agent')` 113.8 MiB with it, 49 MiB
// without), for three REST calls. Connection settings are found as client-node and kubectl find them:
// $KUBECONFIG (its first file), else ~/.kube/config, else the in-cluster service account.
import { existsSync, readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { http } from '@cluster-proxy/proto';
import https from 'node:https';
import tls from 'node:tls';
import os from 'node:os';
import path from 'node:path';

const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';
const REQUEST_TIMEOUT_MS = 15_000;
const MAX_RESPONSE_BYTES = 4 * 1024 * 1024;

export interface KubeRestConfig {
  server: URL;
  /** Where the settings came from, for error messages. */
  source: string;
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
  token?: string;
  /** Read again once a minute (bearerToken): projected service-account tokens are rotated by kubelet. */
  tokenFile?: string;
  insecureSkipTlsVerify?: boolean;
}

export class KubeConfigError extends Error {
  override name = 'KubeConfigError';
}

/** An answer with a status outside 2xx; `message` is the apiserver's Status message when it sent one. */
export class KubeApiError extends Error {
  override name = 'KubeApiError';
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** $KUBECONFIG, else ~/.kube/config, else the in-cluster service account (as client-node's loadFromDefault). */
export async function loadKubeRestConfig(env: NodeJS.ProcessEnv = process.env): Promise<KubeRestConfig> {
  const fromEnv = env['KUBECONFIG']?.split(path.delimiter).find((f) => f !== '');
  if (fromEnv) return fromKubeconfig(fromEnv);
  const home = path.join(env['HOME'] ?? os.homedir(), '.kube', 'config');
  if (existsSync(home)) return fromKubeconfig(home);
  return inCluster(env);
}

function inCluster(env: NodeJS.ProcessEnv): KubeRestConfig {
  const host = env['KUBERNETES_SERVICE_HOST'];
  const port = env['KUBERNETES_SERVICE_PORT'] ?? '443';
  if (!host)
    throw new KubeConfigError(
      'no Kubernetes API settings: KUBECONFIG is not set, ~/.kube/config does not exist, and this is not a pod (KUBERNETES_SERVICE_HOST is not set)',
    );
  const tokenFile = path.join(SERVICE_ACCOUNT_DIR, 'token');
  if (!existsSync(tokenFile)) throw new KubeConfigError(`in a pod, but ${tokenFile} is missing (automountServiceAccountToken: false?)`);
  const hostPart = host.includes(':') ? `[${host}]` : host;
  return {
    server: new URL(`https://${hostPart}:${port}`),
    source: 'the in-cluster service account',
    ca: readFileSync(path.join(SERVICE_ACCOUNT_DIR, 'ca.crt')),
    tokenFile,
  };
}

type Named<T> = { name?: string } & T;
interface KubeconfigDoc {
  'current-context'?: string;
  contexts?: Named<{ context?: { cluster?: string; user?: string } }>[];
  clusters?: Named<{
    cluster?: {
      server?: string;
      'certificate-authority'?: string;
      'certificate-authority-data'?: string;
      'insecure-skip-tls-verify'?: boolean;
    };
  }>[];
  users?: Named<{ user?: Record<string, unknown> }>[];
}

/** The current context of a kubeconfig: server, CA, and a token or client certificate. */
export async function fromKubeconfig(file: string): Promise<KubeRestConfig> {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new KubeConfigError(`cannot read kubeconfig ${file}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
  }
  const doc = await parseKubeconfig(text, file);
  const dir = path.dirname(file);
  const contextName = doc['current-context'];
  const context = doc.contexts?.find((c) => c.name === contextName)?.context;
  if (!context)
    throw new KubeConfigError(`kubeconfig ${file}: current-context ${JSON.stringify(contextName ?? '')} is not among its contexts`);
  const cluster = doc.clusters?.find((c) => c.name === context.cluster)?.cluster;
  if (!cluster?.server) throw new KubeConfigError(`kubeconfig ${file}: cluster ${JSON.stringify(context.cluster ?? '')} has no server`);
  const user = doc.users?.find((u) => u.name === context.user)?.user ?? {};
  let server: URL;
  try {
    server = new URL(cluster.server);
  } catch {
    throw new KubeConfigError(`kubeconfig ${file}: server ${JSON.stringify(cluster.server)} is not a URL`);
  }
  const bytes = (data: unknown, fileField: unknown, what: string): Buffer | undefined => {
    if (typeof data === 'string' && data !== '') return Buffer.from(data, 'base64');
    if (typeof fileField === 'string' && fileField !== '') {
      try {
        return readFileSync(path.resolve(dir, fileField));
      } catch (err) {
        throw new KubeConfigError(
          `kubeconfig ${file}: cannot read ${what} ${fileField}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`,
        );
      }
    }
    return undefined;
  };
  for (const unsupported of ['exec', 'auth-provider']) {
    if (user[unsupported] !== undefined)
      throw new KubeConfigError(
        `kubeconfig ${file}: user "${context.user}" uses ${unsupported}, which the agent does not run; give it a token or a client certificate`,
      );
  }
  const config: KubeRestConfig = { server, source: `kubeconfig ${file}` };
  const ca = bytes(cluster['certificate-authority-data'], cluster['certificate-authority'], 'certificate-authority');
  const cert = bytes(user['client-certificate-data'], user['client-certificate'], 'client-certificate');
  const key = bytes(user['client-key-data'], user['client-key'], 'client-key');
  if (ca) config.ca = ca;
  if (cert) config.cert = cert;
  if (key) config.key = key;
  if (typeof user['token'] === 'string' && user['token'] !== '') config.token = user['token'];
  if (typeof user['tokenFile'] === 'string' && user['tokenFile'] !== '') config.tokenFile = path.resolve(dir, user['tokenFile']);
  if (cluster['insecure-skip-tls-verify'] === true) config.insecureSkipTlsVerify = true;
  return config;
}

/** JSON, or YAML through the `yaml` library, loaded only here (a pod uses the service account instead). */
async function parseKubeconfig(text: string, file: string): Promise<KubeconfigDoc> {
  try {
    if (/^\s*\{/.test(text)) return JSON.parse(text) as KubeconfigDoc;
    const { parse } = await import('yaml');
    const doc = parse(text) as unknown;
    if (typeof doc !== 'object' || doc === null || Array.isArray(doc))
      throw new Error('expected a map (apiVersion, clusters, contexts, users)');
    return doc as KubeconfigDoc;
  } catch (err) {
    throw new KubeConfigError(`kubeconfig ${file}: ${(err as Error).message.split('\n')[0]}`);
  }
}

/**
 * How long a token read from `tokenFile` is used before the file is read again: client-go's cached file token
 * source (one minute). Kubelet rotates a projected token when 80 % of its life (an hour by default) has passed,
 * so the one read last stays valid long after.
 */
export const TOKEN_FILE_MAX_AGE_MS = 60_000;
const tokenReads = new WeakMap<KubeRestConfig, { token: string; readAt: number }>();

/** The bearer token of `config`: its token, or what its tokenFile held at most TOKEN_FILE_MAX_AGE_MS ago. */
export async function bearerToken(config: KubeRestConfig, now: number = Date.now()): Promise<string | undefined> {
  if (!config.tokenFile) return config.token;
  const last = tokenReads.get(config);
  if (last && now >= last.readAt && now - last.readAt < TOKEN_FILE_MAX_AGE_MS) return last.token;
  const token = (await readFile(config.tokenFile, 'utf8')).trim();
  tokenReads.set(config, { token, readAt: now });
  return token;
}

const contexts = new WeakMap<KubeRestConfig, tls.SecureContext>();

/**
 * TLS for requests to `config`'s server: one SecureContext for its CA and client certificate, made once. Given as
 * `ca`, `cert` and `key`, Node's https.Agent would decode all three into its pool key on every request, and each
 * new connection would build a context of its own. Without a CA, Node's root certificates, as before.
 */
export function kubeTls(config: KubeRestConfig): { secureContext: tls.SecureContext; rejectUnauthorized: boolean } {
  let secureContext = contexts.get(config);
  if (!secureContext) {
    secureContext = tls.createSecureContext({
      ...(config.ca ? { ca: config.ca } : {}),
      ...(config.cert ? { cert: config.cert } : {}),
      ...(config.key ? { key: config.key } : {}),
    });
    contexts.set(config, secureContext);
  }
  return { secureContext, rejectUnauthorized: !config.insecureSkipTlsVerify };
}

/** One JSON request; resolves with the status and parsed body (null when empty). */
export async function kubeRequest(
  config: KubeRestConfig,
  method: 'GET' | 'POST' | 'PUT',
  apiPath: string,
  body?: unknown,
): Promise<{ status: number; body: unknown }> {
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  const token = await bearerToken(config);
  const url = new URL(apiPath, config.server);
  const isHttps = url.protocol === 'https:';
  const options: https.RequestOptions = {
    method,
    hostname: url.hostname.replace(/^\[(.*)\]$/, '$1'),
    port: url.port || (isHttps ? 443 : 80),
    path: `${url.pathname}${url.search}`,
    timeout: REQUEST_TIMEOUT_MS,
    agent: false,
    headers: {
      accept: 'application/json',
      ...(payload ? { 'content-type': 'application/json', 'content-length': payload.length } : {}),
      ...(token ? { authorization: `Bearer ${token}` } : {}),
    },
    ...(isHttps ? kubeTls(config) : {}),
  };
  return new Promise((resolve, reject) => {
    const req = (isHttps ? https : http).request(options, (res) => {
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (c: Buffer) => {
        size += c.length;
        if (size > MAX_RESPONSE_BYTES) req.destroy(new Error(`answer larger than ${MAX_RESPONSE_BYTES} bytes`));
        else chunks.push(c);
      });
      res.on('error', reject);
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        let parsed: unknown = null;
        try {
          parsed = text === '' ? null : JSON.parse(text);
        } catch {
          parsed = text;
        }
        resolve({ status: res.statusCode ?? 0, body: parsed });
      });
    });
    req.on('timeout', () => req.destroy(new Error(`no answer within ${REQUEST_TIMEOUT_MS / 1000} s`)));
    req.on('error', (err: NodeJS.ErrnoException) =>
      reject(new Error(`${method} ${url.origin}${url.pathname} (${config.source}): ${err.code ?? err.message}`)),
    );
    req.end(payload);
  });
}

/** "message (HTTP 403)" from an apiserver's Status body, or "HTTP 403". */
export function statusMessage(status: number, body: unknown): string {
  const msg = (body as { message?: unknown } | null)?.message;
  return typeof msg === 'string' ? `${msg} (HTTP ${status})` : `HTTP ${status}`;
}
