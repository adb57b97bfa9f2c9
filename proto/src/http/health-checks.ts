// Named health checks for /healthz and /readyz, answered the way Kubernetes components answer:
//   GET /readyz          200 "ok"                     | 503 with every check listed
//   GET /readyz?verbose  200/503, one line per check:  [+]listeners ok
//                                                      [-]store failed: connection refused
//   GET /readyz?exclude=store  skips a check (repeatable)
// Lives in proto (no dependencies) so the server and the agent share it.

/** Resolves (or returns) when healthy; throws an Error whose message says why not. */
export type CheckFn = () => void | Promise<void>;

export interface HealthCheck {
  /** Short, stable, no spaces: it appears in the output and in `?exclude=`. */
  name: string;
  check: CheckFn;
}

export interface CheckResult {
  name: string;
  ok: boolean;
  /** Why it failed (one line); empty when ok. */
  reason: string;
}

export const DEFAULT_CHECK_TIMEOUT_MS = 2000;

export class HealthChecks {
  private readonly checks: HealthCheck[] = [];

  /** `what` names the endpoint in the last line ("readyz", "healthz"). */
  constructor(
    readonly what: string,
    checks: readonly HealthCheck[] = [],
    private readonly timeoutMs = DEFAULT_CHECK_TIMEOUT_MS,
  ) {
    for (const c of checks) this.add(c);
  }

  add(check: HealthCheck): void {
    if (!/^[A-Za-z0-9_.-]+$/.test(check.name))
      throw new Error(`health check name "${check.name}" must be letters, digits, '.', '_' or '-'`);
    if (this.checks.some((c) => c.name === check.name)) throw new Error(`health check "${check.name}" is already registered`);
    this.checks.push(check);
  }

  get names(): string[] {
    return this.checks.map((c) => c.name);
  }

  /** Runs every check (in parallel, each bounded by the timeout), except the excluded ones. */
  async run(exclude: readonly string[] = []): Promise<{ ok: boolean; results: CheckResult[] }> {
    const results = await Promise.all(this.checks.filter((c) => !exclude.includes(c.name)).map((c) => this.runOne(c)));
    return { ok: results.every((r) => r.ok), results };
  }

  /** Status code and text body for a request URL (`verbose`, `exclude` query parameters). */
  async respond(url: URL): Promise<{ status: number; body: string }> {
    const { ok, results } = await this.run(url.searchParams.getAll('exclude'));
    if (ok && !url.searchParams.has('verbose')) return { status: 200, body: 'ok\n' };
    const lines = results.map((r) => (r.ok ? `[+]${r.name} ok` : `[-]${r.name} failed: ${r.reason}`));
    lines.push(`${this.what} check ${ok ? 'passed' : 'failed'}`);
    return { status: ok ? 200 : 503, body: `${lines.join('\n')}\n` };
  }

  private async runOne(c: HealthCheck): Promise<CheckResult> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${this.timeoutMs} ms`)), this.timeoutMs);
    });
    try {
      await Promise.race([Promise.resolve().then(c.check), timeout]);
      return { name: c.name, ok: true, reason: '' };
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      return { name: c.name, ok: false, reason: message.replace(/\s+/g, ' ').trim() || 'failed' };
    } finally {
      clearTimeout(timer);
    }
  }
}
