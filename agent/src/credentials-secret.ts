// `--credentials-secret NAME`: the agent's key, certificate and hub CA bundle also kept in a Secret of
// its own cluster. The credentials directory is an emptyDir in the install manifests, so without this a
// rescheduled pod, or a second replica, would find no certificate and only a bootstrap token that is
// already used. The directory stays the working copy; the Secret is read when the directory has
// nothing valid and written after every change.
import { KubeApiError, kubeRequest, loadKubeRestConfig, statusMessage, type KubeRestConfig } from './kube-rest.js';

interface Secret {
  apiVersion: 'v1';
  kind: 'Secret';
  metadata: { name: string; namespace: string; resourceVersion?: string; labels?: Record<string, string> };
  type?: string;
  data?: Record<string, string>;
}

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
  private readonly path: string;

  constructor(
    private readonly config: KubeRestConfig,
    private readonly namespace: string,
    private readonly name: string,
  ) {
    this.description = `Secret ${namespace}/${name}`;
    this.path = `/api/v1/namespaces/${encodeURIComponent(namespace)}/secrets`;
  }

  /** In a pod: the service account (in-cluster config); elsewhere KUBECONFIG or ~/.kube/config, as kubectl. */
  static async fromEnvironment(namespace: string, name: string): Promise<SecretCredentialsMirror> {
    return new SecretCredentialsMirror(await loadKubeRestConfig(), namespace, name);
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
      const r = current
        ? await this.call(
            'PUT',
            `${this.path}/${encodeURIComponent(this.name)}`,
            { ...current, data: { ...current.data, ...data } },
            'write',
          )
        : await this.call(
            'POST',
            this.path,
            {
              apiVersion: 'v1',
              kind: 'Secret',
              type: 'Opaque',
              metadata: { name: this.name, namespace: this.namespace, labels: { 'app.kubernetes.io/part-of': 'cluster-proxy' } },
              data,
            },
            'write',
          );
      if (r.status === 409) continue;
      if (r.status >= 200 && r.status < 300) return;
      throw new KubeApiError(r.status, `cannot write ${this.description}: ${statusMessage(r.status, r.body)}`);
    }
    throw new Error(`cannot write ${this.description}: it kept changing under us`);
  }

  private async read(): Promise<Secret | null> {
    const r = await this.call('GET', `${this.path}/${encodeURIComponent(this.name)}`, undefined, 'read');
    if (r.status === 404) return null;
    if (r.status < 200 || r.status >= 300)
      throw new KubeApiError(r.status, `cannot read ${this.description}: ${statusMessage(r.status, r.body)}`);
    return r.body as Secret;
  }

  private async call(
    method: 'GET' | 'POST' | 'PUT',
    apiPath: string,
    body: unknown,
    what: 'read' | 'write',
  ): Promise<{ status: number; body: unknown }> {
    try {
      return await kubeRequest(this.config, method, apiPath, body);
    } catch (err) {
      throw new Error(`cannot ${what} ${this.description}: ${(err as Error).message}`);
    }
  }
}
