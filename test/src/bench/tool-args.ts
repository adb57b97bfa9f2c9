// The bench's stand-alone tools (anp-stuck, gateway-shapes, cpuprofile) read their flags here: `--help`
// prints the usage, and a flag they do not know is one line and the usage, exit code 2 (not a stack trace).
import { parseArgs, type ParseArgsConfig } from 'node:util';

/** parseArgs(config) with `--help` and one-line refusals; exits for either. */
export function toolArgs<T extends ParseArgsConfig>(tool: string, usage: string, config: T): ReturnType<typeof parseArgs<T>> {
  if (process.argv.slice(2).includes('--help')) {
    process.stdout.write(usage);
    process.exit(0);
  }
  try {
    return parseArgs(config);
  } catch (err) {
    return refuse(tool, usage, (err as Error).message.split('. ')[0] ?? 'bad arguments');
  }
}

/** One line naming the problem, the usage, exit code 2. */
export function refuse(tool: string, usage: string, problem: string): never {
  process.stderr.write(`${tool}: ${problem}\n${usage}`);
  process.exit(2);
}
