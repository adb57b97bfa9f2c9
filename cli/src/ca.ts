// `cluster-proxy ca rotate add|promote|finish`: the hub CA rollover on the data-dir PKI (see
// server/src/pki/rotation.ts). The running hub picks each stage up by itself (--tls-reload-interval)
// and passes the new bundle to agents with their next lease renewal.
// `cluster-proxy ca issue-client NAME`: a client certificate for a hub user (SDK, forward, CONNECT
// with a certificate), signed by the data-dir PKI's signing CA.
// `cluster-proxy ca issue-agent CLUSTER`: an agent certificate with OCM's agent subject, for agents
// that cannot bootstrap with a token (an unmodified ANP agent, or ours with --cert/--key).
import { access } from 'node:fs/promises';
import path from 'node:path';
import {
  DEFAULT_AGENT_NAME,
  agentSubject,
  issueAgentCert,
  issueClientCert,
  readPemPair,
  rotateCa,
  splitBundle,
  writePemPair,
  type PemPair,
  type RotationStage,
} from '@cluster-proxy/server';
import { UsageError, duration, helpText, list, parseFlags, str, type FlagSpecs, type ParsedFlags } from './flags.js';
import { hubDataDirFlags } from './hub-files.js';

const caFlags: FlagSpecs = {
  'data-dir': hubDataDirFlags['data-dir']!,
  out: { type: 'string', help: 'issue-client, issue-agent: directory for the .crt and .key (default: the current directory)' },
  validity: { type: 'string', default: '180d', help: 'issue-client, issue-agent: certificate lifetime' },
  group: { type: 'string', multiple: true, help: 'issue-client: organization (O) entries, e.g. a team' },
  'agent-id': { type: 'string', default: DEFAULT_AGENT_NAME, help: 'issue-agent: the agent name in the subject (a DNS-1123 name)' },
};

export const caUsage = helpText(
  'cluster-proxy ca rotate add|promote|finish | ca issue-client NAME | ca issue-agent CLUSTER [--agent-id ID] [--out DIR] [--validity 180d] [--data-dir DIR]',
  'CA rollover in three stages: add (new CA trusted), promote (new CA signs; agents are asked to renew), finish (old CA dropped).\n' +
    'Wait between stages until every agent has renewed its lease (it then trusts the new CA) and, before finish, its certificate.\n' +
    'issue-client writes a client certificate for a hub user (NAME.crt, NAME.key 0600), signed by the hub CA.\n' +
    "issue-agent writes CLUSTER-agent.crt and CLUSTER-agent.key (0600) with OCM's agent subject\n" +
    '(CN system:open-cluster-management:cluster:CLUSTER:addon:cluster-proxy:agent:ID), for an agent without a bootstrap token.',
  caFlags,
);

const CLIENT_NAME = /^[A-Za-z0-9]([A-Za-z0-9._@-]{0,62}[A-Za-z0-9])?$/;

export async function runCa(args: string[]): Promise<void> {
  const { flags, positionals } = parseFlags(args, caFlags);
  if (flags['help']) {
    process.stdout.write(caUsage);
    return;
  }
  const [verb, arg, ...extra] = positionals;
  const pkiDir = path.join(str(flags, 'data-dir')!, 'pki');
  if (verb === 'issue-client') return issueClient(pkiDir, arg, extra, flags);
  if (verb === 'issue-agent') return issueAgent(pkiDir, arg, extra, flags);
  if (verb !== 'rotate' || !arg || extra.length > 0 || !['add', 'promote', 'finish'].includes(arg))
    throw new UsageError('usage: cluster-proxy ca rotate add|promote|finish, ca issue-client NAME, or ca issue-agent CLUSTER');
  try {
    process.stdout.write(`${await rotateCa(pkiDir, arg as RotationStage)}\n`);
  } catch (err) {
    throw new UsageError(`ca rotate ${arg}: ${(err as Error).message}`);
  }
}

async function issueClient(pkiDir: string, name: string | undefined, extra: string[], flags: ParsedFlags): Promise<void> {
  if (!name || extra.length > 0) throw new UsageError("ca issue-client takes one NAME (the user, written as the certificate's CN)");
  if (!CLIENT_NAME.test(name)) throw new UsageError(`invalid client name "${name}": letters, digits, ".", "_", "@" and "-", at most 64`);
  const days = validityDays(flags);
  const out = await freshOut(flags, name);
  const signer = await signingCa(pkiDir, 'issue-client');
  const paths = await writePemPair(
    out,
    name,
    issueClientCert(signer, { commonName: name, organization: list(flags, 'group'), validityDays: days }),
  );
  process.stdout.write(`${paths.certPath}\n${paths.keyPath}\n`);
  process.stderr.write(
    `client certificate for "${name}" valid for ${Math.round(days)} days; trust the hub with ${path.join(pkiDir, 'ca.crt')}\n`,
  );
}

async function issueAgent(pkiDir: string, cluster: string | undefined, extra: string[], flags: ParsedFlags): Promise<void> {
  if (!cluster || extra.length > 0) throw new UsageError('ca issue-agent takes one CLUSTER (the managed cluster the agent serves)');
  const agentName = str(flags, 'agent-id')!;
  let subject: { commonName: string };
  try {
    subject = agentSubject(cluster, agentName); // both names must be DNS-1123: they become the subject
  } catch (err) {
    throw new UsageError(`ca issue-agent: ${(err as Error).message}`);
  }
  const days = validityDays(flags);
  const name = `${cluster}-agent`;
  const out = await freshOut(flags, name);
  const signer = await signingCa(pkiDir, 'issue-agent');
  const paths = await writePemPair(out, name, issueAgentCert(signer, { cluster, agentName, validityDays: days }));
  process.stdout.write(`${paths.certPath}\n${paths.keyPath}\n`);
  process.stderr.write(
    `agent certificate "${subject.commonName}" valid for ${Math.round(days)} days; the agent trusts the hub with ${path.join(pkiDir, 'ca.crt')}\n`,
  );
}

function validityDays(flags: ParsedFlags): number {
  const days = duration(flags, 'validity') / 86_400_000;
  if (!(days >= 1 / 24)) throw new UsageError('--validity must be at least 1h');
  return days;
}

/** --out, refusing to overwrite an existing key. */
async function freshOut(flags: ParsedFlags, name: string): Promise<string> {
  const out = str(flags, 'out') ?? '.';
  if (
    await access(path.join(out, `${name}.key`)).then(
      () => true,
      () => false,
    )
  )
    throw new UsageError(`${path.join(out, `${name}.key`)} exists; choose another --out or NAME`);
  return out;
}

/** The data-dir PKI's signing CA: the bundle's first certificate (the newest, during a rollover). */
async function signingCa(pkiDir: string, verb: string): Promise<PemPair> {
  let ca;
  try {
    ca = await readPemPair(pkiDir, 'ca');
  } catch (err) {
    throw new UsageError(`ca ${verb} needs the hub's data-dir PKI: ${(err as Error).message}`);
  }
  return { certPem: splitBundle(ca.certPem)[0]!, keyPem: ca.keyPem };
}
