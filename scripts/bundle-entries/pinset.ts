// dist/pinset.mjs: `pinset`. The sources start the CLI from src/cli/main.ts
// when it is the program (import.meta.main); in the bundle that module
// shares a file with the kubectl plugin's entry, where import.meta.main is
// false, so this entry starts it instead.
import { runAsProgram } from '../../src/cli/main.ts';

runAsProgram(process.argv.slice(2), { prog: 'pinset' });
