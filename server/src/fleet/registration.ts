// Registration: single-use, expiring bootstrap tokens (kept in the hub store as Secrets, like
// Kubernetes bootstrap tokens: `<id>.<secret>`, only a hash stored), the hub API routes that turn a
// token into an agent certificate (`POST /v1/bootstrap`) and renew one (`POST /v1/renew`), and the
// registry that admits only agents of registered clusters and closes a removed cluster's tunnels.
// Agents send their public key and a signature made with the matching private key (proof of
// possession); the private key never leaves the agent.
import { createHash, createPublicKey, randomBytes, timingSafeEqual, verify } from 'node:crypto';
import type { PeerCertificate } from 'node:tls';
import type { Logger } from 'pino';
import { bootstrapProofMessage, renewProofMessage } from '@cluster-proxy/proto';
import { HubApiError, type HubApi } from './hub-api.js';
import { MIN_AGENT_RSA_BITS, clusterUidFromAltNames, signAgentPublicKey, type PemPair } from '../pki/certificates.js';
import { isDns1123Subdomain } from '../pki/agent-identity.js';
import type { ProxyCore } from '../dataplane/proxy-core.js';
import type { ManagedCluster, Secret } from '../store/objects.js';
import { ConflictError, NotFoundError, type Store, type Watch } from '../store/store.js';

export const BOOTSTRAP_TOKEN_TYPE = 'bootstrap.cluster-proxy.io/token';
const TOKEN_LABEL = 'cluster-proxy.io/bootstrap-token-id';
const TOKEN = /^([a-z0-9]{6})\.([a-z0-9]{16})$/;
const TOKEN_CHARS = 'abcdefghijklmnopqrstuvwxyz0123456789';

function randomToken(n: number): string {
  const bytes = randomBytes(n);
  let out = '';
  for (const b of bytes) out += TOKEN_CHARS[b % TOKEN_CHARS.length];
  return out;
}

const b64 = (s: string): string => Buffer.from(s).toString('base64');
const unb64 = (s: string | undefined): string => Buffer.from(s ?? '', 'base64').toString('utf8');
const sha256 = (s: string): string => createHash('sha256').update(s).digest('hex');

export function bootstrapSecretName(tokenId: string): string {
  return `cluster-proxy-bootstrap-${tokenId}`;
}

/** Issues a token for `cluster`; the returned string is the only copy of its secret part. */
export async function createBootstrapToken(
  store: Store,
  cluster: string,
  ttlSeconds: number,
  now = new Date(),
): Promise<{ token: string; expiresAt: Date }> {
  const id = randomToken(6);
  const secret = randomToken(16);
  const expiresAt = new Date(now.getTime() + ttlSeconds * 1000);
  const obj: Secret = {
    apiVersion: 'v1',
    kind: 'Secret',
    type: BOOTSTRAP_TOKEN_TYPE,
    metadata: { name: bootstrapSecretName(id), namespace: cluster, labels: { [TOKEN_LABEL]: id } },
    data: { 'token-id': b64(id), 'token-secret-sha256': b64(sha256(secret)), expiration: b64(expiresAt.toISOString()), used: b64('false') },
  };
  await store.create('Secret', obj);
  return { token: `${id}.${secret}`, expiresAt };
}

export async function revokeBootstrapTokens(store: Store, cluster: string): Promise<void> {
  const { items } = await store.list('Secret', { namespace: cluster });
  for (const s of items) {
    if (s.type !== BOOTSTRAP_TOKEN_TYPE) continue;
    await store.delete('Secret', { name: s.metadata.name, namespace: cluster }).catch((err: unknown) => {
      if (!(err instanceof NotFoundError)) throw err;
    });
  }
}

/**
 * Marks the token used if it is valid for `cluster`; throws HubApiError (401/403) naming what is
 * wrong — never echoing the token. Two concurrent uses: the store's optimistic concurrency lets one win.
 */
export async function consumeBootstrapToken(store: Store, cluster: string, token: string, now = new Date()): Promise<{ tokenId: string }> {
  const m = TOKEN.exec(token);
  if (!m) throw new HubApiError(401, 'bootstrap token is malformed (expected the <id>.<secret> value written by "cluster-proxy join")');
  const [, id, secret] = m as unknown as [string, string, string];
  const secretObj = await store.get('Secret', { name: bootstrapSecretName(id), namespace: cluster });
  if (!secretObj || secretObj.type !== BOOTSTRAP_TOKEN_TYPE) {
    const elsewhere = (await store.list('Secret', { labels: { [TOKEN_LABEL]: id } })).items.find((s) => s.type === BOOTSTRAP_TOKEN_TYPE);
    if (elsewhere) throw new HubApiError(403, `bootstrap token was issued for another cluster, not for cluster ${cluster}`);
    throw new HubApiError(401, `bootstrap token is unknown to the hub (revoked, or never issued for cluster ${cluster})`);
  }
  const want = Buffer.from(unb64(secretObj.data?.['token-secret-sha256']));
  const got = Buffer.from(sha256(secret));
  if (want.length !== got.length || !timingSafeEqual(want, got))
    throw new HubApiError(401, 'bootstrap token does not match (wrong secret part)');
  const expiration = Date.parse(unb64(secretObj.data?.['expiration']));
  if (!(expiration > now.getTime()))
    throw new HubApiError(
      401,
      `bootstrap token expired at ${new Date(expiration).toISOString()}; run "cluster-proxy join ${cluster}" again for a new one`,
    );
  if (unb64(secretObj.data?.['used']) === 'true')
    throw new HubApiError(401, 'bootstrap token already used (tokens are single use); run "cluster-proxy join" again for a new one');
  try {
    await store.update('Secret', { ...secretObj, data: { ...secretObj.data, used: b64('true'), 'used-at': b64(now.toISOString()) } });
  } catch (err) {
    if (err instanceof ConflictError)
      throw new HubApiError(401, 'bootstrap token already used (tokens are single use); run "cluster-proxy join" again for a new one');
    throw err;
  }
  return { tokenId: id };
}

export interface RegistrationOptions {
  store: Store;
  /** Signs agent certificates (the newest CA of the bundle); read per request, so a CA rollover takes effect at once. */
  signer: () => PemPair;
  /** PEM bundle agents trust for the hub (two CAs during a rollover). */
  caBundle: () => string;
  /** Agent certificate lifetime (default 180 days). */
  certValidityDays?: number;
  log: Logger;
}

interface KeyRequest {
  publicKey: string;
  proof: string;
}

function parseKeyRequest(body: unknown, extra: string[]): KeyRequest & Record<string, string> {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new HubApiError(400, 'expected a JSON object');
  const b = body as Record<string, unknown>;
  for (const k of ['publicKey', 'proof', ...extra])
    if (typeof b[k] !== 'string' || b[k] === '') throw new HubApiError(400, `"${k}" must be a non-empty string`);
  return b as KeyRequest & Record<string, string>;
}

function checkProof(req: KeyRequest, message: Buffer): void {
  let ok = false;
  let key;
  try {
    key = createPublicKey(req.publicKey);
    ok = verify('sha256', message, key, Buffer.from(req.proof, 'base64'));
  } catch {
    throw new HubApiError(400, 'publicKey is not a PEM public key');
  }
  // Checked here, before a bootstrap token is spent on a key the CA would refuse to sign.
  if (key.asymmetricKeyType !== 'rsa' || (key.asymmetricKeyDetails?.modulusLength ?? 0) < MIN_AGENT_RSA_BITS) {
    throw new HubApiError(400, `agent public key must be RSA with at least ${MIN_AGENT_RSA_BITS} bits`);
  }
  if (!ok) throw new HubApiError(400, 'proof does not verify with publicKey: the agent must sign with the key it asks a certificate for');
}

async function acceptedCluster(store: Store, cluster: string): Promise<ManagedCluster> {
  const mc = await store.get('ManagedCluster', { name: cluster });
  if (!mc || mc.metadata.deletionTimestamp) throw new HubApiError(403, `cluster ${cluster} is not registered with the hub`);
  if (!mc.spec.hubAcceptsClient)
    throw new HubApiError(403, `cluster ${cluster} is registered but the hub does not accept it (hubAcceptsClient: false)`);
  return mc;
}

export function registerRegistrationRoutes(api: HubApi, opts: RegistrationOptions): void {
  api.route(
    'POST',
    '/v1/bootstrap',
    async (req) => {
      const body = parseKeyRequest(req.body, ['cluster', 'token']);
      const cluster = body['cluster']!;
      if (!isDns1123Subdomain(cluster)) throw new HubApiError(400, `"${cluster}" is not a valid cluster name`);
      const id = TOKEN.exec(body['token']!)?.[1];
      if (!id)
        throw new HubApiError(401, 'bootstrap token is malformed (expected the <id>.<secret> value written by "cluster-proxy join")');
      checkProof(body, bootstrapProofMessage(cluster, id));
      const mc = await acceptedCluster(opts.store, cluster);
      await consumeBootstrapToken(opts.store, cluster, body['token']!);
      const certificate = sign(opts, cluster, mc, body.publicKey);
      opts.log.info({ cluster, peer: req.caller.peer }, 'agent bootstrapped: certificate issued');
      return { status: 200, body: { certificate, caBundle: opts.caBundle() } };
    },
    { agentOnly: false },
  );

  api.route(
    'POST',
    '/v1/renew',
    async (req) => {
      const cluster = req.caller.agent!.cluster;
      const body = parseKeyRequest(req.body, []);
      checkProof(body, renewProofMessage(cluster));
      const mc = await acceptedCluster(opts.store, cluster);
      const uid = clusterUidFromAltNames(req.caller.certificate?.subjectaltname);
      if (uid !== null && uid !== mc.metadata.uid)
        throw new HubApiError(403, `certificate belongs to an earlier registration of cluster ${cluster}`);
      const certificate = sign(opts, cluster, mc, body.publicKey);
      opts.log.info({ cluster, peer: req.caller.peer }, 'agent certificate renewed');
      return { status: 200, body: { certificate, caBundle: opts.caBundle() } };
    },
    { agentOnly: true },
  );
}

function sign(opts: RegistrationOptions, cluster: string, mc: ManagedCluster, publicKeyPem: string): string {
  const lifetimeMs = (opts.certValidityDays ?? 180) * 86_400_000;
  const now = Date.now();
  // Backdate a little for clock skew, but never so much that the agent's 80 % renewal point has passed already.
  const notBefore = new Date(now - Math.min(5 * 60_000, lifetimeMs / 10));
  try {
    return signAgentPublicKey(opts.signer(), {
      cluster,
      publicKeyPem,
      clusterUid: mc.metadata.uid,
      notBefore,
      notAfter: new Date(now + lifetimeMs),
    });
  } catch (err) {
    throw new HubApiError(400, (err as Error).message);
  }
}

/**
 * Which clusters may connect, kept from a watch on ManagedCluster: agents of a cluster that is not
 * registered, not accepted, or whose certificate names an earlier incarnation (uid) are refused, and a
 * removed cluster's connected agents are cut. Certificates without a uid (issued by hand from the hub
 * CA, as in ANP set-ups) are admitted for unregistered clusters unless `strict`; only CA rotation revokes those.
 */
export class ClusterRegistry {
  private readonly clusters = new Map<string, { uid: string | undefined; accepts: boolean }>();
  private watch: Watch | null = null;
  private synced = false;

  constructor(
    private readonly store: Store,
    private readonly core: ProxyCore,
    private readonly log: Logger,
    private readonly strict: boolean,
  ) {}

  async start(): Promise<void> {
    const list = await this.store.list('ManagedCluster');
    // A relist after a broken watch replaces the table: a cluster removed meanwhile loses its tunnels now.
    const before = new Map(this.clusters);
    this.clusters.clear();
    for (const mc of list.items)
      this.clusters.set(mc.metadata.name, { uid: mc.metadata.uid, accepts: mc.spec.hubAcceptsClient && !mc.metadata.deletionTimestamp });
    for (const [name, old] of before) {
      const now = this.clusters.get(name);
      if (!now) this.cut(name, 'cluster removed from the hub');
      else if (old.accepts && !now.accepts) this.cut(name, 'cluster no longer accepted by the hub');
    }
    this.synced = true;
    this.watch = this.store.watch(
      'ManagedCluster',
      { resourceVersion: list.resourceVersion },
      {
        onEvent: (e) => {
          const name = e.object.metadata.name;
          if (e.type === 'DELETED') this.clusters.delete(name);
          else
            this.clusters.set(name, {
              uid: e.object.metadata.uid,
              accepts: e.object.spec.hubAcceptsClient && !e.object.metadata.deletionTimestamp,
            });
          if (e.type === 'DELETED' || !this.clusters.get(name)?.accepts)
            this.cut(name, e.type === 'DELETED' ? 'cluster removed from the hub' : 'cluster no longer accepted by the hub');
        },
        onError: (err) => {
          this.log.warn({ err: err.message }, 'cluster registry watch ended; listing again');
          this.watch = null;
          void this.start().catch((e: Error) => this.log.error({ err: e.message }, 'cluster registry cannot list ManagedClusters'));
        },
      },
    );
  }

  stop(): void {
    this.watch?.stop();
    this.watch = null;
  }

  check(cluster: string, cert: PeerCertificate): string | null {
    if (!this.synced) return 'hub is starting (registry not loaded yet); retry';
    const entry = this.clusters.get(cluster);
    const uid = clusterUidFromAltNames(cert.subjectaltname);
    if (!entry) {
      // Hand-issued certificates (no uid) keep working unless the hub requires registration (ANP-style set-ups).
      if (uid === null && !this.strict) return null;
      return `cluster ${cluster} is not registered with the hub (run "cluster-proxy join ${cluster}")`;
    }
    if (!entry.accepts) return `cluster ${cluster} is not accepted by the hub (hubAcceptsClient: false)`;
    if (uid !== null && uid !== entry.uid)
      return `certificate belongs to an earlier registration of cluster ${cluster}; bootstrap the agent again`;
    return null;
  }

  private cut(cluster: string, why: string): void {
    const victims = this.core.routes.backends().filter((b) => b.cluster === cluster);
    if (victims.length === 0) return;
    this.log.warn({ cluster, agents: victims.length }, `closing the tunnels of cluster ${cluster}: ${why}`);
    for (const b of victims) b.close(why);
  }
}
