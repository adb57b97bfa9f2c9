// `cluster-proxy ca rotate add|promote|finish`: the hub CA rollover on the data-dir PKI (see
// server/src/pki/rotation.ts). The running hub picks each stage up by itself (--tls-reload-interval)
// and passes the new bundle to agents with their next lease renewal.
import path from 'node:path';
import { rotateCa, type RotationStage } from '@cluster-proxy/server';
import { UsageError, helpText, parseFlags, str, type FlagSpecs } from './flags.js';
import { hubDataDirFlags } from './hub-files.js';

const caFlags: FlagSpecs = { 'data-dir': hubDataDirFlags['data-dir']! };

export const caUsage = helpText(
  'cluster-proxy ca rotate add|promote|finish [--data-dir DIR]',
  'CA rollover in three stages: add (new CA trusted), promote (new CA signs; agents are asked to renew), finish (old CA dropped).\n' +
  'Wait between stages until every agent has renewed its lease (it then trusts the new CA) and, before finish, its certificate.',
  caFlags,
);

export async function runCa(args: string[]): Promise<void> {
  const { flags, positionals } = parseFlags(args, caFlags);
  if (flags['help']) {
    process.stdout.write(caUsage);
    return;
  }
  const [verb, stage, ...extra] = positionals;
  if (verb !== 'rotate' || !stage || extra.length > 0 || !['add', 'promote', 'finish'].includes(stage)) throw new UsageError('usage: cluster-proxy ca rotate add|promote|finish');
  const dir = path.join(str(flags, 'data-dir')!, 'pki');
  try {
    process.stdout.write(`${await rotateCa(dir, stage as RotationStage)}\n`);
  } catch (err) {
    throw new UsageError(`ca rotate ${stage}: ${(err as Error).message}`);
  }
}
