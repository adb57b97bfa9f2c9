// `cluster-proxy token issue|list|revoke`: the bearer tokens of the hub's HTTP CONNECT frontend,
// kept in the hub's token file (DATA_DIR/tokens.json). The hub notices changes on the next request,
// so a revocation takes effect without a restart. The secret is printed once, on stdout, by
// `issue`; the file holds only its SHA-256, and nothing here logs it.
import type { TokenInfo, TokenStore } from '@cluster-proxy/server';
import { UsageError, duration, helpText, list, parseFlags, str, type FlagSpecs, type ParsedFlags } from './flags.js';
import { hubDataDirFlags, openTokenStore, tokensFile } from './hub-files.js';
import { age, table } from './ui.js';
import { toKubectlYaml as toYaml, type YamlValue } from '@cluster-proxy/server';

export const DEFAULT_TOKEN_TTL = '24h';

const issueFlags: FlagSpecs = {
  name: { type: 'string', help: 'a unique name for the token (who or what uses it); required' },
  cluster: { type: 'string', multiple: true, help: 'a cluster the token may reach; "*" or none for every cluster' },
  ttl: { type: 'string', default: DEFAULT_TOKEN_TTL, help: 'lifetime, e.g. 1h, 24h, 30d; 0 = never expires' },
  output: { type: 'string', short: 'o', help: 'json or yaml: print id, name, token and expiry as a document instead of the bare token' },
  ...hubDataDirFlags,
};

const listFlags: FlagSpecs = {
  output: { type: 'string', short: 'o', help: 'json or yaml instead of a table' },
  ...hubDataDirFlags,
};

const revokeFlags: FlagSpecs = { ...hubDataDirFlags };

export const tokenUsage = `Usage: cluster-proxy token issue|list|revoke [flags]

Manages the bearer tokens of the hub's HTTP CONNECT frontend (kubectl's proxy-url, curl
--proxy-header, any HTTP client): DATA_DIR/tokens.json of the hub, read again by the hub on change.

Commands:
  issue --name NAME [--cluster C]... [--ttl 24h]   create a token; prints it once, on stdout
  list                                            the tokens (never their secrets)
  revoke ID|NAME                                  delete a token; the hub refuses it from then on

Run "cluster-proxy token COMMAND --help" for a command's flags.
`;

const issueUsage = helpText(
  'cluster-proxy token issue --name NAME [--cluster C]... [--ttl 24h]',
  'Creates a token and prints it once on stdout (details on stderr). Only its SHA-256 is stored.',
  issueFlags,
);
const listUsage = helpText(
  'cluster-proxy token list [-o json|yaml]',
  'Lists the tokens: name, id, clusters, age, expiry. Secrets are never shown.',
  listFlags,
);
const revokeUsage = helpText('cluster-proxy token revoke ID|NAME', 'Deletes a token; the hub refuses it on the next request.', revokeFlags);

/** --ttl as seconds, or undefined for "never". */
export function ttlSeconds(flags: ParsedFlags, name = 'ttl'): number | undefined {
  const ms = duration(flags, name);
  return ms === 0 ? undefined : Math.max(1, Math.round(ms / 1000));
}

/** Clusters from repeated --cluster flags (comma-separated too); none or "*" = every cluster. */
export function clustersOf(flags: ParsedFlags): string[] | '*' {
  const cs = list(flags, 'cluster')
    .flatMap((c) => c.split(','))
    .map((c) => c.trim())
    .filter(Boolean);
  if (cs.length === 0 || cs.includes('*')) return '*';
  return cs;
}

/** TokenStore.issue's complaints about its input are the user's mistake (exit 2). */
export async function issueToken(
  store: TokenStore,
  o: { name: string; clusters: string[] | '*'; ttlSeconds?: number },
): ReturnType<TokenStore['issue']> {
  try {
    return await store.issue(o);
  } catch (err) {
    const msg = (err as Error).message;
    if (/^(invalid|a token named)/.test(msg)) throw new UsageError(msg);
    throw err;
  }
}

function outputFormat(flags: ParsedFlags, allowed: string[]): string | undefined {
  const o = str(flags, 'output');
  if (o !== undefined && !allowed.includes(o)) throw new UsageError(`-o must be ${allowed.join(' or ')}, got "${o}"`);
  return o;
}

function expiresText(t: TokenInfo, now: number): string {
  if (t.expiresAt === null) return '<never>';
  const ms = Date.parse(t.expiresAt) - now;
  if (ms <= 0) return 'expired';
  const h = ms / 3_600_000;
  return h >= 48 ? `${Math.floor(h / 24)}d` : h >= 2 ? `${Math.floor(h)}h` : `${Math.max(1, Math.floor(ms / 60_000))}m`;
}

export async function runToken(args: string[]): Promise<void> {
  const [sub, ...rest] = args;
  if (!sub || sub === '--help' || sub === '-h' || sub === 'help') {
    process.stdout.write(tokenUsage);
    if (!sub) throw new UsageError('token needs a command: issue, list or revoke');
    return;
  }
  if (sub === 'issue') {
    const { flags, positionals } = parseFlags(rest, issueFlags);
    if (flags['help']) return void process.stdout.write(issueUsage);
    if (positionals.length > 0)
      throw new UsageError(`token issue takes no arguments (got "${positionals[0]}"); name the token with --name`);
    const name = str(flags, 'name');
    if (!name) throw new UsageError('token issue needs --name NAME (who or what will use the token)');
    const format = outputFormat(flags, ['json', 'yaml']);
    const clusters = clustersOf(flags);
    const ttl = ttlSeconds(flags);
    const store = await openTokenStore(flags);
    const t = await issueToken(store, { name, clusters, ttlSeconds: ttl });
    const doc = { id: t.id, name: t.name, token: t.token, clusters: clusters === '*' ? '*' : clusters, expiresAt: t.expiresAt };
    if (format === 'json') process.stdout.write(`${JSON.stringify(doc, null, 2)}\n`);
    else if (format === 'yaml') process.stdout.write(toYaml(doc as YamlValue));
    else process.stdout.write(`${t.token}\n`);
    const scope = clusters === '*' ? 'every cluster' : `cluster${clusters.length > 1 ? 's' : ''} ${clusters.join(', ')}`;
    process.stderr.write(
      `Issued token "${t.name}" (id ${t.id}) for ${scope}, ${t.expiresAt ? `expires ${t.expiresAt}` : 'never expires'}; it is shown only this once. Stored (as a hash) in ${tokensFile(flags)}.\n`,
    );
    return;
  }
  if (sub === 'list' || sub === 'ls') {
    const { flags, positionals } = parseFlags(rest, listFlags);
    if (flags['help']) return void process.stdout.write(listUsage);
    if (positionals.length > 0) throw new UsageError(`token list takes no arguments (got "${positionals[0]}")`);
    const format = outputFormat(flags, ['json', 'yaml', 'wide']);
    const store = await openTokenStore(flags);
    const tokens = store.list();
    if (format === 'json') return void process.stdout.write(`${JSON.stringify({ tokens }, null, 2)}\n`);
    if (format === 'yaml') return void process.stdout.write(toYaml({ tokens } as unknown as YamlValue));
    if (tokens.length === 0) {
      process.stderr.write(`No tokens in ${tokensFile(flags)}.\n`);
      return;
    }
    const now = Date.now();
    process.stdout.write(
      table(
        ['NAME', 'ID', 'CLUSTERS', 'AGE', 'EXPIRES'],
        tokens.map((t) => [
          t.name,
          t.id,
          t.clusters === '*' ? '*' : t.clusters.join(','),
          age(Date.parse(t.createdAt), now),
          expiresText(t, now),
        ]),
      ),
    );
    return;
  }
  if (sub === 'revoke' || sub === 'delete') {
    const { flags, positionals } = parseFlags(rest, revokeFlags);
    if (flags['help']) return void process.stdout.write(revokeUsage);
    if (positionals.length !== 1)
      throw new UsageError('token revoke needs exactly one ID or NAME, e.g. "cluster-proxy token revoke ci-bot"');
    const store = await openTokenStore(flags);
    const target = positionals[0]!;
    const found = store.list().find((t) => t.id === target || t.name === target);
    if (!(await store.revoke(target))) throw new Error(`no token with id or name "${target}" in ${tokensFile(flags)}`);
    process.stdout.write(`token "${found?.name ?? target}" (id ${found?.id ?? '?'}) revoked\n`);
    return;
  }
  throw new UsageError(`unknown token command "${sub}"; use issue, list or revoke`);
}
