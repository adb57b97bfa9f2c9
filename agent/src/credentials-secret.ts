// `--credentials-secret NAME`: the agent's key, certificate and hub CA bundle also kept in a Secret of
// its own cluster. The credentials directory is an emptyDir in the install manifests, so without this a
// rescheduled pod, or a second replica, would find no certificate and only a bootstrap token that is
// already used. The directory stays the working copy; the Secret is read when the directory has
// nothing valid and written after every change.
import { ApiException, CoreV1Api, KubeConfig, type V1Secret } from '@kubernetes/client-node';

/** Somewhere outside the pod that keeps the credential files (name → content). */
export interface CredentialsMirror {
  /** For log lines: e.g. `Secret ns/name`. */
  readonly description: string;
  /** The files saved earlier, or null when nothing was saved yet. */
  load(): Promise<Map<string, Buffer> | null>;
  /** Saves these files, keeping others saved earlier. */
  save(files: Map<string, Buffer>): Promise<void>;
}

export class SecretCredentialsMirror implements CredentialsMirror {
  readonly description: string;

  constructor(private readonly api: CoreV1Api, private readonly namespace: string, private readonly name: string) {
    this.description = `Secret ${namespace}/${name}`;
  }

  /** In a pod: the service account (in-cluster config); elsewhere KUBECONFIG or ~/.kube/config, as kubectl. */
  static fromEnvironment(namespace: string, name: string): SecretCredentialsMirror {
    const kc = new KubeConfig();
    kc.loadFromDefault();
    return new SecretCredentialsMirror(kc.makeApiClient(CoreV1Api), namespace, name);
  }

  async load(): Promise<Map<string, Buffer> | null> {
    const secret = await this.read();
    if (!secret) return null;
    return new Map(Object.entries(secret.data ?? {}).map(([k, v]) => [k, Buffer.from(v, 'base64')]));
  }

  async save(files: Map<string, Buffer>): Promise<void> {
    const data = Object.fromEntries([...files].map(([k, v]) => [k, v.toString('base64')]));
    // Read-modify-write on resourceVersion; another replica writing at the same moment makes us retry.
    for (let attempt = 0; attempt < 5; attempt++) {
      const current = await this.read();
      try {
        if (!current) {
          await this.api.createNamespacedSecret({ namespace: this.namespace, body: { apiVersion: 'v1', kind: 'Secret', type: 'Opaque', metadata: { name: this.name, namespace: this.namespace, labels: { 'app.kubernetes.io/part-of': 'cluster-proxy' } }, data } });
        } else {
          await this.api.replaceNamespacedSecret({ name: this.name, namespace: this.namespace, body: { ...current, data: { ...current.data, ...data } } });
        }
        return;
      } catch (err) {
        if (err instanceof ApiException && err.code === 409) continue;
        throw new Error(`cannot write ${this.description}: ${apiMessage(err)}`);
      }
    }
    throw new Error(`cannot write ${this.description}: it kept changing under us`);
  }

  private async read(): Promise<V1Secret | null> {
    try {
      return await this.api.readNamespacedSecret({ name: this.name, namespace: this.namespace });
    } catch (err) {
      if (err instanceof ApiException && err.code === 404) return null;
      throw new Error(`cannot read ${this.description}: ${apiMessage(err)}`);
    }
  }
}

function apiMessage(err: unknown): string {
  if (err instanceof ApiException) {
    const body = typeof err.body === 'string' ? safeJson(err.body) : err.body;
    const msg = (body as { message?: unknown } | null)?.message;
    return typeof msg === 'string' ? `${msg} (HTTP ${err.code})` : `HTTP ${err.code}`;
  }
  return err instanceof Error ? err.message : String(err);
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
