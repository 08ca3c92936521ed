#!/usr/bin/env node
// pinset: one binary, several commands. Each command module exports
// run(argv): Promise<number>, the process exit code.
//   0 success; 1 the work did not succeed (e.g. a set not Ready, a bad file);
//   2 a usage or configuration error.
// src/cli/kubectl-pinset.ts runs the same commands as a kubectl plugin.
import { UsageError, type FlagSpec } from '../util/flags.ts';

/** A command's module: what it runs, and its flag table (its --help and the reference list them). */
export interface CommandModule {
  run(argv: string[]): Promise<number>;
  flags: readonly FlagSpec[];
}

export const commands: Record<string, { summary: string; load: () => Promise<CommandModule> }> = {
  agent: { summary: 'pin and pre-load the images of the sets that select this node', load: () => import('../agent/boot/main.ts') },
  controller: { summary: 'roll per-node results up into each set\'s status', load: () => import('../controller/main.ts') },
  preflight: { summary: 'check what the cluster needs for pinset: what is fine, what will fail and what to do', load: () => import('./preflight.ts') },
  status: { summary: 'show, per node and set, what the agents report', load: () => import('./status.ts') },
  validate: { summary: 'check PinnedImageSet YAML files offline', load: () => import('./validate.ts') },
  resolve: { summary: 'turn sets or image lists with tags (or a release image) into sets with digests', load: () => import('./resolve.ts') },
  size: { summary: 'download size and estimated disk of the images of sets or image lists', load: () => import('./size.ts') },
  'kubelet-allowlist': { summary: "a kubelet config drop-in that keeps its credential verification from refusing the sets' images offline", load: () => import('./kubelet-allowlist.ts') },
  'mirror-config': { summary: 'the node config (containerd, CRI-O, k3s, OpenShift) that sends pulls through a pull-through cache first', load: () => import('./mirror-config.ts') },
  snapshot: { summary: 'a set of the images that pods run now', load: () => import('./snapshot.ts') },
  uninstall: { summary: 'remove pinset from the cluster, leaving no pin on any node', load: () => import('./uninstall.ts') },
};

export interface CliOptions {
  /** How the program is called, for usage lines: "pinset", "kubectl pinset". */
  prog: string;
  /** Commands not offered under this name. */
  exclude?: readonly string[];
}

function usage(opts: CliOptions): string {
  const offered = Object.entries(commands).filter(([name]) => !opts.exclude?.includes(name));
  const width = offered.reduce((w, [name]) => Math.max(w, name.length), 11) + 1;
  const rows = offered.map(([name, c]) => `  ${name.padEnd(width)} ${c.summary}`);
  return `usage: ${opts.prog} <command> [flags]\n\ncommands:\n${rows.join('\n')}\n\n'${opts.prog} <command> --help' lists a command's flags; '${opts.prog} --version' prints pinset's version.\n`;
}

/** pinset's version, from its package.json: read only when asked (the bundle keeps it in a file of its own). */
export async function packageVersion(): Promise<string> {
  const { default: pkg } = (await import('../../package.json', { with: { type: 'json' } })) as { default: { version: string } };
  return pkg.version;
}

export async function runCli(argv: string[], opts: CliOptions = { prog: 'pinset' }): Promise<number> {
  const [name, ...rest] = argv;
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    process.stdout.write(usage(opts));
    return name ? 0 : 2;
  }
  if (name === '--version') {
    process.stdout.write(`pinset ${await packageVersion()}\n`);
    return 0;
  }
  const cmd = opts.exclude?.includes(name) ? undefined : commands[name];
  if (!cmd) {
    process.stderr.write(`${opts.prog}: unknown command ${JSON.stringify(name)}\n\n${usage(opts)}`);
    return 2;
  }
  try {
    const mod = await cmd.load();
    return await mod.run(rest);
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`${opts.prog} ${name}: ${err.message}\n`);
      return 2;
    }
    throw err;
  }
}

/** Run as a program: the exit code on success, 2 and the stack on an unexpected error. */
export function runAsProgram(argv: string[], opts: CliOptions): void {
  runCli(argv, opts).then(
    (code) => {
      process.exitCode = code;
    },
    (err: unknown) => {
      process.stderr.write(`${opts.prog}: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      process.exitCode = 2;
    },
  );
}

if (import.meta.main) runAsProgram(process.argv.slice(2), { prog: 'pinset' });
